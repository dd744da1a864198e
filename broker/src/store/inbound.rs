//! What the receiving side decided, in the queue: thread names (`thread_names`), inbound policy
//! rules (`inbound_rules`, with a revision per thread that a person's signed change names, so a
//! signature changes the policy once), and the way of a held message (`held -> pending` when a
//! person releases it, `held -> cancelled` when a person drops it).
//!
//! A name outlives its thread's process: a thread that ends keeps its id and rollout, and is
//! resumed under the same id, so the name stays bound to it until `broker name --clear`.

use super::{now_ms, row_to_message, Message, Store, MESSAGE_COLUMNS};
use crate::reason::DeliveryReason;
use anyhow::Result;
use courier_producer_proto::{Action, SenderClass};
use courier_shared::ids::ThreadId;
use rusqlite::{params, OptionalExtension, TransactionBehavior};

/// The rule key of a rule for every sender class.
pub const ANY_CLASS: &str = "*";

pub(super) fn migrate(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS thread_names (
             name     TEXT PRIMARY KEY COLLATE NOCASE,
             thread   TEXT NOT NULL UNIQUE,
             named_at INTEGER NOT NULL
         );
         CREATE TABLE IF NOT EXISTS inbound_rules (
             thread TEXT NOT NULL,
             class  TEXT NOT NULL,
             action TEXT NOT NULL,
             set_at INTEGER NOT NULL,
             PRIMARY KEY (thread, class)
         );
         CREATE TABLE IF NOT EXISTS inbound_revs (
             thread TEXT PRIMARY KEY,
             rev    INTEGER NOT NULL
         );
         CREATE INDEX IF NOT EXISTS messages_held ON messages(seq) WHERE state = 'held';",
    )
}

/// Why `broker name` did not name a thread.
#[derive(Debug, PartialEq, Eq)]
pub enum NameTaken {
    /// Another thread has that name (case aside).
    ByThread(ThreadId),
}

/// One rule of a thread's inbound policy (`class` `None`: every class).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct InboundRule {
    pub thread: ThreadId,
    pub class: Option<SenderClass>,
    pub action: Action,
    pub set_at: i64,
}

impl Store {
    /// Names `thread` `name` (its earlier name, if any, is replaced); `Err` when another thread
    /// has the name.
    pub fn name_thread(&mut self, thread: &ThreadId, name: &str) -> Result<std::result::Result<(), NameTaken>> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let holder: Option<String> = tx.query_row("SELECT thread FROM thread_names WHERE name = ?1", [name], |r| r.get(0)).optional()?;
        if let Some(holder) = holder.filter(|h| h != thread.as_str()) {
            return Ok(Err(NameTaken::ByThread(ThreadId::try_from(holder)?)));
        }
        tx.execute("DELETE FROM thread_names WHERE thread = ?1", [thread.as_str()])?;
        tx.execute("INSERT INTO thread_names (name, thread, named_at) VALUES (?1, ?2, ?3)", params![name, thread.as_str(), now_ms()])?;
        tx.commit()?;
        Ok(Ok(()))
    }

    /// Frees `name`; the thread it named, if any.
    pub fn clear_name(&mut self, name: &str) -> Result<Option<ThreadId>> {
        let thread: Option<String> =
            self.conn.query_row("DELETE FROM thread_names WHERE name = ?1 RETURNING thread", [name], |r| r.get(0)).optional()?;
        Ok(thread.map(ThreadId::try_from).transpose()?)
    }

    /// The thread `name` names (case aside), if any.
    pub fn thread_named(&self, name: &str) -> Result<Option<ThreadId>> {
        let mut stmt = self.conn.prepare_cached("SELECT thread FROM thread_names WHERE name = ?1")?;
        Ok(stmt.query_row([name], |r| super::thread_at(r, 0)).optional()?)
    }

    /// Every name, by thread.
    pub fn thread_names(&self) -> Result<std::collections::HashMap<ThreadId, String>> {
        let mut stmt = self.conn.prepare_cached("SELECT thread, name FROM thread_names")?;
        let rows = stmt.query_map([], |r| Ok((super::thread_at(r, 0)?, r.get::<_, String>(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// What `thread`'s own rules say for a sender of `class`: its rule for that class, else its
    /// rule for every class; `None` when it has neither (the config's default decides).
    pub fn inbound_action(&self, thread: &ThreadId, class: SenderClass) -> Result<Option<Action>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT action FROM inbound_rules WHERE thread = ?1 AND class IN (?2, ?3) ORDER BY class = ?3 LIMIT 1")?;
        let action: Option<String> = stmt.query_row(params![thread.as_str(), class.as_str(), ANY_CLASS], |r| r.get(0)).optional()?;
        Ok(action.and_then(|a| Action::parse(&a)))
    }

    /// `thread`'s rules (every thread's with `None`).
    pub fn inbound_rules(&self, thread: Option<&ThreadId>) -> Result<Vec<InboundRule>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT thread, class, action, set_at FROM inbound_rules WHERE (?1 IS NULL OR thread = ?1) ORDER BY thread, class",
        )?;
        let rows = stmt.query_map([thread.map(ThreadId::as_str)], |r| {
            let class: String = r.get(1)?;
            let action: String = r.get(2)?;
            Ok(InboundRule {
                thread: super::thread_at(r, 0)?,
                class: SenderClass::parse(&class),
                action: Action::parse(&action).unwrap_or(Action::Hold),
                set_at: r.get(3)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The revision of `thread`'s policy: a person's signed change names it, and each change
    /// moves it on, so one signature changes the policy once.
    pub fn inbound_rev(&self, thread: &ThreadId) -> Result<i64> {
        let mut stmt = self.conn.prepare_cached("SELECT rev FROM inbound_revs WHERE thread = ?1")?;
        Ok(stmt.query_row([thread.as_str()], |r| r.get(0)).optional()?.unwrap_or(0))
    }

    /// Sets `thread`'s rule for `class` (every class: `None`, which replaces its per-class rules)
    /// if its policy is still at revision `rev`; whether it was.
    pub fn set_inbound(&mut self, thread: &ThreadId, class: Option<SenderClass>, action: Action, rev: i64) -> Result<bool> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let now: i64 =
            tx.query_row("SELECT COALESCE((SELECT rev FROM inbound_revs WHERE thread = ?1), 0)", [thread.as_str()], |r| r.get(0))?;
        if now != rev {
            return Ok(false);
        }
        if class.is_none() {
            tx.execute("DELETE FROM inbound_rules WHERE thread = ?1", [thread.as_str()])?;
        }
        tx.execute(
            "INSERT INTO inbound_rules (thread, class, action, set_at) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(thread, class) DO UPDATE SET action = excluded.action, set_at = excluded.set_at",
            params![thread.as_str(), class.map_or(ANY_CLASS, SenderClass::as_str), action.as_str(), now_ms()],
        )?;
        tx.execute(
            "INSERT INTO inbound_revs (thread, rev) VALUES (?1, 1) ON CONFLICT(thread) DO UPDATE SET rev = rev + 1",
            [thread.as_str()],
        )?;
        tx.commit()?;
        Ok(true)
    }

    /// The held messages, oldest first.
    pub fn held(&self) -> Result<Vec<Message>> {
        let mut stmt = self.conn.prepare_cached(&format!("SELECT {MESSAGE_COLUMNS} FROM messages WHERE state = 'held' ORDER BY seq"))?;
        let rows = stmt.query_map([], row_to_message)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// A person released held message `id`: `pending` from now on (hooks and wakes may take it).
    /// Whether it was held.
    pub fn release_held(&mut self, id: &str) -> Result<bool> {
        let n = self.conn.execute(
            "UPDATE messages SET state = 'pending', reason = NULL, updated_at = ?2 WHERE id = ?1 AND state = 'held'",
            params![id, now_ms()],
        )?;
        if n > 0 {
            self.pending.bump(1);
        }
        Ok(n > 0)
    }

    /// A person dropped held message `id`: `cancelled` (`dropped_by_person`), never shown.
    /// Whether it was held.
    pub fn drop_held(&mut self, id: &str) -> Result<bool> {
        Ok(self.conn.execute(
            "UPDATE messages SET state = 'cancelled', reason = ?3, updated_at = ?2 WHERE id = ?1 AND state = 'held'",
            params![id, now_ms(), DeliveryReason::DroppedByPerson.as_str()],
        )? > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Channel, Enqueued, Mode, NewMessage, State};
    use codex_format::hook::HookEvent;
    use std::sync::atomic::{AtomicU32, Ordering};

    const T: &ThreadId = crate::store::sample::T1;
    const U: &ThreadId = crate::store::sample::T2;
    static N: AtomicU32 = AtomicU32::new(0);

    fn store() -> (Store, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("courier-inbound-{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst)));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        (Store::open(&dir).unwrap(), dir)
    }

    fn queue(s: &mut Store, body: &str, mode: Mode, held: bool) -> String {
        let new = NewMessage { thread: T, body, sender: None, verified: false, key: None, ttl_ms: None, wake: true, mode, held };
        let Enqueued::New(id) = s.enqueue_message(&new).unwrap() else { panic!() };
        id
    }

    /// A held message is offered to no channel (hooks, wakes) until released; released once, it
    /// is leased like any; a dropped one is cancelled and offered to none.
    #[test]
    fn held_messages_reach_no_channel_until_released_and_dropped_ones_never() {
        let (mut s, dir) = store();
        let held = queue(&mut s, "held", Mode::Steer, true);
        let m = s.message(&held).unwrap().unwrap();
        assert_eq!((m.state, m.reason.as_deref()), (State::Held, Some("held_by_policy")));
        assert!(!s.has_pending(T).unwrap(), "nothing for a hook to look at");
        for channel in [Channel::Hook(HookEvent::PostToolUse), Channel::Hook(HookEvent::UserPromptSubmit), Channel::Wake, Channel::Claude] {
            assert!(s.lease(T, channel, Some("turn"), 10_000, 8_000).unwrap().is_none(), "{channel}");
        }
        assert_eq!(s.held().unwrap().len(), 1);
        assert!(s.release_held(&held).unwrap());
        assert!(!s.release_held(&held).unwrap(), "once");
        assert!(!s.drop_held(&held).unwrap(), "a released message is no longer held");
        let lease = s.lease(T, Channel::Hook(HookEvent::PostToolUse), Some("turn"), 10_000, 8_000).unwrap().unwrap();
        assert_eq!(lease.messages[0].id, held);
        let dropped = queue(&mut s, "dropped", Mode::Steer, true);
        assert!(s.drop_held(&dropped).unwrap());
        let m = s.message(&dropped).unwrap().unwrap();
        assert_eq!((m.state, m.reason.as_deref()), (State::Cancelled, Some("dropped_by_person")));
        assert!(!s.release_held(&dropped).unwrap());
        assert!(s.held().unwrap().is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A `next-turn` message is left by every hook inside a turn and taken by a new prompt's
    /// first hook or a wake; a steer message behind it goes ahead.
    #[test]
    fn next_turn_messages_are_taken_only_outside_a_running_turn() {
        let (mut s, dir) = store();
        let next = queue(&mut s, "next", Mode::NextTurn, false);
        let steer = queue(&mut s, "steer", Mode::Steer, false);
        for event in [HookEvent::PreToolUse, HookEvent::PostToolUse, HookEvent::Stop] {
            assert!(Channel::Hook(event).inside_turn());
        }
        let lease = s.lease(T, Channel::Hook(HookEvent::PostToolUse), Some("turn"), 10_000, 8_000).unwrap().unwrap();
        assert_eq!(lease.messages.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(), [steer.as_str()]);
        for channel in [Channel::Hook(HookEvent::Stop), Channel::Claude] {
            assert!(s.lease(T, channel, Some("turn"), 10_000, 8_000).unwrap().is_none(), "{channel}");
        }
        let lease = s.lease(T, Channel::Hook(HookEvent::UserPromptSubmit), Some("next"), 10_000, 8_000).unwrap().unwrap();
        assert_eq!(lease.messages[0].id, next);
        assert_eq!(lease.messages[0].mode, Mode::NextTurn);
        assert!(
            !Channel::Wake.inside_turn() && !Channel::ClaudeWake.inside_turn() && !Channel::Hook(HookEvent::SessionStart).inside_turn()
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A name is unique per user (case aside), one per thread, and freed only by clearing it.
    #[test]
    fn names_are_unique_and_one_per_thread() {
        let (mut s, dir) = store();
        assert_eq!(s.name_thread(T, "reviewer").unwrap(), Ok(()));
        assert_eq!(s.thread_named("Reviewer").unwrap().as_ref(), Some(T), "case aside");
        assert_eq!(s.name_thread(U, "REVIEWER").unwrap(), Err(NameTaken::ByThread(T.clone())));
        assert_eq!(s.name_thread(T, "lead").unwrap(), Ok(()), "naming again replaces");
        assert_eq!(s.thread_named("reviewer").unwrap(), None);
        assert_eq!(s.thread_names().unwrap()[T], "lead");
        assert_eq!(s.clear_name("lead").unwrap().as_ref(), Some(T));
        assert_eq!(s.clear_name("lead").unwrap(), None);
        assert_eq!(s.name_thread(U, "reviewer").unwrap(), Ok(()));
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A class's rule wins over the thread's rule for every class; a change applies only on the
    /// revision it names, and moves it on (one signature changes the policy once).
    #[test]
    fn rules_apply_per_class_and_each_revision_once() {
        let (mut s, dir) = store();
        assert_eq!(s.inbound_action(T, SenderClass::Nats).unwrap(), None, "no rule: the config decides");
        assert!(s.set_inbound(T, None, Action::Hold, 0).unwrap());
        assert!(!s.set_inbound(T, None, Action::Accept, 0).unwrap(), "a replayed revision changes nothing");
        assert!(s.set_inbound(T, Some(SenderClass::Person), Action::Accept, 1).unwrap());
        assert_eq!(s.inbound_action(T, SenderClass::Person).unwrap(), Some(Action::Accept));
        assert_eq!(s.inbound_action(T, SenderClass::Nats).unwrap(), Some(Action::Hold));
        assert_eq!(s.inbound_action(U, SenderClass::Nats).unwrap(), None, "per thread");
        assert_eq!(s.inbound_rev(T).unwrap(), 2);
        assert!(s.set_inbound(T, None, Action::Refuse, 2).unwrap());
        assert_eq!(s.inbound_action(T, SenderClass::Person).unwrap(), Some(Action::Refuse), "every class replaces the per-class rules");
        assert_eq!(s.inbound_rules(Some(T)).unwrap().len(), 1);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
