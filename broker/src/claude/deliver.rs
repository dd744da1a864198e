//! Delivery mid-turn to a proven Claude Code hook: at a main-conversation PostToolUse the
//! session's oldest pending messages go out as the answer's `additionalContext`, which Claude
//! Code sends to the model with its next request (`PostToolUse:<tool> hook additional context:
//! <text>`). The hand-off is recorded (fsynced, with the claude process it went to) before the
//! answer exists, as every channel's is, so a broker crash can never double a message: what
//! happens after is settled from the transcript (`claude/confirm.rs`).
//!
//! A message larger than one hand-off goes out in parts (`store::Part`), one a PostToolUse, in
//! order, nothing else beside a part: each part renders whole in the budget with `part="k/n"` in
//! its wrapper (`envelope::wrapped_part`), each part's hand-off is recorded as any, and the
//! message is `confirmed` only when the transcript shows every part.
//!
//! Only PostToolUse delivers: PreToolUse context reaches the model in the same request as the
//! call's PostToolUse context (Claude Code merges them), so it would be no sooner, and at
//! PreToolUse the call is not in the transcript yet; Stop would show a message twice and hold the
//! turn open, and a message still pending when a turn ends goes with the idle session's wake.
//! The probes and figures are in docs/claude-code.md.
//!
//! `agent_scope`: a sub-agent's hooks carry the parent's session and an `agent_id`; what they
//! inject reaches only the sub-agent (probed on 2.1.332), so they are handed nothing.

use super::gate::Proven;
use super::Event;
use crate::config::Receipts;
use crate::store::{Channel, HandOff, Message, Store};
use anyhow::Result;
use serde_json::json;

/// Most bytes of one `additionalContext`: Claude Code hands up to 10,000 UTF-16 code units of one
/// hook's context whole and replaces more with a 2 KB preview (probed on 2.1.332; its prefix
/// `PostToolUse:<tool> hook additional context: ` not counted). UTF-8 never takes fewer bytes than
/// UTF-16 units, so a byte budget holds for any text; 10% is kept back. A larger message goes in
/// parts, never previewed.
pub const MAX_CONTEXT_BYTES: usize = 9_000;
/// How long a lease lives before its hand-off must be recorded (the same call records it).
const LEASE_MS: i64 = 10_000;
/// The answer that changes nothing in the session.
pub const NOTHING: &str = "{}";

/// What a proven hook is answered: [`NOTHING`], or at a main-conversation PostToolUse the
/// session's oldest pending messages, already recorded as handed, with the person's receipt line
/// unless `receipts` is off.
pub fn offer(store: &mut Store, p: &Proven, receipts: Receipts) -> Result<String> {
    let pay = &p.payload;
    if pay.event != Event::PostToolUse || pay.agent_id.is_some() {
        return Ok(NOTHING.to_string());
    }
    let Some(lease) = store.lease(&pay.session_id, Channel::Claude, Some(&pay.prompt_id), LEASE_MS, MAX_CONTEXT_BYTES)? else {
        return Ok(NOTHING.to_string());
    };
    let text = lease.text();
    // Confirmation reads the transcript from here: the request carrying the text comes after.
    let offset = std::fs::metadata(&pay.transcript_path).map_or(0, |m| m.len());
    let transcript = pay.transcript_path.to_string_lossy();
    let record = HandOff { part: lease.part.as_ref(), ..HandOff::at(&transcript, offset, p.key()) };
    if !store.hand_off(lease.token, &record)? {
        return Ok(NOTHING.to_string()); // the lease lapsed: its messages are pending again
    }
    crate::failpoint::hit("claude_after_hand_off");
    let ids: Vec<&str> = lease.messages.iter().map(|m| m.id.as_str()).collect();
    let part = lease.part.as_ref().map(|p| format!(" (part {} of {})", p.k, p.n)).unwrap_or_default();
    crate::log_info!("claude: handed {}{part} to session {} (pid {}) at PostToolUse", ids.join(", "), pay.session_id, p.key().pid);
    let mut answer = json!({"hookSpecificOutput": {"hookEventName": "PostToolUse", "additionalContext": text}});
    if receipts == Receipts::Line {
        // Claude Code shows `systemMessage` to the person (`PostToolUse:<tool> says: ...`) and
        // sends it to no model; without it the person sees nothing of a delivery.
        let mut line = Message::receipt_line(&lease.messages);
        if let Some(part) = &lease.part {
            line.push_str(&format!(", part {} of {}", part.k, part.n));
        }
        answer["systemMessage"] = line.into();
    }
    Ok(answer.to_string())
}
