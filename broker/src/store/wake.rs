//! What the wake channel asks of the queue: which threads have messages it may deliver, its own
//! lease (the same fencing as a hook's, so a message is never offered to both), and the turn its
//! `turn/start` opened.

use super::{Lease, Store};
use anyhow::Result;
use rusqlite::params;

impl Store {
    /// Leases a thread's pending messages to the wake channel (`event` = `wake`): the same
    /// lease as a hook's, so a message is never offered to both; messages sent with
    /// `--wake never` are left for the hooks.
    pub fn lease_for_wake(&mut self, thread: &str, lease_ms: i64, max_bytes: usize) -> Result<Option<Lease>> {
        self.lease_inner(thread, "wake", None, lease_ms, max_bytes, true)
    }

    /// Threads with messages the wake channel may deliver (pending, `--wake auto`).
    pub fn wake_candidates(&self) -> Result<Vec<String>> {
        // One index seek per thread, not a pass over every pending message (INDEXED BY: the planner
        // would take messages_state).
        let mut stmt = self.conn.prepare_cached(
            "WITH RECURSIVE t(thread) AS (
                 SELECT MIN(thread) FROM messages INDEXED BY messages_wake_candidates
                 WHERE state = 'pending' AND kind = 'message' AND wake != 'never'
                 UNION ALL
                 SELECT (SELECT MIN(thread) FROM messages INDEXED BY messages_wake_candidates
                         WHERE state = 'pending' AND kind = 'message' AND wake != 'never' AND thread > t.thread)
                 FROM t WHERE t.thread IS NOT NULL
             )
             SELECT thread FROM t WHERE thread IS NOT NULL LIMIT 256",
        )?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Records the turn a wake's `turn/start` opened on the messages of lease `token`.
    pub fn set_lease_turn(&mut self, token: i64, turn_id: &str) -> Result<()> {
        self.conn.execute(
            "UPDATE messages SET turn_id = ?2 WHERE lease_token = ?1 AND state IN ('leased', 'handed')",
            params![token, turn_id],
        )?;
        Ok(())
    }
}
