//! Trusted files of a host whose trust is more than one binary, one table for every such host
//! (`trusted_host_files`: host, the file's role, its SHA-256): GitHub Copilot CLI's native binary
//! and the code it unpacks and runs (`cli-main.js`, `index.js`, `runtime.node`). Each file's
//! identity also goes to `codex_files` (`Store::note_codex_file`), so a hook looks a digest up by
//! identity and never hashes.

use super::{now_ms, Store};
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
    )
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
}

impl Store {
    /// Trusts one file of a host; true if it was not trusted before.
    pub fn trust_host_file(&mut self, f: &TrustedHostFile) -> Result<bool> {
        let n = self.conn.execute(
            "INSERT INTO trusted_host_files (host, role, sha256, path, version, added_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT(host, role, sha256) DO NOTHING",
            params![f.host, f.role, f.sha256, f.path, f.version, now_ms()],
        )?;
        Ok(n > 0)
    }

    /// Whether `sha256` is a trusted file of `host` in `role`.
    pub fn is_trusted_host_file(&self, host: &str, role: &str, sha256: &str) -> Result<bool> {
        let mut stmt =
            self.conn.prepare_cached("SELECT EXISTS(SELECT 1 FROM trusted_host_files WHERE host = ?1 AND role = ?2 AND sha256 = ?3)")?;
        Ok(stmt.query_row(params![host, role, sha256], |r| r.get(0))?)
    }

    /// Whether a trusted file of `host` in `role` was at `path` when trusted.
    pub fn is_trusted_host_path(&self, host: &str, role: &str, path: &str) -> Result<bool> {
        let mut stmt =
            self.conn.prepare_cached("SELECT EXISTS(SELECT 1 FROM trusted_host_files WHERE host = ?1 AND role = ?2 AND path = ?3)")?;
        Ok(stmt.query_row(params![host, role, path], |r| r.get(0))?)
    }

    /// Every trusted file of `host`, newest first.
    pub fn trusted_host_files(&self, host: &str) -> Result<Vec<TrustedHostFile>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT host, role, sha256, path, version FROM trusted_host_files WHERE host = ?1 ORDER BY added_at DESC, role",
        )?;
        let rows = stmt.query_map([host], |r| {
            Ok(TrustedHostFile { host: r.get(0)?, role: r.get(1)?, sha256: r.get(2)?, path: r.get(3)?, version: r.get(4)? })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}
