//! Hook registration and Codex's hook trust hash (port of probe-kit/hook_trust_hash.py, checked
//! against a live `hooks/list` of codex-cli 0.171.0 by the kit self-test).

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

/// The six events Courier's hook-client is registered for.
pub const COURIER_EVENTS: [&str; 6] =
    ["SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop", "SubagentStart"];

/// One command hook: one group with one handler in `hooks.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct Hook {
    /// Codex event name in PascalCase (`PostToolUse`).
    pub event: String,
    pub command: String,
    /// Seconds; `None` means Codex's default (600).
    pub timeout: Option<u64>,
    pub matcher: Option<String>,
    pub status_message: Option<String>,
}

impl Hook {
    pub fn new(event: &str, command: &str) -> Hook {
        Hook { event: event.into(), command: command.into(), timeout: Some(5), matcher: None, status_message: None }
    }

    pub fn timeout(mut self, secs: Option<u64>) -> Hook {
        self.timeout = secs;
        self
    }

    pub fn matcher(mut self, m: &str) -> Hook {
        self.matcher = Some(m.into());
        self
    }

    /// `command` for every event in [`COURIER_EVENTS`] (timeout 5 s).
    pub fn courier_set(command: &str) -> Vec<Hook> {
        COURIER_EVENTS.iter().map(|e| Hook::new(e, command)).collect()
    }

    /// The trust hash Codex computes for this handler.
    pub fn trust_hash(&self) -> String {
        hook_trust_hash(
            &self.event,
            &self.command,
            self.timeout.unwrap_or(600),
            false,
            self.matcher.as_deref(),
            self.status_message.as_deref(),
        )
    }
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

/// `"sha256:" + hex(sha256(canonical JSON))` of
/// `{"event_name", "matcher"?, "hooks":[{"type":"command","command","timeout","async","statusMessage"?}]}`,
/// canonical = keys sorted, no whitespace. Timeout is clamped to >= 1 (and to <= 3 for SessionEnd).
pub fn hook_trust_hash(
    event: &str,
    command: &str,
    timeout: u64,
    is_async: bool,
    matcher: Option<&str>,
    status_message: Option<&str>,
) -> String {
    let mut timeout = timeout.max(1);
    if event == "SessionEnd" {
        timeout = timeout.min(3);
    }
    let mut h = json!({"type": "command", "command": command, "timeout": timeout, "async": is_async});
    if let Some(s) = status_message {
        h["statusMessage"] = json!(s);
    }
    let mut ident = json!({"event_name": snake_event(event), "hooks": [h]});
    if let Some(m) = matcher {
        ident["matcher"] = json!(m);
    }
    let canon = canonical_json(&ident);
    format!("sha256:{}", hex(&Sha256::digest(canon.as_bytes())))
}

/// Compact JSON with object keys sorted at every level, independent of serde_json's map feature.
pub fn canonical_json(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::String(k.clone()), canonical_json(&m[k])))
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(a) => format!("[{}]", a.iter().map(canonical_json).collect::<Vec<_>>().join(",")),
        other => other.to_string(),
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `hooks.json` content for `hooks`: events in order of first appearance, one group per hook.
pub fn hooks_json(hooks: &[Hook]) -> Value {
    let mut events = Map::new();
    for h in hooks {
        let mut handler = json!({"type": "command", "command": h.command});
        if let Some(t) = h.timeout {
            handler["timeout"] = json!(t);
        }
        if let Some(s) = &h.status_message {
            handler["statusMessage"] = json!(s);
        }
        let mut group = json!({"hooks": [handler]});
        if let Some(m) = &h.matcher {
            group["matcher"] = json!(m);
        }
        events.entry(h.event.clone()).or_insert_with(|| json!([])).as_array_mut().unwrap().push(group);
    }
    json!({ "hooks": Value::Object(events) })
}

/// `(state key, trusted hash)` for every handler of `hooks` registered in the file `source`.
/// Key: `<abs source>:<snake_event>:<group idx>:<handler idx>`.
pub fn trust_entries(source: &str, hooks: &[Hook]) -> Vec<(String, String)> {
    let mut per_event: Vec<(String, usize)> = Vec::new();
    let mut out = Vec::new();
    for h in hooks {
        let idx = match per_event.iter_mut().find(|(e, _)| *e == h.event) {
            Some((_, n)) => {
                *n += 1;
                *n - 1
            }
            None => {
                per_event.push((h.event.clone(), 1));
                0
            }
        };
        out.push((format!("{source}:{}:{idx}:0", snake_event(&h.event)), h.trust_hash()));
    }
    out
}

/// TOML basic string literal.
pub fn toml_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snake() {
        assert_eq!(snake_event("PostToolUse"), "post_tool_use");
        assert_eq!(snake_event("SessionStart"), "session_start");
        assert_eq!(snake_event("Stop"), "stop");
    }

    #[test]
    fn hash_matches_python_port() {
        // Values printed by probe-kit/hook_trust_hash.py (hook_hash).
        assert_eq!(
            hook_trust_hash("PostToolUse", "/bin/true", 5, false, None, None),
            "sha256:0e59abad07037762a34c3ef81edcab683a6bd8548bf56109ef5e66f1eeaaadc7"
        );
        assert_eq!(
            hook_trust_hash(
                "Stop",
                "/usr/bin/python3.11 /home/dev/probe/kit/hook_probe.py Stop",
                30,
                false,
                Some("Bash|apply_patch"),
                Some("hi \"x\" \u{e9}")
            ),
            "sha256:964faa913fb44c21006cf58db5427bf20576281281bada5c202e46c9ed4c5364"
        );
        assert_eq!(
            hook_trust_hash("SessionEnd", "x", 30, false, None, None),
            "sha256:b1aa6329f3a5daf36ae487200db1136f90a884bb805ddb24a6326c98dd6f29f6"
        );
    }

    #[test]
    fn canonical_sorts_keys() {
        let v = json!({"b": 1, "a": {"d": [1, {"z": 0, "y": "x"}], "c": null}});
        assert_eq!(canonical_json(&v), r#"{"a":{"c":null,"d":[1,{"y":"x","z":0}]},"b":1}"#);
    }

    #[test]
    fn trust_keys_count_groups_per_event() {
        let hooks = vec![Hook::new("Stop", "a"), Hook::new("PostToolUse", "b"), Hook::new("Stop", "c")];
        let keys: Vec<String> = trust_entries("/h/hooks.json", &hooks).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["/h/hooks.json:stop:0:0", "/h/hooks.json:post_tool_use:0:0", "/h/hooks.json:stop:1:0"]);
    }
}
