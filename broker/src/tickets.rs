//! Used tickets and the alarms they raise (the state each hook follows is
//! named in `codex/proof/ticket.rs`).
//!
//! [`take`] accepts each ticket once ([`TicketLog::take`], `store/ticket_log.rs`): the first
//! verified hook of a Codex action takes it, durably (a line in the ticket journal, written before
//! the hook is answered and replayed into the `tickets` table by the next broker, so a broker
//! killed and restarted still knows it; no write transaction on the hook's path). A later hook presenting the same ticket is refused `ticket_used`: two hooks
//! cannot both follow one Codex action, so one of them is not Codex's, and since either could be
//! the forger, the earlier hand-off is marked: an [`Alarm`] per message it handed (shown by
//! `broker inspect` on the message and in `alarms[]`, and by `broker doctor`). A hand-off whose
//! lease is attached after the alarm ([`attach`]) is marked then.

use crate::gate::{Refusal, Verified};
use crate::refusal::RefusalCode;
use crate::store::{now_ms, Store, Taken, TicketClaim, TicketLog};
use std::sync::Mutex;

pub use crate::store::Alarm;

/// Step 8 of the gate for a verified hook call of `pid` (`Verified::ticket`): the Codex action it
/// follows, taken once. `Ok(None)` for events that need none; a ticket used before is refused
/// `ticket_used` and marks the earlier hand-off.
pub fn take(store: &Mutex<Store>, log: &Mutex<TicketLog>, verified: &Verified, pid: i32) -> Result<Option<Taken>, Refusal> {
    let Some(ticket) = verified.ticket()? else { return Ok(None) };
    // Lock order: the ticket log, then the store.
    let claimed = log.lock().unwrap_or_else(|e| e.into_inner()).take(store, &ticket, pid);
    let refusal = |code, detail: String| {
        let mut r = Refusal::new(code, detail);
        r.thread = Some(verified.thread_id.to_string());
        r.event = Some(verified.event.as_str().to_string());
        r
    };
    match claimed {
        Ok((TicketClaim::New, taken)) => Ok(Some(taken)),
        Ok((TicketClaim::Used { at, pid: earlier, handed }, _)) => {
            let earlier = earlier.map_or("?".into(), |p| p.to_string());
            let handed = if handed.is_empty() { "none yet".to_string() } else { handed.join(", ") };
            crate::log_warn!(
                "ALARM: {} presented twice (pid {earlier}, then pid {pid}); the earlier hand-off is marked (messages: {handed})",
                ticket.key
            );
            Err(refusal(
                RefusalCode::TicketUsed,
                format!(
                    "{} was accepted {} ms before, from pid {earlier}; the messages it was handed ({handed}) are marked",
                    ticket.key,
                    now_ms() - at
                ),
            ))
        }
        Err(e) => {
            crate::log_error!("recording ticket {}: {e:#}", ticket.key);
            Err(refusal(RefusalCode::NoTicket, format!("ticket {} could not be recorded: {e:#}", ticket.key)))
        }
    }
}

/// Records that the hook holding `taken` was leased `token`'s messages ([`Store::attach_ticket`]).
pub fn attach(store: &mut Store, taken: &Taken, token: crate::store::LeaseToken) -> anyhow::Result<()> {
    store.attach_ticket(taken, token)
}
