//! Step 2: the caller is an installed hook-client (by device and inode of its executable), and
//! its request is authentic (the HMAC under the per-login secret binds payload, pid and time),
//! fresh, and a hook payload of an event Courier registers.

use super::{now_ms, GateConfig, HookRequest, Peer, Refusal, RefusalCode};
use crate::os::{self, FileKey};
use codex_format::hook::{HookEvent, HookPayload};
use courier_shared::auth::{self, MAX_CLOCK_SKEW_MS};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Checks the peer's executable and the request; returns the parsed payload.
pub(super) fn check(config: &GateConfig, peer: &Peer, req: &HookRequest) -> Result<HookPayload, Refusal> {
    authenticate(config, peer, req)?;
    serde_json::from_str(req.payload).map_err(|e| Refusal::new(RefusalCode::BadPayload, format!("payload: {e}")))
}

/// The peer is an installed hook-client, and its request is authentic and fresh; the payload is
/// not read (a host whose payload is another format parses it in its wing).
pub(super) fn authenticate(config: &GateConfig, peer: &Peer, req: &HookRequest) -> Result<(), Refusal> {
    let exe = os::exe_id(peer.pid).map_err(|e| {
        if os::is_gone(&e) {
            Refusal::new(RefusalCode::PeerGone, format!("peer exe: {e}"))
        } else {
            Refusal::new(RefusalCode::ClientExe, format!("cannot stat peer exe: {e}"))
        }
    })?;
    peer.still_alive("after exe")?;
    if !config.installed_clients.contains(&exe) {
        return Err(Refusal::new(
            RefusalCode::ClientExe,
            format!("peer executable dev {} ino {} is not an installed hook-client", exe.dev, exe.ino),
        ));
    }
    if req.pid as i64 != peer.pid as i64 {
        return Err(Refusal::new(RefusalCode::BadMac, format!("request pid {} is not peer pid {}", req.pid, peer.pid)));
    }
    if !auth::verify(&config.secret, req.pid, req.ts_ms, req.payload.as_bytes(), req.mac) {
        return Err(Refusal::new(RefusalCode::BadMac, "MAC does not verify"));
    }
    let now = now_ms();
    if now.abs_diff(req.ts_ms) > MAX_CLOCK_SKEW_MS {
        return Err(Refusal::new(
            RefusalCode::StaleRequest,
            format!("timestamp {} is {} ms from broker clock", req.ts_ms, now.abs_diff(req.ts_ms)),
        ));
    }
    Ok(())
}

/// The payload's event, if Courier registers it.
pub(super) fn event(payload: &HookPayload) -> Result<HookEvent, Refusal> {
    match payload.event() {
        HookEvent::Other => Err(Refusal::new(RefusalCode::UnsupportedEvent, format!("event {:?} is not handled", payload.hook_event_name))),
        event => Ok(event),
    }
}

/// (device, inode) of the `hook-client` next to `broker_exe`, plus each of `extra` that exists.
pub fn installed_client_ids(broker_exe: &Path, extra: &[PathBuf]) -> Vec<FileKey> {
    let mut out = Vec::new();
    let beside = broker_exe.parent().map(|d| d.join("hook-client"));
    for p in beside.iter().chain(extra.iter()) {
        if let Ok(m) = std::fs::metadata(p) {
            let key = FileKey { dev: m.dev(), ino: m.ino() };
            if m.is_file() && !out.contains(&key) {
                out.push(key);
            }
        }
    }
    out
}
