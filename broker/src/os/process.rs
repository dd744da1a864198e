//! A process as the proofs read it: its parentage and session (`stat`), its uids and confinement
//! (`status`: NoNewPrivs, Seccomp), its environment and command line, the executable it runs
//! (`exe`), and a pidfd that pins it. Linux sources: `/proc/<pid>/{stat,status,environ,cmdline,exe}`
//! and `pidfd_open`; docs/platforms.md maps each to macOS.

use super::procfs::{pread_record, read_record, read_small};
use super::{FileKey, ProcessKey};
use nix::libc;
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The fields of `/proc/<pid>/stat` the gate uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat {
    pub comm: String,
    /// Field 3: `R`, `S`, `Z` (zombie), ...
    pub state: char,
    pub ppid: i32,
    /// Field 5: the process group.
    pub pgrp: i32,
    /// Field 6: the session (`getsid`): a process that called `setsid` leads a new one.
    pub session: i32,
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
    let (ppid, pgrp, session, tty_nr, tpgid) = (int()?, int()?, int()?, int()?, int()?);
    let starttime: u64 = fields.nth(22 - 9)?.parse().ok()?;
    Some(ProcStat { comm, state, ppid, pgrp, session, tty_nr, tpgid, starttime })
}

/// Start time (`/proc/<pid>/stat` field 22) of `pid`, if it runs.
pub fn starttime(pid: i32) -> Option<u64> {
    read_stat(pid).ok().map(|s| s.starttime)
}

/// The fields of `/proc/<pid>/status` the gate uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStatus {
    /// Real, effective, saved and filesystem uid.
    pub uids: [u32; 4],
    pub no_new_privs: bool,
    /// 0 = none, 1 = strict, 2 = filter.
    pub seccomp: u32,
    /// `FDSize`: the size of the fd table (every open fd number is below it); 0 when not shown.
    pub fd_size: u32,
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
    let mut fd_size = 0;
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
        } else if let Some(v) = line.strip_prefix("FDSize:") {
            fd_size = v.trim().parse().unwrap_or(0);
        } else if let Some(v) = line.strip_prefix("Seccomp:") {
            seccomp = Some(v.trim().parse().ok()?);
        }
    }
    // NoNewPrivs/Seccomp lines exist on every kernel this runs on; their absence is suspicious,
    // so treat a missing line as "confined" rather than "free".
    Some(ProcStatus { uids: uids?, no_new_privs: nnp.unwrap_or(true), seccomp: seccomp.unwrap_or(2), fd_size })
}

/// Largest environment block read (the kernel caps argv+envp far above any sane hook env).
pub const ENVIRON_LIMIT: usize = 4 << 20;

pub fn read_environ(pid: i32, buf: &mut Vec<u8>) -> io::Result<()> {
    read_small(&format!("/proc/{pid}/environ"), buf, ENVIRON_LIMIT)
}

/// The command line of `pid`: its arguments, each ended by a NUL (what it says, never evidence).
pub fn read_cmdline(pid: i32) -> io::Result<Vec<u8>> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
}

/// The path of the executable `pid` runs, as the kernel names it (`<path> (deleted)` once the
/// file was replaced under it).
pub fn exe_path(pid: i32) -> io::Result<PathBuf> {
    std::fs::read_link(exe_link(pid))
}

/// (device, inode) of the executable `pid` actually runs (mapped, whatever its name now).
pub fn exe_id(pid: i32) -> io::Result<FileKey> {
    FileKey::of(Path::new(&exe_link(pid)))
}

/// The metadata of the executable `pid` runs (its identity, whatever its name now).
pub fn exe_metadata(pid: i32) -> io::Result<std::fs::Metadata> {
    std::fs::metadata(exe_link(pid))
}

/// Opens the executable `pid` runs (the mapped file itself, even when its name was replaced):
/// what is hashed is exactly what runs.
pub fn open_exe(pid: i32) -> io::Result<File> {
    File::open(exe_link(pid))
}

/// The kernel's own name for the file this process executes: opened or copied, it is the running
/// file itself, whatever was renamed over its path since.
pub const OWN_EXE: &str = "/proc/self/exe";

/// The working directory of `pid` (what it says, never evidence).
pub fn cwd_path(pid: i32) -> io::Result<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/cwd"))
}

fn exe_link(pid: i32) -> String {
    format!("/proc/{pid}/exe")
}

/// Every process now, with the uid that owns it (its `/proc` entry's owner). Processes that exit
/// meanwhile are left out.
pub fn processes() -> io::Result<Vec<(i32, u32)>> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        if let Ok(m) = entry.metadata() {
            out.push((pid, m.uid()));
        }
    }
    Ok(out)
}

/// Whether a process `pid` exists now (any state, zombies included).
pub fn exists(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parsing_survives_hostile_comm() {
        let line = b"4242 (a) b) c (d) S 17 4242 4343 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 77705 1000 10 18446744073709551615";
        let st = parse_stat(line).unwrap();
        assert_eq!(st.comm, "a) b) c (d");
        assert_eq!((st.ppid, st.pgrp, st.session), (17, 4242, 4343));
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
