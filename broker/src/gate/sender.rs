//! Who sends a message, when `broker send` runs inside a Codex tool command: the thread whose
//! model ran that command, proven with the same evidence the hook gate uses, found from the
//! sender's side.
//!
//! 1. the peer (SO_PEERCRED, pinned by a pidfd) is of the broker's uid, and walking its parents
//!    (step 3) reaches a trusted Codex process;
//! 2. its environment says which thread and tool call it runs for (`CODEX_THREAD_ID`,
//!    `CODEX_TOOL_CALL_ID`, which Codex adds to the commands the model runs and the codex
//!    process itself lacks), or, for an MCP server Codex started, the request says so (Codex
//!    names both in each `tools/call`'s `_meta`): claims, checked next;
//! 3. that codex process holds the thread's writer lock and its rollout for append, through fds it
//!    opened itself (`holder::held_threads`, step 5);
//! 4. the thread's open turn (the rollout read backwards from its end, at most [`MAX_BACKSCAN`])
//!    has a tool call with that call id: the model of that thread asked for a command now;
//! 5. the start times of the chain and the peer are unchanged at the end.
//!
//! What this cannot tell apart: two threads of the same codex process (a parent and its
//! sub-agents, the TUI's daemon with several windows). A command of one of them that sets the
//! other's id and one of its open call ids (read from its rollout) passes as the other. Threads of
//! any other process cannot be claimed. [`ToolSender::threads_in_process`] says how many threads
//! the process runs (1: the attribution is exact).

use super::ancestry::Member;
use super::{Gate, Peer};
use crate::codex::proof::holder;
use crate::exe::CodexTrust;
use crate::os;
use courier_shared::paths::environ_get;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// How far back from the rollout's end the tool call is looked for.
pub const MAX_BACKSCAN: u64 = 16 << 20;
const CHUNK: usize = 64 * 1024;
/// Longest line kept while reading backwards (longer ones are skipped).
const MAX_LINE: usize = 4 << 20;

/// A sender the broker verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolSender {
    /// The Codex thread, or the Claude Code or Copilot CLI session (`session_sender.rs`).
    pub thread: String,
    /// The Codex tool call (empty for a Claude Code command: Claude Code names none).
    pub call_id: String,
    /// The host process the sender runs under: codex, or the session's pinned claude.
    pub codex_pid: i32,
    /// Threads the codex process runs (1: no sibling could pose as this one).
    pub threads_in_process: usize,
}

/// Where a backward scan of a rollout stands on `call_id`.
enum Line {
    Found,
    TurnStart,
    Other,
}

fn classify(line: &[u8], needle: &[u8], call_id: &str) -> Line {
    let head = &line[..line.len().min(200)];
    let has = |h: &[u8], n: &[u8]| h.windows(n.len()).any(|w| w == n);
    if has(head, b"\"task_started\"") {
        return Line::TurnStart;
    }
    if !has(line, needle) || !(has(head, b"\"function_call\"") || has(head, b"\"custom_tool_call\"") || has(head, b"\"local_shell_call\""))
    {
        return Line::Other;
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) else { return Line::Other };
    let p = &v["payload"];
    let kind = p["type"].as_str().unwrap_or("");
    if v["type"] == "response_item" && matches!(kind, "function_call" | "custom_tool_call" | "local_shell_call") && p["call_id"] == call_id
    {
        Line::Found
    } else {
        Line::Other
    }
}

/// The open turn of the rollout (everything after its last `task_started`) holds a tool call
/// `call_id`. Reads backwards from `len`, at most [`MAX_BACKSCAN`] bytes.
pub fn open_turn_has_call(file: &File, len: u64, call_id: &str) -> bool {
    let needle = format!("\"call_id\":\"{call_id}\"").into_bytes();
    let mut pos = len;
    let mut carry: Vec<u8> = Vec::new();
    let mut carry_skipped = false;
    let mut chunk = vec![0u8; CHUNK];
    while pos > 0 && len - pos < MAX_BACKSCAN {
        let n = CHUNK.min(pos as usize);
        pos -= n as u64;
        if file.read_exact_at(&mut chunk[..n], pos).is_err() {
            return false;
        }
        let mut data = chunk[..n].to_vec();
        data.extend_from_slice(&carry);
        let mut end = data.len();
        let mut skipped = carry_skipped;
        for i in (0..data.len().min(n)).rev() {
            if data[i] != b'\n' {
                continue;
            }
            if !skipped {
                match classify(&data[i + 1..end], &needle, call_id) {
                    Line::Found => return true,
                    Line::TurnStart => return false,
                    Line::Other => {}
                }
            }
            end = i;
            skipped = false;
        }
        if end > MAX_LINE {
            carry = Vec::new();
            carry_skipped = true;
        } else {
            carry = data[..end].to_vec();
            carry_skipped = skipped;
        }
    }
    pos == 0 && !carry_skipped && matches!(classify(&carry, &needle, call_id), Line::Found)
}

impl Gate {
    /// The thread whose tool command `peer` is (see the module docs), or why that is not proven.
    /// `claims`: the thread and call id the peer names itself (an MCP server Codex started, from
    /// the request's `_meta`); `None`: read them from the peer's environment (a command the model
    /// ran, which Codex marks with `CODEX_THREAD_ID`/`CODEX_TOOL_CALL_ID`).
    pub fn verify_tool_sender(&self, peer: &Peer, trust: &dyn CodexTrust, claims: Option<(&str, &str)>) -> Result<ToolSender, String> {
        if peer.uid != self.uid {
            return Err(format!("peer uid {} is not the broker's", peer.uid));
        }
        let stat = os::read_stat(peer.pid).map_err(|e| format!("peer stat: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(2);
        let (chain, codex) = self.walk_ancestry(&stat, trust, deadline).map_err(|r| format!("{}: {}", r.code, r.detail))?;
        let mut env = Vec::with_capacity(8192);
        os::read_environ(peer.pid, &mut env).map_err(|e| format!("peer environ: {e}"))?;
        let mut codex_env = Vec::with_capacity(8192);
        os::read_environ(codex.pid, &mut codex_env).map_err(|e| format!("codex environ: {e}"))?;
        let claim = |key: &str| -> Result<String, String> {
            let v = environ_get(&env, key).ok_or_else(|| format!("not a Codex tool command (no {key})"))?;
            if environ_get(&codex_env, key).is_some() {
                return Err(format!("codex {} itself has {key}: the variable does not mark a tool command", codex.pid));
            }
            String::from_utf8(v.to_vec()).map_err(|_| format!("{key} is not UTF-8"))
        };
        let (thread, call_id) = match claims {
            Some((t, c)) => (t.to_string(), c.to_string()),
            None => (claim("CODEX_THREAD_ID")?, claim("CODEX_TOOL_CALL_ID")?),
        };
        if !courier_shared::ids::is_uuid(&thread) || call_id.is_empty() || call_id.contains('"') || call_id.contains('\\') {
            return Err("CODEX_THREAD_ID or CODEX_TOOL_CALL_ID is malformed".into());
        }
        let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let sessions = canon(&self.config.codex_home.join("sessions"));
        let lock_dir = canon(&self.config.codex_home.join("thread-writer-locks"));
        let held = holder::held_threads(codex.pid, &sessions, &lock_dir).map_err(|e| format!("codex {} fds: {e}", codex.pid))?;
        let Some(mine) = held.iter().find(|h| h.thread == thread) else {
            return Err(format!("codex {} does not hold thread {thread} (its rollout and writer lock)", codex.pid));
        };
        let file = os::open_nofollow(&mine.rollout).map_err(|e| format!("open rollout: {e}"))?;
        let len = file.metadata().map_err(|e| format!("rollout: {e}"))?.len();
        if !open_turn_has_call(&file, len, &call_id) {
            return Err(format!("the open turn of thread {thread} has no tool call {call_id}"));
        }
        self.unchanged_since(&chain, &codex, peer, stat.starttime)?;
        Ok(ToolSender { thread, call_id, codex_pid: codex.pid, threads_in_process: held.len() })
    }

    /// Last step: every process from the peer to its host (`chain`, then `host`) is still the
    /// one checked, and the peer (started at `peer_start`) still runs.
    pub(super) fn unchanged_since(&self, chain: &[Member], host: &Member, peer: &Peer, peer_start: u64) -> Result<(), String> {
        for m in chain.iter().chain(std::iter::once(host)) {
            match os::read_stat(m.pid) {
                Ok(s) if s.starttime == m.starttime => {}
                _ => return Err(format!("process {} changed while checked", m.pid)),
            }
        }
        if !peer.is_alive() || !os::read_stat(peer.pid).is_ok_and(|s| s.starttime == peer_start) {
            return Err("the sender exited while checked".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rollout(lines: &[String]) -> (File, u64, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("courier-sender-{}-{}", std::process::id(), lines.len()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("r.jsonl");
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(&p, &text).unwrap();
        (File::open(&p).unwrap(), text.len() as u64, dir)
    }

    fn rec(kind: &str, payload: serde_json::Value) -> String {
        serde_json::json!({"timestamp": "t", "type": kind, "payload": payload}).to_string()
    }

    #[test]
    fn tool_call_must_be_in_the_open_turn() {
        let call = |id: &str| {
            rec("response_item", serde_json::json!({"type": "function_call", "name": "exec_command", "call_id": id, "arguments": "{}"}))
        };
        let started = |t: &str| rec("event_msg", serde_json::json!({"type": "task_started", "turn_id": t}));
        let big = rec("response_item", serde_json::json!({"type": "function_call_output", "call_id": "x", "output": "y".repeat(300_000)}));
        let (f, len, dir) = rollout(&[started("T1"), call("call_old"), started("T2"), big.clone(), call("call_now"), big]);
        assert!(open_turn_has_call(&f, len, "call_now"));
        assert!(!open_turn_has_call(&f, len, "call_old"), "a call of an earlier turn");
        assert!(!open_turn_has_call(&f, len, "call_none"));
        // The call id only inside some output text does not count.
        let fake = rec(
            "response_item",
            serde_json::json!({"type": "function_call_output", "call_id": "x", "output": "\"call_id\":\"call_fake\""}),
        );
        let (f2, len2, dir2) = rollout(&[started("T1"), fake]);
        assert!(!open_turn_has_call(&f2, len2, "call_fake"));
        // The first line counts too.
        let (f3, len3, dir3) = rollout(&[call("call_first")]);
        assert!(open_turn_has_call(&f3, len3, "call_first"));
        for d in [dir, dir2, dir3] {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}
