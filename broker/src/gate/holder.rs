//! Step 5's process-side evidence: does the codex process hold the rollout open for append, and
//! the thread's writer lock? One scan of `/proc/<codex>/fd` answers both (locks from the fds' own
//! fdinfo), and also counts how many thread-writer locks that process holds.
//!
//! The scan stats every fd (a Codex running 100 threads has 200+), so for every event but
//! SessionStart (the only one whose delivery depends on the thread count) the fds the scan found
//! last time ([`FdHints`]) are re-checked first: one stat and one fdinfo read each. A miss falls
//! back to the scan.

use super::sys;
use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::Mutex;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// An `flock` lock as `/proc/locks` shows it: `N: FLOCK  ADVISORY  WRITE <pid> <maj>:<min>:<ino> 0 EOF`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlockWrite {
    pub pid: i32,
    pub major: u32,
    pub minor: u32,
    pub ino: u64,
}

/// The granted (not waiting: `->` lines are blocked requests) FLOCK WRITE locks in `/proc/locks`
/// text, for `pid` only.
pub fn parse_flock_writes(text: &str, pid: i32) -> Vec<FlockWrite> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut it = line.split_ascii_whitespace();
        let _ordinal = it.next();
        let (Some(kind), Some(_mode), Some(access), Some(p), Some(id)) = (it.next(), it.next(), it.next(), it.next(), it.next()) else {
            continue;
        };
        if kind != "FLOCK" || access != "WRITE" {
            continue; // includes "->" waiter lines, whose second token is "->"
        }
        let Ok(p) = p.parse::<i32>() else { continue };
        if p != pid {
            continue;
        }
        let mut parts = id.split(':');
        let (Some(maj), Some(min), Some(ino), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let (Ok(major), Ok(minor), Ok(ino)) =
            (u32::from_str_radix(maj, 16), u32::from_str_radix(min, 16), ino.parse::<u64>())
        else {
            continue;
        };
        out.push(FlockWrite { pid: p, major, minor, ino });
    }
    out
}


/// What one fd scan of the codex process found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HolderScan {
    /// An fd on the rollout (same device and inode), opened writable with `O_APPEND`.
    pub holds_rollout_append: bool,
    /// An fd on the rollout exists, but not writable+append.
    pub holds_rollout_other: bool,
    /// The codex pid holds FLOCK WRITE on the wanted thread lock file, through one of its fds.
    pub holds_thread_lock: bool,
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

fn read_fdinfo(pid: i32, fd: &str, buf: &mut Vec<u8>) -> Option<()> {
    sys::read_record(&format!("/proc/{pid}/fdinfo/{fd}"), buf, 1024, 64 * 1024).ok()
}

fn fdinfo_flags(fdinfo: &str) -> Option<u32> {
    let v = fdinfo.lines().find_map(|l| l.strip_prefix("flags:"))?;
    u32::from_str_radix(v.trim(), 8).ok()
}

/// Does this fdinfo show an exclusive flock held by `pid` through this open file? The kernel lists
/// (under the file's own lock) exactly the locks owned through this fd as `lock:` lines, in the
/// `/proc/locks` format. Unlike `/proc/locks`, which is read in page-sized chunks and can skip
/// lines while other processes take or drop locks, this view is consistent.
fn fdinfo_holds_flock_write(fdinfo: &str, pid: i32) -> bool {
    let lines: String = fdinfo.lines().filter_map(|l| l.strip_prefix("lock:")).map(|l| format!("{}\n", l.trim())).collect();
    !parse_flock_writes(&lines, pid).is_empty()
}

/// Scans `/proc/<pid>/fd` once: stats every fd target, reads fdinfo only for the rollout's fds and
/// for fds on `<writer_lock_dir>/<uuid>.lock` files.
pub fn scan(pid: i32, rollout: (u64, u64), thread_lock: (u64, u64), writer_lock_dir: &Path) -> io::Result<HolderScan> {
    use std::os::unix::fs::MetadataExt;
    let mut out = HolderScan::default();
    let mut thread_lock_ids: HashSet<(u64, u64)> = HashSet::new();
    let mut info = Vec::with_capacity(512);
    let dir = std::fs::read_dir(format!("/proc/{pid}/fd"))?;
    for entry in dir {
        let entry = match entry {
            Ok(e) => e,
            Err(e) if sys::is_gone(&e) => return Err(e),
            Err(_) => continue,
        };
        let name = entry.file_name();
        let Some(fd) = name.to_str() else { continue };
        out.fds += 1;
        let link = format!("/proc/{pid}/fd/{fd}");
        let meta = match std::fs::metadata(&link) {
            Ok(m) => m,
            Err(_) => continue, // closed meanwhile, or a target we cannot stat
        };
        if !meta.is_file() {
            continue;
        }
        let id = (meta.dev(), meta.ino());
        if id == rollout {
            let flags = read_fdinfo(pid, fd, &mut info).and_then(|()| fdinfo_flags(std::str::from_utf8(&info).ok()?));
            match flags {
                Some(f) if f & O_APPEND != 0 && f & O_ACCMODE != 0 => {
                    out.holds_rollout_append = true;
                    out.rollout_fd = Some(fd.to_string());
                }
                _ => out.holds_rollout_other = true,
            }
            continue;
        }
        let is_lock_file = std::fs::read_link(&link).is_ok_and(|t| is_thread_lock_path(&t, writer_lock_dir));
        if !is_lock_file || thread_lock_ids.contains(&id) {
            continue;
        }
        let held = read_fdinfo(pid, fd, &mut info).is_some()
            && std::str::from_utf8(&info).is_ok_and(|t| fdinfo_holds_flock_write(t, pid));
        if held {
            thread_lock_ids.insert(id);
            if id == thread_lock {
                out.holds_thread_lock = true;
                out.thread_lock_fd = Some(fd.to_string());
            }
        }
    }
    out.thread_locks = thread_lock_ids.len();
    Ok(out)
}

/// Where a codex process's rollout and writer-lock fds were found, by (pid, start time, device,
/// inode). Only a place to look first: the fd is re-checked every time.
#[derive(Default)]
pub struct FdHints {
    map: Mutex<HashMap<(i32, u64, u64, u64), String>>,
}

const MAX_HINTS: usize = 4096;

impl FdHints {
    fn get(&self, pid: i32, start: u64, file: (u64, u64)) -> Option<String> {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).get(&(pid, start, file.0, file.1)).cloned()
    }

    /// Remembers what a scan of `pid` found.
    pub fn learn(&self, pid: i32, start: u64, rollout: (u64, u64), lock: (u64, u64), scan: &HolderScan) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_HINTS {
            map.clear();
        }
        for (file, fd) in [(rollout, &scan.rollout_fd), (lock, &scan.thread_lock_fd)] {
            if let Some(fd) = fd {
                map.insert((pid, start, file.0, file.1), fd.clone());
            }
        }
    }
}

/// fdinfo text of `fd` of `pid` if that fd is open on `file` (device, inode), by stat and by
/// fdinfo's own `ino:` line (so an fd closed and reused in between is not taken for the file).
fn fdinfo_if_on(pid: i32, fd: &str, file: (u64, u64)) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(format!("/proc/{pid}/fd/{fd}")).ok()?;
    if (meta.dev(), meta.ino()) != file {
        return None;
    }
    let mut buf = Vec::new();
    sys::read_record(&format!("/proc/{pid}/fdinfo/{fd}"), &mut buf, 1024, 64 * 1024).ok()?;
    let text = String::from_utf8(buf).ok()?;
    let ino = text.lines().find_map(|l| l.strip_prefix("ino:")).map(|v| v.trim().parse::<u64>());
    match ino {
        Some(Ok(ino)) if ino != file.1 => None,
        Some(Err(_)) => None,
        _ => Some(text),
    }
}

/// True when the fds remembered for `pid` still hold `rollout` writable with O_APPEND and a FLOCK
/// WRITE lock of `pid` on `lock`. False (scan instead) on any doubt.
pub fn hinted_holds(hints: &FdHints, pid: i32, start: u64, rollout: (u64, u64), lock: (u64, u64)) -> bool {
    let (Some(rfd), Some(lfd)) = (hints.get(pid, start, rollout), hints.get(pid, start, lock)) else {
        return false;
    };
    let append = fdinfo_if_on(pid, &rfd, rollout)
        .and_then(|t| fdinfo_flags(&t))
        .is_some_and(|f| f & O_APPEND != 0 && f & O_ACCMODE != 0);
    append && fdinfo_if_on(pid, &lfd, lock).is_some_and(|t| fdinfo_holds_flock_write(&t, pid))
}

/// `<dir>/<uuid>.lock`, exactly.
fn is_thread_lock_path(target: &Path, dir: &Path) -> bool {
    if target.parent() != Some(dir) {
        return false;
    }
    let name = target.file_name().map(|n| n.as_bytes()).unwrap_or_default();
    name.strip_suffix(b".lock")
        .and_then(|s| std::str::from_utf8(s).ok())
        .is_some_and(courier_shared::rollout::is_uuid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_real_proc_locks_lines() {
        let text = "1: FLOCK  ADVISORY  WRITE 7216 fe:00:10010639 0 EOF\n\
                    2: POSIX  ADVISORY  READ 7216 fe:00:10011084 128 128\n\
                    3: FLOCK  ADVISORY  WRITE 99 fe:00:5 0 EOF\n\
                    3: -> FLOCK  ADVISORY  WRITE 7216 fe:00:6 0 EOF\n\
                    4: FLOCK  ADVISORY  READ 7216 fe:00:7 0 EOF\n\
                    5: FLOCK  ADVISORY  WRITE 7216 103:02:42 0 EOF\n";
        let l = parse_flock_writes(text, 7216);
        assert_eq!(
            l,
            vec![
                FlockWrite { pid: 7216, major: 0xfe, minor: 0, ino: 10010639 },
                FlockWrite { pid: 7216, major: 0x103, minor: 2, ino: 42 }
            ]
        );
    }

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
        let d = Path::new("/h/.codex/thread-writer-locks");
        assert!(is_thread_lock_path(&d.join("01a22659-8b33-7382-a4b5-24e01f7dc6c5.lock"), d));
        assert!(!is_thread_lock_path(Path::new("/h/.codex/.tmp/plugins.sync.lock"), d));
        assert!(!is_thread_lock_path(&d.join("x.lock"), d));
        assert!(!is_thread_lock_path(&d.join("sub/01a22659-8b33-7382-a4b5-24e01f7dc6c5.lock"), d));
    }
}
