//! The Codex trust tables: trusted binaries (`trusted_codex`, with how each became trusted), file
//! identities known to hold a digest (`codex_files`), and the `codex` commands the broker follows
//! (`codex_commands`).

use super::{now_ms, Store};
use crate::exe::ExeKey;
use anyhow::Result;
use rusqlite::{params, OptionalExtension};

/// How a binary came to be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrustHow {
    /// `broker trust-codex PATH`.
    Manual,
    /// `broker install` (the user's `codex` and the managed-daemon releases at install time).
    Install,
    /// The broker itself: the user's own `codex` now resolves to this binary (an upgrade).
    Followed,
}

impl TrustHow {
    pub fn as_str(self) -> &'static str {
        match self {
            TrustHow::Manual => "manual",
            TrustHow::Install => "install",
            TrustHow::Followed => "followed",
        }
    }

    pub fn parse(s: &str) -> TrustHow {
        match s {
            "install" => TrustHow::Install,
            "followed" => TrustHow::Followed,
            _ => TrustHow::Manual,
        }
    }
}

/// One trusted Codex binary, as `broker inspect --json` and `broker doctor` list it.
#[derive(Debug, Clone, PartialEq)]
pub struct TrustedCodex {
    pub sha256: String,
    /// The native binary's path when it was trusted.
    pub path: String,
    pub version: Option<String>,
    pub how: TrustHow,
    /// For `followed` and `install`: the `codex` command whose resolution it was.
    pub source: Option<String>,
    pub added_at: i64,
}

impl Store {
    /// Records a trusted Codex binary; false (and nothing changed) if its digest was trusted already.
    pub fn trust_codex(&mut self, t: &TrustedCodex) -> Result<bool> {
        let n = self.conn.execute(
            "INSERT INTO trusted_codex (sha256, path, added_at, version, how, source) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT(sha256) DO NOTHING",
            params![t.sha256, t.path, t.added_at, t.version, t.how.as_str(), t.source],
        )?;
        Ok(n > 0)
    }

    /// Forgets a trusted Codex digest (`broker uninstall`); true if it was trusted.
    pub fn untrust_codex(&mut self, sha256: &str) -> Result<bool> {
        Ok(self.conn.execute("DELETE FROM trusted_codex WHERE sha256 = ?1", [sha256])? > 0)
    }

    /// Whether a Codex binary of this digest is trusted now (its row counts: `signed_trust.rs`).
    pub fn is_trusted_codex(&self, sha256: &str) -> Result<bool> {
        self.is_trusted(crate::person::TrustedHost::Codex, sha256)
    }

    /// Remembers that the file with identity `key` holds `sha256`.
    pub fn note_codex_file(&mut self, key: &ExeKey, sha256: &str) -> Result<()> {
        self.conn.execute(
            "INSERT INTO codex_files (dev, ino, size, mtime_ns, ctime_ns, sha256) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT(dev, ino) DO UPDATE SET size = ?3, mtime_ns = ?4, ctime_ns = ?5, sha256 = ?6",
            params![key.dev as i64, key.ino as i64, key.size as i64, key.mtime_ns as i64, key.ctime_ns as i64, sha256],
        )?;
        Ok(())
    }

    /// Hashes the file at `path` and records its identity with its digest (whatever host it is
    /// of), so a broker never hashes this file again. A file that changed while hashed is an error.
    pub fn hash_and_note(&mut self, path: &std::path::Path) -> Result<String> {
        let (key, digest) = crate::exe::hash_identified(path)?;
        self.note_codex_file(&key, &digest)?;
        Ok(digest)
    }

    /// The digest recorded for a file of exactly this identity, if any.
    pub fn codex_file_digest(&self, key: &ExeKey) -> Result<Option<String>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT sha256 FROM codex_files WHERE dev = ?1 AND ino = ?2 AND size = ?3 AND mtime_ns = ?4 AND ctime_ns = ?5",
        )?;
        Ok(stmt
            .query_row(params![key.dev as i64, key.ino as i64, key.size as i64, key.mtime_ns as i64, key.ctime_ns as i64], |r| r.get(0))
            .optional()?)
    }

    /// The sizes of trusted binaries whose file identity is recorded (`codex_files`): a byte copy
    /// of one (a managed-daemon release) has one of these sizes.
    pub fn trusted_codex_sizes(&self) -> Result<Vec<u64>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT DISTINCT f.size FROM codex_files f JOIN trusted_codex t ON t.sha256 = f.sha256 ORDER BY f.size")?;
        let rows = stmt.query_map([], |r| r.get::<_, i64>(0))?;
        Ok(rows.map(|r| r.map(|n| n as u64)).collect::<rusqlite::Result<_>>()?)
    }

    /// Whether a binary at `path` was trusted (by any digest).
    pub fn is_trusted_codex_path(&self, path: &str) -> Result<bool> {
        let mut stmt = self.conn.prepare_cached("SELECT EXISTS(SELECT 1 FROM trusted_codex WHERE path = ?1)")?;
        Ok(stmt.query_row([path], |r| r.get(0))?)
    }

    /// Every trusted binary, oldest first.
    pub fn trusted_codex(&self) -> Result<Vec<TrustedCodex>> {
        let mut stmt =
            self.conn.prepare_cached("SELECT sha256, path, added_at, version, how, source FROM trusted_codex ORDER BY added_at, sha256")?;
        let rows = stmt.query_map([], |r| {
            Ok(TrustedCodex {
                sha256: r.get(0)?,
                path: r.get(1)?,
                added_at: r.get(2)?,
                version: r.get(3)?,
                how: TrustHow::parse(&r.get::<_, String>(4)?),
                source: r.get(5)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Adds a `codex` command for the broker to follow; true if it was new.
    pub fn follow_codex_command(&mut self, command: &str) -> Result<bool> {
        let n = self.conn.execute(
            "INSERT INTO codex_commands (command, added_at) VALUES (?1, ?2) ON CONFLICT(command) DO NOTHING",
            params![command, now_ms()],
        )?;
        Ok(n > 0)
    }

    pub fn unfollow_codex_command(&mut self, command: &str) -> Result<bool> {
        Ok(self.conn.execute("DELETE FROM codex_commands WHERE command = ?1", [command])? > 0)
    }

    pub fn codex_commands(&self) -> Result<Vec<String>> {
        let mut stmt = self.conn.prepare_cached("SELECT command FROM codex_commands ORDER BY added_at, command")?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}
