//! Step 5's process-side evidence: does the codex process hold the rollout open for append, and
//! the thread's writer lock? One scan of `/proc/<codex>/fd` answers both (locks from the fds' own
//! fdinfo), and can count how many thread-writer locks that process holds.
//!
//! A scan stats fds one by one (a Codex running 100 threads has 200+; a long session 2,000), so:
//! the fds the last scan found ([`FdHints`]) are re-checked first, one stat and one fdinfo read
//! each; a miss (a thread's first hook) scans newest fd first and stops at the proof
//! ([`ScanFor::Proof`]: a thread's files are opened after most of what codex holds); and only a
//! SessionStart with something to deliver counts every lock ([`thread_locks`]).
//!
//! # Only what codex opened itself counts
//! A same-uid process can open a thread's rollout and a lock file, make the fds inheritable, and
//! exec the trusted Codex binary: the new codex image then "holds" both (fd smuggling). The real
//! Codex opens its rollout and its writer lock itself, with `O_CLOEXEC` (Rust's std always sets
//! it), and an fd inherited across `exec` cannot carry that flag (it would have been closed).
//! So both fds must show `O_CLOEXEC` in their fdinfo `flags`.
//!
//! # Which lock file
//! The lock must be on the file that is at `thread-writer-locks/<thread>.lock` now (same device
//! and inode), or on one that was there and has been unlinked since (`nlink` 0, fd target
//! `<dir>/<thread>.lock (deleted)`). The second case is the real holder after someone removed or
//! replaced the path under a live thread: the codex that locked the file itself (O_CLOEXEC) when
//! it opened the thread is still that thread's writer, and refusing it would let any same-uid
//! process cut a session off from its messages by replacing one file. Whoever holds the
//! replacement gains nothing by it unless it is a trusted codex that opened and locked it itself,
//! i.e. a real Codex session of that thread. A lock file renamed away (still linked, another
//! name) no longer counts.

use crate::os;
use std::collections::{HashMap, HashSet};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// What one fd scan of the codex process found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HolderScan {
    /// An fd on the rollout (same device and inode), opened writable with `O_APPEND` and
    /// `O_CLOEXEC` (by codex itself).
    pub holds_rollout_append: bool,
    /// An fd on the rollout writable with `O_APPEND`, but inherited across exec (no `O_CLOEXEC`).
    pub rollout_inherited: bool,
    /// An fd on the rollout exists, but not writable+append.
    pub holds_rollout_other: bool,
    /// The codex pid holds FLOCK WRITE on the wanted thread lock file (see the module docs),
    /// through an fd it opened itself (`O_CLOEXEC`).
    pub holds_thread_lock: bool,
    /// ... and that lock file is no longer at the lock path (unlinked since codex locked it).
    pub thread_lock_unlinked: bool,
    /// The codex pid holds FLOCK WRITE on the wanted lock file only through an inherited fd.
    pub thread_lock_inherited: bool,
    /// Distinct `thread-writer-locks/<uuid>.lock` files the codex pid holds FLOCK WRITE on.
    pub thread_locks: usize,
    /// fds examined.
    pub fds: usize,
    /// The fd found holding the rollout for append, and the one holding the wanted lock.
    pub rollout_fd: Option<String>,
    pub thread_lock_fd: Option<String>,
}

const O_ACCMODE: u32 = 0o3;
const O_APPEND: u32 = 0o2000;
/// fdinfo `flags` shows it when the fd's close-on-exec flag is set.
const O_CLOEXEC: u32 = 0o2000000;

fn writable_append(flags: u32) -> bool {
    flags & O_APPEND != 0 && flags & O_ACCMODE != 0
}

fn cloexec(flags: u32) -> bool {
    flags & O_CLOEXEC != 0
}

fn read_fdinfo(pid: i32, fd: &str, buf: &mut Vec<u8>) -> Option<()> {
    os::fd::read_fdinfo(pid, fd, buf).ok()
}

use os::fd::fdinfo_flags;

/// Does this fdinfo show an exclusive flock held by `pid` through this open file? The kernel lists
/// (under the file's own lock) exactly the locks owned through this fd as `lock:` lines, in the
/// `/proc/locks` format. Unlike `/proc/locks`, which is read in page-sized chunks and can skip
/// lines while other processes take or drop locks, this view is consistent.
fn fdinfo_holds_flock_write(fdinfo: &str, pid: i32) -> bool {
    os::locks::fdinfo_flock_writes(fdinfo).iter().any(|l| l.pid == pid)
}

/// How far a [`scan`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanFor {
    /// Stop at the first fds that prove the thread is held (rollout for append and the lock at
    /// its path, both opened by codex): a thread's first hook in a codex holding 2,000 files.
    Proof,
    /// Every fd: also count the thread-writer locks the process holds (SessionStart delivery).
    Count,
}

/// The fd numbers of `pid`, newest first: a thread's rollout and lock are opened when the thread
/// starts, after most of what a long-lived codex holds, so they are usually near the top. An
/// entry that cannot be read is skipped; the process exiting meanwhile is an error: what was
/// seen of it is no evidence.
fn fds_newest_first(pid: i32) -> io::Result<Vec<u32>> {
    let mut fds = os::fd::fd_numbers(pid)?;
    fds.sort_unstable_by(|a, b| b.cmp(a));
    Ok(fds)
}

/// Scans `/proc/<pid>/fd`, newest fd first: stats each fd target, reads fdinfo only for the
/// rollout's fds and for fds on `<writer_lock_dir>/<uuid>.lock` files. `thread_lock` is the file
/// at the thread's lock path now (`None` when there is none); `thread` the thread's id. With
/// [`ScanFor::Proof`] it stops once both are proven held; any doubt scans on to the end.
pub fn scan(
    pid: i32,
    rollout: (u64, u64),
    thread_lock: Option<(u64, u64)>,
    thread: &str,
    writer_lock_dir: &Path,
    scan_for: ScanFor,
) -> io::Result<HolderScan> {
    let mut out = HolderScan::default();
    let proven = |out: &HolderScan| scan_for == ScanFor::Proof && out.holds_rollout_append && out.thread_lock_fd.is_some();
    let mut seen = Seen { thread_lock_ids: HashSet::new(), info: Vec::with_capacity(512) };
    // A thread's first hook: probe the top of codex's fd table, where its newest files are, before
    // listing `/proc/<pid>/fd` (2,000 entries cost ~3 ms of the broker's CPU to list).
    if scan_for == ScanFor::Proof {
        for fd in probe_newest(pid) {
            examine(pid, fd, rollout, thread_lock, thread, writer_lock_dir, &mut out, &mut seen);
            if proven(&out) {
                return Ok(out);
            }
        }
        out = HolderScan::default();
        seen.thread_lock_ids.clear();
    }
    for fd in fds_newest_first(pid)? {
        if proven(&out) {
            break;
        }
        examine(pid, fd, rollout, thread_lock, thread, writer_lock_dir, &mut out, &mut seen);
    }
    out.thread_locks = seen.thread_lock_ids.len();
    Ok(out)
}

/// What a scan keeps between fds: the lock files counted, and a buffer for fdinfo.
struct Seen {
    thread_lock_ids: HashSet<(u64, u64)>,
    info: Vec<u8>,
}

/// How many fd numbers below the top of the fd table a first look probes.
const PROBE: u32 = 64;

/// The top [`PROBE`] fd numbers of `pid`'s fd table (`FDSize` in its status), newest first;
/// empty when unknown. Numbers with no open fd are probed too (one failed stat each).
fn probe_newest(pid: i32) -> Vec<u32> {
    let size = os::read_status(pid).map_or(0, |s| s.fd_size);
    (size.saturating_sub(PROBE)..size).rev().collect()
}

/// One fd of the scan: what it holds, into `out`.
#[allow(clippy::too_many_arguments)]
fn examine(
    pid: i32,
    fd: u32,
    rollout: (u64, u64),
    thread_lock: Option<(u64, u64)>,
    thread: &str,
    writer_lock_dir: &Path,
    out: &mut HolderScan,
    seen: &mut Seen,
) {
    use std::os::unix::fs::MetadataExt;
    let Seen { thread_lock_ids, info } = seen;
    let info = &mut *info;
    let fd = &fd.to_string();
    out.fds += 1;
    let meta = match os::fd::fd_metadata(pid, fd) {
        Ok(m) => m,
        Err(_) => return, // closed meanwhile (or no such fd: a probe), or a target we cannot stat
    };
    if !meta.is_file() {
        return;
    }
    let id = (meta.dev(), meta.ino());
    if id == rollout {
        let flags = read_fdinfo(pid, fd, info).and_then(|()| fdinfo_flags(std::str::from_utf8(info).ok()?));
        match flags {
            Some(f) if writable_append(f) && cloexec(f) => {
                out.holds_rollout_append = true;
                out.rollout_fd = Some(fd.to_string());
            }
            Some(f) if writable_append(f) => out.rollout_inherited = true,
            _ => out.holds_rollout_other = true,
        }
        return;
    }
    let Ok(target) = os::fd::fd_target(pid, fd) else { return };
    let Some(lock_thread) = thread_lock_name(&target, meta.nlink() == 0, writer_lock_dir) else { return };
    let at_path = Some(id) == thread_lock;
    let wanted = at_path || (meta.nlink() == 0 && lock_thread == thread);
    if !wanted && thread_lock_ids.contains(&id) {
        return;
    }
    if read_fdinfo(pid, fd, info).is_none() {
        return;
    }
    let Ok(text) = std::str::from_utf8(info) else { return };
    if !fdinfo_holds_flock_write(text, pid) {
        return;
    }
    thread_lock_ids.insert(id);
    if wanted {
        if fdinfo_flags(text).is_some_and(cloexec) {
            // The lock at the path beats an unlinked one (only it can be remembered as a hint).
            if at_path || !out.holds_thread_lock {
                out.holds_thread_lock = true;
                out.thread_lock_unlinked = !at_path;
                out.thread_lock_fd = at_path.then(|| fd.to_string());
            }
        } else {
            out.thread_lock_inherited = true;
        }
    }
}

/// How many thread-writer locks in `writer_lock_dir` `pid` holds through fds it opened itself,
/// if `pid` still has start time `starttime` afterwards (a full [`scan`]: only asked when a
/// SessionStart has something to deliver).
pub fn thread_locks(pid: i32, starttime: u64, writer_lock_dir: &Path) -> Option<usize> {
    // No file has device 0 and inode 0: the scan looks for locks only.
    let scan = scan(pid, (0, 0), None, "", writer_lock_dir, ScanFor::Count).ok()?;
    let same = os::read_stat(pid).is_ok_and(|s| s.starttime == starttime);
    same.then_some(scan.thread_locks)
}

/// Where a codex process's rollout and writer-lock fds were found, by (pid, start time, device,
/// inode), with that fd's `/proc/<pid>/fdinfo/<fd>` kept open. Only a place to look first: the
/// fd is re-checked every time. A kept fdinfo file is read anew at every `pread` (the kernel
/// looks the fd up then) and fails once its process is gone, even if another has the pid by
/// then: one `pread` instead of an open, a read and a close.
#[derive(Default)]
pub struct FdHints {
    map: Mutex<HashMap<(i32, u64, u64, u64), Hint>>,
}

#[derive(Clone)]
struct Hint {
    fd: String,
    fdinfo: Arc<std::fs::File>,
}

/// Hints kept at most (the map is cleared when full): each holds a file open.
const MAX_HINTS: usize = 1024;

impl FdHints {
    fn get(&self, pid: i32, start: u64, file: (u64, u64)) -> Option<Hint> {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).get(&(pid, start, file.0, file.1)).cloned()
    }

    /// Remembers what a scan of `pid` found.
    pub fn learn(&self, pid: i32, start: u64, rollout: (u64, u64), lock: (u64, u64), scan: &HolderScan) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_HINTS {
            map.clear();
        }
        for (file, fd) in [(rollout, &scan.rollout_fd), (lock, &scan.thread_lock_fd)] {
            let Some(fd) = fd else { continue };
            if let Ok(fdinfo) = os::fd::open_fdinfo(pid, fd) {
                map.insert((pid, start, file.0, file.1), Hint { fd: fd.clone(), fdinfo: Arc::new(fdinfo) });
            }
        }
    }
}

/// fdinfo text of the hinted fd of `pid` if that fd is open on `file` (device, inode), by stat
/// and by fdinfo's own `ino:` line (so an fd closed and reused in between is not taken for the
/// file).
fn fdinfo_if_on(pid: i32, hint: &Hint, file: (u64, u64)) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = os::fd::fd_metadata(pid, &hint.fd).ok()?;
    if (meta.dev(), meta.ino()) != file {
        return None;
    }
    let text = String::from_utf8(os::pread_record(&hint.fdinfo, 1024).ok()?).ok()?;
    let ino = text.lines().find_map(|l| l.strip_prefix("ino:")).map(|v| v.trim().parse::<u64>());
    match ino {
        Some(Ok(ino)) if ino != file.1 => None,
        Some(Err(_)) => None,
        _ => Some(text),
    }
}

/// True when the fds remembered for `pid` still hold `rollout` writable with O_APPEND and a FLOCK
/// WRITE lock of `pid` on `lock`, both opened by codex itself (O_CLOEXEC). False (scan instead)
/// on any doubt.
pub fn hinted_holds(hints: &FdHints, pid: i32, start: u64, rollout: (u64, u64), lock: (u64, u64)) -> bool {
    let (Some(rfd), Some(lfd)) = (hints.get(pid, start, rollout), hints.get(pid, start, lock)) else {
        return false;
    };
    let append = fdinfo_if_on(pid, &rfd, rollout).and_then(|t| fdinfo_flags(&t)).is_some_and(|f| writable_append(f) && cloexec(f));
    append && fdinfo_if_on(pid, &lfd, lock).is_some_and(|t| fdinfo_flags(&t).is_some_and(cloexec) && fdinfo_holds_flock_write(&t, pid))
}

/// The thread id of a writer-lock fd target: `<dir>/<uuid>.lock` exactly, or, for a file that
/// has been unlinked (`unlinked`: nlink 0), the `<dir>/<uuid>.lock (deleted)` the kernel shows.
fn thread_lock_name<'a>(target: &'a Path, unlinked: bool, dir: &Path) -> Option<&'a str> {
    let bytes = target.as_os_str().as_bytes();
    let bytes = if unlinked { bytes.strip_suffix(b" (deleted)")? } else { bytes };
    let path = Path::new(std::ffi::OsStr::from_bytes(bytes));
    if path.parent() != Some(dir) {
        return None;
    }
    let name = path.file_name()?.as_bytes().strip_suffix(b".lock")?;
    std::str::from_utf8(name).ok().filter(|s| courier_shared::ids::is_uuid(s))
}

/// What one trusted codex process holds for one thread: the thread's rollout (open for append)
/// and its writer lock, both through fds it opened itself (`O_CLOEXEC`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldThread {
    pub thread: String,
    /// The rollout's path as the fd shows it (canonical: the kernel's view of the open file).
    pub rollout: std::path::PathBuf,
}

/// The threads `pid` runs, by the same evidence the gate asks of a hook's codex (step 5): one
/// scan of its fds for rollouts under `sessions` (canonical) held writable with `O_APPEND` and
/// `O_CLOEXEC`, and for `thread-writer-locks/<uuid>.lock` files in `writer_lock_dir` (canonical)
/// on which it holds FLOCK WRITE through an fd it opened itself. A thread counts only with both.
/// For listing threads (`broker threads`); the gate's own checks stay in [`scan`].
pub fn held_threads(pid: i32, sessions: &Path, writer_lock_dir: &Path) -> io::Result<Vec<HeldThread>> {
    use std::os::unix::fs::MetadataExt;
    let mut rollouts: HashMap<String, std::path::PathBuf> = HashMap::new();
    let mut locks: HashSet<String> = HashSet::new();
    let mut info = Vec::with_capacity(512);
    for fd in fds_newest_first(pid)? {
        let fd = &fd.to_string();
        let Ok(meta) = os::fd::fd_metadata(pid, fd) else { continue };
        if !meta.is_file() {
            continue;
        }
        let Ok(target) = os::fd::fd_target(pid, fd) else { continue };
        if target.starts_with(sessions) {
            let Some(thread) = target.to_str().and_then(codex_format::rollout::thread_id_from_path) else { continue };
            let thread = thread.to_string();
            let flags = read_fdinfo(pid, fd, &mut info).and_then(|()| fdinfo_flags(std::str::from_utf8(&info).ok()?));
            if flags.is_some_and(|f| writable_append(f) && cloexec(f)) {
                rollouts.insert(thread, target);
            }
            continue;
        }
        let Some(thread) = thread_lock_name(&target, meta.nlink() == 0, writer_lock_dir) else { continue };
        if read_fdinfo(pid, fd, &mut info).is_none() {
            continue;
        }
        let Ok(text) = std::str::from_utf8(&info) else { continue };
        if fdinfo_holds_flock_write(text, pid) && fdinfo_flags(text).is_some_and(cloexec) {
            locks.insert(thread.to_string());
        }
    }
    let mut out: Vec<HeldThread> =
        rollouts.into_iter().filter(|(t, _)| locks.contains(t)).map(|(thread, rollout)| HeldThread { thread, rollout }).collect();
    out.sort_by(|a, b| a.thread.cmp(&b.thread));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fdinfo_lock_lines() {
        let info = "pos:\t0\nflags:\t02100002\nmnt_id:\t25\nino:\t42\nlock:\t1: FLOCK  ADVISORY  WRITE 7216 fe:00:42 0 EOF\n";
        assert!(fdinfo_holds_flock_write(info, 7216));
        assert!(!fdinfo_holds_flock_write(info, 7217));
        assert!(!fdinfo_holds_flock_write("pos:\t0\nflags:\t02\n", 7216));
        let read = "lock:\t1: FLOCK  ADVISORY  READ 7216 fe:00:42 0 EOF\n";
        assert!(!fdinfo_holds_flock_write(read, 7216));
        assert_eq!(fdinfo_flags(info), Some(0o2100002));
    }

    #[test]
    fn thread_lock_paths() {
        const U: &str = "01a22659-8b33-7382-a4b5-24e01f7dc6c5";
        let d = Path::new("/h/.codex/thread-writer-locks");
        fn name(t: &Path, unlinked: bool) -> Option<String> {
            thread_lock_name(t, unlinked, Path::new("/h/.codex/thread-writer-locks")).map(str::to_string)
        }
        let some = |s: &str| Some(s.to_string());
        assert_eq!(name(&d.join(format!("{U}.lock")), false), some(U));
        assert_eq!(name(Path::new("/h/.codex/.tmp/plugins.sync.lock"), false), None);
        assert_eq!(name(&d.join("x.lock"), false), None);
        assert_eq!(name(&d.join(format!("sub/{U}.lock")), false), None);
        // An unlinked lock file, as /proc/<pid>/fd shows it.
        assert_eq!(name(&d.join(format!("{U}.lock (deleted)")), true), some(U));
        // Still linked under that odd name: not a thread lock; unlinked without the suffix: neither.
        assert_eq!(name(&d.join(format!("{U}.lock (deleted)")), false), None);
        assert_eq!(name(&d.join(format!("{U}.lock")), true), None);
    }

    /// The hinted check reads the kept fdinfo files anew each time: a lock released, or the fd
    /// closed and its number reused for another file, is seen at the next call.
    #[test]
    fn kept_fdinfo_hints_see_the_lock_and_the_fd_as_they_are_now() {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        const U: &str = "01a22659-8b33-7382-a4b5-24e01f7dc6c5";
        let dir = courier_shared::scratch::dir("courier-hints");
        let locks = dir.join("thread-writer-locks");
        std::fs::create_dir_all(&locks).unwrap();
        let locks = std::fs::canonicalize(&locks).unwrap();
        let rollout = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("rollout.jsonl")).unwrap();
        let lock = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(locks.join(format!("{U}.lock"))).unwrap();
        let ids = |f: &std::fs::File| {
            let m = f.metadata().unwrap();
            (m.dev(), m.ino())
        };
        let (r, l) = (ids(&rollout), ids(&lock));
        let (pid, start) = (std::process::id() as i32, os::read_stat(std::process::id() as i32).unwrap().starttime);
        let held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|(_, e)| e).unwrap();
        let hints = FdHints::default();
        let found = scan(pid, r, Some(l), U, &locks, ScanFor::Proof).unwrap();
        hints.learn(pid, start, r, l, &found);
        assert!(hinted_holds(&hints, pid, start, r, l));
        // The lock released: the same kept fdinfo file no longer shows it.
        let lock = held.unlock().map_err(|(_, e)| e).unwrap();
        assert!(!hinted_holds(&hints, pid, start, r, l), "a released lock is seen");
        let held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|(_, e)| e).unwrap();
        assert!(hinted_holds(&hints, pid, start, r, l));
        // The rollout's fd number now names another file opened for append.
        let other = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("other.jsonl")).unwrap();
        // SAFETY: dup3 onto an fd this test owns (the rollout's), with O_CLOEXEC as codex opens files.
        assert!(unsafe { nix::libc::dup3(other.as_raw_fd(), rollout.as_raw_fd(), nix::libc::O_CLOEXEC) } >= 0);
        assert!(!hinted_holds(&hints, pid, start, r, l), "an fd number reused for another file is seen");
        drop(held);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A thread's first hook in a process holding many files: the proof is found among the newest
    /// fds and the scan stops there; counting the process's threads still reads every fd.
    #[test]
    fn proof_scan_stops_at_the_newest_fds_and_count_reads_all() {
        use std::os::unix::fs::MetadataExt;
        const U: &str = "01a22659-8b33-7382-a4b5-24e01f7dc6c5";
        let dir = std::env::temp_dir().join(format!("courier-holder-{}", std::process::id()));
        let locks = dir.join("thread-writer-locks");
        std::fs::create_dir_all(&locks).unwrap();
        let locks = std::fs::canonicalize(&locks).unwrap();
        let older: Vec<std::fs::File> = (0..600).map(|_| std::fs::File::open("/dev/null").unwrap()).collect();
        // As Codex opens a new thread: the rollout for append and the writer lock, both O_CLOEXEC.
        let rollout = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("rollout.jsonl")).unwrap();
        let lock_path = locks.join(format!("{U}.lock"));
        let lock = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path).unwrap();
        let _held =
            nix::fcntl::Flock::lock(lock.try_clone().unwrap(), nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|(_, e)| e).unwrap();
        let ids = |f: &std::fs::File| {
            let m = f.metadata().unwrap();
            (m.dev(), m.ino())
        };
        let pid = std::process::id() as i32;
        let proof = scan(pid, ids(&rollout), Some(ids(&lock)), U, &locks, ScanFor::Proof).unwrap();
        assert!(proof.holds_rollout_append && proof.holds_thread_lock, "{proof:?}");
        assert!(proof.fds < 50, "stopped near the top, not after all {} older fds: {proof:?}", older.len());
        // The probe looks at the top of the fd table (FDSize), newest first.
        let probe = probe_newest(pid);
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let size: u32 = status.lines().find_map(|l| l.strip_prefix("FDSize:")).unwrap().trim().parse().unwrap();
        assert_eq!((probe.first(), probe.len()), (Some(&(size - 1)), PROBE as usize));
        assert!(probe.windows(2).all(|w| w[0] == w[1] + 1));
        let all = scan(pid, ids(&rollout), Some(ids(&lock)), U, &locks, ScanFor::Count).unwrap();
        assert!(all.fds > older.len() && all.thread_locks == 1, "{all:?}");
        let start = os::read_stat(pid).unwrap().starttime;
        assert_eq!(thread_locks(pid, start, &locks), Some(1));
        assert_eq!(thread_locks(pid, start + 1, &locks), None, "another process's start time: no answer");
        drop(older);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn close_on_exec_is_read_from_fdinfo_flags() {
        // As a Rust program opens its rollout (O_WRONLY|O_APPEND|O_CLOEXEC) and as an inherited fd shows.
        assert!(cloexec(0o2102001) && writable_append(0o2102001));
        assert!(!cloexec(0o102001) && writable_append(0o102001));
        assert!(!writable_append(0o2100000));
    }
}
