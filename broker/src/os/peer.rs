//! Who is on the other end of a Unix socket: `SO_PEERCRED` (the pid and uid the kernel recorded
//! at `connect()`) and `SO_PEERPIDFD` (Linux 6.5+: a pidfd for that very process, race-free). On
//! macOS the same facts are `LOCAL_PEERPID` and `LOCAL_PEERCRED` (docs/platforms.md).

use nix::libc;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

/// What `SO_PEERCRED` says of a connection: fixed at `connect()`, so read once per connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    pub pid: i32,
    pub uid: u32,
}

/// `SO_PEERCRED` of a connected Unix socket.
pub fn peer_cred(socket: &impl AsFd) -> io::Result<PeerCred> {
    let c = nix::sys::socket::getsockopt(socket, nix::sys::socket::sockopt::PeerCredentials).map_err(io::Error::from)?;
    Ok(PeerCred { pid: c.pid(), uid: c.uid() })
}

/// `SO_PEERPIDFD` (Linux 6.5+): a pidfd for the process that connected. `Ok(None)` when the
/// kernel predates it (the caller falls back to `pidfd_open` on the pid); any other error is one.
pub fn peer_pidfd(socket: &impl AsRawFd) -> io::Result<Option<OwnedFd>> {
    const SO_PEERPIDFD: libc::c_int = 77;
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `fd`.
    let rc = unsafe {
        libc::getsockopt(socket.as_raw_fd(), libc::SOL_SOCKET, SO_PEERPIDFD, &mut fd as *mut libc::c_int as *mut libc::c_void, &mut len)
    };
    if rc == 0 && fd >= 0 {
        // SAFETY: the kernel installed a new fd for us.
        return Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }));
    }
    let err = io::Error::last_os_error();
    if kernel_lacks_peer_pidfd(&err) {
        Ok(None)
    } else {
        Err(err)
    }
}

/// Whether `SO_PEERPIDFD` failed because the kernel predates it (Linux < 6.5).
fn kernel_lacks_peer_pidfd(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOPROTOOPT) | Some(libc::EOPNOTSUPP))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_pair_shows_this_process() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(peer_cred(&a).unwrap(), PeerCred { pid: std::process::id() as i32, uid: courier_shared::paths::uid() });
        if let Some(fd) = peer_pidfd(&a).unwrap() {
            assert!(super::super::pidfd_alive(&fd));
        }
    }

    #[test]
    fn only_a_kernel_without_so_peerpidfd_falls_back_to_pidfd_open() {
        for errno in [libc::ENOPROTOOPT, libc::EOPNOTSUPP] {
            assert!(kernel_lacks_peer_pidfd(&io::Error::from_raw_os_error(errno)), "errno {errno}");
        }
        for errno in [libc::EBADF, libc::ENOTCONN, libc::EMFILE, libc::EINVAL] {
            assert!(!kernel_lacks_peer_pidfd(&io::Error::from_raw_os_error(errno)), "errno {errno}: refused, not a fallback");
        }
    }
}
