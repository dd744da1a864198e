//! The operating system, as the proofs read it: one typed interface for every OS fact a proof
//! rests on, so that a port to another kernel (docs/platforms.md: macOS) is this room and nothing
//! else. No `/proc` path is named outside it (`broker/tests/layout.rs` checks it).
//!
//! - `peer.rs`: who is on the other end of a Unix socket (`SO_PEERCRED`, `SO_PEERPIDFD`);
//! - `process.rs`: a process's parentage, session and start time (`stat`), uids and confinement
//!   (`status`: NoNewPrivs, Seccomp), environment, command line, executable, a pidfd pinning it,
//!   and [`ProcFiles`], kept `/proc` files of long-lived processes;
//! - `fd.rs`: open fds and what they name (paths, sockets, pipes' inodes), fdinfo (flags, locks),
//!   and which processes hold a given target;
//! - `locks.rs`: which process holds an `flock` WRITE lock on which file;
//! - `net.rs`: the TCP table (a loopback connection's owner), listening Unix sockets;
//! - `file.rs`: file identity with birth time (`statx`), opening without following links;
//! - `procfs.rs`: the few ways a `/proc` file is read (one `read`, one `pread`, bounded);
//!
//! and here the two identity types everything else names processes and files by: [`ProcessKey`]
//! (pid and start time) and [`FileKey`] (device and inode).
//!
//! Every reader returns `io::Result`; callers turn `ENOENT`/`ESRCH` (a process that went away
//! mid-check) into refusals. Nothing here panics on malformed input.

pub mod fd;
pub mod file;
pub mod locks;
pub mod net;
pub mod peer;
pub mod process;
pub mod procfs;

#[cfg(test)]
pub use file::NO_OPENAT2;
pub use file::{is_regular, open_no_symlinks, open_nofollow, statx_fd, statx_path, statx_path_nofollow, FileId};
pub use peer::{peer_cred, peer_pidfd, PeerCred};
pub use process::{
    cwd_path, exe_id, exe_metadata, exe_path, exists, open_exe, open_stat, parse_stat, parse_status, pidfd_alive, pidfd_open, read_cmdline,
    read_environ, read_stat, read_status, reread_stat, starttime, ProcFiles, ProcStat, ProcStatus, ENVIRON_LIMIT, OWN_EXE,
};
pub use procfs::pread_record;

use nix::libc;
use std::io;
use std::path::Path;

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

/// errno of an io::Error, if any.
pub fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// The error means the process (or the file it named) is gone.
pub fn is_gone(e: &io::Error) -> bool {
    matches!(errno(e), libc::ENOENT | libc::ESRCH) || e.kind() == io::ErrorKind::NotFound
}
