//! Codex's approvals: what its PermissionRequest hook says (`tool_input.command`, the model's
//! `description`; no call id), and answering its app-server's
//! `item/commandExecution/requestApproval` and `item/fileChange/requestApproval` (probed on 0.160.0
//! and 0.171.0; tests/tests/approvals.rs, tests/tests/approvals_files.rs).
//!
//! A permission request (the model's `request_permissions` tool, behind the feature flag
//! `request_permissions_tool`) runs no PermissionRequest hook: its PreToolUse (`tool_input` the
//! tool's arguments, `tool_use_id` the call) is where Courier sees it, and the app-server's
//! `item/permissions/requestApproval` (`itemId` the call, `permissions` as Codex resolved them)
//! is answered with the permissions granted: all of those asked, or none.
//!
//! A patch (`tool_name` `apply_patch`) asks through the same hook: its `tool_input.command` is the
//! patch text. Its request carries no changes, only the call (`itemId`); the files are in the
//! thread's `fileChange` item of that id, which `thread/resume` returns with the turn.
//!
//! The app-server sends the request to every client subscribed to the thread, with one JSON-RPC
//! id; the first answer wins, every client gets `serverRequest/resolved`, a later answer is
//! ignored without an error. A client that resumes the thread while it waits
//! (`activeFlags: ["waitingOnApproval"]`) gets the request replayed: that is how Courier finds
//! it. The request's `itemId` is the call id, its `command` the shell's whole command line
//! (`/bin/bash -lc '<the model's command>'`).

use super::appserver::{self, Endpoint, WsClient};
use crate::approval::{AnswerOutcome, Approval, ApprovalKind, Decision};
use codex_format::hook::HookPayload;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The app-server's request for each kind of approval.
fn request_method(kind: ApprovalKind) -> &'static str {
    match kind {
        ApprovalKind::Command => "item/commandExecution/requestApproval",
        ApprovalKind::FileChange => "item/fileChange/requestApproval",
        ApprovalKind::Permissions => "item/permissions/requestApproval",
        ApprovalKind::McpTool => MCP_APPROVAL_REQUEST,
    }
}
/// How the app-server asks its client about an MCP tool call: an MCP elicitation whose `_meta`
/// says `codex_approval_kind: "mcp_tool_call"` with the tool and its arguments (`tool_name`,
/// `tool_params`), `serverName` the server; no item id (probed on 0.171.0,
/// `tests/tests/approvals_mcp.rs`).
const MCP_APPROVAL_REQUEST: &str = "mcpServer/elicitation/request";
/// The tool whose PermissionRequest asks to change files.
const PATCH_TOOL: &str = "apply_patch";
/// The tool the model asks for more sandbox permissions with (its PreToolUse is the only hook).
pub const PERMISSIONS_TOOL: &str = "request_permissions";
const RESOLVED: &str = "serverRequest/resolved";
/// How long a request already answered has to show its `serverRequest/resolved` before ours
/// is written (it was queued on our connection before the replay was read).
const SETTLE: Duration = Duration::from_millis(20);

/// The command a PermissionRequest asks to run (`tool_input.command`).
pub fn hook_command(p: &HookPayload) -> Option<String> {
    p.tool_input.as_ref()?.get("command")?.as_str().map(str::to_string)
}

/// What a PermissionRequest asks for: a patch (`apply_patch`), an MCP tool call, or a command.
pub fn hook_kind(p: &HookPayload) -> ApprovalKind {
    match p.tool_name.as_deref() {
        Some(PATCH_TOOL) => ApprovalKind::FileChange,
        _ if mcp_tool_call(p).is_some() => ApprovalKind::McpTool,
        _ => ApprovalKind::Command,
    }
}

/// How Codex's hooks name an MCP tool: `mcp__SERVER__TOOL`.
const MCP_TOOL_PREFIX: &str = "mcp__";

/// The MCP tool call a PermissionRequest asks for (it carries no command): the tool's namespaced
/// name and its arguments as the hook gave them (JSON, in their order).
pub fn mcp_tool_call(p: &HookPayload) -> Option<(String, String)> {
    if hook_command(p).is_some() {
        return None;
    }
    let tool = p.tool_name.as_deref().filter(|t| t.starts_with(MCP_TOOL_PREFIX) && t.len() > MCP_TOOL_PREFIX.len())?;
    let args = p.tool_input.as_ref().map_or_else(|| Value::Null.to_string(), Value::to_string);
    Some((tool.to_string(), args))
}

/// What a PermissionRequest asks for, as its ticket binds it: the command (or patch), or an MCP
/// tool call's tool and arguments.
pub fn hook_ask(p: &HookPayload) -> Option<String> {
    hook_command(p).or_else(|| mcp_tool_call(p).map(|(tool, args)| format!("{tool}\n{args}")))
}

/// What a permission request asks for, canonical: the paths to read and to write (absolute,
/// sorted, each once) and network access. Rendered, it is what an answer is bound to: the
/// request Codex sends must ask exactly this, and the grant is exactly that request's.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PermissionAsk {
    read: Vec<String>,
    write: Vec<String>,
    network: bool,
}

impl PermissionAsk {
    /// From the tool call's arguments (`permissions.file_system.{read,write}`,
    /// `permissions.network.enabled`; a relative path is under `cwd`, as Codex resolves it).
    /// `None` when it asks anything else.
    pub fn from_tool_input(input: &Value, cwd: Option<&str>) -> Option<PermissionAsk> {
        let p = only_keys(&input["permissions"], &["file_system", "network"])?;
        let absolute = |f: &str| match (std::path::Path::new(f).is_absolute(), cwd) {
            (false, Some(cwd)) => std::path::Path::new(cwd).join(f).display().to_string(),
            _ => f.to_string(),
        };
        let mut ask = PermissionAsk::default();
        if let Some(fs) = p.get("file_system").filter(|v| !v.is_null()) {
            let fs = only_keys(fs, &["read", "write"])?;
            ask.read = paths(field(fs, "read"))?.iter().map(|f| absolute(f)).collect();
            ask.write = paths(field(fs, "write"))?.iter().map(|f| absolute(f)).collect();
        }
        ask.network = network(field(p, "network"))?;
        Some(ask.sorted())
    }

    /// From the app-server request's `permissions` (`fileSystem.entries` of plain paths to read
    /// or write, the older `read`/`write` lists, `network.enabled`). `None` when it asks anything
    /// else (a glob, a special path, a deny entry, a field Courier does not know): such a request
    /// is never taken for a listed one, so Courier never grants what it did not show.
    pub fn from_request(permissions: &Value) -> Option<PermissionAsk> {
        let p = only_keys(permissions, &["fileSystem", "network"])?;
        let mut ask = PermissionAsk::default();
        if let Some(fs) = p.get("fileSystem").filter(|v| !v.is_null()) {
            let fs = only_keys(fs, &["read", "write", "entries", "globScanMaxDepth"])?;
            if !field(fs, "globScanMaxDepth").is_null() {
                return None;
            }
            ask.read = paths(field(fs, "read"))?;
            ask.write = paths(field(fs, "write"))?;
            for e in fs.get("entries").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default() {
                let e = only_keys(e, &["path", "access"])?;
                let path = only_keys(field(e, "path"), &["type", "path"])?;
                let (Some("path"), Some(f)) = (field(path, "type").as_str(), field(path, "path").as_str()) else { return None };
                match field(e, "access").as_str() {
                    Some("read") => ask.read.push(f.to_string()),
                    Some("write") => ask.write.push(f.to_string()),
                    _ => return None,
                }
            }
            if !fs.get("entries").is_none_or(|v| v.is_null() || v.is_array()) {
                return None;
            }
        }
        ask.network = network(field(p, "network"))?;
        Some(ask.sorted())
    }

    fn sorted(mut self) -> PermissionAsk {
        for v in [&mut self.read, &mut self.write] {
            v.sort();
            v.dedup();
        }
        self
    }

    /// One line: `write: /a, /b; read: /c; network` (`nothing` when it asks for nothing).
    pub fn render(&self) -> String {
        let mut parts = Vec::new();
        if !self.write.is_empty() {
            parts.push(format!("write: {}", self.write.join(", ")));
        }
        if !self.read.is_empty() {
            parts.push(format!("read: {}", self.read.join(", ")));
        }
        if self.network {
            parts.push("network".to_string());
        }
        if parts.is_empty() {
            return "nothing".into();
        }
        parts.join("; ")
    }
}

/// `v` as an object with no key but `keys` (null counts as empty), or `None`.
fn only_keys<'a>(v: &'a Value, keys: &[&str]) -> Option<&'a serde_json::Map<String, Value>> {
    static EMPTY: std::sync::OnceLock<serde_json::Map<String, Value>> = std::sync::OnceLock::new();
    let map = match v {
        Value::Null => EMPTY.get_or_init(serde_json::Map::new),
        Value::Object(m) => m,
        _ => return None,
    };
    map.keys().all(|k| keys.contains(&k.as_str())).then_some(map)
}

/// `m[key]`, null when absent (a map's `[]` panics on a missing key).
fn field<'a>(m: &'a serde_json::Map<String, Value>, key: &str) -> &'a Value {
    m.get(key).unwrap_or(&Value::Null)
}

/// A list of path strings (null: none), or `None`.
fn paths(v: &Value) -> Option<Vec<String>> {
    match v {
        Value::Null => Some(Vec::new()),
        Value::Array(a) => a.iter().map(|p| p.as_str().map(str::to_string)).collect(),
        _ => None,
    }
}

/// `{enabled: bool|null}` (null: no network), or `None`.
fn network(v: &Value) -> Option<bool> {
    let n = only_keys(v, &["enabled"])?;
    match field(n, "enabled") {
        Value::Null => Some(false),
        Value::Bool(b) => Some(*b),
        _ => None,
    }
}

/// How an approval lists permissions it could not read.
pub const UNREADABLE: &str = "unreadable: ";

/// What a `request_permissions` call asks (its PreToolUse's `tool_input`), as the approval lists
/// it; `None` for any other tool. Arguments Courier cannot read are listed as they are (prefixed
/// `unreadable:`): such an approval is listed, and never matches a request.
pub fn permission_ask(p: &HookPayload) -> Option<String> {
    if p.tool_name.as_deref() != Some(PERMISSIONS_TOOL) {
        return None;
    }
    let input = p.tool_input.clone().unwrap_or(Value::Null);
    Some(match PermissionAsk::from_tool_input(&input, p.cwd.as_deref()) {
        Some(ask) => ask.render(),
        None => format!("{UNREADABLE}{}", input["permissions"]),
    })
}

/// The model's stated reason for a permission request (`tool_input.reason`).
pub fn permission_reason(p: &HookPayload) -> Option<String> {
    p.tool_input.as_ref()?.get("reason")?.as_str().map(str::to_string)
}

/// The files of the `fileChange` item `item_id` in a `thread/resume` result (its paths and the
/// paths moved to), sorted, each once; `None` when the thread shows no such item.
fn item_files(resumed: &Value, item_id: &Value) -> Option<Vec<String>> {
    let turns = resumed.pointer("/thread/turns")?.as_array()?;
    let item =
        turns.iter().rev().filter_map(|t| t["items"].as_array()).flatten().find(|i| i["type"] == "fileChange" && i["id"] == *item_id)?;
    let mut files: Vec<String> = Vec::new();
    for c in item["changes"].as_array()? {
        files.extend(c["path"].as_str().map(str::to_string));
        files.extend(c.pointer("/kind/move_path").and_then(Value::as_str).map(str::to_string));
    }
    files.sort();
    files.dedup();
    Some(files)
}

/// The model's stated reason (`tool_input.description`).
pub fn hook_reason(p: &HookPayload) -> Option<String> {
    p.tool_input.as_ref()?.get("description")?.as_str().map(str::to_string)
}

/// The PermissionRequest hook's output that decides: `allow`, or `deny` with the message the
/// model reads in its tool failure.
pub fn hook_decision(decision: Decision, message: Option<&str>) -> String {
    let d = match decision {
        Decision::Approve => json!({"behavior": "allow"}),
        Decision::Deny => json!({"behavior": "deny", "message": message.unwrap_or("denied by a person (through Courier)")}),
    };
    json!({"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": d}}).to_string()
}

/// What answering through the app-server came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answered {
    /// Sent; `Won` once the app-server resolved it after ours, `Unknown` without an ack.
    Sent(AnswerOutcome),
    /// Not sent: the request was answered before ours, or is gone (nothing is waiting).
    NotSent(String),
    /// Not sent: no session, or the request found is not the one listed (call or command).
    Failed(String),
}

/// The answer to request `params` as the app-server takes it: a command's or a patch's
/// `decision` (`accept`, `decline`); for permissions, the permissions granted for this turn:
/// exactly those the request asks (checked against the approval before), or none.
fn wire_answer(kind: ApprovalKind, d: Decision, params: &Value) -> Value {
    match (kind, d) {
        (ApprovalKind::Command | ApprovalKind::FileChange, Decision::Approve) => json!({"decision": "accept"}),
        (ApprovalKind::Command | ApprovalKind::FileChange, Decision::Deny) => json!({"decision": "decline"}),
        (ApprovalKind::Permissions, Decision::Approve) => json!({"permissions": params["permissions"], "scope": "turn"}),
        (ApprovalKind::Permissions, Decision::Deny) => json!({"permissions": {}, "scope": "turn"}),
        // An elicitation's answer: accept with no content, or decline.
        (ApprovalKind::McpTool, Decision::Approve) => json!({"action": "accept", "content": {}, "_meta": null}),
        (ApprovalKind::McpTool, Decision::Deny) => json!({"action": "decline", "content": null, "_meta": null}),
    }
}

/// The model's command inside the shell's command line `<shell> -lc '<cmd>'` (or `-c`), or the
/// line itself when it is not one.
pub fn unwrap_shell(line: &str) -> String {
    let rest = ["-lc ", "-c "].iter().find_map(|flag| line.split_once(flag).map(|(_, r)| r));
    let Some(rest) = rest else { return line.to_string() };
    let mut out = String::new();
    let mut chars = rest.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    out.push(q);
                }
            }
            '"' => {
                while let Some(q) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' if matches!(chars.peek(), Some('"' | '\\' | '$' | '`')) => out.extend(chars.next()),
                        _ => out.push(q),
                    }
                }
            }
            '\\' => out.extend(chars.next()),
            _ => out.push(c),
        }
    }
    out
}

/// The request (`method`, `params`) is the one this approval lists: its kind, thread, turn, call
/// (when known), and what it asks for: the command, or (`files`: the files the thread's item of
/// that call changes) the files.
pub fn is_request_of(method: &str, params: &Value, files: Option<&[String]>, a: &Approval) -> bool {
    let same_ask = match a.kind {
        ApprovalKind::Command => {
            let command = params["command"].as_str().unwrap_or_default();
            // A network approval (a host the managed proxy asks about) is not the command listed.
            params["networkApprovalContext"].is_null() && (command == a.command || unwrap_shell(command) == a.command)
        }
        ApprovalKind::FileChange => !a.files.is_empty() && files == Some(a.files.as_slice()),
        ApprovalKind::Permissions => PermissionAsk::from_request(&params["permissions"]).is_some_and(|p| p.render() == a.command),
        ApprovalKind::McpTool => is_mcp_request_of(params, a),
    };
    method == request_method(a.kind)
        && params["threadId"] == a.thread.as_str()
        && params["turnId"] == a.turn.as_str()
        // An MCP elicitation names no item: what binds it is the tool and its exact arguments.
        && (a.kind == ApprovalKind::McpTool || a.call_id.as_deref().is_none_or(|c| params["itemId"] == c))
        && same_ask
}

/// An MCP elicitation is this MCP tool call's approval request: Codex's approval of a call (its
/// `_meta`), of the server and tool, with the arguments listed.
fn is_mcp_request_of(params: &Value, a: &Approval) -> bool {
    let meta = &params["_meta"];
    let Some((server, tool)) = a.tool.strip_prefix(MCP_TOOL_PREFIX).and_then(|t| t.split_once("__")) else { return false };
    let args: Option<Value> = serde_json::from_str(&a.command).ok();
    meta["codex_approval_kind"] == "mcp_tool_call"
        && params["serverName"] == server
        && meta["tool_name"] == tool
        && args.is_some_and(|args| meta["tool_params"] == args)
}

/// How long answering may take.
#[derive(Debug, Clone, Copy)]
pub struct Within {
    /// The whole exchange (connect, resume, answer).
    pub exchange: Instant,
    /// After the answer is written, the wait for its acknowledgement (then `Unknown`).
    pub ack: Duration,
}

/// Answers approval `a` with `decision` through the app-server the Codex process `pid` (started
/// at `start`) serves: resume the thread to get the request replayed, check it is this one, and
/// answer it once unless it was answered already. Never retried.
pub fn answer(endpoints: &[Endpoint], pid: i32, start: u64, a: &Approval, decision: Decision, within: Within) -> Answered {
    let deadline = within.exchange;
    let mut ws = match appserver::open_session(endpoints, pid, start, deadline) {
        Ok(ws) => ws,
        Err(why) => return Answered::Failed(format!("no app-server session: {why}")),
    };
    let request = match replayed_request(&mut ws, a) {
        Ok(r) => r,
        Err(done) => return done,
    };
    let id = request["id"].clone();
    // An answer already on its way to us (the person was first) shows before we write ours.
    if resolved_within(&mut ws, &id, Instant::now() + SETTLE) == Some(true) {
        return Answered::NotSent("answered by someone else first".into());
    }
    ws.set_deadline(deadline);
    if let Err(e) = ws.respond(&id, wire_answer(a.kind, decision, &request["params"])) {
        return if e.timed_out { Answered::Sent(AnswerOutcome::Unknown) } else { Answered::Failed(format!("writing the answer: {e}")) };
    }
    // A lost acknowledgement (crash tests) is waited for like any other that never comes.
    let ack_of = if crate::failpoint::armed("approval_ack_lost") { Value::Null } else { id };
    match resolved_within(&mut ws, &ack_of, Instant::now() + within.ack) {
        Some(true) => Answered::Sent(AnswerOutcome::Won),
        _ => Answered::Sent(AnswerOutcome::Unknown),
    }
}

/// Whether Codex still waits on an approval, as the app-server that serves its thread says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waits {
    Yes,
    /// It waits on nothing of this approval's any more: why.
    No(String),
    /// Could not tell (no session, another request waits): why.
    Unsure(String),
}

/// Asks the app-server of the Codex process `pid` whether approval `a`'s request still waits:
/// the thread is resumed and the request replayed, exactly as [`answer`] finds it, and nothing
/// is answered.
pub fn still_waiting(endpoints: &[Endpoint], pid: i32, start: u64, a: &Approval, deadline: Instant) -> Waits {
    let mut ws = match appserver::open_session(endpoints, pid, start, deadline) {
        Ok(ws) => ws,
        Err(why) => return Waits::Unsure(format!("no app-server session: {why}")),
    };
    match replayed_request(&mut ws, a) {
        Ok(_) => Waits::Yes,
        Err(Answered::NotSent(why)) => Waits::No(why),
        Err(Answered::Failed(why)) => Waits::Unsure(why),
        Err(Answered::Sent(o)) => Waits::Unsure(format!("unexpected {o:?}")),
    }
}

/// `thread/resume`, then the request the app-server replays for it, or why there is none.
fn replayed_request(ws: &mut WsClient, a: &Approval) -> Result<Value, Answered> {
    let gone = |why: &str| Answered::NotSent(why.to_string());
    let rid =
        ws.send_request("thread/resume", json!({"threadId": a.thread})).map_err(|e| Answered::Failed(format!("thread/resume: {e}")))?;
    let mut waiting: Option<bool> = None;
    let mut resumed = Value::Null;
    let mut found: Vec<Value> = Vec::new();
    loop {
        // After the resume's answer a waiting thread's replay follows at once.
        if waiting.is_some() {
            ws.set_deadline(Instant::now() + Duration::from_millis(500));
        }
        let mut msg = match ws.recv_any() {
            Ok(m) => m,
            Err(_) if waiting.is_some() => break,
            Err(e) => return Err(Answered::Failed(format!("thread/resume: {e}"))),
        };
        if msg.get("method").is_none() && msg["id"] == json!(rid) {
            if let Some(err) = msg.get("error") {
                return Err(Answered::Failed(format!("thread/resume refused: {err}")));
            }
            let flags = msg.pointer("/result/thread/status/activeFlags").cloned().unwrap_or(Value::Null);
            let w = flags.as_array().is_some_and(|f| f.iter().any(|x| x == "waitingOnApproval"));
            if !w {
                return Err(gone("the thread is not waiting on an approval"));
            }
            waiting = Some(w);
            resumed = msg["result"].take();
            if !found.is_empty() {
                break;
            }
        } else if is_approval_request(&msg) && msg["params"]["threadId"] == a.thread.as_str() {
            found.push(msg);
            if waiting.is_some() {
                break;
            }
        }
    }
    let is_this = |r: &Value| {
        let files = item_files(&resumed, &r["params"]["itemId"]);
        is_request_of(r["method"].as_str().unwrap_or_default(), &r["params"], files.as_deref(), a)
    };
    let of_its_kind = |r: &Value| r["method"] == request_method(a.kind);
    match found.iter().position(is_this) {
        Some(i) => Ok(found.swap_remove(i)),
        None if found.iter().any(|r| !r["params"]["networkApprovalContext"].is_null()) => Err(Answered::Failed(network_refusal(&found))),
        None if found.is_empty() => Err(gone("the thread waits on no command, file-change or permissions approval")),
        // A request of the other kind is never this approval's: this one is over.
        None if !found.iter().any(of_its_kind) => Err(gone(&format!(
            "the thread waits on a request of another kind ({}, call {}), not this approval's",
            found[0]["method"].as_str().unwrap_or_default(),
            found[0]["params"]["itemId"]
        ))),
        None => Err(Answered::Failed(format!(
            "the thread waits on another request ({}, call {}), not this approval's: nothing was sent",
            found[0]["method"].as_str().unwrap_or_default(),
            found[0]["params"]["itemId"]
        ))),
    }
}

/// Why a command request that asks for a host's network access (`networkApprovalContext`) is not
/// answered: accepting one is a grant for the host, not the one command Courier lists, and what
/// it grants was not probed. The person answers it where Codex shows it.
fn network_refusal(found: &[Value]) -> String {
    let ctx = found.iter().map(|r| &r["params"]["networkApprovalContext"]).find(|c| !c.is_null()).unwrap_or(&Value::Null);
    format!(
        "the thread waits on a network approval (host {}, {}): Courier answers no network approval, since accepting one \
         grants the host, not the command it lists; nothing was sent. Answer it where Codex shows it (the TUI's prompt, or \
         the app-server client)",
        ctx["host"].as_str().unwrap_or("?"),
        ctx["protocol"].as_str().unwrap_or("?")
    )
}

/// A request for a person's approval, of any kind Courier answers.
fn is_approval_request(msg: &Value) -> bool {
    ApprovalKind::ALL.iter().any(|k| msg["method"] == request_method(*k))
}

/// Reads until `serverRequest/resolved` for `id` (`Some(true)`), or the deadline (`None`).
fn resolved_within(ws: &mut WsClient, id: &Value, until: Instant) -> Option<bool> {
    ws.set_deadline(until);
    loop {
        let msg = ws.recv_any().ok()?;
        if msg["method"] == RESOLVED && msg["params"]["requestId"] == *id {
            return Some(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shell_line_unwraps_to_the_model_command() {
        assert_eq!(unwrap_shell("/bin/bash -lc 'echo hi'"), "echo hi");
        assert_eq!(unwrap_shell(r#"/bin/bash -lc 'echo '"'"'x'"'"''"#), "echo 'x'");
        assert_eq!(unwrap_shell(r"/bin/bash -lc 'a'\''b'"), "a'b");
        assert_eq!(unwrap_shell("ls"), "ls");
    }

    /// A pending approval of thread T1, turn `u`, for call `call_id`.
    fn pending(call_id: &str, tool: &str, kind: ApprovalKind, command: &str) -> Approval {
        Approval {
            id: format!("apr-{call_id}"),
            host: Default::default(),
            thread: crate::store::sample::T1.clone(),
            turn: "u".into(),
            call_id: Some(call_id.into()),
            tool: tool.into(),
            kind,
            command: command.into(),
            command_digest: crate::approval::command_digest(command),
            files: Vec::new(),
            reason: None,
            cwd: None,
            since: 0,
            state: crate::approval::ApprovalState::Pending,
            answer: None,
            detail: None,
        }
    }

    #[test]
    fn a_request_is_bound_to_call_and_command() {
        let a = pending("call_1", "Bash", ApprovalKind::Command, "echo hi");
        let p =
            json!({"threadId": crate::store::sample::T1.as_str(), "turnId": "u", "itemId": "call_1", "command": "/bin/bash -lc 'echo hi'"});
        let cmd = request_method(ApprovalKind::Command);
        assert!(is_request_of(cmd, &p, None, &a));
        assert!(!is_request_of(request_method(ApprovalKind::FileChange), &p, None, &a), "a command's answer never goes to a file change");
        let other_call =
            json!({"threadId": crate::store::sample::T1.as_str(), "turnId": "u", "itemId": "call_2", "command": "/bin/bash -lc 'echo hi'"});
        assert!(!is_request_of(cmd, &other_call, None, &a));
        let other_cmd =
            json!({"threadId": crate::store::sample::T1.as_str(), "turnId": "u", "itemId": "call_1", "command": "/bin/bash -lc 'echo ho'"});
        assert!(!is_request_of(cmd, &other_cmd, None, &a));
        let other_turn = json!({"threadId": "t", "turnId": "v", "itemId": "call_1", "command": "/bin/bash -lc 'echo hi'"});
        assert!(!is_request_of(cmd, &other_turn, None, &a));
        let network = json!({"threadId": crate::store::sample::T1.as_str(), "turnId": "u", "itemId": "call_1",
            "command": "/bin/bash -lc 'echo hi'", "networkApprovalContext": {"host": "example.com", "protocol": "https"}});
        assert!(!is_request_of(cmd, &network, None, &a), "a network approval is not the command listed");
        assert!(network_refusal(&[json!({"params": network})]).contains("host example.com, https"));
    }

    /// A file change is bound to its call and its files (as the thread's item lists them), and
    /// never answered by a command request, nor a command's approval by a file-change request.
    #[test]
    fn a_file_change_is_bound_to_call_and_files() {
        let patch =
            "*** Begin Patch\n*** Add File: new.txt\n+hi\n*** Update File: /abs/a.rs\n*** Move to: /abs/b.rs\n@@\n-x\n+y\n*** End Patch";
        let files = super::super::patch::patch_files(patch, Some("/w"));
        assert_eq!(files, ["/abs/a.rs", "/abs/b.rs", "/w/new.txt"]);
        let a =
            Approval { files: files.clone(), cwd: Some("/w".into()), ..pending("call_p", "apply_patch", ApprovalKind::FileChange, patch) };
        let resumed = json!({"thread": {"turns": [{"items": [{"type": "fileChange", "id": "call_p", "changes": [
            {"path": "/w/new.txt", "kind": {"type": "add"}, "diff": "hi\n"},
            {"path": "/abs/a.rs", "kind": {"type": "update", "move_path": "/abs/b.rs"}, "diff": "@@"}]}]}]}});
        let item = item_files(&resumed, &json!("call_p"));
        assert_eq!(item.as_deref(), Some(files.as_slice()));
        assert_eq!(item_files(&resumed, &json!("call_q")), None);
        let p = json!({"threadId": crate::store::sample::T1.as_str(), "turnId": "u", "itemId": "call_p"});
        let fc = request_method(ApprovalKind::FileChange);
        assert!(is_request_of(fc, &p, item.as_deref(), &a));
        assert!(!is_request_of(request_method(ApprovalKind::Command), &p, item.as_deref(), &a), "kind");
        assert!(!is_request_of(fc, &p, Some(&files[..2]), &a), "other files");
        assert!(!is_request_of(fc, &p, None, &a), "no item: nothing to bind to");
        let other_call = json!({"threadId": crate::store::sample::T1.as_str(), "turnId": "u", "itemId": "call_q"});
        assert!(!is_request_of(fc, &other_call, item.as_deref(), &a));
    }

    /// A permission request is bound to its call and to exactly the permissions asked: the
    /// request must resolve to the same paths and network; anything Courier cannot read (a glob,
    /// a special path, a deny entry, an unknown field) never matches; and the answer grants
    /// exactly the request's permissions, or none. Never a command's or a patch's request.
    #[test]
    fn a_permission_request_is_bound_to_call_and_permissions() {
        let input = json!({"permissions": {"file_system": {"write": ["out", "/abs/w"], "read": ["/r"]}, "network": {"enabled": true}}});
        let ask = PermissionAsk::from_tool_input(&input, Some("/w")).unwrap();
        assert_eq!(ask.render(), "write: /abs/w, /w/out; read: /r; network");
        assert_eq!(PermissionAsk::from_tool_input(&json!({"permissions": {}}), None).unwrap().render(), "nothing");
        assert_eq!(PermissionAsk::from_tool_input(&json!({"permissions": {"disk": true}}), None), None);
        let a = Approval { cwd: Some("/w".into()), ..pending("call_a", PERMISSIONS_TOOL, ApprovalKind::Permissions, &ask.render()) };
        let entry = |p: &str, access: &str| json!({"path": {"type": "path", "path": p}, "access": access});
        let params = |perms: Value, call: &str| json!({"threadId": crate::store::sample::T1.as_str(), "turnId": "u", "itemId": call, "permissions": perms});
        let asked = json!({"network": {"enabled": true}, "fileSystem": {"read": ["/r"], "write": ["/w/out", "/abs/w"],
            "entries": [entry("/w/out", "write"), entry("/abs/w", "write"), entry("/r", "read")]}});
        let perm = request_method(ApprovalKind::Permissions);
        assert!(is_request_of(perm, &params(asked.clone(), "call_a"), None, &a));
        assert!(!is_request_of(perm, &params(asked.clone(), "call_b"), None, &a), "another call");
        assert!(!is_request_of(request_method(ApprovalKind::Command), &params(asked.clone(), "call_a"), None, &a), "a command's request");
        assert!(!is_request_of(request_method(ApprovalKind::FileChange), &params(asked.clone(), "call_a"), None, &a), "a patch's");
        let more = json!({"network": {"enabled": true}, "fileSystem": {"read": ["/r"], "write": ["/w/out", "/abs/w", "/etc"]}});
        assert!(!is_request_of(perm, &params(more, "call_a"), None, &a), "more than was asked");
        let no_net = json!({"fileSystem": {"read": ["/r"], "write": ["/w/out", "/abs/w"]}});
        assert!(!is_request_of(perm, &params(no_net, "call_a"), None, &a), "other permissions");
        let glob = json!({"network": {"enabled": true}, "fileSystem": {"read": ["/r"], "write": ["/w/out", "/abs/w"],
            "entries": [{"path": {"type": "glob_pattern", "pattern": "/**"}, "access": "write"}]}});
        assert!(!is_request_of(perm, &params(glob, "call_a"), None, &a), "a glob it cannot show");
        let unknown = json!({"network": {"enabled": true}, "fileSystem": {"read": ["/r"], "write": ["/w/out", "/abs/w"]}, "macos": {}});
        assert!(!is_request_of(perm, &params(unknown, "call_a"), None, &a), "a field it does not know");
        let p = params(asked.clone(), "call_a");
        assert_eq!(wire_answer(ApprovalKind::Permissions, Decision::Approve, &p), json!({"permissions": asked, "scope": "turn"}));
        assert_eq!(wire_answer(ApprovalKind::Permissions, Decision::Deny, &p), json!({"permissions": {}, "scope": "turn"}));
    }
}
