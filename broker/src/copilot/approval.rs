//! A Copilot CLI permissionRequest answered once by a person from outside (`broker approve|deny`).
//! Copilot runs the permissionRequest hook before every tool call, `--allow-all-tools` or not, and
//! its answer overrides the user's flags: `{"behavior":"allow"}` runs the tool without a prompt,
//! `{"behavior":"deny","message":M}` refuses it and the model reads `Permission denied by a
//! PermissionRequest hook: M`; no output leaves the call to Copilot's own rules (probed on 1.0.102).
//!
//! What is held is only what the person's config asks (`[approvals] hold`, as for Codex): `off`
//! holds nothing (the hook answers at once, with no decision); `exec` holds the shell tool's
//! calls (`bash`); `all` holds every tool call. A held request is recorded as an approval of
//! host `copilot` (its session, the tool, the command: what a person is shown and signs), held
//! by the broker for `hold_secs` at most (below the hook's `timeoutSec`, which install sets past
//! the longest hold), and answered once through the same person proof as a Codex approval; when
//! the hold ends unanswered the hook gives no decision and the approval is resolved.

use super::gate::Proven;
use super::payload::Payload;
use crate::approval::{command_digest, ApprovalHost, ApprovalKind, Decision, NewApproval};
use crate::config::Hold;
use serde_json::json;

/// Copilot's shell tool, as its permissionRequest names it.
pub const SHELL_TOOL: &str = "bash";

/// Why a Copilot approval whose hold ended unanswered is resolved.
pub const HOLD_ENDED: &str =
    "the permissionRequest hook's hold ended with no answer (or the broker restarted): Copilot CLI decided by its own rules";

/// The approval a proven permissionRequest asks of a person, when `hold` holds it; `None`: it is
/// answered at once with no decision (Copilot's own rules apply).
pub fn to_hold(p: &Proven, hold: Hold) -> Option<NewApproval> {
    let pay = &p.payload;
    let tool = pay.tool.as_deref()?;
    let held = match hold {
        Hold::Off => false,
        Hold::Exec => tool == SHELL_TOOL,
        Hold::All => true,
    };
    if !held {
        return None;
    }
    let (kind, command) = asked(pay, tool)?;
    Some(NewApproval {
        host: ApprovalHost::Copilot,
        thread: pay.session.clone(),
        // No turn id: the hook call's timestamp names it (as `hook.start` in the session record).
        turn: pay.timestamp.clone(),
        call_id: None,
        tool: tool.to_string(),
        kind,
        files: Vec::new(),
        reason: None,
        cwd: pay.cwd.clone(),
        ticket: format!("copilot:{}:{}:{}", pay.session, pay.timestamp, command_digest(&command)),
        command,
    })
}

/// What the call asks to do: the shell's command line, or another tool's input as canonical JSON.
fn asked(pay: &Payload, tool: &str) -> Option<(ApprovalKind, String)> {
    let input = pay.tool_input.as_ref()?;
    match tool {
        SHELL_TOOL => Some((ApprovalKind::Command, input.get("command")?.as_str()?.to_string())),
        _ => Some((ApprovalKind::McpTool, serde_json::to_string(input).ok()?)),
    }
}

/// The permissionRequest hook's output for a person's `decision` (a deny's message with it).
pub fn decision(decision: Decision, message: Option<&str>) -> String {
    match decision {
        Decision::Approve => json!({"behavior": "allow"}),
        Decision::Deny => json!({"behavior": "deny", "message": message.unwrap_or("denied by a person (through Courier)")}),
    }
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::copilot::Event;
    use crate::os::ProcessKey;

    fn proven(tool: &str, input: serde_json::Value) -> Proven {
        let payload = Payload {
            event: Event::PermissionRequest,
            session: courier_shared::ids::ThreadId::parse("0b7c2c53-5f3b-4a53-9d7e-3f0f2a1b9c11").unwrap(),
            stop_hook_active: false,
            timestamp: "1765132800000".into(),
            tool: Some(tool.into()),
            tool_input: Some(input),
            cwd: Some("/w".into()),
        };
        Proven { payload, copilot: ProcessKey { pid: 1, starttime: 1 }, events: "/e".into() }
    }

    /// Only what the config asks is held: nothing with `off`, the shell with `exec`, every tool
    /// with `all`; the shell's command is what a person is shown.
    #[test]
    fn only_what_the_config_asks_is_held() {
        let shell = proven("bash", json!({"command": "rm -rf build"}));
        let view = proven("view", json!({"path": "/w/a"}));
        assert_eq!(to_hold(&shell, Hold::Off), None);
        let a = to_hold(&shell, Hold::Exec).expect("exec holds the shell");
        assert_eq!(
            (a.host, a.kind, a.command.as_str(), a.tool.as_str()),
            (ApprovalHost::Copilot, ApprovalKind::Command, "rm -rf build", "bash")
        );
        assert_eq!(to_hold(&view, Hold::Exec), None, "a read-only tool is not the shell");
        let v = to_hold(&view, Hold::All).expect("all holds every tool");
        assert_eq!((v.kind, v.command.as_str()), (ApprovalKind::McpTool, r#"{"path":"/w/a"}"#));
        assert_ne!(a.ticket, to_hold(&proven("bash", json!({"command": "ls"})), Hold::Exec).unwrap().ticket);
    }

    #[test]
    fn the_decision_is_copilots_permission_request_output() {
        assert_eq!(decision(Decision::Approve, None), r#"{"behavior":"allow"}"#);
        let deny: serde_json::Value = serde_json::from_str(&decision(Decision::Deny, Some("use staging"))).unwrap();
        assert_eq!(deny, json!({"behavior": "deny", "message": "use staging"}));
    }
}
