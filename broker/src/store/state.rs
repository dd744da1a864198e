//! The closed sets of the `messages` table: what a row is ([`Kind`]), where it stands
//! ([`State`]) and which channel took it ([`Channel`]). Stored as their `as_str` text; `inspect --json`, `status --json` and the docs show
//! the same names.
//!
//! Context messages: `pending -> leased -> handed -> confirmed`, or `uncertain`, `expired`,
//! `cancelled`. Effort rows: `pending -> applying -> applied | failed | uncertain`, or `cancelled`.

use codex_format::hook::HookEvent;
use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};
use serde::{Deserialize, Serialize};

/// Where a queued row stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Queued, waiting for a verified hook of its thread (or the wake channel).
    Pending,
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
    pub const ALL: [State; 10] = [
        State::Pending,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
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

/// The delivery channel that took a message (the `event` column; `inspect` shows its name): a
/// Codex hook event's call, the wake channel's `turn/start`, or a Claude Code hook. All lease through the same store call,
/// so a message is never offered to two channels; a new channel is a variant here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Channel {
    /// A verified hook call of this event (`server/hook.rs`).
    Hook(HookEvent),
    /// A turn started in an idle thread through its app-server (`wake/`).
    Wake,
    /// A proven Claude Code hook (`claude/deliver.rs`): its own confirmation reads the Claude
    /// Code transcript (`claude/confirm.rs`), never the Codex scan.
    Claude,
    /// An idle Claude Code session woken by its `asyncRewake` Stop hook (`claude/wake.rs`);
    /// confirmed from the transcript as [`Channel::Claude`] is.
    ClaudeWake,
}

impl Channel {
    pub const fn as_str(self) -> &'static str {
        match self {
            Channel::Hook(e) => e.as_str(),
            Channel::Wake => "wake",
            Channel::Claude => "claude",
            Channel::ClaudeWake => "claude-wake",
        }
    }

    pub fn parse(s: &str) -> Option<Channel> {
        Some(match s {
            "wake" => Channel::Wake,
            "claude" => Channel::Claude,
            "claude-wake" => Channel::ClaudeWake,
            _ => Channel::Hook(HookEvent::parse(s)),
        })
    }

    /// Whether a message too large for one output goes out in parts (`Part`): Claude Code's
    /// hook context passes 10,000 characters whole, and a preview of anything larger.
    pub const fn splits(self) -> bool {
        matches!(self, Channel::Claude)
    }

    /// Whether a message larger than this call carries is passed by later messages that fit
    /// (`waiting_for_larger_hook`) rather than holding them: a Codex hook's budget depends on the
    /// hook (a Stop reason carries 8,000 bytes in every session, a handler from before
    /// `--context-limit` 8,000 on every event), so one large message would otherwise hold the
    /// whole queue for a session; it goes whole to the first hook or wake that carries it.
    pub const fn passes_larger(self) -> bool {
        matches!(self, Channel::Hook(_))
    }

    /// Only messages sent with `--wake auto` may start a turn; the hooks take any.
    pub const fn needs_wake_allowed(self) -> bool {
        matches!(self, Channel::Wake | Channel::ClaudeWake)
    }

    /// Settled from a Claude Code transcript (`claude/confirm.rs`).
    pub const fn is_claude(self) -> bool {
        matches!(self, Channel::Claude | Channel::ClaudeWake)
    }
}

impl Serialize for Channel {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
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
        impl FromSql for $t {
            fn column_result(v: ValueRef<'_>) -> FromSqlResult<Self> {
                let s = v.as_str()?;
                <$t>::parse(s).ok_or_else(|| FromSqlError::Other(format!("unknown {} {s:?}", stringify!($t)).into()))
            }
        }
        impl ToSql for $t {
            fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
                Ok(ToSqlOutput::from(self.as_str()))
            }
        }
    };
}
text_enum!(State);
text_enum!(Kind);
text_enum!(Channel);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in State::ALL {
            assert_eq!(State::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        for k in [Kind::Message, Kind::Effort] {
            assert_eq!(Kind::parse(k.as_str()), Some(k));
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
        }
        for c in
            [Channel::Wake, Channel::Claude, Channel::ClaudeWake, Channel::Hook(HookEvent::PostToolUse), Channel::Hook(HookEvent::Stop)]
        {
            assert_eq!(Channel::parse(c.as_str()), Some(c));
            assert_eq!(serde_json::to_value(c).unwrap(), c.as_str());
        }
    }
}

/// How many rows are in each state (shown by state name: `inspect --json`'s `threads` map,
/// `threads --json`'s `messages`).
pub type StateCounts = std::collections::BTreeMap<State, u64>;

/// A lease's fencing token: taken from the queue's own counter (`next_fencing_token`), so no two
/// leases ever share one, across channels and broker restarts. Every write that ends a lease names
/// it, and a token that no longer holds the row changes nothing. The hook client echoes it in its
/// ack (the wire's `u64`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct LeaseToken(i64);

impl LeaseToken {
    /// The token as the wire carries it (tokens count up from 1).
    pub fn to_wire(self) -> u64 {
        self.0 as u64
    }

    /// Whether an ack naming `lease` acknowledges this token.
    pub fn acked_by(self, lease: u64) -> bool {
        self.to_wire() == lease
    }

    /// A token made up by a test (production tokens come only from the queue's counter).
    #[cfg(any(test, feature = "standin"))]
    pub const fn for_test(n: i64) -> LeaseToken {
        LeaseToken(n)
    }

    /// Another token `n` away (a test's stale or future token).
    #[cfg(test)]
    pub(crate) const fn plus(self, n: i64) -> LeaseToken {
        LeaseToken(self.0 + n)
    }
}

impl std::fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl FromSql for LeaseToken {
    fn column_result(v: ValueRef<'_>) -> FromSqlResult<Self> {
        i64::column_result(v).map(LeaseToken)
    }
}

impl ToSql for LeaseToken {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        self.0.to_sql()
    }
}
