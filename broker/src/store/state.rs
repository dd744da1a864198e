//! The closed sets of the `messages` table: what a row is ([`Kind`]), where it stands
//! ([`State`]) and which channel took it ([`Channel`]). Stored as their `as_str` text; `inspect --json`, `status --json` and the docs show
//! the same names.
//!
//! Context messages: `pending -> leased -> handed -> confirmed`, or `uncertain`, `expired`,
//! `cancelled`. Effort rows: `pending -> applying -> applied | failed | uncertain`, or `cancelled`.

use codex_format::hook::HookEvent;
use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};
use serde::Serialize;

/// Where a queued row stands, and what it is: the producers' protocol's own (shared by the CLI,
/// MCP and the bridge). The queue stores their names (`as_str`); a column is read back with
/// [`column`].
pub use courier_producer_proto::{Kind, State};

/// A closed set stored by its name in a column of the queue.
pub trait Named: Sized {
    const WHAT: &'static str;
    fn named(s: &str) -> Option<Self>;
}

impl Named for State {
    const WHAT: &'static str = "State";
    fn named(s: &str) -> Option<State> {
        State::parse(s)
    }
}

impl Named for Kind {
    const WHAT: &'static str = "Kind";
    fn named(s: &str) -> Option<Kind> {
        Kind::parse(s)
    }
}

/// Column `i` of `row`, stored by name (a [`State`] or [`Kind`]: their types are the protocol's,
/// so they take no SQL conversion of their own).
pub fn column<T: Named>(row: &rusqlite::Row, i: usize) -> rusqlite::Result<T> {
    let text: String = row.get(i)?;
    T::named(&text).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, format!("unknown {} {text:?}", T::WHAT).into())
    })
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
    /// A proven GitHub Copilot CLI hook (`copilot/deliver.rs`): confirmed from its session
    /// record (`copilot/confirm.rs`).
    Copilot,
}

impl Channel {
    pub const fn as_str(self) -> &'static str {
        match self {
            Channel::Hook(e) => e.as_str(),
            Channel::Wake => "wake",
            Channel::Claude => "claude",
            Channel::ClaudeWake => "claude-wake",
            Channel::Copilot => "copilot",
        }
    }

    pub fn parse(s: &str) -> Option<Channel> {
        Some(match s {
            "wake" => Channel::Wake,
            "claude" => Channel::Claude,
            "claude-wake" => Channel::ClaudeWake,
            "copilot" => Channel::Copilot,
            _ => Channel::Hook(HookEvent::parse(s)),
        })
    }

    /// Whether a message too large for one output goes out in parts (`Part`): Claude Code's
    /// hook context passes 10,000 characters whole, and a preview of anything larger; Copilot
    /// CLI's 10,240 and cuts the rest silently.
    pub const fn splits(self) -> bool {
        matches!(self, Channel::Claude | Channel::Copilot)
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

    /// Which host's record settles a hand-off of this channel: one confirmation pass per host
    /// reads exactly the hand-offs of its own channels.
    pub const fn settled_by(self) -> SettledBy {
        match self {
            Channel::Hook(_) | Channel::Wake => SettledBy::CodexRollout,
            Channel::Claude | Channel::ClaudeWake => SettledBy::ClaudeTranscript,
            Channel::Copilot => SettledBy::CopilotEvents,
        }
    }

    /// Whether what it hands goes into a turn already running, which a `next-turn` or
    /// `interrupt` message never does: a Codex hook inside a turn (its Stop too: blocking it
    /// continues the turn), and every Claude Code or Copilot CLI hook (their channel does not say
    /// which event took it, so it is counted as inside). A new prompt's first hook
    /// (UserPromptSubmit, SessionStart) and a wake's own turn are not.
    pub const fn inside_turn(self) -> bool {
        match self {
            Channel::Hook(e) => !matches!(e, HookEvent::UserPromptSubmit | HookEvent::SessionStart),
            Channel::Claude | Channel::Copilot => true,
            Channel::Wake | Channel::ClaudeWake => false,
        }
    }

    /// Settled from a Claude Code transcript (`claude/confirm.rs`).
    pub const fn is_claude(self) -> bool {
        matches!(self.settled_by(), SettledBy::ClaudeTranscript)
    }
}

/// The record a hand-off is settled from ([`Channel::settled_by`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettledBy {
    /// The Codex rollout (`delivery/confirm.rs`, `wake/`).
    CodexRollout,
    /// The Claude Code transcript (`claude/confirm.rs`).
    ClaudeTranscript,
    /// The Copilot CLI session record, `events.jsonl` (`copilot/confirm.rs`).
    CopilotEvents,
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
