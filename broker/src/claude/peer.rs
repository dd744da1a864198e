//! Who holds the other end of a hook connection: the gate's `peer_socket` and `sole_holder`
//! steps. A loopback port is open to every process of every uid, so the connection proves
//! nothing until the kernel names its client socket (its inode and owner uid, from
//! `/proc/net/tcp` by the exact 4-tuple) and the one process holding that socket.

use crate::os::{self, ProcessKey};
use std::net::{SocketAddr, SocketAddrV4};
use std::os::fd::OwnedFd;

/// The client end of an accepted loopback connection, as the kernel lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientSocket {
    pub inode: u64,
    pub uid: u32,
}

/// `peer_socket`: the row of `/proc/net/tcp` whose local address is `client` and remote address
/// `server` (the client's view of the connection). IPv4 loopback only: the broker binds 127.0.0.1.
pub fn client_socket(client: SocketAddr, server: SocketAddr) -> Result<ClientSocket, String> {
    let (SocketAddr::V4(client), SocketAddr::V4(server)) = (client, server) else {
        return Err(format!("{client} -> {server} is not an IPv4 loopback connection"));
    };
    let table = std::fs::read_to_string("/proc/net/tcp").map_err(|e| format!("/proc/net/tcp: {e}"))?;
    let (local, remote) = (proc_net_addr(client), proc_net_addr(server));
    for line in table.lines().skip(1) {
        let t: Vec<&str> = line.split_ascii_whitespace().collect();
        if t.len() > 9 && t[1] == local && t[2] == remote {
            let uid = t[7].parse().map_err(|_| format!("uid {:?} in /proc/net/tcp", t[7]))?;
            let inode: u64 = t[9].parse().map_err(|_| format!("inode {:?} in /proc/net/tcp", t[9]))?;
            if inode == 0 {
                return Err(format!("{client}'s socket has no inode (closed, or no process holds it)"));
            }
            return Ok(ClientSocket { inode, uid });
        }
    }
    Err(format!("no socket {client} -> {server} in /proc/net/tcp"))
}

/// `127.0.0.1:8080` as `/proc/net/tcp` prints it: the address as a host-order u32, the port big.
fn proc_net_addr(a: SocketAddrV4) -> String {
    format!("{:08X}:{:04X}", u32::from_ne_bytes(a.ip().octets()), a.port())
}

/// The one process holding a socket, pinned: a pidfd taken after it was found, and its fd
/// seen again through that pin, so the pid cannot name another process under the later steps.
#[derive(Debug)]
pub struct Holder {
    pub key: ProcessKey,
    pub pidfd: OwnedFd,
}

impl Holder {
    /// The holder has not exited since it was pinned (a reused pid is another process).
    pub fn is_alive(&self) -> bool {
        os::pidfd_alive(&self.pidfd)
    }
}

/// `sole_holder`: every process of `uid` whose fd table holds `socket:[inode]`; exactly one must,
/// with one fd. The holder is pinned with a pidfd, then its fd is read again.
pub fn sole_holder(inode: u64, uid: u32) -> Result<Holder, String> {
    let target = format!("socket:[{inode}]");
    let mut found: Vec<(i32, String)> = Vec::new();
    let procs = std::fs::read_dir("/proc").map_err(|e| format!("/proc: {e}"))?;
    for entry in procs.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        if std::os::unix::fs::MetadataExt::uid(&match entry.metadata() {
            Ok(m) => m,
            Err(_) => continue,
        }) != uid
        {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { continue };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == target.as_str()) {
                found.push((pid, fd.file_name().to_string_lossy().into_owned()));
            }
        }
    }
    let (pid, fd) = match found.as_slice() {
        [one] => one.clone(),
        [] => return Err(format!("no process of uid {uid} holds {target}")),
        many => return Err(format!("{} fds hold {target}: {many:?}", many.len())),
    };
    let pidfd = os::pidfd_open(pid).map_err(|e| format!("pidfd_open({pid}): {e}"))?;
    let key = ProcessKey::of(pid).map_err(|e| format!("pid {pid}: {e}"))?;
    // Through the pin: the process now named `pid` is the one holding the socket.
    let still = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).is_ok_and(|l| l.as_os_str() == target.as_str());
    let holder = Holder { key, pidfd };
    if !still || !holder.is_alive() {
        return Err(format!("pid {pid} let go of {target} during the check"));
    }
    Ok(holder)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    /// This test process connects to itself: its client socket is found by the 4-tuple, is its
    /// uid's, and this process is its one holder.
    #[test]
    fn finds_the_client_socket_and_its_one_holder() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server_side, from) = listener.accept().unwrap();
        let sock = client_socket(from, server_side.local_addr().unwrap()).unwrap();
        assert_eq!(sock.uid, nix::unistd::getuid().as_raw());
        let holder = sole_holder(sock.inode, sock.uid).unwrap();
        assert_eq!(holder.key.pid, std::process::id() as i32);
        // A second fd on the same socket (as a fork or SCM_RIGHTS would give) is refused.
        let dup = client.try_clone().unwrap();
        assert!(sole_holder(sock.inode, sock.uid).unwrap_err().contains("2 fds"));
        drop(dup);
        assert!(client_socket("127.0.0.1:1".parse().unwrap(), server_side.local_addr().unwrap()).is_err());
    }
}
