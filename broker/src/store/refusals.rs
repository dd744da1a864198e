//! Refused hook calls, the most recent [`REFUSALS_KEPT`] kept for `broker inspect` and `broker doctor`.

use super::{now_ms, Store};
use crate::refusal::RefusalCode;
use anyhow::Result;
use courier_shared::ids::ThreadId;
use rusqlite::params;
use serde::Serialize;

/// Refusals are diagnostics, committed without an fsync ([`Store::unsynced`]): an OS crash may
/// lose the last few, and no hook call waits on a disk flush for one.
impl Store {
    pub fn record_refusal(
        &mut self,
        reason: RefusalCode,
        detail: &str,
        thread: Option<&str>,
        event: Option<&str>,
        pid: Option<i64>,
    ) -> Result<()> {
        self.unsynced(|s| {
            let tx = s.conn.transaction()?;
            insert_refusal(&tx, reason, detail, thread, event, pid)?;
            trim_refusals(&tx)?;
            tx.commit()?;
            Ok(())
        })
    }

    /// Records refusals made at accept (no request read: no thread, no event), as (code, detail,
    /// peer pid), in one transaction: a flood of them costs one commit under the store lock that
    /// hook calls wait for, not one each.
    pub fn record_refusals_at_accept(&mut self, refusals: &[(RefusalCode, String, i32)]) -> Result<()> {
        if refusals.is_empty() {
            return Ok(());
        }
        self.unsynced(|s| {
            let tx = s.conn.transaction()?;
            for (code, detail, pid) in refusals {
                insert_refusal(&tx, *code, detail, None, None, Some(i64::from(*pid)))?;
            }
            trim_refusals(&tx)?;
            tx.commit()?;
            Ok(())
        })
    }

    pub fn refusals(&self, thread: Option<&ThreadId>, limit: i64) -> Result<Vec<Refusal>> {
        let thread = thread.map(ThreadId::as_str);
        let mut stmt = self.conn.prepare_cached(
            "SELECT at, reason, detail, thread, event, pid FROM refusals
             WHERE (?1 IS NULL OR thread = ?1) ORDER BY seq DESC LIMIT ?2",
        )?;
        let rows = stmt.query_map(params![thread, limit], |r| {
            Ok(Refusal { at: r.get(0)?, reason: r.get(1)?, detail: r.get(2)?, thread: r.get(3)?, event: r.get(4)?, pid: r.get(5)? })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Refusal {
    pub at: i64,
    pub reason: String,
    pub detail: String,
    pub thread: Option<String>,
    pub event: Option<String>,
    pub pid: Option<i64>,
}

fn insert_refusal(
    tx: &rusqlite::Transaction,
    reason: RefusalCode,
    detail: &str,
    thread: Option<&str>,
    event: Option<&str>,
    pid: Option<i64>,
) -> Result<()> {
    tx.execute(
        "INSERT INTO refusals (at, reason, detail, thread, event, pid) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![now_ms(), reason.as_str(), detail, thread, event, pid],
    )?;
    Ok(())
}

/// Keeps the newest [`REFUSALS_KEPT`].
fn trim_refusals(tx: &rusqlite::Transaction) -> Result<()> {
    tx.execute("DELETE FROM refusals WHERE seq <= (SELECT MAX(seq) FROM refusals) - ?1", [REFUSALS_KEPT])?;
    Ok(())
}

/// Most recent refusals kept for `inspect`.
const REFUSALS_KEPT: i64 = 1000;
