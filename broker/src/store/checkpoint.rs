//! WAL checkpoints off the hook path. SQLite checkpoints inside whichever commit pushes the WAL
//! past `wal_autocheckpoint` pages (1,000 by default): with a large queue that commit, a hook
//! call's ticket or lease, copied and fsynced the pages for 135-431 ms, near hook-client's
//! 500 ms deadline. So the broker's own connection checkpoints only as a safety net
//! ([`SAFETY_NET_PAGES`], should the maintenance thread stall), and the maintenance thread runs
//! a PASSIVE checkpoint on a connection of its own ([`Checkpointer`]) every pass: PASSIVE never
//! waits for, and never blocks, the writer or the readers.
//!
//! Other processes that open the store (`broker send` without a broker, `inspect`, the bridge)
//! keep SQLite's default, so the WAL never grows without bound when no broker runs.

use super::{Store, DB_NAME};
use anyhow::{Context, Result};
use rusqlite::Connection;
use std::path::Path;

/// The broker connection's own `wal_autocheckpoint`: 40 MiB of WAL, far above what one
/// maintenance period writes.
pub const SAFETY_NET_PAGES: i64 = 10_000;

impl Store {
    /// For the broker's connection: checkpoint in the maintenance thread, not in the commit.
    pub fn defer_checkpoints(&self) -> Result<()> {
        self.conn.pragma_update(None, "wal_autocheckpoint", SAFETY_NET_PAGES)?;
        Ok(())
    }
}

/// A connection that only checkpoints.
pub struct Checkpointer {
    conn: Connection,
    /// `data_version` when the last checkpoint copied everything: nothing committed since, nothing to do.
    clean_at: std::cell::Cell<Option<i64>>,
}

/// What one checkpoint did, in WAL frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpointed {
    pub wal_frames: i64,
    pub copied: i64,
}

impl Checkpointer {
    pub fn open(state_dir: &Path) -> Result<Checkpointer> {
        let path = state_dir.join(DB_NAME);
        let conn = Connection::open(&path).with_context(|| format!("opening {} to checkpoint", path.display()))?;
        // Never checkpoint from its own (non-existent) commits; FULL: the copy is fsynced.
        conn.pragma_update(None, "synchronous", "FULL")?;
        Ok(Checkpointer { conn, clean_at: std::cell::Cell::new(None) })
    }

    /// Copies what it can of the WAL into the database without waiting for anyone. Skipped (all
    /// zero) when nobody has committed since the last one copied everything: an idle broker
    /// runs this twice a second.
    pub fn passive(&self) -> Result<Checkpointed> {
        let version: i64 = self.conn.prepare_cached("PRAGMA data_version")?.query_row([], |r| r.get(0))?;
        if self.clean_at.get() == Some(version) {
            return Ok(Checkpointed { wal_frames: 0, copied: 0 });
        }
        let (_busy, wal_frames, copied): (i64, i64, i64) =
            self.conn.prepare_cached("PRAGMA wal_checkpoint(PASSIVE)")?.query_row([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        self.clean_at.set((copied == wal_frames).then_some(version));
        Ok(Checkpointed { wal_frames, copied })
    }
}
