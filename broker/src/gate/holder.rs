//! Step 5's process-side evidence: does the codex process hold the rollout open for append, and
//! the thread's writer lock? One scan of `/proc/<codex>/fd` and one read of `/proc/locks` per
//! request answer both, and also count how many thread-writer locks that process holds.

use super::sys;
use std::collections::HashSet;
use std::io;
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

pub fn read_locks() -> io::Result<String> {
    std::fs::read_to_string("/proc/locks")
}

/// What one fd scan of the codex process found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HolderScan {
    /// An fd on the rollout (same device and inode), opened writable with `O_APPEND`.
    pub holds_rollout_append: bool,
    /// An fd on the rollout exists, but not writable+append.
    pub holds_rollout_other: bool,
    /// FLOCK WRITE locks of the codex pid whose file is, per one of its fds, a
    /// `thread-writer-locks/<uuid>.lock`.
    pub thread_locks: usize,
    /// FLOCK WRITE locks of the codex pid that no fd explains (counted as other threads' locks,
    /// so `sole_thread` errs towards deferring).
    pub unexplained_locks: usize,
    /// fds examined.
    pub fds: usize,
}

const O_ACCMODE: u32 = 0o3;
const O_APPEND: u32 = 0o2000;

fn fdinfo_flags(pid: i32, fd: &str) -> Option<u32> {
    let mut buf = Vec::with_capacity(256);
    sys::read_small(&format!("/proc/{pid}/fdinfo/{fd}"), &mut buf, 8192).ok()?;
    let text = std::str::from_utf8(&buf).ok()?;
    let v = text.lines().find_map(|l| l.strip_prefix("flags:"))?;
    u32::from_str_radix(v.trim(), 8).ok()
}

/// Scans `/proc/<pid>/fd` once: stats every fd target, reads fdinfo only for the rollout's fds,
/// and readlinks only fds that carry one of the pid's flock locks.
pub fn scan(
    pid: i32,
    rollout: (u64, u64),
    locks: &[FlockWrite],
    writer_lock_dir: &Path,
) -> io::Result<HolderScan> {
    use std::os::unix::fs::MetadataExt;
    let mut out = HolderScan::default();
    let lock_ids: HashSet<(u32, u32, u64)> = locks.iter().map(|l| (l.major, l.minor, l.ino)).collect();
    let mut explained: HashSet<(u32, u32, u64)> = HashSet::new();
    let mut thread_lock_ids: HashSet<(u32, u32, u64)> = HashSet::new();
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
        let (dev, ino) = (meta.dev(), meta.ino());
        if (dev, ino) == rollout {
            match fdinfo_flags(pid, fd) {
                Some(f) if f & O_APPEND != 0 && f & O_ACCMODE != 0 => out.holds_rollout_append = true,
                _ => out.holds_rollout_other = true,
            }
        }
        let lid = (sys::dev_major(dev), sys::dev_minor(dev), ino);
        if lock_ids.contains(&lid) {
            explained.insert(lid);
            if let Ok(target) = std::fs::read_link(&link) {
                if is_thread_lock_path(&target, writer_lock_dir) {
                    thread_lock_ids.insert(lid);
                }
            }
        }
    }
    out.thread_locks = thread_lock_ids.len();
    out.unexplained_locks = lock_ids.len() - explained.len();
    Ok(out)
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
    fn thread_lock_paths() {
        let d = Path::new("/h/.codex/thread-writer-locks");
        assert!(is_thread_lock_path(&d.join("01a22659-8b33-7382-a4b5-24e01f7dc6c5.lock"), d));
        assert!(!is_thread_lock_path(Path::new("/h/.codex/.tmp/plugins.sync.lock"), d));
        assert!(!is_thread_lock_path(&d.join("x.lock"), d));
        assert!(!is_thread_lock_path(&d.join("sub/01a22659-8b33-7382-a4b5-24e01f7dc6c5.lock"), d));
    }
}
