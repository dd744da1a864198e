//! What a verified hook call gets, and how a handed message becomes `confirmed`.
//!
//! Offer: the oldest pending messages of the hook's own thread are leased under a fencing token
//! and rendered as the hook output (`additionalContext`, or a Stop block reason). The connection
//! then waits for the client's ack; only that makes them `handed`.
//!
//! Confirmation (`confirm.rs`): [`reconcile`] scans each handed message's rollout forward from
//! where it was handed for the message's marker: `confirmed`; when its turn closed without it,
//! `uncertain` with the reason (`unseen.rs`), never `pending` again: the rollout is a file others
//! can rewrite, and no decision that could show a message twice rests on it.
//! Rendering (`render.rs`) builds the hook output from the wrappers of `crate::envelope`.

mod confirm;
mod render;
pub mod unseen;

pub use confirm::{reconcile, reconcile_shared, set_scan_budget, settle_line, Scan, SERVE_SCAN_BUDGET};
pub use render::render;

use crate::config::Receipts;
use crate::envelope::output_budget;
use crate::gate::Verified;
use crate::reason::DeliveryReason;
use crate::store::{Channel, Store};
use anyhow::Result;
/// How long a client has to print a lease and ack it before it returns to `pending`.
pub const LEASE_MS: i64 = 3_000;
/// Stop blocks Courier causes per turn at most: Codex itself has no loop guard.
pub const MAX_STOP_BLOCKS_PER_TURN: i64 = 3;

pub enum Offer {
    Nothing,
    /// Messages are waiting but this call may not take them; the reason is noted on them.
    Deferred,
    Lease {
        token: crate::store::LeaseToken,
        output: String,
        count: usize,
    },
}

/// `context_limit`: the handler's `additionalContextLimit` as hook-client reports it.
pub fn offer(store: &mut Store, v: &Verified, context_limit: Option<u64>, receipts: Receipts) -> Result<Offer> {
    if !v.event.can_deliver() {
        return Ok(Offer::Nothing);
    }
    if !store.has_pending(&v.thread_id)? {
        return Ok(Offer::Nothing);
    }
    if v.event.needs_sole_thread() && !v.sole_thread() {
        // No turn id to bind to, and the process runs other threads too: wait for a hook that has one.
        store.note_deferral(&v.thread_id, DeliveryReason::DeferredSessionStartSharedProcess)?;
        return Ok(Offer::Deferred);
    }
    if v.event.continues_turn() {
        if let Some(turn) = &v.turn_id {
            if store.stop_blocks(&v.thread_id, turn)? >= MAX_STOP_BLOCKS_PER_TURN {
                store.note_deferral(&v.thread_id, DeliveryReason::DeferredStopBlockLimit)?;
                return Ok(Offer::Deferred);
            }
        }
    }
    // SessionStart carries no turn id; its messages belong to the turn it fired in.
    let turn = v.turn_id.as_deref().or(v.open_turn.as_deref());
    let Some(lease) = store.lease(&v.thread_id, Channel::Hook(v.event), turn, LEASE_MS, output_budget(v.event, context_limit))? else {
        return Ok(Offer::Nothing);
    };
    Ok(Offer::Lease { token: lease.token, output: render(v.event, &lease.messages, receipts), count: lease.messages.len() })
}

#[cfg(test)]
mod tests;
