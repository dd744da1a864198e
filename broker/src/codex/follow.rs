//! Following Codex upgrades: the broker trusts the binary the user's own `codex` runs, with no
//! command from the user, off the hook path. The same thread follows the other host agents'
//! upgrades: each pass also runs the [`HostFollow`]s `broker serve` gives it (Claude Code's,
//! `claude/follow.rs`), watches the directories they return, and hands them what the expected
//! lane hashed.
//!
//! The follower thread resolves every followed `codex` command (recorded by `broker install` or
//! `broker trust-codex`, plus the `codex` on the broker's own PATH), watches the directories
//! those answers depend on (`notify`: inotify, non-recursive), and re-resolves after any change
//! there settles (and every [`RECHECK`] in case an event was missed). A resolution to a binary
//! whose digest is not trusted yet is hashed once (the shared [`DigestCache`], at most
//! [`MAX_HASH_BYTES`]), checked to be a whole ELF file (an install may still be writing it), and
//! trusted as `followed`, with a log line naming the command, path, version and digest.
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
//! The follower also keeps the set of files the gate treats as *expected* Codex binaries: a hook
//! whose codex is one of them waits for its hash instead of being refused (`exe/digest.rs`);
//! when the gate's expected lane hashes such a file first, [`Follower::consider_hashed`] trusts it
//! in time for the waiting hook if a followed command resolves to it (a Codex command, or another
//! host's, through its [`HostFollow::consider_hashed`]).

use super::native::{is_complete_elf, version_beside};
use super::resolve::{self, Layout, Resolved};
use super::{TrustHow, TrustedCodex};
use crate::exe::digest::{DigestCache, MAX_HASH_BYTES};
use crate::exe::ExeKey;
use crate::store::{now_ms, Store};
use anyhow::{bail, Result};
use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Re-resolve this often even without a change event (a missed event, a watch that failed).
pub const RECHECK: Duration = Duration::from_secs(30);
/// Quiet time after the last change event before re-resolving (an npm install writes many files).
const SETTLE: Duration = Duration::from_millis(300);
/// Longest a stream of events can delay a re-resolve.
const SETTLE_MAX: Duration = Duration::from_secs(3);
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

/// Another host agent's part of the follower. The wing that knows the host provides it; this
/// loop runs it, so the Codex wing imports no other host.
pub trait HostFollow: Send + Sync {
    /// One pass: trusts what its user's commands now run, returns the directories an upgrade of
    /// it changes.
    fn pass(&self, store: &mut Store) -> Vec<PathBuf>;
    /// The expected lane hashed the file at `path`: trusts it if one of the host's followed
    /// commands resolves to exactly that file now (what the gate waits for).
    fn consider_hashed(&self, store: &mut Store, path: &Path, key: &ExeKey, digest: &str);
}

/// State shared by the follower thread, the gate's expected lane and the server.
pub struct Follower {
    codex_home: PathBuf,
    state_dir: PathBuf,
    /// `codex` on the broker's own PATH at start (followed without being recorded).
    own_codex: Option<PathBuf>,
    /// The other hosts' parts, run after Codex's in each cycle and for each expected hash.
    others: Vec<Arc<dyn HostFollow>>,
    digests: DigestCache,
    expected: RwLock<Expected>,
    store: Mutex<Option<Store>>,
    /// Re-resolutions done, for tests and `broker inspect`.
    pub cycles: std::sync::atomic::AtomicU64,
}

impl Follower {
    pub fn new(
        codex_home: &Path,
        state_dir: &Path,
        own_codex: Option<PathBuf>,
        digests: DigestCache,
        others: Vec<Arc<dyn HostFollow>>,
    ) -> Arc<Follower> {
        Arc::new(Follower {
            codex_home: codex_home.to_path_buf(),
            state_dir: state_dir.to_path_buf(),
            own_codex,
            others,
            digests,
            expected: RwLock::new(Expected::default()),
            store: Mutex::new(None),
            cycles: Default::default(),
        })
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

    fn with_store<T>(&self, f: impl FnOnce(&mut Store) -> Result<T>) -> Result<T> {
        let mut guard = self.store.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = Some(Store::open(&self.state_dir)?);
        }
        f(guard.as_mut().expect("opened above"))
    }

    fn commands(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = self.with_store(|s| s.codex_commands()).unwrap_or_default().into_iter().map(PathBuf::from).collect();
        if let Some(own) = &self.own_codex {
            if !v.contains(own) {
                v.push(own.clone());
            }
        }
        v
    }

    /// One pass: resolve, trust what the user's commands now run, refresh the expected set,
    /// hash ahead release copies of trusted binaries. Returns the directories to watch.
    pub fn cycle(&self) -> Vec<PathBuf> {
        self.cycles.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let found = resolve::discover(&self.commands(), &self.codex_home);
        let (releases, followed): (Vec<&Resolved>, Vec<&Resolved>) = found.found.iter().partition(|r| r.layout == Layout::ManagedDaemon);
        for r in &followed {
            if let Err(e) = self.consider(r) {
                crate::log_warn!("codex follower: {}: {e:#}", r.native.display());
            }
        }
        let trusted: Vec<TrustedCodex> = self.with_store(|s| s.trusted_codex()).unwrap_or_default();
        {
            let mut e = self.expected.write().unwrap_or_else(|p| p.into_inner());
            e.natives = followed.iter().map(|r| r.native.clone()).chain(trusted.iter().map(|t| PathBuf::from(&t.path))).collect();
            e.releases = Some(resolve::releases_dir(&self.codex_home));
            e.trusted_sizes = self.with_store(|s| s.trusted_codex_sizes()).unwrap_or_default().into_iter().collect();
        }
        // Warm the cache with the other trusted binaries (still-running older releases, binaries
        // trusted by hand) and with release copies of them, so no hook waits for them.
        let trusted_paths = trusted.iter().map(|t| PathBuf::from(&t.path));
        let copies = releases.iter().map(|r| r.native.clone()).filter(|p| self.is_expected(p, size_of(p))).take(RELEASES_PER_PASS);
        for path in trusted_paths.chain(copies) {
            self.warm(&path);
        }
        let mut watch: Vec<PathBuf> = followed.iter().flat_map(|r| r.watch.iter().cloned()).collect();
        // The releases directory, or its nearest existing ancestor up to CODEX_HOME (the TUI
        // creates it on first start); events in CODEX_HOME itself are filtered in `run`.
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
        for other in &self.others {
            watch.extend(self.with_store(|s| Ok(other.pass(s))).unwrap_or_default());
        }
        let mut seen = HashSet::new();
        watch.retain(|p| seen.insert(p.clone()));
        watch
    }

    /// Records the digest of the file at `path` (at most [`MAX_HASH_BYTES`]) unless known.
    fn warm(&self, path: &Path) {
        let Ok(f) = File::open(path) else { return };
        let Ok(key) = ExeKey::of(&f) else { return };
        if key.size > MAX_HASH_BYTES || self.with_store(|s| s.codex_file_digest(&key)).ok().flatten().is_some() {
            return;
        }
        if let Ok(d) = self.digests.of_file(f) {
            let _ = self.with_store(|s| s.note_codex_file(&key, &d));
        }
    }

    /// Trusts `r.native` (what a followed command runs) if it is not yet: hashed once.
    fn consider(&self, r: &Resolved) -> Result<()> {
        let file = File::open(&r.native)?;
        let key = ExeKey::of(&file)?;
        if key.size > MAX_HASH_BYTES {
            bail!("{} bytes, over the {} the broker hashes; not trusted (broker trust-codex PATH)", key.size, MAX_HASH_BYTES);
        }
        let known = self.with_store(|s| s.codex_file_digest(&key))?;
        if known.as_deref().is_some_and(|d| self.with_store(|s| s.is_trusted_codex(d)).unwrap_or(false)) {
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
                self.with_store(|s| s.note_codex_file(&key, &d))?;
                d
            }
        };
        self.trust_if_new(r, &digest)
    }

    fn trust_if_new(&self, r: &Resolved, digest: &str) -> Result<()> {
        if self.with_store(|s| s.is_trusted_codex(digest))? {
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
        if self.with_store(|s| s.trust_codex(&record))? {
            let shown = version.as_deref().unwrap_or("(version unknown)");
            crate::log_info!(
                "trusted Codex {shown} at {} (sha256:{}): `{}` now runs it ({})",
                r.native.display(),
                &digest[..12],
                r.command.display(),
                r.layout.as_str()
            );
            if let Some(v) = version.as_deref().and_then(super::parse_version) {
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

    /// Called by the gate's expected lane with a file it just hashed: if a followed command
    /// (Codex's, or another host's) resolves to exactly that file now, trust it (the hook waiting
    /// on the hash then passes).
    pub fn consider_hashed(&self, path: &Path, key: &ExeKey, digest: &str) {
        self.consider_hashed_codex(path, key, digest);
        for other in &self.others {
            let _ = self.with_store(|s| {
                other.consider_hashed(s, path, key, digest);
                Ok(())
            });
        }
    }

    /// [`Follower::consider_hashed`] for the followed `codex` commands. Managed-daemon releases
    /// are not followed (module docs).
    fn consider_hashed_codex(&self, path: &Path, key: &ExeKey, digest: &str) {
        let found = resolve::discover_commands(&self.commands());
        let Some(r) = found.found.iter().find(|r| r.native == path) else { return };
        let Ok(file) = File::open(&r.native) else { return };
        if ExeKey::of(&file).ok().as_ref() != Some(key) || !is_complete_elf(&file).unwrap_or(false) {
            return;
        }
        let _ = self.with_store(|s| s.note_codex_file(key, digest));
        if let Err(e) = self.trust_if_new(r, digest) {
            crate::log_warn!("codex follower: {}: {e:#}", path.display());
        }
    }

    /// The follower thread: cycle, watch, wait for a change (or [`RECHECK`]), repeat.
    pub fn run(self: Arc<Follower>) {
        use notify::{RecursiveMode, Watcher};
        loop {
            let dirs = self.cycle();
            let (tx, rx) = mpsc::channel();
            let (home, packages) = (self.codex_home.clone(), self.codex_home.join("packages"));
            let mut watcher = match notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
                // CODEX_HOME is busy (sessions, SQLite): only its `packages` entry matters.
                let relevant = ev.is_ok_and(|ev| ev.paths.iter().any(|p| p.parent() != Some(home.as_path()) || p == &packages));
                if relevant {
                    let _ = tx.send(());
                }
            }) {
                Ok(w) => Some(w),
                Err(e) => {
                    crate::log_warn!("codex follower: cannot watch for upgrades ({e}); re-checking every {}s", RECHECK.as_secs());
                    None
                }
            };
            if let Some(w) = watcher.as_mut() {
                for d in dirs.iter().filter(|d| d.is_dir()) {
                    let _ = w.watch(d, RecursiveMode::NonRecursive);
                }
            }
            // Wait for a change, then for it to settle.
            if rx.recv_timeout(RECHECK).is_ok() {
                let start = Instant::now();
                while rx.recv_timeout(SETTLE).is_ok() && start.elapsed() < SETTLE_MAX {}
            }
            drop(watcher);
        }
    }
}

fn size_of(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(u64::MAX)
}
