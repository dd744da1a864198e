//! Trusting a Claude Code native binary: its SHA-256 goes to the store's `trusted_claude` table,
//! its file identity to the digest records, so the broker never hashes it again.

use crate::store::{Store, TrustHow, TrustedClaude};
use anyhow::{bail, Context, Result};
use std::io::Read;
use std::path::Path;

/// Hashes the file `path` resolves to (symbolic links followed: npm's `bin/claude` is a link to
/// the native binary's hard link) and trusts its digest. Returns the record and whether it was new.
pub fn trust_path(store: &mut Store, path: &Path, how: TrustHow) -> Result<(TrustedClaude, bool)> {
    let native = native_of(path)?;
    let sha256 = store.hash_and_note(&native)?;
    trust_digest(store, &native, &sha256, how)
}

/// The native binary `path` resolves to (a canonical path), if it is a whole ELF executable.
pub fn native_of(path: &Path) -> Result<std::path::PathBuf> {
    let native = std::fs::canonicalize(path).with_context(|| format!("resolving {}", path.display()))?;
    let file = std::fs::File::open(&native).with_context(|| format!("opening {}", native.display()))?;
    if !crate::exe::elf::is_complete_elf(&file)? {
        bail!("{} is not a whole ELF executable (Claude Code's native binary is; a launcher script is not)", native.display());
    }
    Ok(native)
}

/// Trusts `sha256`, the digest of the native binary at `native` (a canonical path), hashed by
/// the caller: [`trust_path`], or the follower from the digest cache's expected lane.
pub fn trust_digest(store: &mut Store, native: &Path, sha256: &str, how: TrustHow) -> Result<(TrustedClaude, bool)> {
    let record = TrustedClaude {
        sha256: sha256.to_string(),
        path: native.to_string_lossy().into_owned(),
        version: version_beside(native),
        how,
        added_at: crate::store::now_ms(),
    };
    let new = store.trust_claude(&record)?;
    Ok((record, new))
}

/// The version the npm platform package holding `native` declares (`package.json` of
/// `@anthropic-ai/claude-code-<platform>`), if any.
pub fn version_beside(native: &Path) -> Option<String> {
    native.ancestors().skip(1).take(4).find_map(|dir| {
        let mut text = Vec::new();
        std::fs::File::open(dir.join("package.json")).ok()?.take(64 * 1024).read_to_end(&mut text).ok()?;
        let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
        v["name"].as_str().filter(|n| n.starts_with("@anthropic-ai/claude-code"))?;
        v["version"].as_str().map(String::from)
    })
}
