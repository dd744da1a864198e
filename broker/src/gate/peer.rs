//! Step 1: who is on the other end of the socket. `SO_PEERCRED` gives the uid and pid the kernel
//! recorded at `connect()`; a pidfd taken at once pins that exact process, so later `/proc` reads
//! can be checked against pid reuse: a read is trusted only if the pidfd still shows the process
//! alive afterwards (a live process's pid cannot have been recycled).

use super::{Peer, Refusal, RefusalCode};
use crate::os;
use std::os::unix::net::UnixStream;

/// How the pidfd was obtained (for diagnostics and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PidfdSource {
    PeerPidfd,
    PidfdOpen,
}

/// What `SO_PEERCRED` says of a connection: fixed at `connect()`, so read once per connection.
pub type Credentials = os::PeerCred;

/// Identifies the peer of an accepted connection: uid/pid from `SO_PEERCRED`, then a pidfd.
pub fn identify(stream: &UnixStream) -> Result<Peer, Refusal> {
    identify_with_source(stream).map(|(peer, _)| peer)
}

/// [`identify`], for a connection whose `SO_PEERCRED` was read already (the poll thread reads it
/// at accept).
pub fn identify_as(stream: &UnixStream, cred: &Credentials) -> Result<Peer, Refusal> {
    identify_cred(stream, cred).map(|(peer, _)| peer)
}

pub fn identify_with_source(stream: &UnixStream) -> Result<(Peer, PidfdSource), Refusal> {
    let cred = os::peer_cred(stream).map_err(|e| Refusal::new(RefusalCode::PeerGone, format!("SO_PEERCRED failed: {e}")))?;
    identify_cred(stream, &cred)
}

fn identify_cred(stream: &UnixStream, cred: &Credentials) -> Result<(Peer, PidfdSource), Refusal> {
    let (pid, uid) = (cred.pid, cred.uid);
    if pid <= 0 {
        // The peer is in another pid namespace (pid 0) or credentials are missing.
        return Err(Refusal::new(RefusalCode::PeerGone, format!("peer pid {pid} is not visible in this pid namespace")));
    }
    let (pidfd, source) = match os::peer_pidfd(stream) {
        Ok(Some(fd)) => (fd, PidfdSource::PeerPidfd),
        Ok(None) => match os::pidfd_open(pid) {
            Ok(fd) => (fd, PidfdSource::PidfdOpen),
            Err(e) => return Err(Refusal::new(RefusalCode::PeerGone, format!("pidfd_open({pid}): {e}"))),
        },
        Err(e) => return Err(Refusal::new(RefusalCode::PeerGone, format!("SO_PEERPIDFD for pid {pid}: {e}"))),
    };
    let peer = Peer { pid, uid, pidfd };
    if !peer.is_alive() {
        return Err(Refusal::new(RefusalCode::PeerGone, format!("peer pid {pid} exited")));
    }
    Ok((peer, source))
}

impl Peer {
    /// The exact process that connected has not exited (its pidfd is not readable). Checked after
    /// every `/proc/<pid>` read of the peer: if it is still alive, the pid was not reused.
    pub fn is_alive(&self) -> bool {
        os::pidfd_alive(&self.pidfd)
    }

    /// [`Peer::is_alive`] as a step of the gate: `what` says which read it follows.
    pub(super) fn still_alive(&self, what: &str) -> Result<(), Refusal> {
        if self.is_alive() {
            Ok(())
        } else {
            Err(Refusal::new(RefusalCode::PeerGone, format!("peer {} exited ({what})", self.pid)))
        }
    }
}

/// Step 1 of the gate: the peer runs as the broker's uid and is alive.
pub(super) fn check(peer: &Peer, uid: u32) -> Result<(), Refusal> {
    if peer.uid != uid {
        return Err(Refusal::new(RefusalCode::PeerUid, format!("peer uid {} is not broker uid {}", peer.uid, uid)));
    }
    peer.still_alive("at start")
}
