//! Hook registration for test Codex homes. The trust hash is the broker's own
//! (`broker::install::hook_trust_hash`); the kit self-test checks it against a live `hooks/list` of
//! codex-cli 0.171.0.

use serde_json::{json, Map, Value};

/// The seven events Courier's hook-client is registered for.
pub use broker_lib::install::EVENTS as COURIER_EVENTS;

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
    /// `additionalContextLimit` (tokens); `None`: Codex's default.
    pub context_limit: Option<u64>,
}

impl Hook {
    pub fn new(event: &str, command: &str) -> Hook {
        Hook { event: event.into(), command: command.into(), timeout: Some(5), matcher: None, status_message: None, context_limit: None }
    }

    pub fn timeout(mut self, secs: Option<u64>) -> Hook {
        self.timeout = secs;
        self
    }

    pub fn matcher(mut self, m: &str) -> Hook {
        self.matcher = Some(m.into());
        self
    }

    pub fn context_limit(mut self, tokens: Option<u64>) -> Hook {
        self.context_limit = tokens;
        self
    }

    /// `command` for every event in [`COURIER_EVENTS`], as `broker install` registers it
    /// (Courier's timeout, status message and context limit per event).
    pub fn courier_set(command: &str) -> Vec<Hook> {
        use broker_lib::install::{courier_context_limit, courier_status, courier_timeout};
        COURIER_EVENTS
            .iter()
            .map(|e| {
                let h = Hook::new(e, command).timeout(Some(courier_timeout(e))).context_limit(courier_context_limit(e));
                Hook { status_message: courier_status(e).map(str::to_string), ..h }
            })
            .collect()
    }

    /// The trust hash Codex computes for this handler.
    pub fn trust_hash(&self) -> String {
        hook_trust_hash(
            &self.event,
            &self.command,
            self.timeout.unwrap_or(600),
            self.matcher.as_deref(),
            self.status_message.as_deref(),
            self.context_limit,
        )
    }
}

pub use broker_lib::install::{hook_trust_hash, snake_event};

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
        if let Some(n) = h.context_limit {
            handler["additionalContextLimit"] = json!(n);
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
    fn trust_keys_count_groups_per_event() {
        let hooks = vec![Hook::new("Stop", "a"), Hook::new("PostToolUse", "b"), Hook::new("Stop", "c")];
        let keys: Vec<String> = trust_entries("/h/hooks.json", &hooks).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["/h/hooks.json:stop:0:0", "/h/hooks.json:post_tool_use:0:0", "/h/hooks.json:stop:1:0"]);
    }
}
