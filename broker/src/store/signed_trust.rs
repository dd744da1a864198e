//! A trusted binary's row and the person's signature on it (`proof`): whether the row counts is
//! decided each time it is read, by `person::honoured` (a row written into the database by
//! anything else than the person's signed act trusts nothing once a person key is set). The
//! hook path asks [`Store::is_trusted`] once per digest and remembers the answer
//! (`server/trust.rs`); its own statement then only confirms the row was not removed since.

use super::Store;
use crate::person::{self, Act, KeyState, PersonKey, TrustedHost};
use anyhow::Result;
use rusqlite::{params, OptionalExtension};

/// One trusted binary's row as signed: what the person's [`Act::Trust`] names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustRow {
    pub host: TrustedHost,
    pub sha256: String,
    pub path: String,
    pub proof: Option<String>,
}

impl TrustRow {
    pub fn act(&self) -> Act<'_> {
        Act::Trust { host: self.host, sha256: &self.sha256, path: &self.path }
    }

    /// Whether it counts under `key`.
    pub fn honoured(&self, key: &KeyState) -> bool {
        person::honoured(key, &self.act(), self.proof.as_deref())
    }
}

fn select_one(host: TrustedHost) -> &'static str {
    match host {
        TrustedHost::Codex => "SELECT path, proof FROM trusted_codex WHERE sha256 = ?1",
        TrustedHost::Claude => "SELECT path, proof FROM trusted_claude WHERE sha256 = ?1",
    }
}

fn select_all(host: TrustedHost) -> &'static str {
    match host {
        TrustedHost::Codex => "SELECT sha256, path, proof FROM trusted_codex ORDER BY added_at, sha256",
        TrustedHost::Claude => "SELECT sha256, path, proof FROM trusted_claude ORDER BY added_at, sha256",
    }
}

fn update_proof(host: TrustedHost) -> &'static str {
    match host {
        TrustedHost::Codex => "UPDATE trusted_codex SET path = ?2, proof = ?3 WHERE sha256 = ?1",
        TrustedHost::Claude => "UPDATE trusted_claude SET path = ?2, proof = ?3 WHERE sha256 = ?1",
    }
}

impl Store {
    /// Whether `host`'s binary of digest `sha256` is trusted now: it has a row, and the row
    /// counts under the person key as it is now.
    pub(super) fn is_trusted(&self, host: TrustedHost, sha256: &str) -> Result<bool> {
        let row = self
            .conn
            .prepare_cached(select_one(host))?
            .query_row([sha256], |r| Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?)))
            .optional()?;
        Ok(row.is_some_and(|(path, proof)| TrustRow { host, sha256: sha256.into(), path, proof }.honoured(&PersonKey::current())))
    }

    /// Every trusted binary of `host` with its signature, oldest first.
    pub fn trust_rows(&self, host: TrustedHost) -> Result<Vec<TrustRow>> {
        let mut stmt = self.conn.prepare_cached(select_all(host))?;
        let rows = stmt.query_map([], |r| Ok(TrustRow { host, sha256: r.get(0)?, path: r.get(1)?, proof: r.get(2)? }))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Puts the person's signature `proof` of `row`'s act on its row (and the path it names);
    /// false if there is no row of that digest.
    pub fn sign_trust(&mut self, row: &TrustRow, proof: &str) -> Result<bool> {
        Ok(self.conn.execute(update_proof(row.host), params![row.sha256, row.path, proof])? > 0)
    }
}
