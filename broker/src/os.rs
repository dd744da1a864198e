//! The operating system, as the broker reads it: small, allocation-light readers for the few
//! `/proc` files the gate, delivery and the producer commands need, the raw syscalls (`pidfd_open`,
//! `statx`, `openat2`) that neither std nor nix wraps the way we need them, and the two identity
//! types everything else names processes and files by: [`ProcessKey`] (pid and start time) and
//! [`FileKey`] (device and inode).
//!
//! Every reader returns `io::Result`; callers turn `ENOENT`/`ESRCH` (a process that went away
//! mid-check) into refusals. Nothing here panics on malformed input.

use nix::libc;
use std::collections::HashMap;
use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Reads a small `/proc` file into `buf` (cleared first). `/proc` files report size 0, so read
/// until EOF; `limit` bounds memory for files a hostile process can make large (`environ`).
pub fn read_small(path: &str, buf: &mut Vec<u8>, limit: usize) -> io::Result<()> {
    buf.clear();
    let file = File::open(path)?;
    file.take(limit as u64).read_to_end(buf)?;
    Ok(())
}

/// Reads a one-record `/proc` file (`stat`, `status`, `fdinfo/<fd>`: the kernel renders the whole
/// record and a read returns all of it that fits) with one `read` when it is shorter than `cap`,
/// saving the EOF read. A full buffer falls back to reading until EOF, bounded by `limit`.
pub fn read_record(path: &str, buf: &mut Vec<u8>, cap: usize, limit: usize) -> io::Result<()> {
    buf.clear();
    buf.resize(cap, 0);
    let mut file = File::open(path)?;
    let n = loop {
        match file.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => break other?,
        }
    };
    buf.truncate(n);
    if n == cap {
        file.take(limit.saturating_sub(n) as u64).read_to_end(buf)?;
    }
    Ok(())
}

/// The fields of `/proc/<pid>/stat` the gate uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat {
    pub comm: String,
    /// Field 3: `R`, `S`, `Z` (zombie), ...
    pub state: char,
    pub ppid: i32,
    /// Field 5: the process group.
    pub pgrp: i32,
    /// Field 7: the controlling terminal's device number, 0 for none.
    pub tty_nr: i32,
    /// Field 8: the foreground process group of the controlling terminal, -1 for none.
    pub tpgid: i32,
    /// Field 22: start time in clock ticks after boot. With the pid, it names one process.
    pub starttime: u64,
}

pub fn read_stat(pid: i32) -> io::Result<ProcStat> {
    let mut buf = Vec::with_capacity(512);
    read_record(&format!("/proc/{pid}/stat"), &mut buf, 1024, 4096)?;
    parse_stat(&buf).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unparsable /proc stat"))
}

/// [`read_stat`], with the file kept open: [`pread_record`] on it reads the same process's stat
/// again at one syscall, and fails once that process is gone (never another's with its pid).
pub fn open_stat(pid: i32) -> io::Result<(File, ProcStat)> {
    let file = File::open(format!("/proc/{pid}/stat"))?;
    let stat = reread_stat(&file)?;
    Ok((file, stat))
}

/// The stat of the process whose `/proc/<pid>/stat` `file` is ([`open_stat`]).
pub fn reread_stat(file: &File) -> io::Result<ProcStat> {
    parse_stat(&pread_record(file, 1024)?).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unparsable /proc stat"))
}

/// Parses `pid (comm) state ppid ...`. `comm` may itself contain `)` and spaces, so the fixed
/// fields are counted from the LAST `)`.
pub fn parse_stat(buf: &[u8]) -> Option<ProcStat> {
    let open = buf.iter().position(|b| *b == b'(')?;
    let close = buf.iter().rposition(|b| *b == b')')?;
    if close < open {
        return None;
    }
    let comm = String::from_utf8_lossy(&buf[open + 1..close]).into_owned();
    let rest = std::str::from_utf8(buf.get(close + 1..)?).ok()?;
    // rest starts at field 3 (state); ppid is field 4, pgrp 5, session 6, tty_nr 7, tpgid 8,
    // starttime 22.
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let mut int = || fields.next()?.parse::<i32>().ok();
    let (ppid, pgrp, _session, tty_nr, tpgid) = (int()?, int()?, int()?, int()?, int()?);
    let starttime: u64 = fields.nth(22 - 9)?.parse().ok()?;
    Some(ProcStat { comm, state, ppid, pgrp, tty_nr, tpgid, starttime })
}

/// One process, for as long as it lives: a pid names another process once it is reused, a pid
/// with its start time never does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcessKey {
    pub pid: i32,
    /// `/proc/<pid>/stat` field 22: start time in clock ticks after boot.
    pub starttime: u64,
}

impl ProcessKey {
    /// The process `pid` names now.
    pub fn of(pid: i32) -> io::Result<ProcessKey> {
        read_stat(pid).map(|s| ProcessKey { pid, starttime: s.starttime })
    }

    /// The process still runs (not a zombie) and is the one that started at `starttime`.
    pub fn is_alive(&self) -> bool {
        read_stat(self.pid).is_ok_and(|s| s.state != 'Z' && s.starttime == self.starttime)
    }
}

/// Start time (`/proc/<pid>/stat` field 22) of `pid`, if it runs.
pub fn starttime(pid: i32) -> Option<u64> {
    read_stat(pid).ok().map(|s| s.starttime)
}

/// A file, by device and inode: what a path resolves to, whatever its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    pub dev: u64,
    pub ino: u64,
}

impl FileKey {
    /// The file `path` resolves to (symlinks followed).
    pub fn of(path: &Path) -> io::Result<FileKey> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path)?;
        Ok(FileKey { dev: meta.dev(), ino: meta.ino() })
    }
}

impl From<(u64, u64)> for FileKey {
    fn from((dev, ino): (u64, u64)) -> FileKey {
        FileKey { dev, ino }
    }
}

/// The fields of `/proc/<pid>/status` the gate uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStatus {
    /// Real, effective, saved and filesystem uid.
    pub uids: [u32; 4],
    pub no_new_privs: bool,
    /// 0 = none, 1 = strict, 2 = filter.
    pub seccomp: u32,
}

impl ProcStatus {
    pub fn all_uids_are(&self, uid: u32) -> bool {
        self.uids.iter().all(|u| *u == uid)
    }

    /// Runs under a restriction the codex process itself does not have.
    pub fn more_confined_than(&self, codex: &ProcStatus) -> bool {
        (self.no_new_privs && !codex.no_new_privs) || (self.seccomp != 0 && codex.seccomp == 0)
    }
}

/// `/proc/<pid>/stat` and `status` of long-lived processes (codex), kept open: a read through an
/// open `/proc/<pid>` file is of the process it was opened for, or fails (`ESRCH`) once that
/// process has been reaped, even if another process has the pid by then. So a kept file stands
/// in for opening by pid, at one `pread` instead of an open, a read and a close.
#[derive(Default)]
pub struct ProcFiles {
    map: Mutex<HashMap<i32, Arc<KeptProc>>>,
}

struct KeptProc {
    key: ProcessKey,
    stat: File,
    status: File,
}

/// Processes kept at most (the map is cleared when full).
const MAX_KEPT: usize = 64;

impl ProcFiles {
    fn kept(&self, pid: i32) -> Option<Arc<KeptProc>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).get(&pid).cloned()
    }

    fn drop_kept(&self, pid: i32) {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).remove(&pid);
    }

    /// [`read_stat`], through the kept file when `pid` has one.
    pub fn stat(&self, pid: i32) -> io::Result<ProcStat> {
        if let Some(k) = self.kept(pid) {
            match pread_record(&k.stat, 1024).map(|b| parse_stat(&b)) {
                Ok(Some(st)) if st.starttime == k.key.starttime => return Ok(st),
                _ => self.drop_kept(pid), // exited: the pid is read afresh below
            }
        }
        read_stat(pid)
    }

    /// [`read_status`], through the kept file when `pid` has one.
    pub fn status(&self, pid: i32) -> io::Result<ProcStatus> {
        if let Some(k) = self.kept(pid) {
            match pread_record(&k.status, 4096).map(|b| parse_status(&b)) {
                Ok(Some(st)) => return Ok(st),
                _ => self.drop_kept(pid),
            }
        }
        read_status(pid)
    }

    /// Keeps the files of `key` open from now on (no-op when kept already).
    pub fn keep(&self, key: ProcessKey) {
        if self.kept(key.pid).is_some_and(|k| k.key == key) {
            return;
        }
        let (Ok(stat), Ok(status)) = (File::open(format!("/proc/{}/stat", key.pid)), File::open(format!("/proc/{}/status", key.pid)))
        else {
            return;
        };
        // Opened for that very process (its start time through the file just opened).
        if pread_record(&stat, 1024).ok().and_then(|b| parse_stat(&b)).is_none_or(|st| st.starttime != key.starttime) {
            return;
        }
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_KEPT {
            map.clear();
        }
        map.insert(key.pid, Arc::new(KeptProc { key, stat, status }));
    }
}

/// The whole of a small `/proc` file through an open fd, from offset 0 (proc files render anew
/// on every read at 0). A read that does not fill the buffer has the whole file, as in
/// [`read_record`], so this is one `pread` for `stat` and `status`.
pub fn pread_record(file: &File, cap: usize) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; cap];
    let mut n = 0;
    loop {
        match file.read_at(&mut buf[n..], n as u64) {
            Ok(k) => {
                n += k;
                if k == 0 || n < buf.len() || buf.len() >= 64 * 1024 {
                    break;
                }
                buf.resize(buf.len() * 2, 0);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    buf.truncate(n);
    Ok(buf)
}

pub fn read_status(pid: i32) -> io::Result<ProcStatus> {
    let mut buf = Vec::with_capacity(2048);
    read_record(&format!("/proc/{pid}/status"), &mut buf, 4096, 16 * 1024)?;
    parse_status(&buf).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unparsable /proc status"))
}

pub fn parse_status(buf: &[u8]) -> Option<ProcStatus> {
    let text = std::str::from_utf8(buf).ok()?;
    let mut uids = None;
    let mut nnp = None;
    let mut seccomp = None;
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("Uid:") {
            let mut it = v.split_ascii_whitespace().map(|s| s.parse::<u32>());
            let mut out = [0u32; 4];
            for slot in out.iter_mut() {
                *slot = it.next()?.ok()?;
            }
            uids = Some(out);
        } else if let Some(v) = line.strip_prefix("NoNewPrivs:") {
            nnp = Some(v.trim() != "0");
        } else if let Some(v) = line.strip_prefix("Seccomp:") {
            seccomp = Some(v.trim().parse().ok()?);
        }
    }
    // NoNewPrivs/Seccomp lines exist on every kernel this runs on; their absence is suspicious,
    // so treat a missing line as "confined" rather than "free".
    Some(ProcStatus { uids: uids?, no_new_privs: nnp.unwrap_or(true), seccomp: seccomp.unwrap_or(2) })
}

/// Largest environment block read (the kernel caps argv+envp far above any sane hook env).
pub const ENVIRON_LIMIT: usize = 4 << 20;

pub fn read_environ(pid: i32, buf: &mut Vec<u8>) -> io::Result<()> {
    read_small(&format!("/proc/{pid}/environ"), buf, ENVIRON_LIMIT)
}

/// (device, inode) of the file `/proc/<pid>/exe` points at (the executable actually mapped).
pub fn exe_id(pid: i32) -> io::Result<FileKey> {
    FileKey::of(Path::new(&format!("/proc/{pid}/exe")))
}

/// `pidfd_open(pid, 0)`.
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments; on success it returns a new fd we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just gave us this fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A pidfd is readable (POLLIN) once its process has exited (zombie or reaped).
pub fn pidfd_alive(fd: &OwnedFd) -> bool {
    let mut pfd = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    if n < 0 {
        return false;
    }
    if n == 0 {
        return true;
    }
    pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) == 0
}

/// File identity as the gate compares it: device, inode and birth time (statx btime; zero when
/// the filesystem does not report one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
    pub btime_sec: i64,
    pub btime_nsec: u32,
    pub size: u64,
    pub mode: u32,
}

impl FileId {
    pub fn key(&self) -> FileKey {
        FileKey { dev: self.dev, ino: self.ino }
    }

    /// Same file (size excluded: rollouts grow).
    pub fn same_file(&self, other: &FileId) -> bool {
        self.dev == other.dev && self.ino == other.ino && self.btime_sec == other.btime_sec && self.btime_nsec == other.btime_nsec
    }
}

fn statx_raw(dirfd: i32, path: &CString, flags: i32) -> io::Result<FileId> {
    // SAFETY: statx writes into the zeroed struct we pass; path is NUL-terminated.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statx(dirfd, path.as_ptr(), flags, libc::STATX_BASIC_STATS | libc::STATX_BTIME, &mut stx) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let dev = libc::makedev(stx.stx_dev_major, stx.stx_dev_minor);
    let (btime_sec, btime_nsec) =
        if stx.stx_mask & libc::STATX_BTIME != 0 { (stx.stx_btime.tv_sec, stx.stx_btime.tv_nsec) } else { (0, 0) };
    Ok(FileId { dev, ino: stx.stx_ino, btime_sec, btime_nsec, size: stx.stx_size, mode: stx.stx_mode as u32 })
}

/// statx of an open file.
pub fn statx_fd(fd: &impl AsRawFd) -> io::Result<FileId> {
    statx_raw(fd.as_raw_fd(), &CString::new("").unwrap(), libc::AT_EMPTY_PATH)
}

/// statx of a path, not following a final symlink.
pub fn statx_path_nofollow(path: &Path) -> io::Result<FileId> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    statx_raw(libc::AT_FDCWD, &c, libc::AT_SYMLINK_NOFOLLOW)
}

/// [`statx_path_nofollow`], but a symlink at the end of `path` is followed.
pub fn statx_path(path: &Path) -> io::Result<FileId> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    statx_raw(libc::AT_FDCWD, &c, 0)
}

pub fn is_regular(mode: u32) -> bool {
    mode & libc::S_IFMT == libc::S_IFREG
}

/// Opens a file read-only without following a final symlink and without blocking on a FIFO.
pub fn open_nofollow(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY).open(path)
}

/// Opens `path` read-only like [`open_nofollow`], refusing (ELOOP) if ANY component is a symlink
/// (`openat2` with `RESOLVE_NO_SYMLINKS`): one syscall proves the path names the file literally,
/// where resolving it with `realpath` costs one `readlink` per component. `Ok(None)` where
/// openat2 is unavailable (Linux < 5.6, or filtered by a seccomp profile).
pub fn open_no_symlinks(path: &Path) -> io::Result<Option<File>> {
    #[cfg(test)]
    if NO_OPENAT2.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(None);
    }
    openat2_no_symlinks(path)
}

fn openat2_no_symlinks(path: &Path) -> io::Result<Option<File>> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: zeroed open_how is valid (all fields are integers); we fill flags and resolve.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: valid NUL-terminated path and an open_how of the size we pass.
    let fd = unsafe {
        libc::syscall(libc::SYS_openat2, libc::AT_FDCWD, c.as_ptr(), &how as *const libc::open_how, std::mem::size_of::<libc::open_how>())
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOSYS) | Some(libc::EPERM) => Ok(None),
            _ => Err(e),
        };
    }
    // SAFETY: the kernel just gave us this fd.
    Ok(Some(unsafe { File::from_raw_fd(fd as i32) }))
}

/// Tests set this to exercise the fallback for kernels without openat2.
#[cfg(test)]
pub static NO_OPENAT2: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// errno of an io::Error, if any.
pub fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// The error means the process (or the file it named) is gone.
pub fn is_gone(e: &io::Error) -> bool {
    matches!(errno(e), libc::ENOENT | libc::ESRCH) || e.kind() == io::ErrorKind::NotFound
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parsing_survives_hostile_comm() {
        let line = b"4242 (a) b) c (d) S 17 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 77705 1000 10 18446744073709551615";
        let st = parse_stat(line).unwrap();
        assert_eq!(st.comm, "a) b) c (d");
        assert_eq!(st.ppid, 17);
        assert_eq!(st.starttime, 77705);
        assert_eq!(parse_stat(b"garbage"), None);
    }

    #[test]
    fn status_parsing() {
        let s = b"Name:\tx\nUid:\t1000\t1000\t1000\t1000\nGid:\t1\t1\t1\t1\nNoNewPrivs:\t1\nSeccomp:\t2\n";
        let st = parse_status(s).unwrap();
        assert!(st.all_uids_are(1000));
        assert!(st.no_new_privs);
        assert_eq!(st.seccomp, 2);
        let own = read_status(std::process::id() as i32).unwrap();
        assert!(own.all_uids_are(courier_shared::paths::uid()));
    }

    #[test]
    fn record_reads_match_reads_to_eof() {
        let pid = std::process::id();
        for (name, cap) in [("status", 4096), ("status", 16), ("stat", 1024), ("stat", 7)] {
            let path = format!("/proc/{pid}/{name}");
            let (mut a, mut b) = (Vec::new(), Vec::new());
            read_record(&path, &mut a, cap, 1 << 20).unwrap();
            read_small(&path, &mut b, 1 << 20).unwrap();
            // Counters move between the two reads; the line structure must not.
            let lines = |v: &[u8]| v.iter().filter(|c| **c == b'\n').count();
            assert_eq!(lines(&a), lines(&b), "{name} cap {cap}");
            assert!(a.len() > cap || cap > 100, "{name}: a small buffer must fall back to reading on");
        }
    }

    #[test]
    fn open_no_symlinks_refuses_any_symlink_on_the_way() {
        let dir = std::env::temp_dir().join(format!("courier-openat2-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("real")).unwrap();
        std::fs::write(dir.join("real/f"), "x").unwrap();
        std::os::unix::fs::symlink(dir.join("real"), dir.join("alias")).unwrap();
        assert!(openat2_no_symlinks(&dir.join("real/f")).unwrap().is_some());
        let e = openat2_no_symlinks(&dir.join("alias/f")).unwrap_err();
        assert_eq!(errno(&e), libc::ELOOP);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn statx_dev_matches_stat() {
        let id = statx_path_nofollow(Path::new("/proc/self/status")).unwrap();
        let meta = std::fs::symlink_metadata("/proc/self/status").unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(id.dev, meta.dev());
    }

    /// A kept `/proc` file reads its own process while it lives, and never stale data after it
    /// has been reaped: the read fails and the pid is read afresh (here: no such process).
    #[test]
    fn kept_proc_files_follow_their_process_only() {
        let files = ProcFiles::default();
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id() as i32;
        let key = ProcessKey::of(pid).unwrap();
        files.keep(key);
        assert!(files.kept(pid).is_some());
        let st = files.stat(pid).unwrap();
        assert_eq!((st.starttime, st.comm.as_str()), (key.starttime, "sleep"));
        assert!(files.status(pid).unwrap().all_uids_are(courier_shared::paths::uid()));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(files.stat(pid).is_err(), "a reaped process has no stat, kept file or not");
        assert!(files.kept(pid).is_none(), "the dead entry is dropped");
        // A key whose start time is not the process's is never kept.
        files.keep(ProcessKey { pid: std::process::id() as i32, starttime: 1 });
        assert!(files.kept(std::process::id() as i32).is_none());
    }
}
