//! The camelCase hook payloads of Copilot CLI that Courier reads (probed on 1.0.102): every
//! event has `sessionId` (a UUID), `timestamp` (Unix ms) and `cwd`; agentStop adds
//! `stop_hook_active` (true in the turn a `block` started); permissionRequest `toolName` and
//! `toolInput` (`{command}` for `bash`). No turn id, no tool call id.

use super::Event;
use crate::refusal::{Refusal, RefusalCode};
use courier_shared::ids::ThreadId;
use serde::Deserialize;

#[derive(Deserialize)]
struct Wire {
    #[serde(rename = "sessionId")]
    session_id: String,
    timestamp: Option<serde_json::Value>,
    #[serde(default)]
    stop_hook_active: bool,
    #[serde(rename = "toolName", default)]
    tool_name: Option<String>,
    #[serde(rename = "toolInput", default)]
    tool_input: Option<serde_json::Value>,
    cwd: Option<String>,
}

/// A proven-to-parse payload of `event`.
#[derive(Debug, Clone, PartialEq)]
pub struct Payload {
    pub event: Event,
    pub session: ThreadId,
    /// agentStop: the turn was itself continued by a hook's `block`.
    pub stop_hook_active: bool,
    /// The payload's `timestamp` as sent (Unix ms): with the session, it names one hook call.
    pub timestamp: String,
    /// permissionRequest: the tool asking and its input.
    pub tool: Option<String>,
    pub tool_input: Option<serde_json::Value>,
    pub cwd: Option<String>,
}

/// The payload of a hook registered for `event` (text from the hook command), or why not.
pub fn parse(event: &str, payload: &str) -> Result<Payload, Refusal> {
    let bad = |detail: String| Refusal::new(RefusalCode::CopilotPayload, detail);
    let event = Event::parse(event).ok_or_else(|| bad(format!("event {event:?} is not one Courier registers")))?;
    let wire: Wire = serde_json::from_str(payload).map_err(|e| bad(format!("{} payload: {e}", event.as_str())))?;
    let session = ThreadId::parse(&wire.session_id).map_err(|_| bad(format!("sessionId {:?} is not a UUID", wire.session_id)))?;
    let Some(timestamp) = wire.timestamp else {
        return Err(bad("payload has no timestamp: not a camelCase Copilot CLI payload".into()));
    };
    Ok(Payload {
        event,
        session,
        stop_hook_active: wire.stop_hook_active,
        timestamp: timestamp.to_string(),
        tool: wire.tool_name,
        tool_input: wire.tool_input,
        cwd: wire.cwd,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SID: &str = "0b7c2c53-5f3b-4a53-9d7e-3f0f2a1b9c11";

    #[test]
    fn a_post_tool_use_payload_as_probed_parses() {
        let p = format!(
            r#"{{"sessionId":"{SID}","timestamp":1765132800000,"cwd":"/w","toolName":"bash","toolArgs":{{"command":"ls"}},"toolResult":{{"resultType":"success","textResultForLlm":"x"}}}}"#
        );
        let got = parse("postToolUse", &p).unwrap();
        assert_eq!((got.event, got.session.as_str(), got.stop_hook_active), (Event::PostToolUse, SID, false));
    }

    #[test]
    fn agent_stop_carries_whether_a_block_continued_the_turn() {
        let p = format!(r#"{{"sessionId":"{SID}","timestamp":1,"cwd":"/w","stopReason":"end_turn","stop_hook_active":true}}"#);
        assert!(parse("agentStop", &p).unwrap().stop_hook_active);
    }

    #[test]
    fn other_events_dialects_and_ids_are_refused() {
        let ok = format!(r#"{{"sessionId":"{SID}","timestamp":1}}"#);
        for (event, payload) in [
            ("preToolUse", ok.as_str()),
            ("PostToolUse", ok.as_str()),
            ("postToolUse", r#"{"session_id":"0b7c2c53-5f3b-4a53-9d7e-3f0f2a1b9c11","timestamp":"2026-12-07T00:00:00Z"}"#),
            ("postToolUse", r#"{"sessionId":"../../etc","timestamp":1}"#),
            ("postToolUse", r#"{"sessionId":"0b7c2c53-5f3b-4a53-9d7e-3f0f2a1b9c11"}"#),
        ] {
            assert_eq!(parse(event, payload).unwrap_err().code, RefusalCode::CopilotPayload, "{event} {payload}");
        }
    }
}
