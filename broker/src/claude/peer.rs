//! Who holds the other end of a hook connection: the gate's `peer_socket` and `sole_holder`
//! steps. A loopback port is open to every process of every uid, so the connection proves
//! nothing until the kernel names its client socket (its inode and owner uid, from
//! `/proc/net/tcp` by the exact 4-tuple) and the one process holding that socket.

use crate::os::{self, ProcessKey};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

/// The client end of an accepted loopback connection, as the kernel lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientSocket {
    pub inode: u64,
    pub uid: u32,
}

/// `peer_socket`: the socket whose local address is `client` and remote address `server` in the
/// kernel's TCP table (the client's view of the connection). IPv4 loopback only: the broker binds
/// 127.0.0.1.
pub fn client_socket(client: SocketAddr, server: SocketAddr) -> Result<ClientSocket, String> {
    let (SocketAddr::V4(client), SocketAddr::V4(server)) = (client, server) else {
        return Err(format!("{client} -> {server} is not an IPv4 loopback connection"));
    };
    match os::net::tcp4_socket(client, server).map_err(|e| format!("the TCP table: {e}"))? {
        Some(s) if s.inode == 0 => Err(format!("{client}'s socket has no inode (closed, or no process holds it)")),
        Some(s) => Ok(ClientSocket { inode: s.inode, uid: s.uid }),
        None => Err(format!("no socket {client} -> {server} in the TCP table")),
    }
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

/// How long `sole_holder` waits for a fork of the holder to let go of the socket.
const FORK_WINDOW: Duration = Duration::from_secs(1);

/// `sole_holder`: every process of `uid` whose fd table holds `socket:[inode]`; exactly one must,
/// with one fd. The holder is pinned with a pidfd, then its fd is read again.
///
/// When claude starts a process (a tool's command, a command hook) while a hook's request is on
/// the wire, the child holds a copy of every fd from its fork until its exec closes them
/// (`O_CLOEXEC`): a fork window, milliseconds, longer on a loaded machine. Only that shape (the
/// other holders are children of the one) is scanned again, until it ends or `FORK_WINDOW` (or
/// `until`) passes; any other second holder is refused at once, and so is a fork that keeps it.
pub fn sole_holder(inode: u64, uid: u32, until: Instant) -> Result<Holder, String> {
    let target = format!("socket:[{inode}]");
    let started = Instant::now();
    let until = until.min(started + FORK_WINDOW);
    let mut pause = Duration::from_millis(1);
    let mut forked = None;
    let (pid, fd) = loop {
        let found = holders(&target, uid)?;
        match found.as_slice() {
            [one] => break *one,
            [] => return Err(format!("no process of uid {uid} holds {target}")),
            many if in_fork_window(many) && Instant::now() + pause < until => {
                forked = Some(many.len() - 1);
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(16));
            }
            many => return Err(format!("{} fds hold {target}: {many:?}", many.len())),
        }
    };
    if let Some(n) = forked {
        crate::log_debug!("claude: {target} of pid {pid} also held by {n} fork(s) of it for {:?}, until their exec", started.elapsed());
    }
    let pidfd = os::pidfd_open(pid).map_err(|e| format!("pidfd_open({pid}): {e}"))?;
    let key = ProcessKey::of(pid).map_err(|e| format!("pid {pid}: {e}"))?;
    // Through the pin: the process now named `pid` is the one holding the socket.
    let still = os::fd::fd_target(pid, fd).is_ok_and(|l| l.as_os_str() == target.as_str());
    let holder = Holder { key, pidfd };
    if !still || !holder.is_alive() {
        return Err(format!("pid {pid} let go of {target} during the check"));
    }
    Ok(holder)
}

/// Every (pid, fd) of a process of `uid` whose fd links to `target`.
fn holders(target: &str, uid: u32) -> Result<Vec<(i32, u32)>, String> {
    os::fd::holders(target, uid).map_err(|e| format!("the process table: {e}"))
}

/// The holders are one fd of one process and one fd of each of some of its children: the shape
/// of a fork that has not reached its exec yet.
fn in_fork_window(found: &[(i32, u32)]) -> bool {
    let ppid = |pid: i32| os::read_stat(pid).map(|s| s.ppid).ok();
    let mut pids: Vec<i32> = found.iter().map(|(pid, _)| *pid).collect();
    pids.sort_unstable();
    pids.dedup();
    if pids.len() != found.len() {
        return false; // one process holds it twice
    }
    pids.iter().any(|parent| pids.iter().all(|pid| pid == parent || ppid(*pid) == Some(*parent)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::libc;
    use std::net::{TcpListener, TcpStream};

    /// This test process connects to itself: its client socket is found by the 4-tuple, is its
    /// uid's, and this process is its one holder.
    #[test]
    fn finds_the_client_socket_and_its_one_holder() {
        let _alone = FORKS.lock().unwrap_or_else(|e| e.into_inner());
        let (client, server_side, sock) = connected();
        assert_eq!(sock.uid, nix::unistd::getuid().as_raw());
        let holder = sole_holder(sock.inode, sock.uid, soon()).unwrap();
        assert_eq!(holder.key.pid, std::process::id() as i32);
        // A second fd on the same socket (as SCM_RIGHTS or a dup would give) is refused.
        let dup = client.try_clone().unwrap();
        assert!(sole_holder(sock.inode, sock.uid, soon()).unwrap_err().contains("2 fds"));
        drop(dup);
        assert!(client_socket("127.0.0.1:1".parse().unwrap(), server_side.local_addr().unwrap()).is_err());
    }

    /// The fork test's children hold copies of every socket of this process: the tests that
    /// count holders take turns.
    static FORKS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// A loopback connection of this process to itself: its client end, its server end, and the
    /// client socket as the kernel lists it.
    fn connected() -> (TcpStream, TcpStream, ClientSocket) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server_side, from) = listener.accept().unwrap();
        let sock = client_socket(from, server_side.local_addr().unwrap()).unwrap();
        (client, server_side, sock)
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(2)
    }

    /// A child forked with the socket that execs `/bin/sleep 30` after `ms` (the exec closes the
    /// `O_CLOEXEC` socket; the process lives on), or holds it until killed when `ms` is `None`.
    fn fork_holding(ms: Option<u64>) -> i32 {
        let sleep = std::ffi::CString::new("/bin/sleep").unwrap();
        let arg = std::ffi::CString::new("30").unwrap();
        let argv = [sleep.as_ptr(), arg.as_ptr(), std::ptr::null()];
        let pause = libc::timespec { tv_sec: 0, tv_nsec: (ms.unwrap_or(0) * 1_000_000) as libc::c_long };
        // SAFETY: the child calls only async-signal-safe functions (nanosleep, pause, execv, _exit).
        match unsafe { libc::fork() } {
            0 => unsafe {
                match ms {
                    Some(_) => {
                        libc::nanosleep(&pause, std::ptr::null_mut());
                        libc::execv(sleep.as_ptr(), argv.as_ptr());
                    }
                    None => loop {
                        libc::pause();
                    },
                }
                libc::_exit(127)
            },
            pid => pid,
        }
    }

    fn reap(pid: i32) {
        // SAFETY: our own child, killed and waited for once.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
    }

    /// A fork of the holder that has not reached its exec yet holds the socket too: the holder is
    /// still found once the exec closes it (claude starting a command while its hook is on the
    /// wire). A fork that keeps it is refused after the fork window.
    #[test]
    fn a_fork_of_the_holder_is_waited_out_until_its_exec() {
        let _alone = FORKS.lock().unwrap_or_else(|e| e.into_inner());
        let (client, _server_side, sock) = connected();

        // The fork's exec comes well after a scan of /proc has seen it (a scan takes ms, more on a
        // loaded machine: timed here).
        let scan = Instant::now();
        assert_eq!(holders(&format!("socket:[{}]", sock.inode), sock.uid).unwrap().len(), 1);
        let window = (scan.elapsed() * 4).max(Duration::from_millis(50)).min(FORK_WINDOW / 2);
        let child = fork_holding(Some(window.as_millis() as u64));
        let holder = sole_holder(sock.inode, sock.uid, soon());
        reap(child);
        assert_eq!(holder.expect("the holder, once the fork's exec let go").key.pid, std::process::id() as i32);

        let child = fork_holding(None);
        let started = Instant::now();
        let refused = sole_holder(sock.inode, sock.uid, soon()).unwrap_err();
        reap(child);
        assert!(refused.contains("2 fds"), "{refused}");
        assert!(started.elapsed() >= FORK_WINDOW / 2, "refused after {:?}, before the fork window passed", started.elapsed());
        drop(client);
    }
}
