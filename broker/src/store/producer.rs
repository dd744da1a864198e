//! What the producer commands (`broker status`, `wait`, `threads`, `send`) ask of the queue: one
//! message by id, the per-thread counts, whether anything changed, and the expiry of messages
//! whose thread never appeared.

use super::{now_ms, row_to_message, Message, State, StateCounts, Store, MESSAGE_COLUMNS};
use crate::reason::DeliveryReason;
use anyhow::Result;
use courier_shared::ids::ThreadId;
use rusqlite::{params, OptionalExtension};
use std::collections::BTreeMap;

/// Threads with pending messages with no `--ttl` queued before `?1`: one index seek per thread,
/// not a pass over every pending message (INDEXED BY: the planner would take messages_state; a
/// plan test holds it).
pub(crate) const PENDING_SINCE: &str = "WITH RECURSIVE t(thread) AS (
         SELECT MIN(thread) FROM messages INDEXED BY messages_pending_no_ttl WHERE state = 'pending' AND expires_at IS NULL
         UNION ALL
         SELECT (SELECT MIN(thread) FROM messages INDEXED BY messages_pending_no_ttl
         WHERE state = 'pending' AND expires_at IS NULL AND thread > t.thread)
         FROM t WHERE t.thread IS NOT NULL
     )
     SELECT thread FROM t WHERE thread IS NOT NULL
       AND EXISTS (SELECT 1 FROM messages m INDEXED BY messages_pending_no_ttl WHERE m.thread = t.thread AND m.state = 'pending'
           AND m.expires_at IS NULL AND m.created_at < ?1)";

impl Store {
    /// The message with this id, if the queue has it.
    pub fn message(&self, id: &str) -> Result<Option<Message>> {
        let mut stmt = self.conn.prepare_cached(&format!("SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = ?1"))?;
        Ok(stmt.query_row([id], row_to_message).optional()?)
    }

    /// The message queued with idempotency key `key`, if the queue has it.
    pub fn message_by_key(&self, key: &str) -> Result<Option<Message>> {
        let mut stmt = self.conn.prepare_cached(&format!("SELECT {MESSAGE_COLUMNS} FROM messages WHERE idem_key = ?1"))?;
        Ok(stmt.query_row([key], row_to_message).optional()?)
    }

    /// Per thread, how many context messages are in each state.
    pub fn counts_by_thread(&self) -> Result<BTreeMap<ThreadId, StateCounts>> {
        let mut stmt =
            self.conn.prepare_cached("SELECT thread, state, COUNT(*) FROM messages WHERE kind = 'message' GROUP BY thread, state")?;
        let mut out: BTreeMap<ThreadId, StateCounts> = BTreeMap::new();
        let rows = stmt.query_map([], |r| Ok((super::thread_at(r, 0)?, super::column::<State>(r, 1)?, r.get::<_, i64>(2)?)))?;
        for row in rows {
            let (thread, state, n) = row?;
            out.entry(thread).or_default().insert(state, n as u64);
        }
        Ok(out)
    }

    /// SQLite's `data_version`: changes when another connection commits to the database.
    pub fn data_version(&self) -> Option<i64> {
        self.conn.prepare_cached("PRAGMA data_version").ok()?.query_row([], |r| r.get(0)).ok()
    }

    /// Threads with pending messages that have no `--ttl` and were queued before `cutoff`.
    pub fn threads_pending_since(&self, cutoff: i64) -> Result<Vec<ThreadId>> {
        let mut stmt = self.conn.prepare_cached(PENDING_SINCE)?;
        let rows = stmt.query_map([cutoff], |r| super::thread_at(r, 0))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Expires `thread`'s pending messages with no `--ttl` queued before `cutoff`: their thread
    /// never appeared (`thread_never_appeared`). Returns how many.
    pub fn expire_never_appeared(&mut self, thread: &ThreadId, cutoff: i64) -> Result<usize> {
        let thread = thread.as_str();
        Ok(self.conn.execute(
            "UPDATE messages SET state = 'expired', reason = ?4, updated_at = ?3
             WHERE thread = ?1 AND state = 'pending' AND expires_at IS NULL AND created_at < ?2
             AND NOT EXISTS (SELECT 1 FROM message_parts p WHERE p.message = messages.id)",
            params![thread, cutoff, now_ms(), DeliveryReason::ThreadNeverAppeared.as_str()],
        )?)
    }

    /// Makes every message look `ms` older (tests of time-based rules, without a fake clock).
    #[cfg(test)]
    pub(crate) fn backdate_messages(&mut self, ms: i64) {
        self.conn.execute("UPDATE messages SET created_at = created_at - ?1", [ms]).unwrap();
    }
}
