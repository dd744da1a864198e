//! What Codex writes to a command hook's stdin, the rules Courier applies per event, and the
//! output Codex reads back.
//! Field names follow the hook input schemas of codex-cli 0.160.0-0.171.0 (`tests/tests/drift.rs`
//! records real payloads of the newest and oldest and fails on a field Courier reads that changed).

use serde::Deserialize;
use serde_json::json;

/// A Codex hook event, and every rule Courier applies per event: a new event is one variant
/// here, its rules below, and its tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HookEvent {
    SessionStart,
    UserPromptSubmit,
    PreToolUse,
    PostToolUse,
    Stop,
    SubagentStart,
    SubagentStop,
    /// Any event Courier does not handle (refused: `unsupported_event`).
    Other,
}

/// How a hook's output hands messages to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// `hookSpecificOutput.additionalContext`: a developer message in the current turn.
    Context,
    /// `{"decision":"block","reason":...}`: the turn goes on with the text as a hook prompt.
    StopBlock,
    /// The event's output cannot carry a message.
    None,
}

impl HookEvent {
    /// The events `broker install` registers the hook-client for, in hooks.json order.
    pub const REGISTERED: [HookEvent; 6] = [
        HookEvent::SessionStart,
        HookEvent::UserPromptSubmit,
        HookEvent::PreToolUse,
        HookEvent::PostToolUse,
        HookEvent::Stop,
        HookEvent::SubagentStart,
    ];

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

    pub const fn as_str(self) -> &'static str {
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

    /// The payload field that names the thread's rollout: the child's for SubagentStop (the hook
    /// runs for the sub-agent's thread), `transcript_path` for the others.
    pub fn transcript_path(self, p: &HookPayload) -> Option<&str> {
        match self {
            HookEvent::SubagentStop => p.agent_transcript_path.as_deref(),
            _ => p.transcript_path.as_deref(),
        }
    }

    /// Whether the payload must carry the rollout's open turn. SessionStart has no turn id: its
    /// messages belong to the turn it fired in, and it may deliver only when the codex process
    /// runs that one thread ([`HookEvent::needs_sole_thread`]).
    pub const fn needs_turn(self) -> bool {
        !matches!(self, HookEvent::SessionStart)
    }

    /// Whether delivery depends on the codex process holding this thread's writer lock and no
    /// other (the gate counts the locks for it; otherwise delivery is deferred).
    pub const fn needs_sole_thread(self) -> bool {
        matches!(self, HookEvent::SessionStart)
    }

    /// How the event's output delivers.
    pub const fn delivery(self) -> Delivery {
        match self {
            HookEvent::Stop => Delivery::StopBlock,
            HookEvent::SubagentStop | HookEvent::Other => Delivery::None,
            _ => Delivery::Context,
        }
    }

    /// Events whose output can carry a message to the model.
    pub const fn can_deliver(self) -> bool {
        !matches!(self.delivery(), Delivery::None)
    }

    /// Whether delivering continues a turn that was ending (Stop): such deliveries are counted
    /// per turn and limited, since Codex has no loop guard of its own.
    pub const fn continues_turn(self) -> bool {
        matches!(self.delivery(), Delivery::StopBlock)
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
    /// PreToolUse / PostToolUse: the tool call's id (its `call_id` in the rollout).
    #[serde(default)]
    pub tool_use_id: Option<String>,
}

impl HookPayload {
    pub fn event(&self) -> HookEvent {
        HookEvent::parse(&self.hook_event_name)
    }
}

/// The stdout that hands `text` to the model for `event`: a block reason for Stop (the turn goes
/// on with it as a hook prompt), `additionalContext` (a developer message) for the others. A
/// `notice` is shown to the person in the TUI (`systemMessage`), never sent to the model.
pub fn delivery_output(event: HookEvent, text: &str, notice: Option<&str>) -> String {
    let mut value = match event.delivery() {
        Delivery::StopBlock => json!({"decision": "block", "reason": text}),
        Delivery::Context | Delivery::None => {
            json!({"hookSpecificOutput": {"hookEventName": event.as_str(), "additionalContext": text}})
        }
    };
    if let Some(n) = notice {
        value["systemMessage"] = json!(n);
    }
    value.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_blocks_and_others_add_context() {
        let stop: serde_json::Value = serde_json::from_str(&delivery_output(HookEvent::Stop, "hi", None)).unwrap();
        assert_eq!(stop, json!({"decision":"block","reason":"hi"}));
        let stop: serde_json::Value = serde_json::from_str(&delivery_output(HookEvent::Stop, "hi", Some("seen"))).unwrap();
        assert_eq!(stop, json!({"decision":"block","reason":"hi","systemMessage":"seen"}));
        let post: serde_json::Value = serde_json::from_str(&delivery_output(HookEvent::PostToolUse, "hi", Some("seen"))).unwrap();
        assert_eq!(post["systemMessage"], "seen");
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
