//! Finding the app-server endpoint that belongs to one verified Codex process, and proving it.
//!
//! Candidates are the listening Unix sockets with a path whose inodes sit in that process's own
//! fd table (`/proc/<pid>/fd` against `/proc/<pid>/net/unix`): only that process can be serving
//! them. A path can still be swapped between the check and `connect`, so after connecting the
//! listener's `SO_PEERCRED` pid (the process that called `listen`) must be the same Codex process,
//! with the same start time. The TUI's managed daemon is the same case (it runs the hooks);
//! `$CODEX_HOME/app-server-daemon/daemon.pid` only orders its control socket first.

use crate::os;
use std::collections::HashSet;
use std::fs;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    pub path: PathBuf,
    /// `managed_daemon` or `listen_socket`.
    pub via: &'static str,
}

pub use crate::os::starttime;

fn socket_inodes(pid: i32) -> HashSet<u64> {
    os::fd::fd_targets(pid).unwrap_or_default().iter().filter_map(|(_, t)| os::fd::socket_inode(t)).collect()
}

/// The managed daemon's record: `{"pid":N,"processIdentity":{"startTicks":T,..},..}`.
fn daemon_record(codex_home: &Path) -> Option<(i32, u64)> {
    let text = fs::read_to_string(codex_home.join("app-server-daemon/daemon.pid")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let pid = i32::try_from(v.get("pid")?.as_i64()?).ok()?;
    let ticks = v.pointer("/processIdentity/startTicks")?.as_u64()?;
    Some((pid, ticks))
}

/// Endpoints served by Codex process `pid` (started at `start`), best first. Empty when it
/// serves none (e.g. `codex exec`).
pub fn discover(codex_home: &Path, pid: i32, start: u64) -> Vec<Endpoint> {
    let inodes = socket_inodes(pid);
    if inodes.is_empty() {
        return Vec::new();
    }
    let mut found: Vec<Endpoint> = os::net::listening_unix_sockets(pid)
        .unwrap_or_default()
        .into_iter()
        .filter(|(inode, _)| inodes.contains(inode))
        .map(|(_, path)| Endpoint { path: PathBuf::from(path), via: "listen_socket" })
        .collect();
    // The fd table was read from a live process only if it is still the same process.
    if starttime(pid) != Some(start) {
        return Vec::new();
    }
    if daemon_record(codex_home) == Some((pid, start)) {
        let control = codex_home.join("app-server-control/app-server-control.sock");
        if let Ok(real) = fs::canonicalize(&control) {
            if let Some(i) = found.iter().position(|e| e.path == real) {
                let mut e = found.remove(i);
                e.via = "managed_daemon";
                found.insert(0, e);
            }
        }
    }
    found
}

/// Connects to `ep` and proves the listener is Codex process `pid` started at `start`.
pub fn connect_verified(ep: &Endpoint, pid: i32, start: u64) -> Result<UnixStream, String> {
    let stream = UnixStream::connect(&ep.path).map_err(|e| format!("connect {}: {e}", ep.path.display()))?;
    let cred = os::peer_cred(&stream).map_err(|e| format!("SO_PEERCRED: {e}"))?;
    if cred.pid != pid || cred.uid != courier_shared::paths::uid() {
        return Err(format!("{} is served by pid {} uid {}, not codex pid {pid}", ep.path.display(), cred.pid, cred.uid));
    }
    if starttime(pid) != Some(start) {
        return Err(format!("codex pid {pid} is no longer the verified process"));
    }
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn parses_listening_path_sockets_only() {
        let t = "Num       RefCount Protocol Flags    Type St Inode Path\n\
            00000000e6f5dec1: 00000002 00000000 00010000 0001 01 64273 /tmp/codex-daemon-0/28df\n\
            00000000e6f5dec2: 00000003 00000000 00000000 0001 03 64274 /tmp/codex-daemon-0/28df\n\
            00000000e6f5dec3: 00000002 00000000 00010000 0001 01 64275 @abstract\n\
            00000000e6f5dec4: 00000002 00000000 00000000 0001 03 64276\n";
        assert_eq!(os::net::parse_net_unix(t), vec![(64273, "/tmp/codex-daemon-0/28df".to_string())]);
    }

    #[test]
    fn finds_own_listener_and_not_others() {
        let _one = super::super::LISTENER_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let dir = std::env::temp_dir().join(format!("courier-ep-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let _l = UnixListener::bind(&path).unwrap();
        let me = std::process::id() as i32;
        let start = starttime(me).unwrap();
        let found = discover(&dir, me, start);
        assert!(found.iter().any(|e| e.path == path), "{found:?}");
        assert!(discover(&dir, me, start + 1).is_empty(), "another start time is another process");
        // pid 1 does not hold our socket.
        assert!(!discover(&dir, 1, starttime(1).unwrap_or(0)).iter().any(|e| e.path == path));
        let ep = Endpoint { path: path.clone(), via: "listen_socket" };
        assert!(connect_verified(&ep, me, start).is_ok());
        let err = connect_verified(&ep, 1, starttime(1).unwrap_or(0)).unwrap_err();
        assert!(err.contains("not codex pid 1"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
