//! A process's open fds and what they name: the fd table (`/proc/<pid>/fd`), each fd's target
//! (a path, `socket:[inode]`, `pipe:[inode]`), the open file's flags and the locks taken through
//! it (`/proc/<pid>/fdinfo/<fd>`), and which processes hold a given target. Linux only; see
//! docs/platforms.md for macOS (`proc_pidinfo(PROC_PIDLISTFDS)`, `proc_pidfdinfo`).

use super::procfs::read_record;
use std::fmt::Display;
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::RawFd;
use std::path::PathBuf;

/// The fd numbers `pid` has open, unsorted. An entry that cannot be read is skipped; the process
/// exiting meanwhile is an error: what was seen of it is no evidence.
pub fn fd_numbers(pid: i32) -> io::Result<Vec<u32>> {
    let mut fds = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        match entry {
            Ok(e) => fds.extend(e.file_name().to_str().and_then(|n| n.parse::<u32>().ok())),
            Err(e) if super::is_gone(&e) => return Err(e),
            Err(_) => continue,
        }
    }
    Ok(fds)
}

/// What fd `fd` of `pid` names: a path, or `socket:[inode]`, `pipe:[inode]`, `anon_inode:...`.
pub fn fd_target(pid: i32, fd: impl Display) -> io::Result<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))
}

/// The metadata of the file fd `fd` of `pid` has open (its device and inode, whatever its name).
pub fn fd_metadata(pid: i32, fd: impl Display) -> io::Result<Metadata> {
    std::fs::metadata(format!("/proc/{pid}/fd/{fd}"))
}

/// The fdinfo record of fd `fd` of `pid` into `buf`: `pos`, `flags` (octal, `O_CLOEXEC` shown),
/// `ino`, and one `lock:` line per lock taken through this open file.
pub fn read_fdinfo(pid: i32, fd: impl Display, buf: &mut Vec<u8>) -> io::Result<()> {
    read_record(&format!("/proc/{pid}/fdinfo/{fd}"), buf, 1024, 64 * 1024)
}

/// The fdinfo file of fd `fd` of `pid`, kept open: `procfs::pread_record` on it reads that
/// process's fd again at one syscall, and fails once the process is gone.
pub fn open_fdinfo(pid: i32, fd: impl Display) -> io::Result<File> {
    File::open(format!("/proc/{pid}/fdinfo/{fd}"))
}

/// The `flags:` of an fdinfo record (octal in the file).
pub fn fdinfo_flags(fdinfo: &str) -> Option<u32> {
    let v = fdinfo.lines().find_map(|l| l.strip_prefix("flags:"))?;
    u32::from_str_radix(v.trim(), 8).ok()
}

/// Every fd of `pid` with what it names; fds closed meanwhile are left out.
pub fn fd_targets(pid: i32) -> io::Result<Vec<(u32, PathBuf)>> {
    Ok(fd_numbers(pid)?.into_iter().filter_map(|fd| Some((fd, fd_target(pid, fd).ok()?))).collect())
}

/// The inode of a `socket:[N]` fd target.
pub fn socket_inode(target: &std::path::Path) -> Option<u64> {
    target.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// The inode of a `pipe:[N]` fd target: both ends of one pipe name the same inode, so the
/// process on the other end of a pipe is the one whose fd names it too.
pub fn pipe_inode(target: &std::path::Path) -> Option<u64> {
    target.to_str()?.strip_prefix("pipe:[")?.strip_suffix(']')?.parse().ok()
}

/// What the broker's own open file `fd` names (the path the kernel resolved at open).
pub fn own_fd_target(fd: RawFd) -> io::Result<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{fd}"))
}

/// The metadata of what the broker's own fd `fd` names (the file, not the link).
pub fn own_fd_metadata(fd: i32) -> io::Result<Metadata> {
    std::fs::metadata(format!("/proc/self/fd/{fd}"))
}

/// Whether `pid` holds `socket:[inode]` through some fd.
pub fn holds_socket(pid: i32, inode: u64) -> bool {
    fd_targets(pid).is_ok_and(|fds| fds.iter().any(|(_, t)| socket_inode(t) == Some(inode)))
}

/// Every (pid, fd) of a process of `uid` whose fd names `target` (`socket:[N]`, `pipe:[N]`, a
/// path): who holds an open file. Processes that exit meanwhile are skipped.
pub fn holders(target: &str, uid: u32) -> io::Result<Vec<(i32, u32)>> {
    let mut found = Vec::new();
    for (pid, owner) in super::process::processes()? {
        if owner != uid {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { continue };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == target) {
                found.extend(fd.file_name().to_str().and_then(|n| n.parse::<u32>().ok()).map(|n| (pid, n)));
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn fds_name_files_pipes_and_sockets() {
        let me = std::process::id() as i32;
        let (r, w) = nix::unistd::pipe().unwrap();
        let target = fd_target(me, r.as_raw_fd()).unwrap();
        let inode = pipe_inode(&target).expect("a pipe");
        assert_eq!(pipe_inode(&fd_target(me, w.as_raw_fd()).unwrap()), Some(inode), "both ends name one inode");
        assert!(fd_numbers(me).unwrap().contains(&(r.as_raw_fd() as u32)));
        let uid = courier_shared::paths::uid();
        assert_eq!(holders(&target.to_string_lossy(), uid).unwrap().iter().filter(|(p, _)| *p == me).count(), 2);
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(socket_inode(&fd_target(me, a.as_raw_fd()).unwrap()).is_some());
        assert_eq!(socket_inode(std::path::Path::new("/tmp/x")), None);
        let mut buf = Vec::new();
        read_fdinfo(me, r.as_raw_fd(), &mut buf).unwrap();
        let flags = fdinfo_flags(std::str::from_utf8(&buf).unwrap()).unwrap();
        assert_eq!(flags & 0o3, 0, "the read end is open read-only");
    }
}
