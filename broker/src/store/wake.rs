//! What the wake channel asks of the queue besides the lease and the hand-off every channel uses:
//! which threads have messages it may deliver, its leases a dead broker left, and the turn its
//! `turn/start` opened.

use super::{now_ms, Channel, LeaseToken, Store};
use crate::reason::Reason;
use anyhow::Result;
use courier_shared::ids::ThreadId;
use rusqlite::params;

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
}
