//! Delivery to a proven Copilot CLI hook. The hand-off is recorded (fsynced, with the copilot
//! process it goes to and where its session record stood) before the answer exists, as every
//! channel's is, so a broker crash can never double a message; what happens after is settled
//! from the session record (`confirm.rs`).
//!
//! - postToolUse: the session's oldest pending messages as `{"additionalContext": T}`, which
//!   Copilot appends verbatim to the call's tool message in the turn's next request. Copilot
//!   cuts T silently at 10,240 characters (probed on 1.0.102), so T is at most
//!   [`MAX_CONTEXT_BYTES`] bytes (never fewer bytes than UTF-16 units, what JavaScript counts):
//!   a larger message goes whole in parts (`store::Part`), one a hook, never cut.
//! - agentStop: where a message would otherwise wait for the next prompt, `{"decision":"block",
//!   "reason": R}` makes R a new user message and runs another turn; bounded by the same budget
//!   and once a turn: a turn a block started (`stop_hook_active`) is never blocked again, so
//!   Courier can never keep a session running.
//!
//! Copilot has no output that shows the person a line without the model (Claude Code's
//! `systemMessage`): the receipt line is not sent.

use super::gate::Proven;
use super::Event;
use crate::store::{Channel, HandOff, Store};
use anyhow::Result;
use serde_json::json;

/// Most bytes of one hand-off's text (the wrapper included): under Copilot's 10,240-character
/// cut, with room to spare.
pub const MAX_CONTEXT_BYTES: usize = 9_000;
/// How long a lease lives before its hand-off must be recorded (the same call records it).
const LEASE_MS: i64 = 10_000;

/// What was handed, for the log and the caller.
pub struct Handed {
    /// The hook's stdout: Copilot's JSON answer.
    pub output: String,
    pub count: usize,
}

/// How a hook's output carries a message to the model.
enum Carrier {
    /// postToolUse `additionalContext`.
    Context,
    /// agentStop `block`.
    Block,
}

/// The session's oldest pending messages for a proven hook, recorded as handed; `None` when
/// nothing goes (nothing pending, a continued turn's agentStop, a lease that lapsed).
pub fn offer(store: &mut Store, p: &Proven) -> Result<Option<Handed>> {
    let pay = &p.payload;
    let carrier = match pay.event {
        Event::PostToolUse => Carrier::Context,
        Event::AgentStop if !pay.stop_hook_active => Carrier::Block,
        // A permissionRequest's output is a decision on the tool call, never a message.
        Event::AgentStop | Event::PermissionRequest => return Ok(None),
    };
    let Some(lease) = store.lease(&pay.session, Channel::Copilot, None, LEASE_MS, MAX_CONTEXT_BYTES)? else {
        return Ok(None);
    };
    let text = lease.text();
    // Confirmation reads the session record from here: what carries the text comes after.
    let offset = std::fs::metadata(&p.events).map_or(0, |m| m.len());
    let events = p.events.to_string_lossy();
    let record = HandOff { part: lease.part.as_ref(), ..HandOff::at(&events, offset, p.copilot) };
    if !store.hand_off(lease.token, &record)? {
        return Ok(None); // the lease lapsed: its messages are pending again
    }
    crate::failpoint::hit("copilot_after_hand_off");
    let ids: Vec<&str> = lease.messages.iter().map(|m| m.id.as_str()).collect();
    let part = lease.part.as_ref().map(|p| format!(" (part {} of {})", p.k, p.n)).unwrap_or_default();
    crate::log_info!(
        "copilot: handed {}{part} to session {} (pid {}) at {}",
        ids.join(", "),
        pay.session,
        p.copilot.pid,
        pay.event.as_str()
    );
    let output = match carrier {
        Carrier::Context => json!({ "additionalContext": text }),
        Carrier::Block => json!({ "decision": "block", "reason": text }),
    };
    Ok(Some(Handed { output: output.to_string(), count: lease.messages.len() }))
}
