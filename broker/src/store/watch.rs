//! Whether the queue changed, for the broker's periodic passes (maintenance every 500 ms, the
//! wake channel every second). SQLite's `data_version` on a connection that never writes changes
//! exactly when another connection commits: the broker's own, `broker send` in another process,
//! the bridge. A pass that found nothing to do at one version finds nothing at the same version
//! (nothing else it reads changes without a commit), so it is skipped until the version moves:
//! an idle broker then costs one `PRAGMA data_version` a pass, not its statements.
//!
//! The version is read BEFORE the pass's own reads: a commit in between makes the pass read a
//! newer queue than the version it is filed under, so the next pass sees the version move and
//! looks again. Never the other way round, so a skip is never taken over an unseen commit.

use super::{State, DB_NAME};
use anyhow::{Context, Result};
use rusqlite::{Connection, OpenFlags};
use std::path::Path;
use std::sync::OnceLock;

/// A read-only connection of one periodic pass, and the version at which its last look found
/// nothing to do.
pub struct Watch {
    conn: Connection,
    /// The version the current look was filed under (read before it).
    looking_at: Option<i64>,
    /// A version at which a look found nothing to do.
    idle_at: Option<i64>,
}

impl Watch {
    pub fn open(state_dir: &Path) -> Result<Watch> {
        let path = state_dir.join(DB_NAME);
        // Read-only: it must never commit, or its own commits would not move its version.
        let conn = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
            .with_context(|| format!("opening {} to watch it", path.display()))?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        Ok(Watch { conn, looking_at: None, idle_at: None })
    }

    fn version(&self) -> Result<i64> {
        Ok(self.conn.prepare_cached("PRAGMA data_version")?.query_row([], |r| r.get(0))?)
    }

    /// Whether nothing was committed since a look found nothing to do (the pass may be skipped).
    /// Otherwise the caller looks, then says what it found ([`Watch::found`]).
    pub fn unchanged_since_idle(&mut self) -> Result<bool> {
        let version = self.version()?;
        if self.idle_at == Some(version) {
            return Ok(true);
        }
        self.looking_at = Some(version);
        Ok(false)
    }

    /// What the look begun by [`Watch::unchanged_since_idle`] found: nothing to do (`idle`), or work.
    pub fn found(&mut self, idle: bool) {
        self.idle_at = if idle { self.looking_at.take() } else { None };
    }

    /// For the maintenance pass: whether no row is in a state that can still move (pending,
    /// leased, handed, applying) since nothing was committed; looks (one index probe) when
    /// something was. Every step of the pass (expiry, lapsed leases, hand-offs to confirm,
    /// orphaned effort claims, threads that never appeared) works on such rows only.
    pub fn nothing_live(&mut self) -> Result<bool> {
        if self.unchanged_since_idle()? {
            return Ok(true);
        }
        let live: bool = self.conn.prepare_cached(any_live_sql())?.query_row([], |r| r.get(0))?;
        self.found(!live);
        Ok(!live)
    }
}

/// `SELECT EXISTS` a row in a state that is not final ([`State::is_final`]).
fn any_live_sql() -> &'static str {
    static SQL: OnceLock<String> = OnceLock::new();
    SQL.get_or_init(|| {
        let live: Vec<String> = State::ALL.iter().filter(|s| !s.is_final()).map(|s| format!("'{}'", s.as_str())).collect();
        format!("SELECT EXISTS (SELECT 1 FROM messages INDEXED BY messages_state WHERE state IN ({}))", live.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Enqueued, Store};

    fn dir() -> std::path::PathBuf {
        courier_shared::scratch::dir("courier-watch")
    }

    /// A commit of another connection ends a skip; a look that found work never starts one; a
    /// final row is not live.
    #[test]
    fn skips_only_between_commits_after_a_look_that_found_nothing() {
        let dir = dir();
        let mut store = Store::open(&dir).unwrap();
        let mut watch = Watch::open(&dir).unwrap();
        assert!(watch.nothing_live().unwrap(), "an empty queue");
        assert!(watch.unchanged_since_idle().unwrap(), "no commit since");
        let Enqueued::New(id) = store.enqueue(crate::store::sample::T1, "hello", None, None, None).unwrap() else { panic!("not new") };
        assert!(!watch.unchanged_since_idle().unwrap(), "a commit of the store's connection");
        watch.found(false);
        assert!(!watch.unchanged_since_idle().unwrap(), "a look that found work starts no skip");
        assert!(!watch.nothing_live().unwrap(), "a pending message");
        assert!(!watch.nothing_live().unwrap(), "still pending, nothing committed: looked at again");
        store.cancel(&id).unwrap();
        assert!(watch.nothing_live().unwrap(), "a cancelled message is final");
        assert!(watch.unchanged_since_idle().unwrap());
        watch.found(false);
        assert!(!watch.unchanged_since_idle().unwrap(), "work found: no skip until a look finds nothing");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The live states are the non-final ones, and the probe seeks the state index.
    #[test]
    fn live_probe_names_every_non_final_state_and_seeks_the_index() {
        for s in State::ALL {
            assert_eq!(any_live_sql().contains(&format!("'{}'", s.as_str())), !s.is_final(), "{s:?}");
        }
        let dir = dir();
        let _store = Store::open(&dir).unwrap();
        let watch = Watch::open(&dir).unwrap();
        let plan: Vec<String> = watch
            .conn
            .prepare(&format!("EXPLAIN QUERY PLAN {}", any_live_sql()))
            .unwrap()
            .query_map([], |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert!(plan.iter().any(|p| p.contains("USING COVERING INDEX messages_state")), "{plan:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
