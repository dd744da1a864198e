//! Files as the proofs compare them: identity with birth time (`statx`), opening without
//! following symbolic links (`openat2` with `RESOLVE_NO_SYMLINKS`, `O_NOFOLLOW`).

use super::FileKey;
use nix::libc;
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

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

#[cfg(test)]
mod tests {
    use super::super::errno;
    use super::*;

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
}
