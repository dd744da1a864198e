//! Trusting a Claude Code native binary: its SHA-256 goes to the store's `trusted_claude` table,
//! its file identity to the digest records, so the broker never hashes it again.

use super::follow::Followed;
use super::gate::ClaudeTrust;
use crate::exe::ExeKey;
use crate::store::{Store, TrustHow, TrustedClaude};
use anyhow::{bail, Context, Result};
use std::io::Read;
use std::path::Path;
use std::sync::Mutex;

/// Hashes the file `path` resolves to (symbolic links followed: npm's `bin/claude` is a link to
/// the native binary's hard link) and trusts its digest. Returns the record and whether it was new.
pub fn trust_path(store: &mut Store, path: &Path, how: TrustHow) -> Result<(TrustedClaude, bool)> {
    let native = std::fs::canonicalize(path).with_context(|| format!("resolving {}", path.display()))?;
    let file = std::fs::File::open(&native).with_context(|| format!("opening {}", native.display()))?;
    if !crate::codex::native::is_complete_elf(&file)? {
        bail!("{} is not a whole ELF executable (Claude Code's native binary is; a launcher script is not)", native.display());
    }
    let sha256 = crate::codex::hash_and_note(store, &native)?;
    trust_digest(store, &native, &sha256, how)
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

/// The gate's view of Claude Code trust, from the store and the followed commands (also the
/// sender check's, `gate/claude_sender.rs`).
pub(crate) struct StoreTrust<'a>(pub(crate) &'a Mutex<Store>, pub(crate) &'a Followed);

impl ClaudeTrust for StoreTrust<'_> {
    fn is_trusted(&self, sha256: &str) -> bool {
        crate::store::lock(self.0).is_trusted_claude(sha256).unwrap_or(false)
    }
    /// Asked only for a binary the digest cache has not seen: a trusted binary's path, or what a
    /// followed `claude` runs now (the first hook after an upgrade: `follow.rs`).
    fn is_expected(&self, path: &Path, size: u64) -> bool {
        if size > crate::exe::digest::MAX_HASH_BYTES {
            return false;
        }
        let (trusted_path, commands) = {
            let store = crate::store::lock(self.0);
            let shown = path.to_string_lossy();
            (store.trusted_claude().map(|all| all.iter().any(|t| t.path == shown)).unwrap_or(false), self.1.commands(&store))
        };
        // Resolved with the store unlocked: concurrent hooks never wait for a resolution.
        trusted_path || Followed::runs(&commands, path).is_some()
    }
    fn known_digest(&self, key: &ExeKey) -> Option<String> {
        crate::store::lock(self.0).codex_file_digest(key).ok().flatten()
    }
}
