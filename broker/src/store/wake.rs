//! What the wake channel asks of the queue besides the lease and the hand-off every channel uses:
//! which threads have messages it may deliver, its leases a dead broker left, the turn its
//! `turn/start` opened, and the running turn an `interrupt` message stops first.

use super::{now_ms, Channel, LeaseToken, Store};
use crate::reason::Reason;
use anyhow::Result;
use courier_shared::ids::ThreadId;
use rusqlite::{params, OptionalExtension};

/// Threads with messages the wake channel may deliver: one index seek per thread, not a pass
/// over every pending message (INDEXED BY: the planner would take messages_state; a plan test
/// holds it).
pub(crate) const WAKE_CANDIDATES: &str = "WITH RECURSIVE t(thread) AS (
         SELECT MIN(thread) FROM messages INDEXED BY messages_wake_candidates
         WHERE state = 'pending' AND kind = 'message' AND wake != 'never'
         UNION ALL
         SELECT (SELECT MIN(thread) FROM messages INDEXED BY messages_wake_candidates
         WHERE state = 'pending' AND kind = 'message' AND wake != 'never' AND thread > t.thread)
         FROM t WHERE t.thread IS NOT NULL
     )
     SELECT thread FROM t WHERE thread IS NOT NULL LIMIT 256";

/// The pending `interrupt` messages of a thread that may still stop a running turn: a wake may
/// deliver them (`--wake auto`), they have not expired, and the turn they stop is not recorded
/// yet or is `?2` (its `turn/interrupt` may not have left before a crash).
const INTERRUPTING: &str = "thread = ?1 AND state = 'pending' AND kind = 'message' AND mode = 'interrupt' AND wake != 'never'
     AND (expires_at IS NULL OR expires_at > ?3) AND (interrupted_turn IS NULL OR interrupted_turn = ?2)";

impl Store {
    /// Returns every lease of `channel` to `pending` at once, live or not: at start-up, for the
    /// wake channel, whose leases only a dead broker's pass can hold. A wake sends nothing before
    /// its hand-off record, so a message still `leased` never reached Codex.
    pub fn release_leases_of(&mut self, channel: Channel, reason: impl Into<Reason>) -> Result<usize> {
        let n = self.conn.execute(
            "UPDATE messages SET state = 'pending', lease_token = NULL, lease_expires_at = NULL,
             reason = ?2, updated_at = ?3 WHERE state = 'leased' AND event = ?1",
            params![channel, reason.into().as_str(), now_ms()],
        )?;
        self.pending.bump(n);
        Ok(n)
    }

    /// Threads with messages the wake channel may deliver (pending, `--wake auto`).
    pub fn wake_candidates(&self) -> Result<Vec<ThreadId>> {
        let mut stmt = self.conn.prepare_cached(WAKE_CANDIDATES)?;
        let rows = stmt.query_map([], |r| super::thread_at(r, 0))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Records the turn a wake's `turn/start` opened on the messages of lease `token`.
    pub fn set_lease_turn(&mut self, token: LeaseToken, turn_id: &str) -> Result<()> {
        self.conn.execute(
            "UPDATE messages SET turn_id = ?2 WHERE lease_token = ?1 AND state IN ('leased', 'handed')",
            params![token, turn_id],
        )?;
        Ok(())
    }

    /// Whether `thread`'s running turn `turn` is to be interrupted: a pending `interrupt`
    /// message has not stopped a turn yet, or stopped exactly this one (the interrupt may not
    /// have left). A message interrupts at most one turn: once its turn ended, it waits for the
    /// wake like a `next-turn` message and stops no other.
    pub fn interrupt_due(&self, thread: &ThreadId, turn: &str) -> Result<bool> {
        let sql = format!("SELECT EXISTS (SELECT 1 FROM messages WHERE {INTERRUPTING})");
        Ok(self.conn.prepare_cached(&sql)?.query_row(params![thread.as_str(), turn, now_ms()], |r| r.get(0))?)
    }

    /// Records, fsynced, that `thread`'s pending `interrupt` messages stop `turn`: BEFORE
    /// `turn/interrupt` is sent, so a broker that dies after sending it interrupts no other turn
    /// for them when it restarts. The messages stay `pending`: the wake delivers them (exactly
    /// once, by its own lease and hand-off). Returns how many messages it names.
    pub fn record_interrupt(&mut self, thread: &ThreadId, turn: &str) -> Result<usize> {
        let sql = format!("UPDATE messages SET interrupted_turn = ?2, updated_at = ?3 WHERE {INTERRUPTING}");
        Ok(self.conn.execute(&sql, params![thread.as_str(), turn, now_ms()])?)
    }

    /// The turn the message `id` interrupted, if it did (for tests and `inspect`).
    pub fn interrupted_turn(&self, id: &str) -> Result<Option<String>> {
        let turn = self.conn.query_row("SELECT interrupted_turn FROM messages WHERE id = ?1", [id], |r| r.get(0)).optional()?;
        Ok(turn.flatten())
    }
}
