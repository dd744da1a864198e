//! TEMPORARY minimal gate (uid, MAC, payload, thread from the rollout path) so the delivery path
//! can run end to end while the full gate is built. Replaced by the real checks.

use super::{GateConfig, HookRequest, Peer, Refusal, Verified};
use courier_shared::hook::HookPayload;

pub mod peer {
    use super::super::{Peer, Refusal};
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    use std::os::fd::FromRawFd;
    use std::os::unix::net::UnixStream;

    pub fn identify(stream: &UnixStream) -> Result<Peer, Refusal> {
        let cred = getsockopt(stream, PeerCredentials).map_err(|e| refusal("peer_gone", e.to_string()))?;
        // SAFETY: pidfd_open returns a new fd we own, or -1.
        let fd = unsafe { libc_pidfd_open(cred.pid()) };
        if fd < 0 {
            return Err(refusal("peer_gone", "pidfd_open failed".into()));
        }
        Ok(Peer { pid: cred.pid(), uid: cred.uid(), pidfd: unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) } })
    }

    unsafe fn libc_pidfd_open(pid: i32) -> i32 {
        nix::libc::syscall(nix::libc::SYS_pidfd_open, pid, 0) as i32
    }

    fn refusal(code: &'static str, detail: String) -> Refusal {
        Refusal { code, detail, thread: None, event: None }
    }
}

pub struct Gate {
    config: GateConfig,
}

impl Gate {
    pub fn new(config: GateConfig) -> Gate {
        Gate { config }
    }

    pub fn verify(&self, peer: &Peer, req: &HookRequest, _is_trusted: &dyn Fn(&str) -> bool) -> Result<Verified, Refusal> {
        let refuse = |code, detail: &str| Refusal { code, detail: detail.into(), thread: None, event: None };
        if peer.uid != courier_shared::paths::uid() {
            return Err(refuse("peer_uid", "other uid"));
        }
        if req.pid as i32 != peer.pid
            || !courier_shared::auth::verify(&self.config.secret, req.pid, req.ts_ms, req.payload.as_bytes(), req.mac)
        {
            return Err(refuse("bad_mac", "mac"));
        }
        let payload: HookPayload = serde_json::from_str(req.payload).map_err(|e| refuse("bad_payload", &e.to_string()))?;
        let path = payload.transcript_path.clone().ok_or_else(|| refuse("transcript_path", "none"))?;
        let thread = courier_shared::rollout::thread_id_from_path(&path).ok_or_else(|| refuse("transcript_path", "name"))?.to_string();
        let len = std::fs::metadata(&path).map_err(|e| refuse("transcript_path", &e.to_string()))?.len();
        Ok(Verified {
            event: payload.event(),
            turn_id: payload.turn_id.clone(),
            payload,
            thread_id: thread,
            codex_pid: 0,
            rollout_path: path.into(),
            rollout_offset: len,
            sole_thread: true,
        })
    }
}

pub fn installed_client_ids(broker_exe: &std::path::Path, extra: &[std::path::PathBuf]) -> Vec<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let sibling = broker_exe.with_file_name("hook-client");
    std::iter::once(sibling)
        .chain(extra.iter().cloned())
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| (m.dev(), m.ino()))
        .collect()
}
