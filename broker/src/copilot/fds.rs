//! What a copilot process holds, read from `/proc/<pid>/fd` and each fd's fdinfo: the pipes it
//! reads (a hook's stdout is one), and the `inuse.<pid>.hold` files it holds an exclusive flock
//! on (one in the dist dir it runs, one per session it runs, probed on 1.0.102).

use crate::os;
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
    let mut buf = Vec::with_capacity(1024);
    let mut fdinfo = |fd: u32| -> Option<String> {
        os::fd::read_fdinfo(pid, fd, &mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf).into_owned())
    };
    for (fd, target) in os::fd::fd_targets(pid)? {
        if let Some(ino) = pipe_inode(&target) {
            if fdinfo(fd).is_some_and(|info| os::fd::fdinfo_flags(&info).is_some_and(|f| f & O_ACCMODE == O_RDONLY)) {
                held.pipes_read.push(ino);
            }
            continue;
        }
        let is_hold = target.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("inuse.") && n.ends_with(".hold"));
        if is_hold && fdinfo(fd).is_some_and(|info| os::locks::fdinfo_flock_writes(&info).iter().any(|l| l.pid == pid)) {
            held.holds.push(target);
        }
    }
    if !os::exists(pid) {
        return Err(io::Error::from_raw_os_error(nix::libc::ESRCH));
    }
    Ok(held)
}

/// The inode of `pipe:[N]`, the link of an fd on a pipe.
pub(super) fn pipe_inode(target: &std::path::Path) -> Option<u64> {
    os::fd::pipe_inode(target)
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
        let read_ino = pipe_inode(&os::fd::own_fd_target(r.as_raw_fd()).unwrap()).unwrap();
        assert!(held.pipes_read.contains(&read_ino), "{held:?}");
        drop(r);
        assert!(!scan(pid).unwrap().pipes_read.contains(&read_ino), "the write end alone is no read end");
        drop(w);
        assert_eq!(unsafe { nix::libc::flock(file.as_raw_fd(), nix::libc::LOCK_UN) }, 0);
        assert!(!scan(pid).unwrap().holds.contains(&path));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
