//! The producers' protocol, in one place for every producer: `broker send|wait|status` (the
//! CLI and the broker's socket service), `courier-mcp` and `courier-bridge` (docs/producers.md,
//! docs/many-hosts.md). Nothing here is the hook's: its own crate, so the hook-client (which links
//! `courier-shared`) carries none of it.
//!
//! - [`State`], [`Kind`]: where a queued row stands and what it is (the queue stores their
//!   names; every record, receipt and listing shows the same ones);
//! - [`ReceiptState`]: the states a bridge's receipt reports;
//! - [`rule`]: what a producer waits for ([`Want`]), the one rule of whether a message reached
//!   it ([`progress`]), how a wait ends ([`Outcome`]) and the exit status of each ([`Exit`]);
//! - [`request`]: the JSON-lines requests of the socket ([`Request`]) and the typed replies
//!   (a send's [`Sent`], the message [`Record`], [`WaitReply`]; the error replies, [`ErrorReply`]
//!   with its [`ErrorCode`], are `courier_shared::wire`'s, re-exported here).
//!
//! Every name on the wire comes from serde on these enums: no producer matches a state's text.

pub mod inbound;
pub mod request;
pub mod rule;

pub use courier_shared::wire::{ErrorCode, ErrorReply};
pub use inbound::{Action, Mode, SenderClass};
pub use request::{Record, Request, Sent, ThreadStatus, WaitReply};
pub use rule::{progress, Exit, Outcome, Progress, Want};

use serde::{Deserialize, Serialize};

/// Where a queued row stands.
///
/// Context messages: `pending -> leased -> handed -> confirmed`, or `uncertain`, `expired`,
/// `cancelled`; a message the receiving thread's inbound policy holds starts `held` and becomes
/// `pending` when a person releases it (`cancelled` when a person drops it). Effort rows: `pending -> applying -> applied | failed | uncertain`, or `cancelled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Queued, waiting for a verified hook of its thread (or the wake channel).
    Pending,
    /// Held by the receiving thread's inbound policy: offered to no hook or wake until a person
    /// releases it (`broker release`, then `pending`) or drops it (`cancelled`).
    Held,
    /// Offered to one hook call (or wake) under a fencing token, not acknowledged yet.
    Leased,
    /// The hook client printed it and acked (or the app-server accepted the wake's turn).
    Handed,
    /// Its marker is in a hook-injected message of its thread's rollout.
    Confirmed,
    /// Handed, but its turn closed without it (or an effort change may or may not have landed).
    Uncertain,
    /// Its `--ttl` ran out (or its thread never appeared) before it was handed.
    Expired,
    /// Cancelled before it was shown (by the user, superseded, or too large for a hook output).
    Cancelled,
    /// Effort: claimed by one hook call; the update may be on its way.
    Applying,
    /// Effort: the app-server reported it applied.
    Applied,
    /// Effort: the app-server refused it, or no target was available.
    Failed,
}

impl State {
    /// Every state, in the order `inspect` lists them.
    pub const ALL: [State; 11] = [
        State::Pending,
        State::Held,
        State::Leased,
        State::Handed,
        State::Confirmed,
        State::Uncertain,
        State::Expired,
        State::Cancelled,
        State::Applying,
        State::Applied,
        State::Failed,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Held => "held",
            State::Leased => "leased",
            State::Handed => "handed",
            State::Confirmed => "confirmed",
            State::Uncertain => "uncertain",
            State::Expired => "expired",
            State::Cancelled => "cancelled",
            State::Applying => "applying",
            State::Applied => "applied",
            State::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<State> {
        State::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// A state no row leaves (what `prune` may forget after the retention period).
    pub const fn is_final(self) -> bool {
        matches!(self, State::Confirmed | State::Uncertain | State::Expired | State::Cancelled | State::Applied | State::Failed)
    }
}

/// What a queued row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A context message (`broker send`), delivered through hooks or a wake.
    Message,
    /// A reasoning-effort change (`broker effort`, or the policy), applied through the app-server.
    Effort,
}

impl Kind {
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Message => "message",
            Kind::Effort => "effort",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        [Kind::Message, Kind::Effort].into_iter().find(|k| k.as_str() == s)
    }
}

/// The state a bridge's receipt reports (`courier.receipt.HOST.PUB`): the states of a context
/// message a producer sees, in the order a message passes them, and `refused` (the host did not
/// queue the request). `leased` is not one: it is internal and may go back to `pending`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReceiptState {
    /// Held by the receiving thread's inbound policy until a person releases or drops it.
    Held,
    Pending,
    Handed,
    Confirmed,
    Uncertain,
    Expired,
    Cancelled,
    /// The host refused the request: no message, `reason` is the error code.
    Refused,
}

impl ReceiptState {
    /// The states a queued message's receipts report, in the order it passes them.
    pub const PASSED: [ReceiptState; 7] = [
        ReceiptState::Held,
        ReceiptState::Pending,
        ReceiptState::Handed,
        ReceiptState::Confirmed,
        ReceiptState::Uncertain,
        ReceiptState::Expired,
        ReceiptState::Cancelled,
    ];

    /// The receipt a message in `state` calls for (`leased` reads `pending`); `None` for an
    /// effort row's own states, which never travel.
    pub const fn of(state: State) -> Option<ReceiptState> {
        Some(match state {
            State::Held => ReceiptState::Held,
            State::Pending | State::Leased => ReceiptState::Pending,
            State::Handed => ReceiptState::Handed,
            State::Confirmed => ReceiptState::Confirmed,
            State::Uncertain => ReceiptState::Uncertain,
            State::Expired => ReceiptState::Expired,
            State::Cancelled => ReceiptState::Cancelled,
            State::Applying | State::Applied | State::Failed => return None,
        })
    }

    /// The message state it reports; `None` for a refusal (no message).
    pub const fn state(self) -> Option<State> {
        Some(match self {
            ReceiptState::Held => State::Held,
            ReceiptState::Pending => State::Pending,
            ReceiptState::Handed => State::Handed,
            ReceiptState::Confirmed => State::Confirmed,
            ReceiptState::Uncertain => State::Uncertain,
            ReceiptState::Expired => State::Expired,
            ReceiptState::Cancelled => State::Cancelled,
            ReceiptState::Refused => return None,
        })
    }

    pub const fn as_str(self) -> &'static str {
        match self.state() {
            Some(s) => s.as_str(),
            None => "refused",
        }
    }

    pub fn parse(s: &str) -> Option<ReceiptState> {
        [ReceiptState::Refused].into_iter().chain(ReceiptState::PASSED).find(|r| r.as_str() == s)
    }

    /// Nothing follows it: the last receipt of a message (or of a refused request).
    pub const fn is_final(self) -> bool {
        match self.state() {
            Some(s) => s.is_final(),
            None => true,
        }
    }
}

macro_rules! text_enum {
    ($t:ty) => {
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl PartialEq<&str> for $t {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }
        impl PartialEq<str> for $t {
            fn eq(&self, other: &str) -> bool {
                self.as_str() == other
            }
        }
    };
}
text_enum!(State);
text_enum!(Kind);
text_enum!(ReceiptState);

#[cfg(test)]
mod tests {
    use super::*;

    /// Each name is serde's, `as_str`'s and `parse`'s alike, so the queue's text, the records and
    /// the receipts cannot drift apart.
    #[test]
    fn names_are_serdes_and_round_trip() {
        for s in State::ALL {
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
            assert_eq!(State::parse(s.as_str()), Some(s));
        }
        for k in [Kind::Message, Kind::Effort] {
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
            assert_eq!(Kind::parse(k.as_str()), Some(k));
        }
        for r in [ReceiptState::Refused].into_iter().chain(ReceiptState::PASSED) {
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
            assert_eq!(ReceiptState::parse(r.as_str()), Some(r));
        }
        assert_eq!(State::parse("refused"), None);
    }

    #[test]
    fn receipts_report_message_states_only() {
        assert_eq!(ReceiptState::of(State::Leased), Some(ReceiptState::Pending));
        assert_eq!(ReceiptState::of(State::Applied), None);
        for s in State::ALL {
            if let Some(r) = ReceiptState::of(s) {
                assert_eq!(r.is_final(), s.is_final(), "{s}");
            }
        }
        assert!(ReceiptState::Refused.is_final());
    }
}
