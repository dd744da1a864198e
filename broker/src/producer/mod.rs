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
//! The protocol itself (requests, replies, states, the receipt rule, outcomes, exit statuses) is
//! `courier_producer_proto`, shared with MCP and the bridge. Here: that rule applied to a row
//! of the queue, the record of a row, and the small store queries these need.

pub mod cli;
pub mod line;
pub mod owner;
pub mod proto;
pub mod send;
pub mod threads;
pub mod wait;

use crate::store::{Message, Store};
use anyhow::Result;
use courier_shared::ids::ThreadId;
use serde_json::Value;
use std::collections::BTreeMap;

pub use courier_producer_proto::{Exit, Outcome, Progress, Record, WaitReply, Want};

/// Where `m` stands relative to `want`: the protocol's one rule
/// ([`courier_producer_proto::progress`]), on a row of the queue.
pub fn progress(m: &Message, want: Want) -> Progress {
    courier_producer_proto::progress(m.kind, m.state, m.handed_at.is_some(), want)
}

/// How a wait over `messages` ends (once settled, or at its timeout).
pub fn outcome(messages: &[Message], want: Want) -> Outcome {
    Outcome::of(messages.iter().map(|m| progress(m, want)))
}

/// Every message is settled one way or the other: nothing more to wait for.
pub fn settled(messages: &[Message], want: Want) -> bool {
    messages.iter().all(|m| progress(m, want).is_settled())
}

/// One message as producers see it (`broker status --json`, `wait --json`, the socket's
/// `messages[]`): the fields of `broker inspect --json`'s `messages[]`, same names and meaning.
pub fn record(m: &Message, now: i64) -> Record {
    Record {
        id: m.id.clone(),
        thread: m.thread.clone(),
        kind: m.kind,
        state: m.state,
        from: m.from.clone(),
        key: m.key.clone(),
        created_at: m.created_at,
        updated_at: m.updated_at,
        age_ms: now - m.created_at,
        expires_at: m.expires_at,
        event: m.event.map(|e| e.as_str().to_string()),
        turn_id: m.turn_id.clone(),
        handed_at: m.handed_at,
        confirmed_at: m.confirmed_at,
        reason: m.reason.clone(),
        attempts: m.attempts,
        bytes: m.body.len(),
        alarms: m.alarms.clone(),
        sender_check: m.sender_check.map(|c| c.as_str().to_string()),
        mode: m.mode,
    }
}

/// [`record`] as JSON.
pub fn record_json(m: &Message, now: i64) -> Value {
    serde_json::to_value(record(m, now)).unwrap_or_default()
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
        if threads::codex::has_rollout(codex_home, thread.as_str()) || store.claude_session_pin(&thread)?.is_some() {
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

    /// The queue's rows are judged by the protocol's rule, `handed_at` included.
    #[test]
    fn rows_are_judged_by_the_protocols_rule() {
        use Progress::*;
        assert_eq!(progress(&msg("message", "uncertain", true), Want::Handed), Reached);
        assert_eq!(progress(&msg("message", "uncertain", false), Want::Handed), Ended);
        assert_eq!(progress(&msg("effort", "applied", false), Want::Confirmed), Reached);
        let ms = |states: &[&str]| states.iter().map(|s| msg("message", s, *s != "pending")).collect::<Vec<_>>();
        assert_eq!(outcome(&ms(&["confirmed", "confirmed"]), Want::Confirmed), Outcome::Reached);
        assert_eq!(outcome(&ms(&["confirmed", "pending"]), Want::Confirmed), Outcome::TimedOut);
        assert_eq!(outcome(&ms(&["expired", "pending"]), Want::Confirmed), Outcome::Ended);
        assert!(!settled(&ms(&["expired", "pending"]), Want::Confirmed));
        assert!(settled(&ms(&["expired", "handed"]), Want::Handed));
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
        let mine = record_json(m, report.now);
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
