//! Following Claude Code upgrades: Claude's part of the broker's upgrade follower (`exe/follow.rs`
//! runs the loop, its watches and re-checks for every host; the digest cache's expected lane
//! hands it what it hashed).
//!
//! [`Followed`] resolves the `claude` commands `broker install` recorded (`claude_commands`) and
//! the `claude` on the broker's own PATH, as `broker install` does (`resolve.rs`), and trusts the
//! native binary each now runs as `followed`, with a log line: the user runs exactly that file
//! whenever they type `claude`, so trusting it adds nothing a process able to change it could
//! not already get by changing it. A file beside it that no command resolves to (another entry of
//! the native installer's `versions/`) is never trusted for being there. The binary is hashed
//! once (its identity goes to `codex_files`), checked to be a whole ELF file, never executed.
//!
//! Two ways reach that trust, one rule for both:
//! - the follower's pass ([`Followed::pass`]), after a change in a watched directory settles (or
//!   every 30 s);
//! - the gate's expected lane, for a hook that comes first (the first hook after an upgrade, or
//!   while the broker's first pass still runs): a binary a followed command resolves to *now*
//!   ([`Followed::runs`], asked by the gate through `StoreTrust::is_expected`) is hashed on the
//!   shared digest cache's expected lane while the hook waits (bounded there), and
//!   [`Followed::consider_hashed`] trusts it if a followed command still resolves to exactly that
//!   file. Any other file goes to the background lane and is refused as before.

use super::resolve::{self, Resolved};
use crate::exe::digest::MAX_HASH_BYTES;
use crate::exe::elf::is_complete_elf;
use crate::exe::follow::{HostFollow, LazyStore};
use crate::exe::ExeKey;
use crate::store::{Store, TrustHow, TrustedClaude};
use anyhow::{bail, Result};
use std::fs::File;
use std::path::{Path, PathBuf};

/// The `claude` commands the broker follows: those `broker install` recorded, and `own`, the
/// `claude` on the broker's own PATH at start.
#[derive(Debug, Default)]
pub struct Followed {
    own: Option<PathBuf>,
}

impl Followed {
    pub fn new(own: Option<PathBuf>) -> Followed {
        Followed { own }
    }

    /// The followed commands (the store's, then the broker's own).
    pub fn commands(&self, store: &Store) -> Vec<PathBuf> {
        let mut commands: Vec<PathBuf> = store.claude_commands().unwrap_or_default().into_iter().map(PathBuf::from).collect();
        if let Some(own) = self.own.as_ref().filter(|o| !commands.contains(o)) {
            commands.push(own.clone());
        }
        commands
    }

    /// What one of `commands` resolves to now, if that is the file at `native` (a canonical path,
    /// as `/proc/<pid>/exe` reads). Resolved now, not at the last pass: an upgrade switches the
    /// link before any pass sees it. Nothing is executed or hashed.
    pub fn runs(commands: &[PathBuf], native: &Path) -> Option<Resolved> {
        resolve::discover(commands).found.into_iter().find(|r| r.native == native)
    }

    /// Resolves the followed commands, trusts what they run now, and returns the directories an
    /// upgrade changes (for the follower's watches).
    pub fn pass(&self, store: &mut Store) -> Vec<PathBuf> {
        let found = resolve::discover(&self.commands(store));
        let mut watch = Vec::new();
        for r in &found.found {
            // Acts out a pass that comes after the upgraded claude's first hook (tests of the
            // expected lane): this pass trusts nothing.
            if crate::failpoint::armed("claude_follow_late") {
                continue;
            }
            if let Err(e) = consider(store, r) {
                crate::log_warn!("claude follower: {}: {e:#}", r.native.display());
            }
        }
        for r in &found.found {
            // The command's directory (the installer switches `~/.local/bin/claude`) and the
            // binary's (`versions/`, an npm package's `bin/`).
            watch.extend([r.command.parent(), r.native.parent()].into_iter().flatten().map(Path::to_path_buf));
        }
        watch.extend(found.problems.iter().filter_map(|(command, _)| command.parent().map(Path::to_path_buf)));
        watch
    }

    /// The expected lane hashed the file at `path` (identity `key`): trusts its digest if a
    /// followed command resolves to exactly that file now and it is a whole ELF file.
    pub fn consider_hashed(&self, store: &mut Store, path: &Path, key: &ExeKey, digest: &str) {
        let Some(r) = Followed::runs(&self.commands(store), path) else { return };
        let Ok(file) = File::open(&r.native) else { return };
        if ExeKey::of(&file).ok().as_ref() != Some(key) || !is_complete_elf(&file).unwrap_or(false) {
            return;
        }
        let trusted =
            store.note_codex_file(key, digest).and_then(|()| super::trust::trust_digest(store, &r.native, digest, TrustHow::Followed));
        match trusted {
            Ok((record, new)) => log_trusted(&r, &record, new),
            Err(e) => crate::log_warn!("claude follower: {}: {e:#}", path.display()),
        }
    }
}

impl HostFollow<Store> for Followed {
    fn pass(&self, store: &LazyStore<Store>) -> Vec<PathBuf> {
        store.with(|s| Ok(Followed::pass(self, s))).unwrap_or_default()
    }
    fn consider_hashed(&self, store: &LazyStore<Store>, path: &Path, key: &ExeKey, digest: &str) {
        let _ = store.with(|s| {
            Followed::consider_hashed(self, s, path, key, digest);
            Ok(())
        });
    }
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
    log_trusted(r, &record, new);
    Ok(())
}

/// The log line of a binary the follower trusted (nothing when it was trusted already).
fn log_trusted(r: &Resolved, record: &TrustedClaude, new: bool) {
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
}
