//! Effort rows live in the queue's `messages` table (`kind = 'effort'`, `body` = the level) with
//! two extra columns added by [`migrate`]. Their states:
//! `pending -> applying -> applied | failed | uncertain`, or `cancelled` (superseded or by the
//! user). `applying` is a fenced claim: exactly one hook call wins it, and it is never returned
//! to `pending` once the request may have been sent.

use super::{new_message_id, next_fencing_token, now_ms, LeaseToken, State, Store};
use crate::config::{EffortLevel, EffortScope};
use anyhow::Result;
use courier_shared::ids::ThreadId;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::collections::HashMap;

/// Safe on existing databases: adds what is missing, touches nothing else.
pub(super) fn migrate(conn: &Connection) -> Result<()> {
    for (name, decl) in [("scope", "TEXT"), ("effort_detail", "TEXT")] {
        super::add_column(conn, "messages", name, decl)?;
    }
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS effort_streaks (
            thread    TEXT NOT NULL,
            tool      TEXT NOT NULL,
            failures  INTEGER NOT NULL DEFAULT 0,
            successes INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (thread, tool)
        );",
    )?;
    Ok(())
}

#[derive(Debug, Clone)]
pub struct Claim {
    pub id: String,
    pub token: LeaseToken,
    pub level: EffortLevel,
    pub scope: EffortScope,
}

/// `id -> (scope, detail)` of effort rows, for inspect.
pub type Details = HashMap<String, (Option<String>, Option<String>)>;

impl Store {
    /// Queues `level` for `thread`; older unapplied requests of the thread become `cancelled`
    /// (`superseded`). Returns the new id and the ids it superseded.
    pub fn effort_enqueue(
        &mut self,
        thread: &ThreadId,
        level: EffortLevel,
        scope: EffortScope,
        from: &str,
    ) -> Result<(String, Vec<String>)> {
        let thread = thread.as_str();
        let now = now_ms();
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let superseded: Vec<String> = tx
            .prepare("SELECT id FROM messages WHERE thread = ?1 AND kind = 'effort' AND state = 'pending' ORDER BY seq")?
            .query_map([thread], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        tx.execute(
            "UPDATE messages SET state = 'cancelled', reason = 'superseded', updated_at = ?2
             WHERE thread = ?1 AND kind = 'effort' AND state = 'pending'",
            params![thread, now],
        )?;
        let id = new_message_id();
        tx.execute(
            "INSERT INTO messages (id, thread, kind, body, sender, state, created_at, updated_at, scope)
             VALUES (?1, ?2, 'effort', ?3, ?4, 'pending', ?5, ?5, ?6)",
            params![id, thread, level.as_str(), from, now, scope.as_str()],
        )?;
        tx.commit()?;
        self.pending.bump(1);
        Ok((id, superseded))
    }

    pub fn effort_has_pending(&self, thread: &ThreadId) -> Result<bool> {
        let thread = thread.as_str();
        let mut stmt = self
            .conn
            .prepare_cached("SELECT EXISTS(SELECT 1 FROM messages WHERE thread = ?1 AND kind = 'effort' AND state = 'pending')")?;
        Ok(stmt.query_row([thread], |r| r.get(0))?)
    }

    /// Records why the pending request of `thread` still waits (only when the reason changes).
    pub fn effort_mark_waiting(&self, thread: &ThreadId, reason: &str) -> Result<()> {
        let thread = thread.as_str();
        self.conn.execute(
            "UPDATE messages SET reason = ?2, updated_at = ?3
             WHERE thread = ?1 AND kind = 'effort' AND state = 'pending' AND reason IS NOT ?2",
            params![thread, reason, now_ms()],
        )?;
        Ok(())
    }

    /// Claims the newest pending request of `thread` under a new fencing token (`applying`).
    /// A hook with no turn id (`turn_id` None) takes only a thread-scope request; a turn-scope one
    /// waits for a hook with a turn (reason `waiting_for_turn`).
    pub fn effort_claim(
        &mut self,
        thread: &ThreadId,
        event: &str,
        turn_id: Option<&str>,
        rollout: (&str, u64),
        detail: &str,
    ) -> Result<Option<Claim>> {
        let thread = thread.as_str();
        let now = now_ms();
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let row: Option<(String, String, Option<String>)> = tx
            .query_row(
                "SELECT id, body, scope FROM messages WHERE thread = ?1 AND kind = 'effort' AND state = 'pending'
                 ORDER BY seq DESC LIMIT 1",
                [thread],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let Some((id, level, scope)) = row else {
            return Ok(None);
        };
        // Only `effort_enqueue` writes these rows; a body that is no level is not applied.
        let Ok(level) = EffortLevel::parse(&level) else {
            tx.execute("UPDATE messages SET state = 'cancelled', reason = 'not_allowed', updated_at = ?2 WHERE id = ?1", params![id, now])?;
            tx.commit()?;
            return Ok(None);
        };
        // A row written before scopes existed is a turn change; an unknown scope is read as one
        // too (it then waits for a hook with a turn, the safer of the two).
        let scope = scope.as_deref().map_or(EffortScope::Turn, |s| EffortScope::parse(s).unwrap_or(EffortScope::Turn));
        if scope == EffortScope::Turn && turn_id.is_none() {
            tx.execute("UPDATE messages SET reason = 'waiting_for_turn' WHERE id = ?1 AND reason IS NOT 'waiting_for_turn'", [&id])?;
            tx.commit()?;
            return Ok(None);
        }
        let token = next_fencing_token(&tx)?;
        // Only one pending row per thread should exist; any older one is superseded all the same.
        tx.execute(
            "UPDATE messages SET state = 'cancelled', reason = 'superseded', updated_at = ?3
             WHERE thread = ?1 AND kind = 'effort' AND state = 'pending' AND id != ?2",
            params![thread, id, now],
        )?;
        let n = tx.execute(
            "UPDATE messages SET state = 'applying', lease_token = ?2, event = ?3, turn_id = ?4, handed_at = ?5,
             updated_at = ?5, attempts = attempts + 1, reason = NULL, rollout_path = ?6, scan_offset = ?7,
             effort_detail = ?8
             WHERE id = ?1 AND state = 'pending'",
            params![id, token, event, turn_id, now, rollout.0, rollout.1 as i64, detail],
        )?;
        tx.commit()?;
        Ok((n == 1).then_some(Claim { id, token, level, scope }))
    }

    /// Moves a claimed request to its outcome; false when the claim was no longer ours.
    pub fn effort_settle(&self, c: &Claim, state: State, reason: Option<&str>) -> Result<bool> {
        let now = now_ms();
        let n = self.conn.execute(
            "UPDATE messages SET state = ?3, reason = ?4, updated_at = ?5, lease_token = NULL,
             confirmed_at = CASE WHEN ?3 = 'applied' AND scope = 'turn' THEN ?5 ELSE confirmed_at END
             WHERE id = ?1 AND lease_token = ?2 AND state = 'applying'",
            params![c.id, c.token, state.as_str(), reason, now],
        )?;
        Ok(n == 1)
    }

    /// Nothing was sent: the claim goes back to `pending` for a later hook.
    pub fn effort_unclaim(&self, c: &Claim, reason: &str) -> Result<bool> {
        let n = self.conn.execute(
            "UPDATE messages SET state = 'pending', reason = ?3, updated_at = ?4, lease_token = NULL
             WHERE id = ?1 AND lease_token = ?2 AND state = 'applying'",
            params![c.id, c.token, reason, now_ms()],
        )?;
        Ok(n == 1)
    }

    /// The rollout shows a thread-scope change in effect.
    pub fn effort_confirm(&self, id: &str) -> Result<bool> {
        let n = self.conn.execute(
            "UPDATE messages SET confirmed_at = ?2, updated_at = ?2 WHERE id = ?1 AND state = 'applied' AND confirmed_at IS NULL",
            params![id, now_ms()],
        )?;
        Ok(n == 1)
    }

    /// Claims nobody will settle (the broker stopped, or a worker died) become `uncertain`: the
    /// request may have reached Codex, so it is never sent again. `older_than_ms`: None = all.
    pub fn effort_sweep_orphans(&self, older_than_ms: Option<i64>, reason: &str) -> Result<usize> {
        let now = now_ms();
        let cutoff = older_than_ms.map_or(i64::MAX, |ms| now - ms);
        Ok(self.conn.execute(
            "UPDATE messages SET state = 'uncertain', reason = ?1, updated_at = ?2, lease_token = NULL
             WHERE kind = 'effort' AND state = 'applying' AND handed_at <= ?3",
            params![reason, now, cutoff],
        )?)
    }

    /// The effort Codex last reported applied for `thread` (what the policy has adopted).
    pub fn effort_adopted(&self, thread: &ThreadId) -> Result<Option<EffortLevel>> {
        let thread = thread.as_str();
        Ok(self
            .conn
            .query_row(
                "SELECT body FROM messages WHERE thread = ?1 AND kind = 'effort' AND state = 'applied'
                 ORDER BY updated_at DESC, seq DESC LIMIT 1",
                [thread],
                |r| r.get::<_, String>(0),
            )
            .optional()?
            .and_then(|l| EffortLevel::parse(&l).ok()))
    }

    /// The newest request of `thread` not settled yet.
    pub fn effort_in_flight(&self, thread: &ThreadId) -> Result<Option<EffortLevel>> {
        let thread = thread.as_str();
        Ok(self
            .conn
            .query_row(
                "SELECT body FROM messages WHERE thread = ?1 AND kind = 'effort' AND state IN ('pending', 'applying')
                 ORDER BY seq DESC LIMIT 1",
                [thread],
                |r| r.get::<_, String>(0),
            )
            .optional()?
            .and_then(|l| EffortLevel::parse(&l).ok()))
    }

    /// Updates the consecutive-outcome streaks of `tool` in `thread`; returns (failures, successes).
    pub fn effort_record_outcome(&self, thread: &ThreadId, tool: &str, success: bool) -> Result<(u32, u32)> {
        let thread = thread.as_str();
        let (f, s) = if success { (0, 1) } else { (1, 0) };
        Ok(self.conn.query_row(
            "INSERT INTO effort_streaks (thread, tool, failures, successes) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(thread, tool) DO UPDATE SET
               failures = CASE WHEN ?3 = 1 THEN failures + 1 ELSE 0 END,
               successes = CASE WHEN ?4 = 1 THEN successes + 1 ELSE 0 END
             RETURNING failures, successes",
            params![thread, tool, f, s],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?)
    }

    /// `id -> (scope, detail)` of effort rows, for inspect.
    pub fn effort_details(&self, thread: Option<&ThreadId>) -> Result<Details> {
        let thread = thread.map(ThreadId::as_str);
        let mut stmt = self
            .conn
            .prepare_cached("SELECT id, scope, effort_detail FROM messages WHERE kind = 'effort' AND (?1 IS NULL OR thread = ?1)")?;
        let rows = stmt.query_map([thread], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?))))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}
