//! What the broker's maintenance pass and prune ask of the queue: `--ttl`s that ran out, leases
//! whose time is up, and forgetting what no longer matters.

use super::{now_ms, Store};
use crate::reason::DeliveryReason;
use anyhow::Result;
use rusqlite::params;

/// Expires every pending message whose `--ttl` ran out. INDEXED BY: the planner would take
/// messages_state and visit every pending message (a plan test holds it).
pub(crate) const EXPIRE_DUE: &str = "UPDATE messages INDEXED BY messages_pending_expiry SET state = 'expired', reason = ?2, updated_at = ?1
     WHERE state = 'pending' AND expires_at IS NOT NULL AND expires_at <= ?1
     AND NOT EXISTS (SELECT 1 FROM message_parts p WHERE p.message = messages.id)";

impl Store {
    /// Forgets what no longer matters: messages in a final state not touched for `retention_ms`
    /// (their idempotency keys and parts with them), codex records of leases no longer live, and all but the
    /// newest Stop-continuation counters. Returns the messages removed.
    pub fn prune(&mut self, retention_ms: i64) -> Result<usize> {
        let cutoff = now_ms() - retention_ms;
        let tx = self.conn.transaction()?;
        let removed = tx.execute(
            "DELETE FROM messages WHERE updated_at < ?1
             AND state IN ('confirmed', 'uncertain', 'expired', 'cancelled', 'applied', 'failed')",
            [cutoff],
        )?;
        tx.execute("DELETE FROM message_parts WHERE message NOT IN (SELECT id FROM messages)", [])?;
        // A part's hand-off keeps its claude on record until its message is gone: confirmation
        // asks whether each part's claude is alive.
        tx.execute(
            "DELETE FROM handed_to WHERE lease_token NOT IN
             (SELECT lease_token FROM messages WHERE lease_token IS NOT NULL AND state IN ('leased', 'handed')
              UNION SELECT lease_token FROM message_parts)",
            [],
        )?;
        tx.execute("DELETE FROM stop_blocks WHERE rowid <= (SELECT MAX(rowid) FROM stop_blocks) - 10000", [])?;
        super::tickets::prune(&tx, cutoff)?;
        tx.commit()?;
        Ok(removed)
    }

    /// Retires every pending message whose `--ttl` ran out (the broker's maintenance pass, so a
    /// message expires on time whether or not a hook of its thread ever fires). Returns how many.
    pub fn expire_due(&mut self) -> Result<usize> {
        let now = now_ms();
        Ok(self.conn.execute(EXPIRE_DUE, params![now, DeliveryReason::TtlElapsed.as_str()])?)
    }

    /// Releases every lease whose time is up (after a broker crash, or a client that vanished).
    pub fn release_expired_leases(&mut self) -> Result<usize> {
        let now = now_ms();
        let n = self.conn.execute(
            "UPDATE messages SET state = 'pending', lease_token = NULL, lease_expires_at = NULL,
             reason = ?2, updated_at = ?1 WHERE state = 'leased' AND lease_expires_at <= ?1",
            params![now, DeliveryReason::LeaseExpired.as_str()],
        )?;
        self.pending.bump(n);
        Ok(n)
    }
}
