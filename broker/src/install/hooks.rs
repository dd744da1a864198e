//! Codex's side of a hook registration: the trust hash Codex computes for each handler, the
//! command line it runs, and Courier's groups merged into (and out of) `hooks.json`.

use super::{manifest::Manifest, EVENTS, HOOK_CONTEXT_LIMIT, HOOK_TIMEOUT_SECS};
use anyhow::{Context, Result};
use courier_shared::wire::CONTEXT_LIMIT_FLAG;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::fs;
use std::path::{Path, PathBuf};

// Codex's hook trust hash: Codex trusts a handler when `hooks.state."<source>:<event>:<group>:0"
// .trusted_hash` in config.toml is the SHA-256 of the handler's canonical JSON (event in snake case,
// command, timeout, matcher, status message, additional-context limit); `hook_trust_hash`
// computes it the same way.

pub use crate::envelope::CODEX_DEFAULT_CONTEXT_LIMIT;

/// Whether Codex reads a handler's `additionalContextLimit` for `event` (PascalCase): only for
/// events whose output has `additionalContext`. For Stop (and SubagentStop) it ignores the key,
/// in the hash too (`hooks/list` shows `null`, probed on 0.171.0). PermissionRequest's output is
/// a decision, never context: Courier writes no limit for it.
pub fn takes_context_limit(event: &str) -> bool {
    !matches!(event, "Stop" | "SubagentStop" | "PermissionRequest")
}

/// `PostToolUse` -> `post_tool_use`.
pub fn snake_event(ev: &str) -> String {
    let mut out = String::new();
    for (i, c) in ev.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// `"sha256:" + hex(sha256(canonical JSON))` of the handler identity Codex hashes:
/// `{"event_name","matcher"?,"hooks":[{"type":"command","command","timeout","async","statusMessage"?,
/// "additionalContextLimit"?}]}` with keys sorted and no whitespace; timeout >= 1 (SessionEnd: <= 3);
/// a context limit of Codex's default ([`CODEX_DEFAULT_CONTEXT_LIMIT`]) is left out.
pub fn hook_trust_hash(
    event: &str,
    command: &str,
    timeout: u64,
    matcher: Option<&str>,
    status: Option<&str>,
    context_limit: Option<u64>,
) -> String {
    let mut timeout = timeout.max(1);
    if event == "SessionEnd" {
        timeout = timeout.min(3);
    }
    let mut h = json!({"type": "command", "command": command, "timeout": timeout, "async": false});
    if let Some(s) = status {
        h["statusMessage"] = json!(s);
    }
    if let Some(n) = context_limit.filter(|n| *n != CODEX_DEFAULT_CONTEXT_LIMIT && takes_context_limit(event)) {
        h["additionalContextLimit"] = json!(n);
    }
    let mut ident = json!({"event_name": snake_event(event), "hooks": [h]});
    if let Some(m) = matcher {
        ident["matcher"] = json!(m);
    }
    format!("sha256:{}", courier_shared::auth::hex(&Sha256::digest(canonical_json(&ident).as_bytes())))
}

/// Compact JSON, object keys sorted at every level (whatever serde_json's map order is).
pub fn canonical_json(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys.into_iter().map(|k| format!("{}:{}", Value::String(k.clone()), canonical_json(&m[k]))).collect();
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(a) => format!("[{}]", a.iter().map(canonical_json).collect::<Vec<_>>().join(",")),
        other => other.to_string(),
    }
}

/// Quotes `s` for a POSIX shell when it needs it (Codex runs hook commands with `$SHELL -c`).
pub fn shell_quote(s: &str) -> String {
    let safe = !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-+=:,@%".contains(&b));
    if safe {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The hook command for an installed hook-client: its absolute path and the context limit its
/// handler sets ([`CONTEXT_LIMIT_FLAG`], so the broker knows what Codex passes whole), a simple
/// command, so bash execs it (its parent is then codex itself).
pub fn hook_command(hook_client: &Path) -> String {
    format!("{} {CONTEXT_LIMIT_FLAG} {HOOK_CONTEXT_LIMIT}", shell_quote(&hook_client.to_string_lossy()))
}

/// The `additionalContextLimit` Courier's handler of `event` carries: [`HOOK_CONTEXT_LIMIT`], so a
/// whole message passes, where Codex reads one.
pub fn courier_context_limit(event: &str) -> Option<u64> {
    takes_context_limit(event).then_some(HOOK_CONTEXT_LIMIT)
}

/// Codex's timeout for Courier's handler of `event`. PermissionRequest's covers the longest hold
/// for a remote answer (`[approvals] hold_secs`) and hook-client's margin: Codex would otherwise
/// kill a held hook first. hook-client itself still gives up at its own 500 ms deadline unless
/// the broker says it holds.
pub fn courier_timeout(event: &str) -> u64 {
    match event {
        "PermissionRequest" => crate::config::MAX_HOLD_SECS + 30,
        _ => HOOK_TIMEOUT_SECS,
    }
}

/// What the person at the TUI sees while Courier's handler of `event` runs: a PermissionRequest
/// may be held for a remote answer.
pub fn courier_status(event: &str) -> Option<&'static str> {
    (event == "PermissionRequest").then_some(PERMISSION_STATUS)
}

const PERMISSION_STATUS: &str = "Courier: this approval can be answered remotely (broker approve|deny)";

/// Courier's handler of `event` as hooks.json holds it.
pub(super) fn handler(event: &str, command: &str) -> Value {
    let mut h = json!({"type": "command", "command": command, "timeout": courier_timeout(event)});
    if let Some(n) = courier_context_limit(event) {
        h["additionalContextLimit"] = json!(n);
    }
    if let Some(s) = courier_status(event) {
        h["statusMessage"] = json!(s);
    }
    h
}

/// The trust hash Codex computes for Courier's handler of `event` as [`handler`] writes it.
pub fn courier_trust_hash(event: &str, command: &str) -> String {
    hook_trust_hash(event, command, courier_timeout(event), None, courier_status(event), courier_context_limit(event))
}

/// The path Codex names hooks.json by in trust keys.
pub fn hooks_source(codex_home: &Path) -> PathBuf {
    fs::canonicalize(codex_home).unwrap_or_else(|_| codex_home.to_path_buf()).join("hooks.json")
}

pub fn trust_key(source: &Path, event: &str, group: usize) -> String {
    format!("{}:{}:{group}:0", source.display(), snake_event(event))
}

/// One handler as Codex's app-server `hooks/list` reports it.
#[derive(Clone, Debug)]
pub struct ListedHook {
    /// Its trust key (`<source>:<event>:<group>:<handler>`).
    pub key: String,
    /// camelCase (`postToolUse`).
    pub event: String,
    pub command: String,
    /// The trust hash Codex computes now (`sha256:...`).
    pub current_hash: String,
    /// `trusted`, `untrusted`, `modified`, ...
    pub trust_status: String,
    pub enabled: bool,
    /// The whole entry, for messages.
    pub raw: Value,
}

/// The handlers of a `hooks/list` result (`data[].hooks[]`); a missing string field reads as
/// empty, a missing `enabled` as true. Shared by `broker doctor` and the test kit.
pub fn parse_hooks_list(result: &Value) -> Vec<ListedHook> {
    let mut out = Vec::new();
    for d in result.get("data").and_then(Value::as_array).into_iter().flatten() {
        for h in d.get("hooks").and_then(Value::as_array).into_iter().flatten() {
            let s = |k: &str| h.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            out.push(ListedHook {
                key: s("key"),
                event: s("eventName"),
                command: s("command"),
                current_hash: s("currentHash"),
                trust_status: s("trustStatus"),
                enabled: h.get("enabled").and_then(Value::as_bool).unwrap_or(true),
                raw: h.clone(),
            });
        }
    }
    out
}

// hooks.json

/// Registers `command` for every event in [`EVENTS`]: keeps a group that is exactly Courier's,
/// otherwise removes handlers running any of `old_commands` and appends Courier's group. Returns
/// each event's group index (for the trust key).
pub fn merge_hooks(doc: &mut Value, command: &str, old_commands: &[String], m: &mut Manifest) -> Result<Vec<(String, usize)>> {
    let is_old = |h: &Value| h.get("command").and_then(Value::as_str).is_some_and(|c| c == command || old_commands.iter().any(|o| o == c));
    let created = Created { hooks_key: &mut m.created_hooks_key, events: &mut m.created_events };
    merge_groups(doc, "hooks.json", &EVENTS, &|ev| json!({"hooks": [handler(ev, command)]}), &is_old, created)
}

/// What a merge created, for its inverse: the `hooks` key, and the events it added.
pub(super) struct Created<'a> {
    pub(super) hooks_key: &'a mut bool,
    pub(super) events: &'a mut Vec<String>,
}

/// Puts group `ours(event)` into `hooks.<event>` of `doc` (the `{"hooks": {"<Event>": [{"hooks":
/// [...]}]}}` shape Codex's hooks.json and Claude Code's settings.json share) for each of
/// `events`: a group equal to it stays where it is; otherwise handlers `is_old` says are
/// Courier's earlier ones are removed and `ours` is appended after the user's groups. `file`
/// names the file in errors. Returns each event's group index.
pub(super) fn merge_groups(
    doc: &mut Value,
    file: &str,
    events: &[&str],
    ours: &dyn Fn(&str) -> Value,
    is_old: &dyn Fn(&Value) -> bool,
    created: Created<'_>,
) -> Result<Vec<(String, usize)>> {
    let root = doc.as_object_mut().with_context(|| format!("{file} is not a JSON object"))?;
    if !root.contains_key("hooks") {
        root.insert("hooks".into(), json!({}));
        *created.hooks_key = true;
    }
    let hooks = root.get_mut("hooks").and_then(Value::as_object_mut).with_context(|| format!("\"hooks\" in {file} is not an object"))?;
    let mut out = Vec::new();
    for ev in events.iter().copied() {
        let ours = ours(ev);
        if !hooks.contains_key(ev) {
            hooks.insert(ev.into(), json!([]));
            if !created.events.iter().any(|e| e == ev) {
                created.events.push(ev.into());
            }
        }
        let groups = hooks.get_mut(ev).and_then(Value::as_array_mut).with_context(|| format!("hooks.{ev} in {file} is not an array"))?;
        if let Some(i) = groups.iter().position(|g| *g == ours) {
            let stale = groups.iter().enumerate().any(|(j, g)| j != i && group_has(g, is_old));
            if !stale {
                out.push((ev.to_string(), i));
                continue;
            }
        }
        strip_handlers(groups, is_old);
        groups.push(ours);
        out.push((ev.to_string(), groups.len() - 1));
    }
    Ok(out)
}

pub(super) fn group_has(g: &Value, pred: &dyn Fn(&Value) -> bool) -> bool {
    g.get("hooks").and_then(Value::as_array).is_some_and(|hs| hs.iter().any(pred))
}

/// Removes matching handlers; drops groups left empty by that.
pub(super) fn strip_handlers(groups: &mut Vec<Value>, pred: &dyn Fn(&Value) -> bool) {
    groups.retain_mut(|g| {
        let Some(hs) = g.get_mut("hooks").and_then(Value::as_array_mut) else { return true };
        let before = hs.len();
        hs.retain(|h| !pred(h));
        !(hs.is_empty() && before > 0)
    });
}

/// Structural inverse of [`merge_hooks`].
pub fn unmerge_hooks(doc: &mut Value, m: &Manifest) {
    let is_ours = |h: &Value| h.get("command").and_then(Value::as_str).is_some_and(|c| m.commands.iter().any(|o| o == c));
    unmerge_groups(doc, &EVENTS, &is_ours, m.created_hooks_key, &m.created_events);
}

/// Structural inverse of [`merge_groups`]: handlers `is_ours` says are Courier's removed, and the
/// events and `hooks` key the merge created removed once empty.
pub(super) fn unmerge_groups(
    doc: &mut Value,
    events: &[&str],
    is_ours: &dyn Fn(&Value) -> bool,
    hooks_key: bool,
    created_events: &[String],
) {
    let Some(root) = doc.as_object_mut() else { return };
    if let Some(hooks) = root.get_mut("hooks").and_then(Value::as_object_mut) {
        for ev in events.iter().copied() {
            if let Some(groups) = hooks.get_mut(ev).and_then(Value::as_array_mut) {
                strip_handlers(groups, is_ours);
                if groups.is_empty() && created_events.iter().any(|e| e == ev) {
                    hooks.remove(ev);
                }
            }
        }
        if hooks.is_empty() && hooks_key {
            root.remove("hooks");
        }
    }
}

pub(super) fn json_text(doc: &Value) -> String {
    let mut s = serde_json::to_string_pretty(doc).expect("JSON value serializes");
    s.push('\n');
    s
}
