//! The upgrade follower: the broker's thread that trusts the binary each host's user command runs
//! now, with no command from the user, off the hook path. It runs every host's part (a
//! [`HostFollow`]: `codex/follow.rs`, `claude/follow.rs`) in turn, watches the directories they
//! return (`notify`: inotify, non-recursive), and runs them again after a change there settles, or
//! every [`RECHECK`] in case an event was missed. When the gate's expected lane hashes a binary a
//! hook waits for (`digest.rs`), [`Follower::consider_hashed`] hands it to every host, so the
//! host whose followed command runs exactly that file trusts it in time for the waiting hook.
//!
//! What a host follows, and why that is no wider than what its user already runs, is the host's
//! part's to say (its module docs). The loop is generic over the store it hands the parts (`S`,
//! the queue's `Store` in `broker serve`), so this room stays below the store.

use super::ExeKey;
use anyhow::Result;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Re-resolve this often even without a change event (a missed event, a watch that failed).
pub const RECHECK: Duration = Duration::from_secs(30);
/// Quiet time after the last change event before re-resolving (an npm install writes many files).
const SETTLE: Duration = Duration::from_millis(300);
/// Longest a stream of events can delay a re-resolve.
const SETTLE_MAX: Duration = Duration::from_secs(3);

/// One host's part of the follower, provided by the wing that knows the host.
pub trait HostFollow<S>: Send + Sync {
    /// One pass: trusts what the host's followed commands run now, returns the directories an
    /// upgrade of it changes.
    fn pass(&self, store: &LazyStore<S>) -> Vec<PathBuf>;
    /// The expected lane hashed the file at `path` (identity `key`): trusts it if one of the
    /// host's followed commands resolves to exactly that file now (what the gate waits for).
    fn consider_hashed(&self, store: &LazyStore<S>, path: &Path, key: &ExeKey, digest: &str);
    /// Whether a change at `path` in a watched directory is noise to this host (a busy directory
    /// it watches for one entry only). Noise to any host is no reason for a new pass.
    fn is_noise(&self, _path: &Path) -> bool {
        false
    }
}

/// The follower's own store connection, opened on first use and kept; each use takes it briefly,
/// so a hash on the expected lane never waits for a whole pass.
pub struct LazyStore<S> {
    slot: Mutex<Option<S>>,
    open: Box<dyn Fn() -> Result<S> + Send + Sync>,
}

impl<S> LazyStore<S> {
    pub fn new(open: impl Fn() -> Result<S> + Send + Sync + 'static) -> LazyStore<S> {
        LazyStore { slot: Mutex::new(None), open: Box::new(open) }
    }

    pub fn with<T>(&self, f: impl FnOnce(&mut S) -> Result<T>) -> Result<T> {
        let mut guard = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = Some((self.open)()?);
        }
        f(guard.as_mut().expect("opened above"))
    }
}

/// The follower: every host's part over one store connection.
pub struct Follower<S> {
    hosts: Vec<Arc<dyn HostFollow<S>>>,
    store: LazyStore<S>,
    /// Passes done, for tests.
    pub cycles: AtomicU64,
}

impl<S> Follower<S> {
    pub fn new(store: LazyStore<S>, hosts: Vec<Arc<dyn HostFollow<S>>>) -> Arc<Follower<S>> {
        Arc::new(Follower { hosts, store, cycles: AtomicU64::new(0) })
    }

    /// One pass of every host, in order; returns the directories to watch, each once.
    pub fn cycle(&self) -> Vec<PathBuf> {
        self.cycles.fetch_add(1, Ordering::Relaxed);
        let mut watch: Vec<PathBuf> = self.hosts.iter().flat_map(|h| h.pass(&self.store)).collect();
        let mut seen = HashSet::new();
        watch.retain(|p| seen.insert(p.clone()));
        watch
    }

    /// Called by the gate's expected lane with a file it just hashed: every host whose followed
    /// command resolves to exactly that file now trusts it (the hook waiting on the hash then
    /// passes).
    pub fn consider_hashed(&self, path: &Path, key: &ExeKey, digest: &str) {
        for host in &self.hosts {
            host.consider_hashed(&self.store, path, key, digest);
        }
    }

    fn is_noise(&self, path: &Path) -> bool {
        self.hosts.iter().any(|h| h.is_noise(path))
    }
}

impl<S: Send + 'static> Follower<S> {
    /// The follower thread: cycle, watch, wait for a change (or [`RECHECK`]), repeat.
    pub fn run(self: Arc<Follower<S>>) {
        use notify::{RecursiveMode, Watcher};
        loop {
            let dirs = self.cycle();
            let (tx, rx) = mpsc::channel();
            let me = Arc::clone(&self);
            let mut watcher = match notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
                if ev.is_ok_and(|ev| ev.paths.iter().any(|p| !me.is_noise(p))) {
                    let _ = tx.send(());
                }
            }) {
                Ok(w) => Some(w),
                Err(e) => {
                    crate::log_warn!("follower: cannot watch for upgrades ({e}); re-checking every {}s", RECHECK.as_secs());
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A host that records what the loop hands it, over a counting "store".
    struct Host {
        name: &'static str,
        watch: Vec<PathBuf>,
        hashed: Mutex<Vec<PathBuf>>,
    }

    impl HostFollow<Vec<&'static str>> for Host {
        fn pass(&self, store: &LazyStore<Vec<&'static str>>) -> Vec<PathBuf> {
            store
                .with(|s| {
                    s.push(self.name);
                    Ok(())
                })
                .unwrap();
            self.watch.clone()
        }
        fn consider_hashed(&self, _: &LazyStore<Vec<&'static str>>, path: &Path, _: &ExeKey, _: &str) {
            self.hashed.lock().unwrap().push(path.to_path_buf());
        }
        fn is_noise(&self, path: &Path) -> bool {
            path.starts_with("/busy") && self.name == "a"
        }
    }

    #[test]
    fn every_host_runs_in_order_over_one_store_and_gets_every_hash() {
        let opened = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&opened);
        let store = LazyStore::new(move || {
            counter.fetch_add(1, Ordering::Relaxed);
            Ok(Vec::new())
        });
        let host =
            |name, watch: &[&str]| Arc::new(Host { name, watch: watch.iter().map(PathBuf::from).collect(), hashed: Mutex::default() });
        let (a, b) = (host("a", &["/x", "/y"]), host("b", &["/y", "/z"]));
        let f = Follower::new(store, vec![a.clone() as Arc<dyn HostFollow<_>>, b.clone()]);
        assert_eq!(f.cycle(), ["/x", "/y", "/z"].map(PathBuf::from), "each directory once, in host order");
        f.cycle();
        assert_eq!(f.store.with(|s| Ok(s.clone())).unwrap(), ["a", "b", "a", "b"]);
        assert_eq!(opened.load(Ordering::Relaxed), 1, "one connection, opened once");
        let key = ExeKey { dev: 1, ino: 2, size: 3, mtime_ns: 4, ctime_ns: 5 };
        f.consider_hashed(Path::new("/bin/new"), &key, "d");
        assert_eq!(*a.hashed.lock().unwrap(), [PathBuf::from("/bin/new")]);
        assert_eq!(*b.hashed.lock().unwrap(), [PathBuf::from("/bin/new")]);
        assert!(f.is_noise(Path::new("/busy/db")) && !f.is_noise(Path::new("/x/codex")));
    }
}
