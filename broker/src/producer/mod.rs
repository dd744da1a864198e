//! The sending side: what a producer (a relay, a CI bot, a coordinator agent, a person) needs to
//! address a thread, queue a message and learn whether it arrived.
//!
//! - [`send`]: addressing (`--thread`, `--cwd`), the refusal of thread ids no rollout has, and
//!   the note for ended threads; shared by the CLI and the socket protocol;
//! - [`wait`]: receipts: the broker's waiter thread, which answers parked waits when a message's
//!   state changes, and the client side of `broker wait` / `send --wait` (with a slow local poll
//!   only when no broker runs);
//! - [`threads`]: the Codex threads Courier can reach, from what trusted codex processes hold;
//! - [`proto`]: the JSON-lines request format on the broker socket (docs/producers.md);
//! - [`cli`]: `broker send|status|wait|threads`.
//!
//! Here: what "reached" means for a wanted state, the message record producers see, and the
//! small store queries these need.

pub mod cli;
pub mod line;
pub mod proto;
pub mod send;
pub mod threads;
pub mod wait;

use crate::store::{Kind, Message, State, Store};
use anyhow::Result;
use courier_shared::ids::ThreadId;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The state a producer waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Want {
    /// The hook client printed it and acknowledged: Codex has it.
    Handed,
    /// Its marker is in the thread's rollout: it reached the model.
    #[default]
    Confirmed,
}

impl Want {
    pub fn parse(s: &str) -> Option<Want> {
        match s {
            "handed" => Some(Want::Handed),
            "confirmed" => Some(Want::Confirmed),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Want::Handed => "handed",
            Want::Confirmed => "confirmed",
        }
    }
}

/// Where a message stands relative to a wanted state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Still queued, leased or handed: it may yet get there.
    InFlight,
    /// The wanted state, or one past it.
    Reached,
    /// A final state that is not (and never will be) the wanted one.
    Ended,
}

/// `confirmed` passes `handed`; `uncertain` was handed (so it passed `handed`) but never
/// confirmed. Effort rows: `applied` is reached for both, `failed`/`uncertain`/`cancelled` ended.
pub fn progress(m: &Message, want: Want) -> Progress {
    match m.state {
        State::Confirmed | State::Applied => Progress::Reached,
        State::Handed if want == Want::Handed => Progress::Reached,
        State::Handed | State::Pending | State::Leased | State::Applying => Progress::InFlight,
        State::Uncertain if m.kind == Kind::Message && want == Want::Handed && m.handed_at.is_some() => Progress::Reached,
        State::Uncertain | State::Expired | State::Cancelled | State::Failed => Progress::Ended,
    }
}

/// How a wait over several messages ended, and the exit status of the waiting commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every message reached the wanted state (exit 0).
    Reached,
    /// The timeout ran out with some message still queued, leased or handed (exit 3).
    TimedOut,
    /// Some message ended without reaching it (exit 4); this wins over a timeout.
    Ended,
}

impl Outcome {
    pub fn of(messages: &[Message], want: Want) -> Outcome {
        let p: Vec<Progress> = messages.iter().map(|m| progress(m, want)).collect();
        if p.contains(&Progress::Ended) {
            Outcome::Ended
        } else if p.contains(&Progress::InFlight) {
            Outcome::TimedOut
        } else {
            Outcome::Reached
        }
    }

    /// Every message is settled one way or the other: nothing more to wait for.
    pub fn settled(messages: &[Message], want: Want) -> bool {
        messages.iter().all(|m| progress(m, want) != Progress::InFlight)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Reached => "reached",
            Outcome::TimedOut => "timed_out",
            Outcome::Ended => "ended",
        }
    }

    pub fn parse(s: &str) -> Option<Outcome> {
        match s {
            "reached" => Some(Outcome::Reached),
            "timed_out" => Some(Outcome::TimedOut),
            "ended" => Some(Outcome::Ended),
            _ => None,
        }
    }

    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Reached => 0,
            Outcome::TimedOut => 3,
            Outcome::Ended => 4,
        }
    }
}

/// One message as producers see it (`broker status --json`, `wait --json`, the socket's
/// `messages[]`): the fields of `broker inspect --json`'s `messages[]`, same names and meaning.
pub fn record(m: &Message, now: i64) -> Value {
    json!({
        "id": m.id, "thread": m.thread, "kind": m.kind, "state": m.state, "from": m.from,
        "key": m.key, "created_at": m.created_at, "updated_at": m.updated_at,
        "age_ms": now - m.created_at, "expires_at": m.expires_at,
        "event": m.event, "turn_id": m.turn_id, "handed_at": m.handed_at,
        "confirmed_at": m.confirmed_at, "reason": m.reason, "attempts": m.attempts,
        "bytes": m.body.len(), "alarms": m.alarms, "sender_check": m.sender_check,
    })
}

/// A message id as `broker send` prints it (`m_` and 16 hex digits).
pub fn is_message_id(s: &str) -> bool {
    s.strip_prefix("m_").is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The message with this id, if the queue has it.
pub fn load(store: &Store, id: &str) -> Result<Option<Message>> {
    store.message(id)
}

/// The messages with these ids that the queue has, in the order asked.
pub fn load_all(store: &Store, ids: &[String]) -> Result<Vec<Option<Message>>> {
    ids.iter().map(|id| load(store, id)).collect()
}

/// Per thread, how many context messages are in each state.
pub fn counts_by_thread(store: &Store) -> Result<BTreeMap<ThreadId, crate::store::StateCounts>> {
    store.counts_by_thread()
}

/// How long a message with no `--ttl` waits for a thread that has no rollout before it expires
/// (reason `thread_never_appeared`): a thread id that was meant for the future, or a typo from an
/// older Courier that accepted any id.
pub const FUTURE_THREAD_WAIT_MS: i64 = 24 * 3_600_000;

/// Expires pending messages (no `--ttl`, queued more than [`FUTURE_THREAD_WAIT_MS`] ago) whose
/// thread still has no rollout under `$CODEX_HOME/sessions` (nor is a proven Claude Code session).
/// The broker runs it with its prune.
pub fn expire_never_appeared(store: &mut Store, codex_home: &std::path::Path) -> Result<usize> {
    let cutoff = crate::store::now_ms() - FUTURE_THREAD_WAIT_MS;
    let threads = store.threads_pending_since(cutoff)?;
    let mut expired = 0;
    for thread in threads {
        // A Claude Code session the broker has proven has no rollout: it appeared all the same.
        if crate::codex::rollout::find_rollout(codex_home, thread.as_str()).is_some() || store.claude_session_pin(&thread)?.is_some() {
            continue;
        }
        expired += store.expire_never_appeared(&thread, cutoff)?;
    }
    Ok(expired)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(kind: &str, state: &str, handed: bool) -> Message {
        Message {
            body: "x".into(),
            handed_at: handed.then_some(1),
            ..Message::sample("m_0000000000000001", crate::store::sample::T1, kind, state)
        }
    }

    #[test]
    fn reached_passed_and_ended_per_wanted_state() {
        use Progress::*;
        let cases = [
            ("pending", false, InFlight, InFlight),
            ("leased", false, InFlight, InFlight),
            ("handed", true, Reached, InFlight),
            ("confirmed", true, Reached, Reached),
            ("uncertain", true, Reached, Ended),
            ("expired", false, Ended, Ended),
            ("cancelled", false, Ended, Ended),
        ];
        for (state, handed, for_handed, for_confirmed) in cases {
            let m = msg("message", state, handed);
            assert_eq!(progress(&m, Want::Handed), for_handed, "{state} for handed");
            assert_eq!(progress(&m, Want::Confirmed), for_confirmed, "{state} for confirmed");
        }
        assert_eq!(progress(&msg("effort", "applied", false), Want::Confirmed), Reached);
        assert_eq!(progress(&msg("effort", "applying", false), Want::Handed), InFlight);
        assert_eq!(progress(&msg("effort", "uncertain", false), Want::Handed), Ended);
        assert_eq!(progress(&msg("effort", "failed", false), Want::Handed), Ended);
    }

    #[test]
    fn outcome_of_several_prefers_ended_then_timeout() {
        let ms = |states: &[&str]| states.iter().map(|s| msg("message", s, *s != "pending")).collect::<Vec<_>>();
        assert_eq!(Outcome::of(&ms(&["confirmed", "confirmed"]), Want::Confirmed), Outcome::Reached);
        assert_eq!(Outcome::of(&ms(&["confirmed", "pending"]), Want::Confirmed), Outcome::TimedOut);
        assert_eq!(Outcome::of(&ms(&["expired", "pending"]), Want::Confirmed), Outcome::Ended);
        assert!(!Outcome::settled(&ms(&["expired", "pending"]), Want::Confirmed));
        assert!(Outcome::settled(&ms(&["expired", "handed"]), Want::Handed));
        assert_eq!([Outcome::Reached, Outcome::TimedOut, Outcome::Ended].map(Outcome::exit_code), [0, 3, 4]);
    }

    /// The producer record carries every field `inspect --json` documents for a message, with
    /// the same values.
    #[test]
    fn record_matches_inspect_fields() {
        let dir = std::env::temp_dir().join(format!("courier-producer-record-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut store = Store::open(&dir).unwrap();
        store.enqueue(crate::store::sample::T1, "hi", Some("me"), Some("k"), Some(60_000)).unwrap();
        let report = crate::inspect::Report::gather(&store, None, None).unwrap();
        let inspected = report.to_json()["messages"][0].clone();
        let m = &store.messages(None).unwrap()[0];
        let mine = record(m, report.now);
        // `origin` is inspect's alone: it reads the NATS bridges' own records (inspect::bridged_origins).
        for (k, v) in inspected.as_object().unwrap().iter().filter(|(k, _)| *k != "origin") {
            assert_eq!(mine.get(k), Some(v), "field {k}");
        }
        assert!(is_message_id(&m.id));
        assert_eq!(load(&store, &m.id).unwrap().as_ref(), Some(m));
        assert_eq!(load(&store, "m_0000000000000000").unwrap(), None);
        assert_eq!(counts_by_thread(&store).unwrap()[&m.thread][&crate::store::State::Pending], 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
