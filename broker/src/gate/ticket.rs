//! Step 8 of the gate: one ticket per Codex action. Which rollout records prove which action is
//! the Codex wing's (`codex::proof::ticket`, its table); here the key it finds becomes the
//! [`Ticket`] `crate::tickets::take` accepts once, or the refusal `no_ticket`.

use super::{Refusal, Verified};
use crate::codex::proof::ticket::payload_ticket_key;
use crate::refusal::RefusalCode;
use crate::store::Ticket;

/// The ticket of a verified hook call, `None` for events that deliver nothing (SubagentStop), or
/// the refusal `no_ticket` when the rollout does not show the state the hook follows.
pub fn bind(v: &Verified) -> Result<Option<Ticket>, Refusal> {
    let key = payload_ticket_key(v.event, &v.payload, v.open_turn.as_deref(), &v.actions).map_err(|detail| {
        let mut r = Refusal::new(RefusalCode::NoTicket, detail);
        r.thread = Some(v.thread_id.to_string());
        r.event = Some(v.event.as_str().to_string());
        r
    })?;
    Ok(key.map(|key| Ticket { thread: v.thread_id.clone(), key, event: v.event }))
}
