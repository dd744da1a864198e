//! Gate step 7, turn affinity. The payload's `turn_id` must be the rollout's open turn;
//! SessionStart has none (whether it may deliver is the caller's decision, from
//! `Verified::sole_thread`).

use crate::codex::rollout::Snapshot;
use crate::refusal::{Refusal, RefusalCode};
use codex_format::hook::{HookEvent, HookPayload};

/// The verified turn id (`None` only for SessionStart).
pub fn check_turn(event: HookEvent, payload: &HookPayload, snap: &Snapshot) -> Result<Option<String>, Refusal> {
    let open = snap.open_turn.as_deref();
    match (event, payload.turn_id.as_deref()) {
        (e, None) if !e.needs_turn() => Ok(None),
        (_, Some(t)) if open == Some(t) => Ok(Some(t.to_string())),
        (_, t) => Err(Refusal::new(RefusalCode::TurnMismatch, format!("payload turn {t:?} is not the rollout's open turn {open:?}"))),
    }
}
