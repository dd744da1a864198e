//! What Codex writes to a command hook's stdin, and the outputs Courier answers with.
//! Field names follow the hook input schemas of codex-cli 0.171.0 (`../shared/codex-reference`).

use serde::Deserialize;
use serde_json::json;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HookEvent {
    SessionStart,
    UserPromptSubmit,
    PreToolUse,
    PostToolUse,
    Stop,
    SubagentStart,
    SubagentStop,
    Other,
}

impl HookEvent {
    pub fn parse(name: &str) -> HookEvent {
        match name {
            "SessionStart" => HookEvent::SessionStart,
            "UserPromptSubmit" => HookEvent::UserPromptSubmit,
            "PreToolUse" => HookEvent::PreToolUse,
            "PostToolUse" => HookEvent::PostToolUse,
            "Stop" => HookEvent::Stop,
            "SubagentStart" => HookEvent::SubagentStart,
            "SubagentStop" => HookEvent::SubagentStop,
            _ => HookEvent::Other,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            HookEvent::SessionStart => "SessionStart",
            HookEvent::UserPromptSubmit => "UserPromptSubmit",
            HookEvent::PreToolUse => "PreToolUse",
            HookEvent::PostToolUse => "PostToolUse",
            HookEvent::Stop => "Stop",
            HookEvent::SubagentStart => "SubagentStart",
            HookEvent::SubagentStop => "SubagentStop",
            HookEvent::Other => "Other",
        }
    }

    /// Events whose output can carry a message to the model.
    pub fn can_deliver(self) -> bool {
        !matches!(self, HookEvent::SubagentStop | HookEvent::Other)
    }
}

/// The hook input fields Courier reads; everything else is ignored.
#[derive(Debug, Clone, Deserialize, Default)]
pub struct HookPayload {
    pub hook_event_name: String,
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub transcript_path: Option<String>,
    #[serde(default)]
    pub turn_id: Option<String>,
    #[serde(default)]
    pub agent_id: Option<String>,
    #[serde(default)]
    pub agent_transcript_path: Option<String>,
    #[serde(default)]
    pub stop_hook_active: Option<bool>,
    #[serde(default)]
    pub tool_name: Option<String>,
}

impl HookPayload {
    pub fn event(&self) -> HookEvent {
        HookEvent::parse(&self.hook_event_name)
    }
}

/// The stdout that hands `text` to the model for `event`: a block reason for Stop (the turn goes
/// on with it as a hook prompt), `additionalContext` (a developer message) for the others.
pub fn delivery_output(event: HookEvent, text: &str) -> String {
    let value = match event {
        HookEvent::Stop => json!({"decision": "block", "reason": text}),
        _ => json!({"hookSpecificOutput": {"hookEventName": event.as_str(), "additionalContext": text}}),
    };
    value.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_blocks_and_others_add_context() {
        let stop: serde_json::Value = serde_json::from_str(&delivery_output(HookEvent::Stop, "hi")).unwrap();
        assert_eq!(stop, json!({"decision":"block","reason":"hi"}));
        let post: serde_json::Value =
            serde_json::from_str(&delivery_output(HookEvent::PostToolUse, "hi")).unwrap();
        assert_eq!(post["hookSpecificOutput"]["hookEventName"], "PostToolUse");
        assert_eq!(post["hookSpecificOutput"]["additionalContext"], "hi");
    }

    #[test]
    fn parses_captured_payload() {
        let raw = r#"{"session_id":"01a22652-96c4-7652-bf64-6f7bc9883ce2","turn_id":"t1","transcript_path":"/x.jsonl","cwd":"/w","hook_event_name":"PostToolUse","model":"m","permission_mode":"bypassPermissions","tool_name":"Bash","tool_input":{"command":"echo hello"},"tool_response":"hello\n","tool_use_id":"call_0002"}"#;
        let p: HookPayload = serde_json::from_str(raw).unwrap();
        assert_eq!(p.event(), HookEvent::PostToolUse);
        assert_eq!(p.turn_id.as_deref(), Some("t1"));
        assert_eq!(p.tool_name.as_deref(), Some("Bash"));
    }
}
