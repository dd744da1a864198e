//! When a hand-off's turn closed without it: how it settles. Never `pending` again.
//!
//! A hook's output reaches the model only through Codex's history of the turn, and Codex writes
//! every history item to the rollout, in order, before the turn's `task_complete`; a hook whose
//! output Codex withdrew (its client killed, or not told its ack was taken) leaves nothing there.
//! So a turn that closed with no sign of a hand-off suggests the model never saw it. Suggests,
//! never proves: the rollout is a file the user's other processes can rewrite after Codex wrote
//! it (under `/tmp`, a sandboxed model command can too), and one hex digit changed in a marker
//! makes a message the model read look unseen. A decision that could show a message twice rests
//! only on evidence nobody can write after the fact (docs/reliability.md, "Evidence classes"),
//! so such a hand-off is `uncertain`: `turn_closed_unseen` when nothing else is known, else the
//! [`Doubt`] found on the way (each named):
//! - an aborted turn (`turn_aborted_without_marker`): its pending input may be carried on;
//! - a compaction since the hand-off (`compacted_without_marker`): the model sees a summary;
//! - hook output naming no Courier message (`unaccounted_hook_output`): another hook's, or a
//!   preview Codex kept of an output it cut;
//! - hook output naming a message Courier never handed to this rollout (`rollout_tampered`):
//!   someone rewrote the record; an alarm is raised (`confirm.rs`);
//! - a rollout line too long to read (`unread_rollout_line`, over 1 MiB).
//!
//! A codex that exited first is `codex_exited`; a hand-off with no turn (SessionStart)
//! `turn_closed_without_marker`; a wake whose turn never became known waits for its user message
//! or its deadline (`wake_unanswered`: a `turn/start` that may have left may still start one).

use crate::reason::{DeliveryReason, Doubt, Reason};
use crate::store::{Channel, Message};
use codex_format::rollout::marker_ids;
use codex_format::rollout::TurnEnd;

/// Hook output `text` (after a hand-off, not settling any of its messages) casts doubt on the
/// hand-offs still open when it names no Courier message: a cut one may have kept none.
pub fn doubt_of_hook_text(text: &str) -> Option<Doubt> {
    marker_ids(text).next().is_none().then_some(Doubt::UnaccountedHookOutput)
}

/// Why `m`, still open, is `uncertain` now that turn `turn_id` closed (`end`), given what cast
/// doubt on it so far (this scan's, or an earlier one's in its `reason`). `None`: not its turn.
pub fn reason_at_close(m: &Message, turn_id: &str, end: TurnEnd, doubt: Option<Doubt>) -> Option<Reason> {
    // A wake whose turn is not known yet is not judged by another turn's end (a person's turn
    // may close before `turn/start` is read): its user message, or its time running out, is.
    if m.event == Some(Channel::Wake) && m.turn_id.is_none() {
        return None;
    }
    let Some(own) = m.turn_id.as_deref() else { return Some(DeliveryReason::TurnClosedWithoutMarker.into()) };
    if own != turn_id {
        return None;
    }
    let doubt = if end == TurnEnd::Aborted { Some(Doubt::Aborted) } else { doubt.or(m.reason.as_deref().and_then(Doubt::parse)) };
    Some(doubt.map_or(DeliveryReason::TurnClosedUnseen.into(), Reason::from))
}
