//! Following Codex upgrades: Codex's part of the broker's upgrade follower (`exe/follow.rs` runs
//! the loop, its watches and re-checks for every host). The broker trusts the binary the user's
//! own `codex` runs, with no command from the user, off the hook path.
//!
//! Each pass resolves every followed `codex` command (recorded by `broker install` or `broker
//! trust-codex`, plus the `codex` on the broker's own PATH) and returns the directories those
//! answers depend on. A resolution to a binary whose digest is not trusted yet is hashed once (the
//! shared [`DigestCache`], at most [`MAX_HASH_BYTES`]), checked to be a whole ELF file (an install
//! may still be writing it), and trusted as `followed`, with a log line naming the command, path,
//! version and digest.
//!
//! What is followed, and why it is no wider than what the user already runs:
//! - **The user's own `codex` commands**, resolved as Codex's launcher resolves them: the user
//!   runs exactly that file whenever they type `codex`, so trusting it adds nothing a process
//!   able to change it could not already get by changing it.
//! - **Managed-daemon releases are never trusted for being there.** A release
//!   (`$CODEX_HOME/packages/app-server-daemon/releases/<dir>/bin/codex`) is a byte copy the
//!   user's trusted Codex makes of itself (`codex app-server daemon start`, the TUI): it has the
//!   trusted digest already, so the gate accepts it by digest and nothing needs trusting. A
//!   release with any other digest stays untrusted (`broker trust-codex PATH` if the user wants
//!   it): `CODEX_HOME` is writable by the commands Codex's sandbox runs, and Codex records no
//!   digest of its own for a release that a tool command could not forge. The follower only
//!   hashes ahead a release copy whose size equals a trusted binary's (a handful per pass), so
//!   the first hook of a new managed daemon does not wait for it.
//! - **No candidate is ever executed** (`native.rs`): not to ask its version, not to check it
//!   runs. Its version is read from the package files beside it, a label only.
//!
//! This part also keeps the set of files the gate treats as *expected* Codex binaries: a hook
//! whose codex is one of them waits for its hash instead of being refused (`exe/digest.rs`);
//! when the gate's expected lane hashes such a file first, [`Followed::consider_hashed`] trusts
//! it in time for the waiting hook if a followed command resolves to it.

use super::native::version_beside;
use super::resolve::{self, Layout, Resolved};
use super::{TrustHow, TrustedCodex};
use crate::exe::digest::{DigestCache, MAX_HASH_BYTES};
use crate::exe::elf::is_complete_elf;
use crate::exe::follow::{HostFollow, LazyStore};
use crate::exe::ExeKey;
use crate::store::{now_ms, Store};
use anyhow::{bail, Result};
use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

/// Release copies hashed ahead per pass at most (a real one appears once per daemon install).
const RELEASES_PER_PASS: usize = 2;

#[derive(Default)]
struct Expected {
    /// What the followed commands resolve to, and the paths trusted binaries were recorded at.
    natives: HashSet<PathBuf>,
    releases: Option<PathBuf>,
    /// Sizes of the trusted binaries whose identity is recorded: a release copy of one has the same.
    trusted_sizes: HashSet<u64>,
}

/// The `codex` commands the broker follows, and the files the gate waits for.
pub struct Followed {
    codex_home: PathBuf,
    /// `codex` on the broker's own PATH at start (followed without being recorded).
    own_codex: Option<PathBuf>,
    digests: DigestCache,
    expected: RwLock<Expected>,
}

impl Followed {
    pub fn new(codex_home: &Path, own_codex: Option<PathBuf>, digests: DigestCache) -> Followed {
        Followed { codex_home: codex_home.to_path_buf(), own_codex, digests, expected: RwLock::new(Expected::default()) }
    }

    /// Whether the gate should wait for the hash of the executable at `path`, `size` bytes: a
    /// followed or trusted path, or a release copy the size of a trusted binary. Any other file
    /// (what a tool command may plant under `releases/`) goes to the background lane.
    pub fn is_expected(&self, path: &Path, size: u64) -> bool {
        // A binary replaced under a running codex reads as "<path> (deleted)".
        let s = path.to_string_lossy();
        let path = Path::new(s.strip_suffix(" (deleted)").unwrap_or(&s));
        let e = self.expected.read().unwrap_or_else(|p| p.into_inner());
        size <= MAX_HASH_BYTES
            && (e.natives.contains(path) || e.releases.as_deref().is_some_and(|r| path.starts_with(r)) && e.trusted_sizes.contains(&size))
    }

    fn commands(&self, store: &LazyStore<Store>) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = store.with(|s| s.codex_commands()).unwrap_or_default().into_iter().map(PathBuf::from).collect();
        if let Some(own) = &self.own_codex {
            if !v.contains(own) {
                v.push(own.clone());
            }
        }
        v
    }

    /// One pass: resolve, trust what the user's commands now run, refresh the expected set,
    /// hash ahead release copies of trusted binaries. Returns the directories to watch.
    pub fn pass(&self, store: &LazyStore<Store>) -> Vec<PathBuf> {
        let found = resolve::discover(&self.commands(store), &self.codex_home);
        let (releases, followed): (Vec<&Resolved>, Vec<&Resolved>) = found.found.iter().partition(|r| r.layout == Layout::ManagedDaemon);
        for r in &followed {
            if let Err(e) = self.consider(store, r) {
                crate::log_warn!("codex follower: {}: {e:#}", r.native.display());
            }
        }
        let trusted: Vec<TrustedCodex> = store.with(|s| s.trusted_codex()).unwrap_or_default();
        {
            let mut e = self.expected.write().unwrap_or_else(|p| p.into_inner());
            e.natives = followed.iter().map(|r| r.native.clone()).chain(trusted.iter().map(|t| PathBuf::from(&t.path))).collect();
            e.releases = Some(resolve::releases_dir(&self.codex_home));
            e.trusted_sizes = store.with(|s| s.trusted_codex_sizes()).unwrap_or_default().into_iter().collect();
        }
        // Warm the cache with the other trusted binaries (still-running older releases, binaries
        // trusted by hand) and with release copies of them, so no hook waits for them.
        let trusted_paths = trusted.iter().map(|t| PathBuf::from(&t.path));
        let copies = releases.iter().map(|r| r.native.clone()).filter(|p| self.is_expected(p, size_of(p))).take(RELEASES_PER_PASS);
        for path in trusted_paths.chain(copies) {
            self.warm(store, &path);
        }
        let mut watch: Vec<PathBuf> = followed.iter().flat_map(|r| r.watch.iter().cloned()).collect();
        // The releases directory, or its nearest existing ancestor up to CODEX_HOME (the TUI
        // creates it on first start); events in CODEX_HOME itself are noise (`is_noise`).
        let releases = resolve::releases_dir(&self.codex_home);
        for dir in releases.ancestors() {
            watch.push(dir.to_path_buf());
            if dir.is_dir() || dir == self.codex_home {
                break;
            }
        }
        for (command, _) in &found.problems {
            watch.extend(command.parent().map(Path::to_path_buf));
        }
        watch
    }

    /// Records the digest of the file at `path` (at most [`MAX_HASH_BYTES`]) unless known.
    fn warm(&self, store: &LazyStore<Store>, path: &Path) {
        let Ok(f) = File::open(path) else { return };
        let Ok(key) = ExeKey::of(&f) else { return };
        if key.size > MAX_HASH_BYTES || store.with(|s| s.codex_file_digest(&key)).ok().flatten().is_some() {
            return;
        }
        if let Ok(d) = self.digests.of_file(f) {
            let _ = store.with(|s| s.note_codex_file(&key, &d));
        }
    }

    /// Trusts `r.native` (what a followed command runs) if it is not yet: hashed once.
    fn consider(&self, store: &LazyStore<Store>, r: &Resolved) -> Result<()> {
        let file = File::open(&r.native)?;
        let key = ExeKey::of(&file)?;
        if key.size > MAX_HASH_BYTES {
            bail!("{} bytes, over the {} the broker hashes; not trusted (broker trust-codex PATH)", key.size, MAX_HASH_BYTES);
        }
        let known = store.with(|s| s.codex_file_digest(&key))?;
        if known.as_deref().is_some_and(|d| store.with(|s| s.is_trusted_codex(d)).unwrap_or(false)) {
            return Ok(());
        }
        // A file an install is still writing is not recorded; the next event or re-check looks again.
        if !is_complete_elf(&file)? {
            bail!("not a whole native executable yet; not trusted");
        }
        let digest = match known {
            Some(d) => d,
            None => {
                let d = self.digests.of_file(file)?;
                store.with(|s| s.note_codex_file(&key, &d))?;
                d
            }
        };
        self.trust_if_new(store, r, &digest)
    }

    fn trust_if_new(&self, store: &LazyStore<Store>, r: &Resolved, digest: &str) -> Result<()> {
        if store.with(|s| s.is_trusted_codex(digest))? {
            return Ok(());
        }
        let version = version_beside(&r.native);
        let record = TrustedCodex {
            sha256: digest.to_string(),
            path: r.native.to_string_lossy().into_owned(),
            version: version.clone(),
            how: TrustHow::Followed,
            source: Some(r.command.to_string_lossy().into_owned()),
            added_at: now_ms(),
        };
        if store.with(|s| s.trust_codex(&record))? {
            let shown = version.as_deref().unwrap_or("(version unknown)");
            crate::log_info!(
                "trusted Codex {shown} at {} (sha256:{}): `{}` now runs it ({})",
                r.native.display(),
                &digest[..12],
                r.command.display(),
                r.layout.as_str()
            );
            if !store.with(|s| s.is_trusted_codex(digest))? {
                // The broker's own word counts for nothing once a person key is set (person/honour.rs).
                crate::log_warn!(
                    "a person key is set: Codex at {} counts only once the person signs it (`broker trust-codex {}` at a terminal)",
                    r.native.display(),
                    r.native.display()
                );
            }
            if let Some(v) = version.as_deref().and_then(crate::exe::parse_version) {
                if super::support(v) != super::Support::Tested {
                    crate::log_warn!(
                        "Codex {shown} is outside the range Courier is tested on ({}); delivery may not be confirmed",
                        super::supported_range()
                    );
                }
            }
        }
        Ok(())
    }

    /// The expected lane hashed the file at `path`: trusts it if a followed `codex` command
    /// resolves to exactly that file now. Managed-daemon releases are not followed (module docs).
    pub fn consider_hashed(&self, store: &LazyStore<Store>, path: &Path, key: &ExeKey, digest: &str) {
        let found = resolve::discover_commands(&self.commands(store));
        let Some(r) = found.found.iter().find(|r| r.native == path) else { return };
        let Ok(file) = File::open(&r.native) else { return };
        if ExeKey::of(&file).ok().as_ref() != Some(key) || !is_complete_elf(&file).unwrap_or(false) {
            return;
        }
        let _ = store.with(|s| s.note_codex_file(key, digest));
        if let Err(e) = self.trust_if_new(store, r, digest) {
            crate::log_warn!("codex follower: {}: {e:#}", path.display());
        }
    }
}

impl HostFollow<Store> for Followed {
    fn pass(&self, store: &LazyStore<Store>) -> Vec<PathBuf> {
        Followed::pass(self, store)
    }
    fn consider_hashed(&self, store: &LazyStore<Store>, path: &Path, key: &ExeKey, digest: &str) {
        Followed::consider_hashed(self, store, path, key, digest)
    }
    /// CODEX_HOME is busy (sessions, SQLite): only its `packages` entry matters there.
    fn is_noise(&self, path: &Path) -> bool {
        path.parent() == Some(self.codex_home.as_path()) && path != self.codex_home.join("packages")
    }
}

fn size_of(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(u64::MAX)
}
