//! Following Claude Code upgrades: one pass of the broker's follower thread (`codex/follow.rs`
//! runs the loop, its watches and its re-check for both hosts).
//!
//! The pass resolves the `claude` commands `broker install` recorded (`claude_commands`) and the
//! `claude` on the broker's own PATH, as `broker install` does (`resolve.rs`), and trusts the
//! native binary each now runs as `followed`, with a log line: the user runs exactly that file
//! whenever they type `claude`, so trusting it adds nothing a process able to change it could
//! not already get by changing it. A file beside it that no command resolves to (another entry of
//! the native installer's `versions/`) is never trusted for being there. The binary is hashed
//! once (its identity goes to `codex_files`), checked to be a whole ELF file, never executed.

use super::resolve::{self, Resolved};
use crate::exe::digest::MAX_HASH_BYTES;
use crate::exe::ExeKey;
use crate::store::{Store, TrustHow};
use anyhow::{bail, Result};
use std::fs::File;
use std::path::{Path, PathBuf};

/// Resolves the followed `claude` commands (plus `own`, the broker's PATH's), trusts what they
/// run now, and returns the directories an upgrade changes (for the follower's watches).
pub fn pass(store: &mut Store, own: Option<&Path>) -> Vec<PathBuf> {
    let mut commands: Vec<PathBuf> = store.claude_commands().unwrap_or_default().into_iter().map(PathBuf::from).collect();
    if let Some(own) = own.filter(|o| !commands.iter().any(|c| c == o)) {
        commands.push(own.to_path_buf());
    }
    let found = resolve::discover(&commands);
    let mut watch = Vec::new();
    for r in &found.found {
        if let Err(e) = consider(store, r) {
            crate::log_warn!("claude follower: {}: {e:#}", r.native.display());
        }
        // The command's directory (the installer switches `~/.local/bin/claude`) and the
        // binary's (`versions/`, an npm package's `bin/`).
        watch.extend([r.command.parent(), r.native.parent()].into_iter().flatten().map(Path::to_path_buf));
    }
    watch.extend(found.problems.iter().filter_map(|(command, _)| command.parent().map(Path::to_path_buf)));
    watch
}

/// Trusts `r.native` (what a followed command runs) unless its digest is trusted already.
fn consider(store: &mut Store, r: &Resolved) -> Result<()> {
    let key = ExeKey::of(&File::open(&r.native)?)?;
    if key.size > MAX_HASH_BYTES {
        bail!("{} bytes, over the {MAX_HASH_BYTES} the broker hashes; not trusted (broker trust-claude PATH)", key.size);
    }
    if let Some(d) = store.codex_file_digest(&key)? {
        if store.is_trusted_claude(&d)? {
            return Ok(());
        }
    }
    let (record, new) = super::trust::trust_path(store, &r.native, TrustHow::Followed)?;
    if new {
        crate::log_info!(
            "trusted Claude Code {} at {} (sha256:{}): `{}` now runs it ({})",
            r.version.as_deref().unwrap_or("(version unknown)"),
            record.path,
            &record.sha256[..12],
            r.command.display(),
            r.layout.as_str()
        );
    }
    Ok(())
}
