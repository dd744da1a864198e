//! Setting up what `broker serve` serves: the one-broker-per-login lock, the stop signals, the
//! socket (bound, or passed by systemd socket activation) and removing it at stop, the fd limit.

use crate::os::FileKey;
use anyhow::{bail, Context, Result};
use nix::libc;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Holds the per-login locks for the broker's lifetime.
pub struct InstanceLock {
    _files: Vec<File>,
}

/// How long a starting broker waits for the lock of one that is exiting.
const STOPPING_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// One broker per login, locked (`flock`, exclusive) on what a rename cannot take from under
/// it: the runtime directory itself, opened `O_DIRECTORY` (the socket is there, so a second
/// broker must not take it over even with another state directory), and the queue database
/// file (whatever name or hard link reaches it, it is the same inode, so no second broker ever
/// serves that queue). Lock files were not enough: renamed away, the next broker created and
/// locked new ones and took the socket of the live one. A lock dies with its process, so a crash
/// leaves none behind. (SQLite's own locks on the database are POSIX record locks, which an
/// `flock` neither takes nor disturbs; this fd stays open for the broker's life.)
pub fn lock_instance(runtime_dir: &Path, state_dir: &Path) -> Result<InstanceLock> {
    let queue = state_dir.join(crate::store::DB_NAME);
    let mut files = Vec::new();
    for (path, what) in [(runtime_dir, "runtime directory"), (queue.as_path(), "queue")] {
        let file = open_lockable(path).with_context(|| format!("opening {} to lock it", path.display()))?;
        // A broker that was just stopped has removed its socket but may not have exited yet:
        // give its lock a moment to go (a live broker keeps it, and is reported below).
        let grace = std::time::Instant::now() + STOPPING_GRACE;
        while file.try_lock().is_err() && std::time::Instant::now() < grace {
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        if file.try_lock().is_err() {
            let holder = crate::install::lock_holder(&file).map_or_else(|| "unknown".to_string(), |p| p.to_string());
            bail!("another broker already runs with this {what} {} (pid {holder}); stop it first", path.display());
        }
        files.push(file);
    }
    Ok(InstanceLock { _files: files })
}

/// The runtime directory (opened read-only, `O_DIRECTORY`), or the queue database (created,
/// private, if it is not there yet: SQLite takes an empty file as an empty database).
fn open_lockable(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut open = OpenOptions::new();
    if path.is_dir() {
        open.read(true).custom_flags(libc::O_DIRECTORY);
    } else {
        open.read(true).write(true).create(true).truncate(false).mode(0o600);
    }
    open.open(path)
}

/// Signals that stop the broker cleanly (socket removed, a line logged).
pub(super) const STOP_SIGNALS: [nix::sys::signal::Signal; 3] =
    [nix::sys::signal::Signal::SIGTERM, nix::sys::signal::Signal::SIGINT, nix::sys::signal::Signal::SIGHUP];

/// Blocks the stop signals in this thread and every thread it starts from now on; the
/// `signals` thread takes them with `sigwait`. (Children get std's reset mask.)
pub(super) fn block_stop_signals() -> Result<nix::sys::signal::SigSet> {
    let mut set = nix::sys::signal::SigSet::empty();
    for s in STOP_SIGNALS {
        set.add(s);
    }
    set.thread_block().context("blocking SIGTERM/SIGINT/SIGHUP")?;
    Ok(set)
}

/// The socket file this broker bound, to remove at stop only if it is still that file (never a
/// socket a later broker bound, nor systemd's under socket activation).
pub(super) struct BoundSocket {
    path: PathBuf,
    id: Option<FileKey>,
    started: Instant,
}

/// Set once the broker serves its socket.
pub(super) static BOUND: std::sync::OnceLock<BoundSocket> = std::sync::OnceLock::new();

impl BoundSocket {
    fn remove(&self) -> bool {
        let ours = fs::symlink_metadata(&self.path).is_ok_and(|m| Some(FileKey { dev: m.dev(), ino: m.ino() }) == self.id);
        ours && fs::remove_file(&self.path).is_ok()
    }

    /// Removes the socket (if ours) and logs the stop line.
    pub(super) fn stopped(&self, why: &str) {
        let removed = self.remove();
        crate::log_info!(
            "broker stopped {why}: pid {}, up {} s; {}",
            std::process::id(),
            self.started.elapsed().as_secs(),
            if removed {
                format!("removed socket {}", self.path.display())
            } else {
                format!("socket {} left to its owner", self.path.display())
            }
        );
    }
}

/// After [`serve`] returned an error (logged by the caller): removes the socket it served, if
/// it got that far, and logs the stop.
pub fn stopped_after_error() {
    if let Some(b) = BOUND.get() {
        b.stopped("after an error");
    }
}

/// Binds the socket, replacing a stale one of ours; refuses anything else in its place.
pub(super) fn bind_socket(path: &Path) -> Result<UnixListener> {
    if let Ok(meta) = fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() || meta.uid() != courier_shared::paths::uid() {
            bail!(
                "{} exists and is not a socket of this user (uid {}, {}); refusing to replace it",
                path.display(),
                meta.uid(),
                if meta.file_type().is_symlink() {
                    "a symlink"
                } else if meta.file_type().is_socket() {
                    "a socket"
                } else {
                    "not a socket"
                }
            );
        }
        // We hold the instance lock, so no live broker owns it.
        fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// The listening socket systemd passed (socket activation: `LISTEN_PID` = us, `LISTEN_FDS` >= 1,
/// first fd 3), or `None` when not activated. A passed fd that is not a listening Unix stream
/// socket is an error: the unit is wrong, and binding our own would leave systemd's unserved.
pub(super) fn activated_listener(expected: &Path) -> Result<Option<UnixListener>> {
    use nix::sys::socket::{getsockname, getsockopt, sockopt, AddressFamily, SockType, SockaddrLike, UnixAddr};
    use std::os::fd::{BorrowedFd, FromRawFd};
    let ours = std::env::var("LISTEN_PID").ok().and_then(|p| p.parse::<u32>().ok()) == Some(std::process::id());
    let fds = std::env::var("LISTEN_FDS").ok().and_then(|n| n.parse::<i32>().ok()).unwrap_or(0);
    if !ours || fds < 1 {
        return Ok(None);
    }
    const FD: i32 = 3; // SD_LISTEN_FDS_START
                       // SAFETY: systemd hands fd 3 to this process; we only inspect it here.
    let fd = unsafe { BorrowedFd::borrow_raw(FD) };
    let sock_type = getsockopt(&fd, sockopt::SockType).context("LISTEN_FDS is set but fd 3 is not a socket")?;
    let listening = getsockopt(&fd, sockopt::AcceptConn).unwrap_or(false);
    let addr: UnixAddr = getsockname(FD).context("fd 3 from systemd is not a Unix socket")?;
    if sock_type != SockType::Stream || !listening || addr.family() != Some(AddressFamily::Unix) {
        bail!("fd 3 from systemd is not a listening Unix stream socket; check courier-broker.socket");
    }
    if addr.path() != Some(expected) {
        crate::log_warn!(
            "systemd passed a socket at {:?} but hook-clients connect to {}; fix ListenStream= or COURIER_RUNTIME_DIR",
            addr.path(),
            expected.display()
        );
    }
    nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC))?;
    // SAFETY: fd 3 is ours from here on and nothing else wraps it.
    Ok(Some(unsafe { UnixListener::from_raw_fd(FD) }))
}

/// Raises the soft open-file limit to the hard one: every unfinished connection holds an fd.
pub(super) fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// The socket hook-clients connect to: systemd's (socket activation) or one bound here, and how
/// it came (`"socket-activated"` or `"bound"`); remembered so the stop removes it if it is ours.
pub(super) fn listen(socket: &Path) -> Result<(UnixListener, &'static str)> {
    let (listener, how) = match activated_listener(socket)? {
        Some(l) => (l, "socket-activated"),
        None => (bind_socket(socket)?, "bound"),
    };
    let _ = BOUND.set(BoundSocket {
        path: socket.to_path_buf(),
        id: (how == "bound").then(|| fs::symlink_metadata(socket).ok().map(|m| FileKey { dev: m.dev(), ino: m.ino() })).flatten(),
        started: Instant::now(),
    });
    Ok((listener, how))
}
