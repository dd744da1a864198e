//! When a hand-off's turn closed without it, whether the rollout proves the model never saw it.
//!
//! A hook's output reaches the model only through Codex's history of the turn, and Codex writes
//! every history item to the rollout, in order, before the turn's `task_complete`; a hook whose
//! output Codex withdrew (its client killed, or not told its ack was taken: exit status not 0)
//! leaves nothing there, then or later. So a hand-off whose own turn ran to `task_complete`, with
//! nothing in the rollout since the hand-off that could be it, was never seen: it is `pending`
//! again (`turn_closed_unseen`), at most [`crate::store::MAX_REOFFERS`] times. The same holds for
//! a wake whose turn is known: a turn's user message is written as it starts.
//!
//! Not evidence, so `uncertain` as before (each named, a [`Doubt`] or a [`DeliveryReason`]):
//! - a codex that exited before its turn closed (`codex_exited`): its rollout just stops;
//! - a turn that was aborted (`turn_aborted_without_marker`): an interrupted turn's pending
//!   input may be carried into the next one;
//! - a compaction since the hand-off (`compacted_without_marker`): the model then sees a summary,
//!   and what it summarised is not read here;
//! - hook output since the hand-off that names no message Courier can account for
//!   (`unaccounted_hook_output`): another hook's, or a preview Codex kept of an output it cut;
//! - a rollout line too long to read (`unread_rollout_line`, over 1 MiB);
//! - a hand-off with no turn (SessionStart: `turn_closed_without_marker`), or a wake whose turn
//!   never became known (`wake_unanswered`: a `turn/start` that may have left may still start
//!   one).

use crate::codex::rollout::TurnEnd;
use crate::envelope::marker_ids;
use crate::reason::{DeliveryReason, Doubt, Reason};
use crate::store::{Channel, Message, State};

/// Hook output `text` (after a hand-off, not settling any of its messages) casts doubt on the
/// hand-offs still open when it names no Courier message: a cut one may have kept none.
pub fn doubt_of_hook_text(text: &str) -> Option<Doubt> {
    marker_ids(text).next().is_none().then_some(Doubt::UnaccountedHookOutput)
}

/// How `m`, still open, settles when turn `turn_id` closes (`end`), given what cast doubt on it
/// so far (this scan's, or an earlier one's in its `reason`). `None`: not its turn.
pub fn settle_at_close(m: &Message, turn_id: &str, end: TurnEnd, doubt: Option<Doubt>) -> Option<(State, Reason)> {
    // A wake whose turn is not known yet is not judged by another turn's end (a person's turn
    // may close before `turn/start` is read): its user message, or its time running out, is.
    if m.event == Some(Channel::Wake) && m.turn_id.is_none() {
        return None;
    }
    let Some(own) = m.turn_id.as_deref() else { return Some((State::Uncertain, DeliveryReason::TurnClosedWithoutMarker.into())) };
    if own != turn_id {
        return None;
    }
    let doubt = if end == TurnEnd::Aborted { Some(Doubt::Aborted) } else { doubt.or(m.reason.as_deref().and_then(Doubt::parse)) };
    Some(match doubt {
        Some(d) => (State::Uncertain, d.into()),
        None => (State::Pending, DeliveryReason::TurnClosedUnseen.into()),
    })
}
