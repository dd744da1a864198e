//! SHA-256 of process executables, computed off the hook path and cached by file identity.
//!
//! The Codex binary is ~300 MB and takes about a second to hash, longer than a hook client waits
//! (500 ms). So no worker ever hashes: a file the cache has not seen goes to one of two hashing
//! threads, and the hook call either waits for the answer (bounded by its deadline) or moves on.
//!
//! - The **expected** lane hashes files the broker has reason to believe are Codex: a trusted
//!   binary's path, the native binary the user's own `codex` resolves to, a managed-daemon
//!   release copy the size of a trusted binary (`broker::codex::follow` keeps that set); for the
//!   Claude Code gate, a trusted Claude path or what a followed `claude` runs now
//!   (`broker::claude::follow`). A hook whose binary is such a file waits for it, bounded three ways: at most [`EXPECTED_QUEUE`]
//!   files queued, at most [`EXPECTED_WAITERS`] workers waiting at once (the others answer
//!   `Pending` at once), each until its deadline.
//! - The **background** lane hashes everything else, one file at a time at the lowest CPU
//!   priority, at most [`BACKGROUND_QUEUE`] files queued; a hook never waits for it. This is what
//!   keeps a flood of fresh "codex" executables (any same-uid process can make them, under
//!   `releases/` too) from taking the broker's CPU, fds or workers from honest hooks.
//!
//! No lane and no caller hashes a file over [`MAX_HASH_BYTES`]: it is answered "unhashable" at
//! once. A queued file holds an open fd, so the queue caps bound the broker's fds as well.
//!
//! Every answer, a digest or "unreadable / too large", is cached under the file's key (device,
//! inode, size, mtime, ctime of the file actually executed, read from an fd opened on
//! `/proc/<pid>/exe`, which reaches the mapped file even if its path was replaced or deleted). The
//! cache holds digests, not verdicts: whether a digest is trusted is asked anew on every call, so
//! `broker trust-codex` and `broker uninstall` take effect at once. ctime is in the key as well as
//! mtime because an owner can reset mtime after rewriting a file, but not ctime.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Instant;

use crate::exe::{hash_reader, ExeKey};

/// Entries kept before the cache is cleared (executables of ancestors seen; small in practice).
const MAX_ENTRIES: usize = 4096;
/// The most the broker hashes of one executable anywhere (both lanes, the follower, doctor).
/// Codex 0.171.0's native binary is 315 MB (0.160.0: 289 MB); 1 GiB leaves room for growth, and
/// a bigger file is never read: at ~1 GB/s it would hold a core for seconds or, sparse, for hours.
/// Only `broker trust-codex PATH`, the user naming a file, hashes past it.
pub const MAX_HASH_BYTES: u64 = 1 << 30;
/// Unknown files waiting for the background lane; more are answered "not hashed" for now and
/// asked again by a later call.
pub const BACKGROUND_QUEUE: usize = 16;
/// Expected files waiting for the expected lane (a real upgrade brings one or two).
pub const EXPECTED_QUEUE: usize = 4;
/// Workers that may wait for the expected lane at once, of the server's 16: a hook beyond them
/// is answered `Pending` at once, so no set of expected files can hold every worker.
pub const EXPECTED_WAITERS: usize = 4;

/// Which hashing thread a file goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    Expected,
    Background,
}

/// What the cache knows of an executable right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Digest(String),
    /// Queued or being hashed (the caller's wait, if any, ran out first).
    Pending,
    /// Could not be read, changed while hashed, or is too large for the background lane.
    Unhashable,
}

/// Looks a file identity up among digests recorded elsewhere (the store's `codex_files`).
pub type Known<'a> = dyn Fn(&ExeKey) -> Option<String> + 'a;

/// Whether the executable at a path, of a size, is an expected Codex binary (the expected lane).
pub type Expected<'a> = dyn Fn(&Path, u64) -> bool + 'a;
/// The same, held by another thread (the thread lister).
pub type SharedExpected = dyn Fn(&Path, u64) -> bool + Send + Sync;

/// Called by the expected lane after it hashed a file, before waiters see the digest: lets the
/// upgrade follower trust a new binary of the user's own `codex` (or `claude`) in time for the
/// hook waiting on it.
pub type OnExpected = Box<dyn Fn(&Path, &ExeKey, &str) + Send + Sync>;

struct Job {
    key: ExeKey,
    file: File,
    path: PathBuf,
    slot: Arc<Slot>,
}

#[derive(Default)]
struct Slot {
    done: OnceLock<Option<String>>,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Slot {
    fn finish(&self, digest: Option<String>) {
        let _ = self.done.set(digest);
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.cv.notify_all();
    }

    fn wait_until(&self, until: Instant) -> Option<&Option<String>> {
        let mut guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(d) = self.done.get() {
                return Some(d);
            }
            let now = Instant::now();
            if now >= until {
                return None;
            }
            guard = self.cv.wait_timeout(guard, until - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

#[derive(Default)]
struct LaneQueue {
    jobs: Mutex<VecDeque<Job>>,
    cv: Condvar,
}

#[derive(Default)]
struct Inner {
    entries: Mutex<HashMap<ExeKey, Arc<Slot>>>,
    lanes: [LaneQueue; 2],
    started: OnceLock<()>,
    on_expected: OnceLock<OnExpected>,
    /// Files hashed (cache misses), for tests and diagnostics.
    hashed: AtomicU64,
    /// Bytes hashed by the background lane.
    background_bytes: AtomicU64,
    /// Workers waiting for the expected lane now.
    waiters: AtomicUsize,
}

/// A handle on the shared cache and its two hashing threads (started on first use). Clones share both.
#[derive(Clone, Default)]
pub struct DigestCache {
    inner: Arc<Inner>,
}

impl DigestCache {
    /// Number of files hashed so far (cache misses).
    pub fn hashed(&self) -> u64 {
        self.inner.hashed.load(Ordering::Relaxed)
    }

    /// Files waiting in both lanes now.
    pub fn queued(&self) -> usize {
        self.inner.lanes.iter().map(|q| q.jobs.lock().unwrap_or_else(|p| p.into_inner()).len()).sum()
    }

    pub fn background_bytes(&self) -> u64 {
        self.inner.background_bytes.load(Ordering::Relaxed)
    }

    /// Registers the follower's callback (once; later calls are ignored).
    pub fn on_expected(&self, f: OnExpected) {
        let _ = self.inner.on_expected.set(f);
    }

    /// The digest of `pid`'s executable if known. A file not seen before is queued: on the
    /// expected lane if `expected(its path, its size)` (then the call waits for it until `until`),
    /// else on the background lane (the call does not wait).
    pub fn lookup(&self, pid: i32, known: &Known<'_>, expected: &Expected<'_>, until: Instant) -> io::Result<Lookup> {
        // An answer already cached needs no open: the identity through the link is enough (a
        // file changed since has another size, mtime or ctime, so another key).
        if let Ok(meta) = crate::os::exe_metadata(pid) {
            if let Some(answer) = self.answered(ExeKey::from_metadata(&meta)) {
                return Ok(answer);
            }
        }
        let file = crate::os::open_exe(pid)?;
        self.lookup_file(file, &|| crate::os::exe_path(pid).unwrap_or_default(), known, expected, until)
    }

    pub fn lookup_file(
        &self,
        file: File,
        path: &dyn Fn() -> PathBuf,
        known: &Known<'_>,
        expected: &Expected<'_>,
        until: Instant,
    ) -> io::Result<Lookup> {
        let key = ExeKey::of(&file)?;
        let (slot, new) = self.slot(key);
        let mut wait = false;
        if slot.done.get().is_none() {
            // Recorded by a trust command, install or the follower, perhaps after an earlier call
            // queued this file (a binary the person trusts only once its hooks were refused): the
            // recorded digest answers now, no lane is waited for.
            if let Some(d) = known(&key) {
                slot.finish(Some(d));
            }
        }
        if slot.done.get().is_some() {
            // Nothing to hash.
        } else if new {
            let path = path();
            let lane = if expected(&path, key.size) { Lane::Expected } else { Lane::Background };
            if !self.submit(Job { key, file, path, slot: Arc::clone(&slot) }, lane) {
                return Ok(Lookup::Pending); // the lane is full: nothing cached, a later call asks again
            }
            wait = lane == Lane::Expected;
        } else if slot.done.get().is_none() {
            // Queued by an earlier call: wait only if it is an expected binary.
            wait = expected(&path(), key.size);
        }
        let answer = if wait { self.wait_bounded(&slot, until) } else { slot.done.get() };
        Ok(match answer {
            Some(Some(d)) => Lookup::Digest(d.clone()),
            Some(None) => Lookup::Unhashable,
            None => Lookup::Pending,
        })
    }

    /// Hashes `file` now on the caller's thread (the follower, start-up warm-up, tools), or
    /// returns the cached digest; shares the cache with the lanes.
    pub fn of_file(&self, mut file: File) -> io::Result<String> {
        let key = ExeKey::of(&file)?;
        if key.size > MAX_HASH_BYTES {
            return Err(io::Error::other(format!("{} bytes, over the {MAX_HASH_BYTES} the broker hashes", key.size)));
        }
        let (slot, new) = self.slot(key);
        if new {
            let d = self.hash_checked(&mut file, key);
            slot.finish(d);
        } else if slot.done.get().is_none() {
            // A lane holds it: wait for the lane (bounded by how long a hash can take).
            slot.wait_until(Instant::now() + std::time::Duration::from_secs(120));
        }
        match slot.done.get() {
            Some(Some(d)) => Ok(d.clone()),
            _ => {
                self.forget(key, &slot);
                Err(io::Error::other("executable changed or unreadable while hashing"))
            }
        }
    }

    /// Waits for `slot` until `until` if fewer than [`EXPECTED_WAITERS`] workers wait already.
    fn wait_bounded<'s>(&self, slot: &'s Slot, until: Instant) -> Option<&'s Option<String>> {
        let waiters = &self.inner.waiters;
        if waiters.fetch_add(1, Ordering::AcqRel) >= EXPECTED_WAITERS {
            waiters.fetch_sub(1, Ordering::AcqRel);
            return slot.done.get();
        }
        let answer = slot.wait_until(until);
        waiters.fetch_sub(1, Ordering::AcqRel);
        answer
    }

    /// The finished answer for `key`, if there is one.
    fn answered(&self, key: ExeKey) -> Option<Lookup> {
        let map = self.inner.entries.lock().unwrap_or_else(|p| p.into_inner());
        Some(match map.get(&key)?.done.get()? {
            Some(d) => Lookup::Digest(d.clone()),
            None => Lookup::Unhashable,
        })
    }

    fn slot(&self, key: ExeKey) -> (Arc<Slot>, bool) {
        let mut map = self.inner.entries.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_ENTRIES && !map.contains_key(&key) {
            map.retain(|_, s| s.done.get().is_none());
        }
        match map.get(&key) {
            Some(s) => (Arc::clone(s), false),
            None => {
                let s = Arc::new(Slot::default());
                map.insert(key, Arc::clone(&s));
                (s, true)
            }
        }
    }

    fn forget(&self, key: ExeKey, slot: &Arc<Slot>) {
        let mut map = self.inner.entries.lock().unwrap_or_else(|p| p.into_inner());
        if map.get(&key).is_some_and(|c| Arc::ptr_eq(c, slot)) {
            map.remove(&key);
        }
    }

    /// Queues `job` on `lane`; false if the lane is full (then nothing is cached for the file).
    fn submit(&self, job: Job, lane: Lane) -> bool {
        if job.key.size > MAX_HASH_BYTES {
            job.slot.finish(None); // a stable answer for this file: never hashed
            return true;
        }
        self.start_lanes();
        let q = &self.inner.lanes[lane as usize];
        let mut jobs = q.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let cap = match lane {
            Lane::Expected => EXPECTED_QUEUE,
            Lane::Background => BACKGROUND_QUEUE,
        };
        if jobs.len() >= cap {
            drop(jobs);
            self.forget(job.key, &job.slot);
            job.slot.finish(None); // wakes any other caller of this slot; the fd closes here
            return false;
        }
        jobs.push_back(job);
        q.cv.notify_one();
        true
    }

    fn start_lanes(&self) {
        self.inner.started.get_or_init(|| {
            for lane in [Lane::Expected, Lane::Background] {
                let me = self.clone();
                let name = match lane {
                    Lane::Expected => "hash-expected",
                    Lane::Background => "hash-background",
                };
                let spawned = std::thread::Builder::new().name(name.into()).spawn(move || me.run_lane(lane));
                if let Err(e) = spawned {
                    crate::log_error!("cannot start the {name} thread: {e}");
                }
            }
        });
    }

    fn run_lane(&self, lane: Lane) {
        if lane == Lane::Background {
            // Lowest CPU priority for this thread only (Linux: a thread id is a PRIO_PROCESS target).
            unsafe { nix::libc::setpriority(nix::libc::PRIO_PROCESS, nix::libc::gettid() as u32, 19) };
        }
        let q = &self.inner.lanes[lane as usize];
        loop {
            let mut job = {
                let mut jobs = q.jobs.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    match jobs.pop_front() {
                        Some(j) => break j,
                        None => jobs = q.cv.wait(jobs).unwrap_or_else(|p| p.into_inner()),
                    }
                }
            };
            let digest = self.hash_checked(&mut job.file, job.key);
            if lane == Lane::Background {
                self.inner.background_bytes.fetch_add(job.key.size, Ordering::Relaxed);
            }
            if let (Lane::Expected, Some(d), Some(f)) = (lane, &digest, self.inner.on_expected.get()) {
                f(&job.path, &job.key, d);
            }
            let lane_name = match lane {
                Lane::Expected => "expected",
                Lane::Background => "background",
            };
            let said = match &digest {
                Some(d) => format!("hashed {} ({lane_name} lane): sha256 {d}", job.path.display()),
                None => format!("could not hash {} ({lane_name} lane): unreadable or changed", job.path.display()),
            };
            job.slot.finish(digest);
            // Logged once the answer is cached: a hook after this line gets the digest.
            crate::log_info!("{said}");
        }
    }

    /// The digest, or `None` if unreadable or changed while hashed (no trustworthy answer).
    fn hash_checked(&self, file: &mut File, key: ExeKey) -> Option<String> {
        self.inner.hashed.fetch_add(1, Ordering::Relaxed);
        let d = hash_reader(file).ok();
        match ExeKey::of(file) {
            Ok(after) if after == key => d,
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::Duration;

    fn temp_file(name: &str, bytes: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("courier-digest-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("exe");
        std::fs::File::create(&p).unwrap().write_all(bytes).unwrap();
        p
    }

    #[test]
    fn expected_lane_answers_waiters_and_caches() {
        let p = temp_file("expected", b"hello");
        let cache = DigestCache::default();
        let until = Instant::now() + Duration::from_secs(10);
        let path = || p.clone();
        let got = cache.lookup_file(File::open(&p).unwrap(), &path, &|_| None, &|_, _| true, until).unwrap();
        assert_eq!(got, Lookup::Digest(crate::exe::sha256_file(&p).unwrap()));
        let hashed = cache.hashed();
        // Known now: answered without waiting and without hashing again.
        let again = cache.lookup_file(File::open(&p).unwrap(), &path, &|_| None, &|_, _| false, Instant::now()).unwrap();
        assert_eq!(again, got);
        assert_eq!(cache.hashed(), hashed);
    }

    #[test]
    fn background_lane_never_makes_the_caller_wait_and_skips_huge_files() {
        let p = temp_file("background", &vec![7u8; 4 << 20]);
        let cache = DigestCache::default();
        let path = || p.clone();
        let never = |_: &Path, _: u64| false;
        let far = Instant::now() + Duration::from_secs(60);
        let first = cache.lookup_file(File::open(&p).unwrap(), &path, &|_| None, &never, far).unwrap();
        assert!(matches!(first, Lookup::Pending | Lookup::Digest(_)), "{first:?}");
        // It is hashed in the background: a later lookup finds the digest (bounded poll).
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match cache.lookup_file(File::open(&p).unwrap(), &path, &|_| None, &never, far).unwrap() {
                Lookup::Digest(_) => break,
                other => assert!(Instant::now() < deadline, "still {other:?}"),
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(cache.background_bytes(), 4 << 20);
        // A sparse file over the cap is answered at once and never read.
        let big = temp_file("big", b"");
        std::fs::OpenOptions::new().write(true).open(&big).unwrap().set_len(MAX_HASH_BYTES + 1).unwrap();
        let hashed = cache.hashed();
        let big_path = || big.clone();
        let got = cache.lookup_file(File::open(&big).unwrap(), &big_path, &|_| None, &never, far).unwrap();
        assert_eq!(got, Lookup::Unhashable);
        assert_eq!(cache.hashed(), hashed);
    }

    #[test]
    fn the_expected_lane_queues_and_waits_for_a_bounded_few() {
        let cache = DigestCache::default();
        let expected = |_: &Path, _: u64| true;
        // Keep the lane busy for a while: a sparse 256 MiB file.
        let busy = temp_file("busy", b"");
        std::fs::OpenOptions::new().write(true).open(&busy).unwrap().set_len(256 << 20).unwrap();
        let now = Instant::now;
        cache.lookup_file(File::open(&busy).unwrap(), &|| busy.clone(), &|_| None, &expected, now()).unwrap();
        let files: Vec<PathBuf> = (0..EXPECTED_QUEUE + 3).map(|i| temp_file(&format!("queued-{i}"), format!("{i}").as_bytes())).collect();
        let answers: Vec<Lookup> =
            files.iter().map(|p| cache.lookup_file(File::open(p).unwrap(), &|| p.clone(), &|_| None, &expected, now()).unwrap()).collect();
        assert!(answers.iter().all(|a| *a == Lookup::Pending), "{answers:?}");
        assert!(cache.queued() <= EXPECTED_QUEUE, "{} queued", cache.queued());
        // Many hooks on one queued file: only EXPECTED_WAITERS wait for it, the rest answer at once.
        let queued = files[0].clone();
        let far = now() + Duration::from_secs(60);
        let waits: Vec<_> = (0..EXPECTED_WAITERS + 4)
            .map(|_| {
                let (cache, p) = (cache.clone(), queued.clone());
                std::thread::spawn(move || cache.lookup_file(File::open(&p).unwrap(), &|| p.clone(), &|_| None, &expected, far).unwrap())
            })
            .collect();
        let got: Vec<Lookup> = waits.into_iter().map(|h| h.join().unwrap()).collect();
        let waited = got.iter().filter(|a| matches!(a, Lookup::Digest(_))).count();
        assert_eq!(waited, EXPECTED_WAITERS, "{got:?}");
        // A file the full lane turned away was not cached: asked again, it is hashed.
        let turned_away = files.last().unwrap();
        let again = cache.lookup_file(File::open(turned_away).unwrap(), &|| turned_away.clone(), &|_| None, &expected, far).unwrap();
        assert_eq!(again, Lookup::Digest(crate::exe::sha256_file(turned_away).unwrap()));
    }

    #[test]
    fn a_recorded_digest_is_used_without_hashing() {
        let p = temp_file("known", b"recorded");
        let cache = DigestCache::default();
        let key = ExeKey::of_path(&p).unwrap();
        let known = move |k: &ExeKey| (*k == key).then(|| "d".repeat(64));
        let got = cache.lookup_file(File::open(&p).unwrap(), &|| p.clone(), &known, &|_, _| false, Instant::now()).unwrap();
        assert_eq!(got, Lookup::Digest("d".repeat(64)));
        assert_eq!(cache.hashed(), 0);
    }

    #[test]
    fn a_digest_recorded_while_the_file_waits_in_a_lane_answers_at_once() {
        let cache = DigestCache::default();
        let never = |_: &Path, _: u64| false;
        // Keep the background lane busy: a sparse 512 MiB file, hashed at the lowest priority.
        let busy = temp_file("lane-busy", b"");
        std::fs::OpenOptions::new().write(true).open(&busy).unwrap().set_len(512 << 20).unwrap();
        cache.lookup_file(File::open(&busy).unwrap(), &|| busy.clone(), &|_| None, &never, Instant::now()).unwrap();
        // A binary seen before anyone trusted it waits behind it.
        let p = temp_file("trusted-late", b"the codex the person trusts next");
        let first = cache.lookup_file(File::open(&p).unwrap(), &|| p.clone(), &|_| None, &never, Instant::now()).unwrap();
        assert_eq!(first, Lookup::Pending);
        // The person's trust command records its digest by identity: the next call takes it, even
        // one that would wait for the lane (the file is expected now).
        let key = ExeKey::of_path(&p).unwrap();
        let known = move |k: &ExeKey| (*k == key).then(|| "d".repeat(64));
        let far = Instant::now() + Duration::from_secs(60);
        let got = cache.lookup_file(File::open(&p).unwrap(), &|| p.clone(), &known, &|_, _| true, far).unwrap();
        assert_eq!(got, Lookup::Digest("d".repeat(64)), "the recorded digest, not the lane's");
    }

    #[test]
    fn a_rewritten_file_is_hashed_anew() {
        let p = temp_file("rewrite", b"one");
        let cache = DigestCache::default();
        let a = cache.of_file(File::open(&p).unwrap()).unwrap();
        // File timestamps tick with the kernel's coarse clock (a few ms): wait for a new one.
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(&p, b"two").unwrap();
        let b = cache.of_file(File::open(&p).unwrap()).unwrap();
        assert_ne!(a, b);
        assert_eq!(b, crate::exe::sha256_file(&p).unwrap());
    }
}
