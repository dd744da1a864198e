//! Gate step 8, one ticket per Codex action: which rollout records prove which Codex action.
//!
//! Codex writes a distinct rollout record just before each hook it runs (docs/security.md;
//! measured on 0.160.0 and 0.171.0): a hook is accepted only in the state that record leaves, and
//! each such state at most once. [`ticket_key`] names the state a verified hook follows (the key
//! of its ticket) or says why the rollout shows none; [`bind`] turns that into a ticket or the
//! refusal `no_ticket`, and `crate::tickets::take` accepts each ticket once (`ticket_used`, an
//! alarm, for any later hook presenting it).
//!
//! | event | the open turn's records must show | ticket |
//! |---|---|---|
//! | PreToolUse(C) | the tool call C (`function_call`, ...), no `item_completed` C, no output of C | (thread, turn, C) |
//! | PostToolUse(C) | `item_completed` C (the tool finished), no output of C yet (Codex writes it after the hook) | (thread, turn, C) |
//! | Stop | model output (the answer) after the turn's last tool call, and every call of the turn answered | (thread, turn, that answer) |
//! | UserPromptSubmit, SessionStart, SubagentStart | no model output yet in the turn | (thread, turn, event) |
//! | PermissionRequest(cmd) | a tool call not completed (the one asking; the payload names no call) | (thread, turn, open calls, digest of cmd) |
//!
//! A command the model runs is inside a tool call whose `item_completed` does not exist yet, so
//! it cannot present PostToolUse of its own call or Stop (its call is unanswered), nor the
//! opening events (the model already spoke), and its call's PreToolUse ticket was used by the
//! hook that ran before the command started. Codex writes no `item_completed` for a
//! `request_permissions` call nor for an `exec_command` the sandbox denied: their PostToolUse sees
//! the rollout as a process running beside the call does (for as long as the person takes to
//! answer, in the first case), so it is refused and a message waits for the turn's next hook.
//! What this does not stop is in docs/security.md (residual risks).

use crate::codex::rollout::{Actions, OpenCall};
use crate::codex::Verified;
use crate::refusal::{Refusal, RefusalCode};
use crate::store::Ticket;
use codex_format::hook::{HookEvent, HookPayload};

/// The ticket of a verified hook call, `None` for events that deliver nothing (SubagentStop), or
/// the refusal `no_ticket` when the rollout does not show the state the hook follows.
pub fn bind(v: &Verified) -> Result<Option<Ticket>, Refusal> {
    let key = payload_ticket_key(v.event, &v.payload, v.open_turn.as_deref(), &v.actions).map_err(|detail| {
        let mut r = Refusal::new(RefusalCode::NoTicket, detail);
        r.thread = Some(v.thread_id.to_string());
        r.event = Some(v.event.as_str().to_string());
        r
    })?;
    Ok(key.map(|key| Ticket { thread: v.thread_id.clone(), key, event: v.event }))
}

/// The ticket key of a hook call with `payload` (what [`ticket_key`] decides, the payload's
/// [`Subject`] read from it).
pub fn payload_ticket_key(
    event: HookEvent,
    payload: &HookPayload,
    open_turn: Option<&str>,
    actions: &Actions,
) -> Result<Option<String>, String> {
    let ask = crate::codex::approval::hook_ask(payload);
    let subject = Subject { tool_use_id: payload.tool_use_id.as_deref(), command: ask.as_deref() };
    ticket_key(event, subject, open_turn, actions)
}

/// What a hook's payload says it is about: the tool call (PreToolUse, PostToolUse) or what
/// PermissionRequest asks for (a command, a patch, or an MCP tool call: its tool and arguments).
#[derive(Debug, Clone, Copy, Default)]
pub struct Subject<'a> {
    pub tool_use_id: Option<&'a str>,
    pub command: Option<&'a str>,
}

/// The ticket key for `event` (its payload's [`Subject`]) in a rollout whose open turn is
/// `open_turn` with `actions`, or why the rollout shows no such state.
pub fn ticket_key(event: HookEvent, subject: Subject<'_>, open_turn: Option<&str>, actions: &Actions) -> Result<Option<String>, String> {
    if event == HookEvent::PermissionRequest {
        return permission_key(subject.command, open_turn, actions).map(Some);
    }
    if !event.can_deliver() {
        return Ok(None);
    }
    let tool_use_id = subject.tool_use_id;
    let turn = open_turn.ok_or("no turn is open")?;
    let ev = event.as_str();
    let call = |id: Option<&str>| -> Result<&OpenCall, String> {
        let id = id.ok_or_else(|| format!("{ev} without a tool_use_id"))?;
        actions.calls.iter().find(|c| c.id == id).ok_or_else(|| format!("the open turn has no call {id} waiting for its output"))
    };
    match event {
        HookEvent::PreToolUse => match call(tool_use_id)? {
            OpenCall { id, completed: false } => Ok(Some(format!("{ev}:{turn}:{id}"))),
            OpenCall { id, completed: true } => Err(format!("call {id} has already completed")),
        },
        HookEvent::PostToolUse => match call(tool_use_id)? {
            OpenCall { id, completed: true } => Ok(Some(format!("{ev}:{turn}:{id}"))),
            OpenCall { id, completed: false } => {
                Err(format!("call {id} has not completed (no item_completed): no PostToolUse can follow it yet"))
            }
        },
        HookEvent::Stop => {
            if let Some(c) = actions.calls.first() {
                return Err(format!("call {} of the turn is not answered yet", c.id));
            }
            if actions.overflow {
                return Err("more calls were open at once than are tracked".into());
            }
            match actions.said_at {
                Some(at) => Ok(Some(format!("{ev}:{turn}:{at}"))),
                None => Err("no model output after the turn's last tool call".into()),
            }
        }
        HookEvent::UserPromptSubmit | HookEvent::SessionStart | HookEvent::SubagentStart => {
            if actions.spoke {
                Err(format!("the model has already responded in turn {turn}"))
            } else {
                Ok(Some(format!("{ev}:{turn}")))
            }
        }
        HookEvent::SubagentStop | HookEvent::PermissionRequest | HookEvent::Other => Ok(None),
    }
}

/// PermissionRequest names no call: Codex asks for the command (or the MCP tool call) of a call
/// it has not run yet. The key is the open turn, the calls not completed yet and the digest of
/// what is asked, so a second hook asking the same for the same calls is a reuse.
fn permission_key(ask: Option<&str>, open_turn: Option<&str>, actions: &Actions) -> Result<String, String> {
    let turn = open_turn.ok_or("no turn is open")?;
    let command = ask.ok_or("PermissionRequest without a command or an MCP tool call")?;
    let waiting: Vec<&str> = actions.calls.iter().filter(|c| !c.completed).map(|c| c.id.as_str()).collect();
    if waiting.is_empty() {
        return Err("no tool call of the open turn is waiting to run".into());
    }
    let digest = crate::approval::command_digest(command);
    Ok(format!("{}:{turn}:{}:{digest}", HookEvent::PermissionRequest.as_str(), waiting.join(",")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codex::rollout::{RolloutIdentity, RolloutTracker};
    use serde_json::Value;
    use std::collections::HashMap;
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;
    use std::path::{Path, PathBuf};

    /// Hooks of a real Codex session as recorded (`hooklog.jsonl`: each payload plus `s0`, the
    /// rollout's size when the hook started), and its rollouts.
    struct Recording {
        hooks: Vec<Value>,
        rollouts: HashMap<String, Vec<u8>>,
    }

    fn recording(version: &str) -> Recording {
        recording_in(&format!("hooks-{version}"))
    }

    fn recording_in(name: &str) -> Recording {
        let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../codex-format/testdata")).join(name);
        let hooks = std::fs::read_to_string(dir.join("hooklog.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let mut rollouts = HashMap::new();
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if name.starts_with("rollout-") {
                rollouts.insert(name, std::fs::read(&p).unwrap());
            }
        }
        Recording { hooks, rollouts }
    }

    fn file_name(payload: &Value, key: &str) -> String {
        Path::new(payload[key].as_str().unwrap()).file_name().unwrap().to_string_lossy().into_owned()
    }

    /// A copy of a recorded rollout, grown to any prefix and read by a tracker.
    struct Replay {
        path: PathBuf,
        file: std::fs::File,
        data: Vec<u8>,
        written: usize,
    }

    /// An earlier, closed turn of 300 KB.
    static PAD: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let mut s =
            String::from("{\"timestamp\":\"t\",\"type\":\"event_msg\",\"payload\":{\"type\":\"task_started\",\"turn_id\":\"pad\"}}\n");
        for _ in 0..10 {
            s += &format!("{{\"timestamp\":\"t\",\"type\":\"response_item\",\"payload\":{{\"type\":\"function_call_output\",\"call_id\":\"pad\",\"output\":\"{}\"}}}}\n", "p".repeat(30_000));
        }
        s + "{\"timestamp\":\"t\",\"type\":\"event_msg\",\"payload\":{\"type\":\"task_complete\",\"turn_id\":\"pad\"}}\n"
    });

    impl Replay {
        fn reset(&mut self) {
            self.file = std::fs::File::create(&self.path).unwrap();
            self.written = 0;
        }
        fn new(dir: &Path, name: &str, data: &[u8]) -> Replay {
            std::fs::create_dir_all(dir).unwrap();
            let path = dir.join(name);
            let file = std::fs::File::create(&path).unwrap();
            Replay { path, file, data: data.to_vec(), written: 0 }
        }
        fn grow_to(&mut self, len: usize) {
            if len > self.written {
                self.file.write_all(&self.data[self.written..len]).unwrap();
                self.written = len;
            }
        }
        fn read(&self, tracker: &RolloutTracker) -> crate::codex::rollout::Snapshot {
            let r = std::fs::File::open(&self.path).unwrap();
            let m = r.metadata().unwrap();
            let id = RolloutIdentity { dev: m.dev(), ino: m.ino(), btime_sec: 0, btime_nsec: 0 };
            tracker.update(&self.path, &r, id, m.len()).unwrap()
        }
    }

    fn key_of(snap: &crate::codex::rollout::Snapshot, hook: &Value) -> Result<Option<String>, String> {
        let event = HookEvent::parse(hook["hook_event_name"].as_str().unwrap());
        let subject = Subject { tool_use_id: hook["tool_use_id"].as_str(), command: hook["tool_input"]["command"].as_str() };
        ticket_key(event, subject, snap.open_turn.as_deref(), &snap.actions)
    }

    /// Every hook of real Codex sessions (0.171.0 and 0.160.0: parallel tool calls, an
    /// exec_command that yields and keeps running, a tty call, a Stop that blocked and the Stop
    /// after it, SessionStart on startup and resume, a sub-agent's SubagentStart and hooks)
    /// replayed against the rollout as it stood when the hook started: each gets a ticket, no two
    /// the same; read incrementally and, for each hook, on first sight.
    #[test]
    fn every_recorded_genuine_hook_gets_its_own_ticket() {
        for version in ["0.171.0", "0.160.0"] {
            let rec = recording(version);
            let dir = std::env::temp_dir().join(format!("courier-ticket-replay-{}-{version}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let mut replays: HashMap<String, Replay> = rec.rollouts.iter().map(|(n, d)| (n.clone(), Replay::new(&dir, n, d))).collect();
            let mut padded_replays: HashMap<String, Replay> = rec
                .rollouts
                .iter()
                .map(|(n, d)| {
                    let first = d.iter().position(|b| *b == b'\n').unwrap() + 1;
                    let mut data = d[..first].to_vec();
                    data.extend_from_slice(PAD.as_bytes());
                    data.extend_from_slice(&d[first..]);
                    (n.clone(), Replay::new(&dir.join("padded"), n, &data))
                })
                .collect();
            let tracker = RolloutTracker::new();
            let mut keys = std::collections::HashSet::new();
            let mut events = std::collections::BTreeMap::new();
            for hook in &rec.hooks {
                let event = hook["hook_event_name"].as_str().unwrap();
                *events.entry(event.to_string()).or_insert(0) += 1;
                if event == "SubagentStop" {
                    continue; // delivers nothing, needs no ticket (and `s0` is its parent's rollout)
                }
                let name = file_name(hook, "transcript_path");
                let s0 = hook["s0"].as_u64().unwrap() as usize;
                let replay = replays.get_mut(&name).unwrap();
                replay.grow_to(s0);
                let snap = replay.read(&tracker);
                let key = key_of(&snap, hook).unwrap_or_else(|e| panic!("{version}: genuine {event} refused: {e}\n{hook}"));
                // Read for the first time at this point (a broker restarted just before the hook),
                // behind 300 KB of an earlier turn, so the tail is read backwards.
                let padded = padded_replays.get_mut(&name).unwrap();
                padded.grow_to(s0 + PAD.len());
                let fresh = key_of(&padded.read(&RolloutTracker::new()), hook);
                padded.reset();
                // A Stop's ticket names its answer by offset: further on by the padding.
                let shifted = key.as_ref().map(|k| match (event, k.rsplit_once(':')) {
                    ("Stop", Some((head, at))) => format!("{head}:{}", at.parse::<usize>().unwrap() + PAD.len()),
                    _ => k.clone(),
                });
                assert_eq!(fresh, Ok(shifted), "{version}: {event} on first sight");
                if let Some(k) = key {
                    assert!(keys.insert(format!("{name}/{k}")), "{version}: two hooks got ticket {k}");
                }
            }
            assert_eq!(events.get("Stop"), Some(&3), "{version}: {events:?}");
            assert!(events.get("PreToolUse").is_some_and(|n| *n >= 9), "{version}: {events:?}");
            assert!(events.contains_key("SubagentStart"), "{version}: {events:?}");
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// At every point of the same sessions where a tool call is running (after its PreToolUse,
    /// before its item_completed), a command inside it that presents PostToolUse of its own call,
    /// Stop, UserPromptSubmit or SessionStart finds no ticket, and its PreToolUse ticket is the one
    /// the real PreToolUse already got.
    #[test]
    fn inside_a_running_call_only_its_used_pretooluse_ticket_exists() {
        for version in ["0.171.0", "0.160.0"] {
            let rec = recording(version);
            let main = rec.hooks.iter().find(|h| h["hook_event_name"] == "SessionStart").unwrap();
            let name = file_name(main, "transcript_path");
            let data = &rec.rollouts[&name];
            let dir = std::env::temp_dir().join(format!("courier-ticket-forge-{}-{version}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let mut replay = Replay::new(&dir, &name, data);
            let mut checked = 0;
            for pre in rec.hooks.iter().filter(|h| h["hook_event_name"] == "PreToolUse" && file_name(h, "transcript_path") == name) {
                let call = pre["tool_use_id"].as_str().unwrap();
                // The rollout once the tool runs: everything before this call's own item_completed
                // (or its output, for a call that yields).
                let text = std::str::from_utf8(data).unwrap();
                let mut at = 0;
                let mut done = None;
                for line in text.split_inclusive('\n') {
                    let id = format!("\"id\":\"{call}\"");
                    let completed = line.contains("\"type\":\"item_completed\"") && line.contains(&id);
                    if completed || line.contains(&format!("\"call_id\":\"{call}\",\"output\"")) {
                        done = Some(at);
                        break;
                    }
                    at += line.len();
                }
                let Some(end) = done else { continue };
                if end < pre["s0"].as_u64().unwrap() as usize {
                    continue; // another parallel call's hook wrote first
                }
                // Parallel calls finish in any order: each point is read from its own copy.
                replay.reset();
                replay.grow_to(end);
                let snap = replay.read(&RolloutTracker::new());
                let genuine = key_of(&snap, pre).unwrap().unwrap();
                let turn = pre["turn_id"].as_str().unwrap();
                assert_eq!(genuine, format!("PreToolUse:{turn}:{call}"));
                for event in ["PostToolUse", "Stop", "UserPromptSubmit", "SessionStart"] {
                    let r = ticket_key(
                        HookEvent::parse(event),
                        Subject { tool_use_id: Some(call), command: None },
                        snap.open_turn.as_deref(),
                        &snap.actions,
                    );
                    assert!(r.is_err(), "{version}: {event} forged inside {call} got {r:?}");
                }
                checked += 1;
            }
            assert!(checked >= 6, "{version}: {checked}");
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// Permission requests and failing commands on the real Codex (0.171.0 and 0.160.0, an
    /// app-server thread on-request and read-only, `request_permissions_tool` on): a
    /// `request_permissions` call alone, one sent with an `exec_command` beside it (Codex runs them
    /// one after the other), a command the sandbox denies, one exiting 4. Codex writes no
    /// `item_completed` for `request_permissions` nor for the denied command; their PostToolUse
    /// runs with the rollout as it was while the call ran. Each hook replayed against the rollout
    /// as it stood when it started: every one gets its own ticket except the PostToolUse of the
    /// two requests and of the denied command (`no_ticket`: a process running beside the call
    /// would see the same rollout), and the hooks after them still get theirs.
    #[test]
    fn permission_requests_and_a_denied_command_get_no_post_tool_use_ticket() {
        for version in ["0.171.0", "0.160.0"] {
            let rec = recording_in(&format!("hooks-permissions-{version}"));
            let dir = std::env::temp_dir().join(format!("courier-ticket-perm-{}-{version}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            let (name, data) = rec.rollouts.iter().next().unwrap();
            let mut replay = Replay::new(&dir, name, data);
            let tracker = RolloutTracker::new();
            let mut keys = std::collections::HashSet::new();
            let mut refused = Vec::new();
            for hook in &rec.hooks {
                let event = hook["hook_event_name"].as_str().unwrap();
                let call = hook["tool_use_id"].as_str().unwrap_or("-");
                replay.grow_to(hook["s0"].as_u64().unwrap() as usize);
                let snap = replay.read(&tracker);
                let fresh = key_of(&replay.read(&RolloutTracker::new()), hook);
                let key = key_of(&snap, hook);
                assert_eq!(key, fresh, "{version}: {event} {call} on first sight");
                match key {
                    Ok(Some(k)) => assert!(keys.insert(k.clone()), "{version}: two hooks got ticket {k}"),
                    Ok(None) => {}
                    Err(why) => refused.push(format!("{event} {call}: {why}")),
                }
            }
            let refused_calls: Vec<&str> = refused.iter().map(|r| r.split(':').next().unwrap()).collect();
            assert_eq!(
                refused_calls,
                ["PostToolUse call_perm", "PostToolUse call_perm2", "PostToolUse call_0007"],
                "{version}: {refused:#?}"
            );
            assert!(refused.iter().all(|r| r.contains("no item_completed")), "{refused:?}");
            assert!(keys.contains(&format!("PostToolUse:{}:call_par", rec.hooks[0]["turn_id"].as_str().unwrap())), "{keys:?}");
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// A PermissionRequest for an MCP tool call carries no command: its ticket binds the tool and
    /// its arguments (one per call, as a command's), a second hook asking the same is the same
    /// ticket, other arguments or another tool another one; a payload with neither is refused.
    #[test]
    fn an_mcp_tool_calls_permission_request_gets_its_own_ticket() {
        use crate::codex::rollout::{Actions, OpenCall};
        let actions = Actions { calls: vec![OpenCall { id: "call_mcp".into(), completed: false }], ..Default::default() };
        let payload = |tool: &str, input: serde_json::Value| -> HookPayload {
            serde_json::from_value(serde_json::json!({"hook_event_name": "PermissionRequest", "tool_name": tool, "tool_input": input}))
                .unwrap()
        };
        let key = |p: &HookPayload| payload_ticket_key(HookEvent::PermissionRequest, p, Some("t1"), &actions);
        let send = payload("mcp__courier__send_message", serde_json::json!({"thread": "T", "text": "hi"}));
        let k = key(&send).unwrap().unwrap();
        assert!(k.starts_with("PermissionRequest:t1:call_mcp:sha256:"), "{k}");
        assert_eq!(key(&send).unwrap().unwrap(), k, "the same call, the same ticket");
        let other_text = payload("mcp__courier__send_message", serde_json::json!({"thread": "T", "text": "bye"}));
        let other_tool = payload("mcp__courier__list_threads", serde_json::json!({"thread": "T", "text": "hi"}));
        assert_ne!(key(&other_text).unwrap().unwrap(), k);
        assert_ne!(key(&other_tool).unwrap().unwrap(), k);
        let neither = payload("WebFetch", serde_json::json!({"url": "x"}));
        assert_eq!(key(&neither), Err("PermissionRequest without a command or an MCP tool call".to_string()));
    }
}
