//! The receipt rule: what a producer waits for, whether a message got there, how a wait ends, and
//! the exit status of each ending. `broker wait`/`send --wait` (and the broker's parked waits),
//! MCP's `send_message` with `wait` and `courier-bridge send --wait` all judge with [`progress`]
//! and end with an [`Outcome`]: one rule, so the three cannot disagree.

use crate::{Kind, ReceiptState, State};
use serde::{Deserialize, Serialize};

/// The state a producer waits for (`--wait`, `--for`, the socket's `wait`/`for`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Want {
    /// The hook client printed it and acknowledged: the host has it.
    Handed,
    /// Its marker is in the thread's rollout (or transcript): it reached the model.
    #[default]
    Confirmed,
}

impl Want {
    pub fn parse(s: &str) -> Option<Want> {
        [Want::Handed, Want::Confirmed].into_iter().find(|w| w.as_str() == s)
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Want::Handed => State::Handed.as_str(),
            Want::Confirmed => State::Confirmed.as_str(),
        }
    }
}

/// Where a message stands relative to a wanted state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Still queued, leased or handed: it may yet get there.
    InFlight,
    /// Held by the receiving thread's inbound policy: it gets there only if a person releases it.
    Held,
    /// The wanted state, or one past it.
    Reached,
    /// A final state that is not (and never will be) the wanted one.
    Ended,
}

impl Progress {
    /// Nothing more will happen to it by itself: a wait over it may end. A held message is not
    /// settled: `--wait confirmed` keeps waiting for the person's release.
    pub const fn is_settled(self) -> bool {
        matches!(self, Progress::Reached | Progress::Ended)
    }
}

/// THE rule. `confirmed` passes `handed`; `uncertain` passed `handed` only if the message was
/// handed (`handed`: its `handed_at` is set, or a bridge's `handed` receipt came first), and never
/// reached `confirmed`. Effort rows: `applied` is reached for both, `failed`/`uncertain`/
/// `cancelled` ended.
pub fn progress(kind: Kind, state: State, handed: bool, want: Want) -> Progress {
    match state {
        State::Confirmed | State::Applied => Progress::Reached,
        State::Handed if want == Want::Handed => Progress::Reached,
        State::Handed | State::Pending | State::Leased | State::Applying => Progress::InFlight,
        State::Held => Progress::Held,
        State::Uncertain if kind == Kind::Message && want == Want::Handed && handed => Progress::Reached,
        State::Uncertain | State::Expired | State::Cancelled | State::Failed => Progress::Ended,
    }
}

/// How a wait ended: the `outcome` of a `wait` reply, of a `send` with `wait`, of MCP's
/// `send_message` and of `courier-bridge send --json`.
///
/// What a producer can tell apart: delivered (`reached` for `confirmed`), refused (by the
/// request's checks, or the thread's inbound policy), too large (a refusal, by its code or
/// message), uncertain (`ended`, with the record's `state`), held (the timeout ran out while the
/// receiving thread's policy held it) and misaddressed (a name no thread has: nothing queued).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Every message reached the wanted state (or passed it).
    Reached,
    /// The timeout ran out with some message still queued, leased or handed (or, across hosts,
    /// no receipt yet).
    TimedOut,
    /// Some message ended without reaching it; this wins over a timeout.
    Ended,
    /// The host refused the request (a bridge's `refused` receipt): nothing was queued.
    Refused,
    /// The timeout ran out while the receiving thread's inbound policy held a message (and none
    /// ended).
    Held,
    /// Addressed to a name no thread has: nothing was queued.
    Misaddressed,
}

impl Outcome {
    /// How a wait over messages that stand at `progress` ends (once they are settled, or the
    /// timeout ran out).
    pub fn of(progress: impl IntoIterator<Item = Progress>) -> Outcome {
        let (mut in_flight, mut held, mut ended) = (false, false, false);
        for p in progress {
            in_flight |= p == Progress::InFlight;
            held |= p == Progress::Held;
            ended |= p == Progress::Ended;
        }
        if ended {
            Outcome::Ended
        } else if held {
            Outcome::Held
        } else if in_flight {
            Outcome::TimedOut
        } else {
            Outcome::Reached
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Reached => "reached",
            Outcome::TimedOut => "timed_out",
            Outcome::Ended => "ended",
            Outcome::Refused => "refused",
            Outcome::Held => "held",
            Outcome::Misaddressed => "misaddressed",
        }
    }

    pub fn parse(s: &str) -> Option<Outcome> {
        [Outcome::Reached, Outcome::TimedOut, Outcome::Ended, Outcome::Refused, Outcome::Held, Outcome::Misaddressed]
            .into_iter()
            .find(|o| o.as_str() == s)
    }

    pub const fn exit(self) -> Exit {
        match self {
            Outcome::Reached => Exit::Reached,
            Outcome::TimedOut => Exit::TimedOut,
            Outcome::Ended => Exit::Ended,
            Outcome::Refused => Exit::Usage,
            Outcome::Held => Exit::Held,
            Outcome::Misaddressed => Exit::Misaddressed,
        }
    }
}

/// What a receipt of a bridged message means for a remote wait: `Some` ends it. `handed`: a
/// `handed` receipt of this publish came before (receipts report every state passed, in order).
pub fn receipt_outcome(state: ReceiptState, handed: bool, want: Want) -> Option<Outcome> {
    let Some(state) = state.state() else { return Some(Outcome::Refused) };
    match progress(Kind::Message, state, handed, want) {
        Progress::InFlight | Progress::Held => None,
        p => Some(Outcome::of([p])),
    }
}

/// Exit status of the producer commands (`broker send|wait|status`, `courier-bridge send`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// Every message reached the wanted state (or passed it); a command without a wait: done.
    Reached = 0,
    /// An error: I/O, database, the broker's reply, NATS, an unknown message id.
    Error = 1,
    /// A usage error, or a request the receiving side refused as wrong in itself (a thread no
    /// rollout has, a bad label, a message over the size limit, a reused key).
    Usage = 2,
    /// The timeout ran out with a message still `pending`, `leased` or `handed`.
    TimedOut = 3,
    /// A message ended without reaching it: `uncertain`, `expired`, `cancelled`.
    Ended = 4,
    /// The address (a thread name) names no thread: nothing was queued.
    Misaddressed = 5,
    /// The timeout ran out while the receiving thread's inbound policy held a message.
    Held = 6,
}

impl Exit {
    pub const fn code(self) -> u8 {
        self as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reached_passed_and_ended_per_wanted_state() {
        use Progress::*;
        let cases = [
            (State::Pending, false, InFlight, InFlight),
            (State::Leased, false, InFlight, InFlight),
            (State::Held, false, Held, Held),
            (State::Handed, true, Reached, InFlight),
            (State::Confirmed, true, Reached, Reached),
            (State::Uncertain, true, Reached, Ended),
            // Never handed: it did not pass `handed` (the bridge once read it as reached).
            (State::Uncertain, false, Ended, Ended),
            (State::Expired, false, Ended, Ended),
            (State::Cancelled, false, Ended, Ended),
        ];
        for (state, handed, for_handed, for_confirmed) in cases {
            assert_eq!(progress(Kind::Message, state, handed, Want::Handed), for_handed, "{state} for handed");
            assert_eq!(progress(Kind::Message, state, handed, Want::Confirmed), for_confirmed, "{state} for confirmed");
        }
        assert_eq!(progress(Kind::Effort, State::Applied, false, Want::Confirmed), Reached);
        assert_eq!(progress(Kind::Effort, State::Applying, false, Want::Handed), InFlight);
        assert_eq!(progress(Kind::Effort, State::Uncertain, true, Want::Handed), Ended);
        assert_eq!(progress(Kind::Effort, State::Failed, false, Want::Handed), Ended);
    }

    #[test]
    fn outcome_of_several_prefers_ended_then_timeout() {
        use Progress::*;
        assert_eq!(Outcome::of([Reached, Reached]), Outcome::Reached);
        assert_eq!(Outcome::of([Reached, InFlight]), Outcome::TimedOut);
        assert_eq!(Outcome::of([Ended, InFlight]), Outcome::Ended);
        assert_eq!(Outcome::of([Held, InFlight, Reached]), Outcome::Held, "a held message is why the wait timed out");
        assert_eq!(Outcome::of([Ended, Held]), Outcome::Ended);
        assert!(!Held.is_settled() && !InFlight.is_settled() && Reached.is_settled() && Ended.is_settled());
        assert_eq!([Outcome::Misaddressed, Outcome::Held].map(|o| o.exit().code()), [5, 6]);
        let codes = [Outcome::Reached, Outcome::Refused, Outcome::TimedOut, Outcome::Ended].map(|o| o.exit().code());
        assert_eq!(codes, [0, 2, 3, 4], "docs/producers.md's exit table");
        for o in [Outcome::Reached, Outcome::TimedOut, Outcome::Ended, Outcome::Refused, Outcome::Held, Outcome::Misaddressed] {
            assert_eq!(serde_json::to_value(o).unwrap(), o.as_str());
            assert_eq!(Outcome::parse(o.as_str()), Some(o));
        }
        assert_eq!(Want::parse("handed"), Some(Want::Handed));
        assert_eq!(serde_json::to_value(Want::Confirmed).unwrap(), Want::Confirmed.as_str());
    }

    #[test]
    fn receipts_end_a_remote_wait_by_the_same_rule() {
        use ReceiptState as R;
        assert_eq!(receipt_outcome(R::Pending, false, Want::Handed), None);
        assert_eq!(receipt_outcome(R::Held, false, Want::Confirmed), None, "a held receipt keeps a remote wait waiting");
        assert_eq!(receipt_outcome(R::Handed, true, Want::Handed), Some(Outcome::Reached));
        assert_eq!(receipt_outcome(R::Handed, true, Want::Confirmed), None);
        assert_eq!(receipt_outcome(R::Uncertain, true, Want::Handed), Some(Outcome::Reached));
        assert_eq!(receipt_outcome(R::Uncertain, false, Want::Handed), Some(Outcome::Ended));
        assert_eq!(receipt_outcome(R::Uncertain, true, Want::Confirmed), Some(Outcome::Ended));
        assert_eq!(receipt_outcome(R::Refused, false, Want::Confirmed), Some(Outcome::Refused));
    }
}
