//! Trusted files of a host whose trust is more than one binary, one table for every such host
//! (`trusted_host_files`: host, the file's role, its SHA-256): GitHub Copilot CLI's native binary
//! and the code it unpacks and runs (`cli-main.js`, `index.js`, `runtime.node`). Each file's
//! identity also goes to `codex_files` (`Store::note_codex_file`), so a hook looks a digest up by
//! identity and never hashes.
//!
//! Each row carries the person's signature of trusting exactly that file (`proof`,
//! [`Act::TrustFile`]), and whether it counts is decided each time it is read, by
//! `person::honoured`, as for a trusted binary's row (`signed_trust.rs`): once a person key is
//! set, a row written into the database by anything else than the person's signed act trusts
//! nothing.

use super::{now_ms, Store};
use crate::person::{self, Act, KeyState, PersonKey};
use anyhow::Result;
use rusqlite::{params, Connection};

pub(super) fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS trusted_host_files (
            host     TEXT NOT NULL,
            role     TEXT NOT NULL,
            sha256   TEXT NOT NULL,
            path     TEXT NOT NULL,
            version  TEXT,
            added_at INTEGER NOT NULL,
            PRIMARY KEY (host, role, sha256)
        );",
    )?;
    // Added after the table first shipped: the person's signature of the row's act.
    super::add_column(conn, "trusted_host_files", "proof", "TEXT")
}

/// One trusted file of a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedHostFile {
    pub host: String,
    /// What the file is to the host (`binary`, `cli-main.js`, ...).
    pub role: String,
    pub sha256: String,
    pub path: String,
    pub version: Option<String>,
    /// The person's signature of [`TrustedHostFile::act`] (hex), or none.
    pub proof: Option<String>,
}

impl TrustedHostFile {
    /// What the person signs to trust it.
    pub fn act(&self) -> Act<'_> {
        Act::TrustFile { host: &self.host, role: &self.role, sha256: &self.sha256, path: &self.path }
    }

    /// Whether it counts under `key`.
    pub fn honoured(&self, key: &KeyState) -> bool {
        person::honoured(key, &self.act(), self.proof.as_deref())
    }
}

const COLUMNS: &str = "host, role, sha256, path, version, proof";

fn row(r: &rusqlite::Row) -> rusqlite::Result<TrustedHostFile> {
    Ok(TrustedHostFile { host: r.get(0)?, role: r.get(1)?, sha256: r.get(2)?, path: r.get(3)?, version: r.get(4)?, proof: r.get(5)? })
}

impl Store {
    /// Trusts one file of a host (with its signature, when it has one); true if it was not
    /// trusted before. A file trusted before keeps its row; a signature given now goes on it
    /// (with the path it names).
    pub fn trust_host_file(&mut self, f: &TrustedHostFile) -> Result<bool> {
        let n = self.conn.execute(
            "INSERT INTO trusted_host_files (host, role, sha256, path, version, added_at, proof) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT(host, role, sha256) DO NOTHING",
            params![f.host, f.role, f.sha256, f.path, f.version, now_ms(), f.proof],
        )?;
        if let (0, Some(proof)) = (n, &f.proof) {
            self.sign_host_file(f, proof)?;
        }
        Ok(n > 0)
    }

    /// Whether `sha256` is a trusted file of `host` in `role` now: it has a row, and the row
    /// counts under the person key as it is now.
    pub fn is_trusted_host_file(&self, host: &str, role: &str, sha256: &str) -> Result<bool> {
        let mut stmt =
            self.conn.prepare_cached(&format!("SELECT {COLUMNS} FROM trusted_host_files WHERE host = ?1 AND role = ?2 AND sha256 = ?3"))?;
        let rows = stmt.query_map(params![host, role, sha256], row)?.collect::<rusqlite::Result<Vec<_>>>()?;
        if rows.is_empty() {
            return Ok(false); // no key file read for a digest never trusted
        }
        let key = PersonKey::current();
        Ok(rows.iter().any(|f| f.honoured(&key)))
    }

    /// Whether a trusted file of `host` in `role` was at `path` when trusted.
    pub fn is_trusted_host_path(&self, host: &str, role: &str, path: &str) -> Result<bool> {
        let mut stmt =
            self.conn.prepare_cached("SELECT EXISTS(SELECT 1 FROM trusted_host_files WHERE host = ?1 AND role = ?2 AND path = ?3)")?;
        Ok(stmt.query_row(params![host, role, path], |r| r.get(0))?)
    }

    /// Every trusted file of `host`, newest first.
    pub fn trusted_host_files(&self, host: &str) -> Result<Vec<TrustedHostFile>> {
        let mut stmt =
            self.conn.prepare_cached(&format!("SELECT {COLUMNS} FROM trusted_host_files WHERE host = ?1 ORDER BY added_at DESC, role"))?;
        let rows = stmt.query_map([host], row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Every trusted file of every host, oldest first (`person set` signs those that count).
    pub fn all_trusted_host_files(&self) -> Result<Vec<TrustedHostFile>> {
        let mut stmt = self.conn.prepare_cached(&format!("SELECT {COLUMNS} FROM trusted_host_files ORDER BY added_at, host, role"))?;
        let rows = stmt.query_map([], row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Puts the person's signature `proof` of `f`'s act on its row; false if it has none.
    pub fn sign_host_file(&mut self, f: &TrustedHostFile, proof: &str) -> Result<bool> {
        Ok(self.conn.execute(
            "UPDATE trusted_host_files SET path = ?4, proof = ?5 WHERE host = ?1 AND role = ?2 AND sha256 = ?3",
            params![f.host, f.role, f.sha256, f.path, proof],
        )? > 0)
    }
}
