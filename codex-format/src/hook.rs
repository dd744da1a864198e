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
    /// Codex is about to ask the person to approve a tool call (after PreToolUse, before the
    /// prompt). Courier records it as a pending approval and answers with no decision.
    PermissionRequest,
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
    pub const REGISTERED: [HookEvent; 7] = [
        HookEvent::SessionStart,
        HookEvent::UserPromptSubmit,
        HookEvent::PreToolUse,
        HookEvent::PostToolUse,
        HookEvent::Stop,
        HookEvent::SubagentStart,
        HookEvent::PermissionRequest,
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
            "PermissionRequest" => HookEvent::PermissionRequest,
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
            HookEvent::PermissionRequest => "PermissionRequest",
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
            HookEvent::SubagentStop | HookEvent::PermissionRequest | HookEvent::Other => Delivery::None,
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
    /// The tool's input (PermissionRequest: `{command, description}`, the model's reason).
    #[serde(default)]
    pub tool_input: Option<serde_json::Value>,
    #[serde(default)]
    pub cwd: Option<String>,
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

    const ALL: [HookEvent; 9] = [
        HookEvent::SessionStart,
        HookEvent::UserPromptSubmit,
        HookEvent::PreToolUse,
        HookEvent::PostToolUse,
        HookEvent::Stop,
        HookEvent::SubagentStart,
        HookEvent::SubagentStop,
        HookEvent::PermissionRequest,
        HookEvent::Other,
    ];

    #[test]
    fn each_event_is_named_as_codex_names_it() {
        let names: Vec<&str> = ALL.iter().map(|e| e.as_str()).collect();
        assert_eq!(
            names,
            [
                "SessionStart",
                "UserPromptSubmit",
                "PreToolUse",
                "PostToolUse",
                "Stop",
                "SubagentStart",
                "SubagentStop",
                "PermissionRequest",
                "Other"
            ]
        );
        for e in ALL {
            assert_eq!(HookEvent::parse(e.as_str()), e, "{e:?}");
        }
        for unknown in ["", "stop", "Notification", "PreCompact"] {
            assert_eq!(HookEvent::parse(unknown), HookEvent::Other, "{unknown:?}");
        }
        assert!(!HookEvent::REGISTERED.contains(&HookEvent::Other) && !HookEvent::REGISTERED.contains(&HookEvent::SubagentStop));
    }

    /// The rules per event (see each method): (needs a turn id, needs the codex
    /// to run this one thread, how it delivers, continues a turn that was ending).
    #[test]
    fn each_event_has_its_rules() {
        use Delivery::{Context, None as Nothing, StopBlock};
        let rules = [
            (HookEvent::SessionStart, false, true, Context, false),
            (HookEvent::UserPromptSubmit, true, false, Context, false),
            (HookEvent::PreToolUse, true, false, Context, false),
            (HookEvent::PostToolUse, true, false, Context, false),
            (HookEvent::Stop, true, false, StopBlock, true),
            (HookEvent::SubagentStart, true, false, Context, false),
            (HookEvent::SubagentStop, true, false, Nothing, false),
            (HookEvent::PermissionRequest, true, false, Nothing, false),
            (HookEvent::Other, true, false, Nothing, false),
        ];
        for (e, turn, sole, delivery, continues) in rules {
            assert_eq!(
                (e.needs_turn(), e.needs_sole_thread(), e.delivery(), e.continues_turn()),
                (turn, sole, delivery, continues),
                "{e:?}"
            );
            assert_eq!(e.can_deliver(), delivery != Nothing, "{e:?}");
        }
    }

    #[test]
    fn a_subagent_stop_names_the_child_rollout_and_the_others_their_own() {
        let p = HookPayload {
            transcript_path: Some("/parent.jsonl".into()),
            agent_transcript_path: Some("/child.jsonl".into()),
            ..HookPayload::default()
        };
        for e in ALL {
            let want = if e == HookEvent::SubagentStop { "/child.jsonl" } else { "/parent.jsonl" };
            assert_eq!(e.transcript_path(&p), Some(want), "{e:?}");
        }
        assert_eq!(HookEvent::SubagentStop.transcript_path(&HookPayload::default()), None);
        assert_eq!(HookEvent::Stop.transcript_path(&HookPayload::default()), None);
    }

    #[test]
    fn a_context_output_without_a_notice_carries_only_the_context() {
        let out: serde_json::Value = serde_json::from_str(&delivery_output(HookEvent::SessionStart, "hi", None)).unwrap();
        assert_eq!(out, json!({"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": "hi"}}));
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
