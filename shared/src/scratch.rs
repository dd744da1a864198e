//! Scratch directories for tests (the broker's unit tests, the end-to-end kit): unique by
//! construction. A name made of the pid and the time is not: two tests of one process starting
//! in the same millisecond (the test harness runs them on parallel threads) got one directory and
//! shared a store. Here the pid tells processes apart, a process-wide counter tells one
//! process's directories apart, and the directory is created exclusively (`mkdir`, never "create
//! if missing"), so a leftover of an earlier process that had the same pid is stepped over, never
//! reused.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A new, empty directory `<parent>/<prefix>-<pid>-<n>`, created by this call and by no other.
/// Panics when it cannot be created (a test's setup).
pub fn dir_in(parent: &Path, prefix: &str) -> PathBuf {
    loop {
        let dir = parent.join(format!("{prefix}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
        match std::fs::create_dir(&dir) {
            Ok(()) => return dir,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => panic!("creating scratch directory {}: {e}", dir.display()),
        }
    }
}

/// [`dir_in`] the system's temporary directory.
pub fn dir(prefix: &str) -> PathBuf {
    dir_in(&std::env::temp_dir(), prefix)
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_call_gets_a_directory_of_its_own_even_at_once() {
        let dirs: Vec<_> = std::thread::scope(|s| {
            let all: Vec<_> = (0..8).map(|_| s.spawn(|| (0..16).map(|_| super::dir("courier-scratch-test")).collect::<Vec<_>>())).collect();
            all.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        let unique: std::collections::BTreeSet<_> = dirs.iter().collect();
        assert_eq!(unique.len(), dirs.len());
        // A leftover with the next name is stepped over, not reused.
        let parent = super::dir("courier-scratch-parent");
        let next = parent.join(format!("x-{}-{}", std::process::id(), super::NEXT.load(std::sync::atomic::Ordering::Relaxed)));
        std::fs::create_dir(&next).unwrap();
        std::fs::write(next.join("stale"), "").unwrap();
        let fresh = super::dir_in(&parent, "x");
        assert_ne!(fresh, next);
        assert_eq!(std::fs::read_dir(&fresh).unwrap().count(), 0);
        for d in dirs.iter().chain([&parent]) {
            std::fs::remove_dir_all(d).unwrap();
        }
    }
}
