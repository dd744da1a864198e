//! Following Codex upgrades: the broker trusts the binary the user's own `codex` runs, with no
//! command from the user, off the hook path.
//!
//! The follower thread resolves every followed `codex` command (recorded by `broker install`,
//! plus the `codex` on the broker's own PATH) and every managed-daemon release, watches the
//! directories those answers depend on (`notify`: inotify, non-recursive), and re-resolves after
//! any change there settles (and every [`RECHECK`] in case an event was missed). A resolution to
//! a binary whose digest is not trusted yet is hashed once (the shared [`DigestCache`]), checked
//! to run (`--version`), and trusted as `followed`, with a log line naming the command, path,
//! version and digest.
//!
//! Why this is no weaker than a recorded digest: any process of this uid can already run
//! `broker trust-codex` or rewrite the user's `codex`; following the user's own command trusts
//! exactly what the user runs, and nothing else. A binary outside these places still needs
//! `broker trust-codex`.
//!
//! The follower also keeps the set of paths the gate treats as *expected* Codex binaries: a hook
//! whose codex is one of them waits for its hash instead of being refused (`gate/digest.rs`);
//! when the gate's expected lane hashes such a file first, [`Follower::consider_hashed`] trusts it
//! in time for the waiting hook.

use super::resolve::{self, Resolved};
use super::{version_of, TrustHow, TrustedCodex};
use crate::gate::digest::{DigestCache, ExeKey};
use crate::store::{now_ms, Store};
use anyhow::Result;
use std::collections::HashSet;
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

#[derive(Default)]
struct Expected {
    natives: HashSet<PathBuf>,
    releases: Option<PathBuf>,
}

/// State shared by the follower thread, the gate's expected lane and the server.
pub struct Follower {
    codex_home: PathBuf,
    state_dir: PathBuf,
    /// `codex` on the broker's own PATH at start (followed without being recorded).
    own_codex: Option<PathBuf>,
    digests: DigestCache,
    expected: RwLock<Expected>,
    store: Mutex<Option<Store>>,
    /// Re-resolutions done, for tests and `broker inspect`.
    pub cycles: std::sync::atomic::AtomicU64,
}

impl Follower {
    pub fn new(codex_home: &Path, state_dir: &Path, own_codex: Option<PathBuf>, digests: DigestCache) -> Arc<Follower> {
        Arc::new(Follower {
            codex_home: codex_home.to_path_buf(),
            state_dir: state_dir.to_path_buf(),
            own_codex,
            digests,
            expected: RwLock::new(Expected::default()),
            store: Mutex::new(None),
            cycles: Default::default(),
        })
    }

    /// Whether the gate should wait for the hash of the executable at `path` (see module docs).
    pub fn is_expected(&self, path: &Path) -> bool {
        // A binary replaced under a running codex reads as "<path> (deleted)".
        let s = path.to_string_lossy();
        let path = Path::new(s.strip_suffix(" (deleted)").unwrap_or(&s));
        let e = self.expected.read().unwrap_or_else(|p| p.into_inner());
        e.natives.contains(path) || e.releases.as_deref().is_some_and(|r| path.starts_with(r))
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

    /// One pass: resolve, refresh the expected set, trust what the user's commands now run.
    /// Returns the directories to watch.
    pub fn cycle(&self) -> Vec<PathBuf> {
        self.cycles.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let found = resolve::discover(&self.commands(), &self.codex_home);
        let trusted: Vec<TrustedCodex> = self.with_store(|s| s.trusted_codex()).unwrap_or_default();
        {
            let mut e = self.expected.write().unwrap_or_else(|p| p.into_inner());
            e.natives = found.natives().map(Path::to_path_buf).chain(trusted.iter().map(|t| PathBuf::from(&t.path))).collect();
            e.releases = Some(resolve::releases_dir(&self.codex_home));
        }
        for r in &found.found {
            if let Err(e) = self.consider(r) {
                crate::log_warn!("codex follower: {}: {e:#}", r.native.display());
            }
        }
        // Warm the cache with the other trusted binaries (still-running older releases, binaries
        // trusted by hand), so no hook waits for them.
        for t in &trusted {
            let Ok(f) = std::fs::File::open(&t.path) else { continue };
            let Ok(key) = ExeKey::of(&f) else { continue };
            if self.with_store(|s| s.codex_file_digest(&key)).ok().flatten().is_none() {
                if let Ok(d) = self.digests.of_file(f) {
                    let _ = self.with_store(|s| s.note_codex_file(&key, &d));
                }
            }
        }
        let mut watch: Vec<PathBuf> = found.found.iter().flat_map(|r| r.watch.iter().cloned()).collect();
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
        let mut seen = HashSet::new();
        watch.retain(|p| seen.insert(p.clone()));
        watch
    }

    /// Trusts `r.native` if it is not yet: hashed once, checked to run.
    fn consider(&self, r: &Resolved) -> Result<()> {
        let file = std::fs::File::open(&r.native)?;
        let key = ExeKey::of(&file)?;
        let known = self.with_store(|s| s.codex_file_digest(&key))?;
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
        // A binary that does not run (half-written by an install in progress) is not trusted;
        // the next change event or re-check looks again.
        let Some(version) = version_of(&r.native) else {
            anyhow::bail!("does not answer --version yet; not trusted");
        };
        let record = TrustedCodex {
            sha256: digest.to_string(),
            path: r.native.to_string_lossy().into_owned(),
            version: Some(version.clone()),
            how: TrustHow::Followed,
            source: Some(r.command.to_string_lossy().into_owned()),
            added_at: now_ms(),
        };
        if self.with_store(|s| s.trust_codex(&record))? {
            crate::log_info!(
                "trusted Codex {version} at {} (sha256:{}): `{}` now runs it ({})",
                r.native.display(),
                &digest[..12],
                r.command.display(),
                r.layout.as_str()
            );
            if let Some(v) = super::parse_version(&version) {
                if super::support(v) != super::Support::Tested {
                    crate::log_warn!(
                        "Codex {version} is outside the range Courier is tested on ({}); delivery may not be confirmed",
                        super::supported_range()
                    );
                }
            }
        }
        Ok(())
    }

    /// Called by the gate's expected lane with a file it just hashed: if a followed command
    /// resolves to exactly that file now, trust it (the hook waiting on the hash then passes).
    pub fn consider_hashed(&self, path: &Path, key: &ExeKey, digest: &str) {
        let found = resolve::discover(&self.commands(), &self.codex_home);
        for r in found.found.iter().filter(|r| r.native == path) {
            if ExeKey::of_path(&r.native).ok().as_ref() == Some(key) {
                let _ = self.with_store(|s| s.note_codex_file(key, digest));
                if let Err(e) = self.trust_if_new(r, digest) {
                    crate::log_warn!("codex follower: {}: {e:#}", path.display());
                }
                return;
            }
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
