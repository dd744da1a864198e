//! What a copilot process holds, read from `/proc/<pid>/fd` and each fd's fdinfo: the pipes it
//! reads (a hook's stdout is one), and the `inuse.<pid>.hold` files it holds an exclusive flock
//! on (one in the dist dir it runs, one per session it runs, probed on 1.0.102).

use std::io;
use std::path::PathBuf;

const O_ACCMODE: u32 = 0o3;
const O_RDONLY: u32 = 0;

/// One scan of a copilot process's fds.
#[derive(Debug, Default)]
pub(super) struct Held {
    /// Inodes of the pipes it holds a read end of.
    pub(super) pipes_read: Vec<u64>,
    /// `inuse.*.hold` files it holds an exclusive flock on, by the path the fd names.
    pub(super) holds: Vec<PathBuf>,
}

/// Scans `pid`'s fds. An fd closed meanwhile is skipped; the process exiting is an error.
pub(super) fn scan(pid: i32) -> io::Result<Held> {
    let mut held = Held::default();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let Ok(entry) = entry else { continue };
        let fd = entry.file_name();
        let Ok(target) = std::fs::read_link(entry.path()) else { continue };
        if let Some(ino) = pipe_inode(&target) {
            if fdinfo(pid, &fd).is_some_and(|info| flags(&info).is_some_and(|f| f & O_ACCMODE == O_RDONLY)) {
                held.pipes_read.push(ino);
            }
            continue;
        }
        let is_hold = target.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("inuse.") && n.ends_with(".hold"));
        if is_hold && fdinfo(pid, &fd).is_some_and(|info| holds_flock_write(&info, pid)) {
            held.holds.push(target);
        }
    }
    if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        return Err(io::Error::from_raw_os_error(nix::libc::ESRCH));
    }
    Ok(held)
}

/// The inode of `pipe:[N]`, the link of an fd on a pipe.
pub(super) fn pipe_inode(target: &std::path::Path) -> Option<u64> {
    target.to_str()?.strip_prefix("pipe:[")?.strip_suffix(']')?.parse().ok()
}

fn fdinfo(pid: i32, fd: &std::ffi::OsStr) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", fd.to_string_lossy())).ok()
}

fn flags(fdinfo: &str) -> Option<u32> {
    u32::from_str_radix(fdinfo.lines().find_map(|l| l.strip_prefix("flags:"))?.trim(), 8).ok()
}

/// The fdinfo's `lock:` lines (the locks owned through this open file, in `/proc/locks`'
/// format) show an exclusive flock of `pid`: `lock: 1: FLOCK ADVISORY WRITE <pid> ...`.
fn holds_flock_write(fdinfo: &str, pid: i32) -> bool {
    fdinfo.lines().filter_map(|l| l.strip_prefix("lock:")).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 4 && f[1] == "FLOCK" && f[3] == "WRITE" && f[4].parse::<i32>() == Ok(pid)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn pipe_links_name_their_inode() {
        assert_eq!(pipe_inode(std::path::Path::new("pipe:[4026532]")), Some(4026532));
        assert_eq!(pipe_inode(std::path::Path::new("socket:[12]")), None);
        assert_eq!(pipe_inode(std::path::Path::new("/tmp/pipe:[12]")), None);
    }

    /// A real flock and a real pipe of this process, seen as Copilot's would be.
    #[test]
    fn a_held_flock_and_a_read_end_are_found_and_a_released_one_is_not() {
        let dir = std::env::temp_dir().join(format!("courier-copilot-fds-{}-{}", std::process::id(), line!()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("inuse.{}.hold", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        let (r, w) = nix::unistd::pipe().unwrap();
        let pid = std::process::id() as i32;
        let before = scan(pid).unwrap();
        assert!(!before.holds.contains(&path), "no lock taken yet");
        assert_eq!(unsafe { nix::libc::flock(file.as_raw_fd(), nix::libc::LOCK_EX) }, 0);
        let held = scan(pid).unwrap();
        assert!(held.holds.contains(&path), "{held:?}");
        let read_ino = pipe_inode(&std::fs::read_link(format!("/proc/self/fd/{}", r.as_raw_fd())).unwrap()).unwrap();
        assert!(held.pipes_read.contains(&read_ino), "{held:?}");
        drop(r);
        assert!(!scan(pid).unwrap().pipes_read.contains(&read_ino), "the write end alone is no read end");
        drop(w);
        assert_eq!(unsafe { nix::libc::flock(file.as_raw_fd(), nix::libc::LOCK_UN) }, 0);
        assert!(!scan(pid).unwrap().holds.contains(&path));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
