//! Step 4: the caller is a hook, not a command the model ran. Codex sets tool-command markers
//! only in the environment of commands the model runs, and runs those under a sandbox
//! (NoNewPrivs, seccomp) it does not apply to hooks: neither may appear on the peer or any
//! process between it and codex unless codex itself has it.

use super::ancestry::Ancestry;
use super::{Peer, Refusal, RefusalCode};
use crate::codex::TOOL_COMMAND_MARKERS;
use crate::os::{self, ProcessKey};
use courier_shared::paths::environ_get;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What codex's own environment sets each marker to.
type Markers = [Option<Vec<u8>>; TOOL_COMMAND_MARKERS.len()];

/// Codex's marker values by process: a codex process's environment is the one it was started
/// with, so it is read on the first hook of that process, not on every hook (the entry is keyed
/// by pid and start time, which no other process ever has).
#[derive(Default)]
pub(super) struct CodexMarkers {
    map: Mutex<HashMap<ProcessKey, Arc<Markers>>>,
}

/// Codex processes remembered at most (the map is cleared when full: a re-read costs one hook).
const MAX_CODEX_PROCESSES: usize = 256;

impl CodexMarkers {
    fn of(&self, codex: ProcessKey) -> std::io::Result<Arc<Markers>> {
        if let Some(m) = self.map.lock().unwrap_or_else(|e| e.into_inner()).get(&codex) {
            return Ok(Arc::clone(m));
        }
        let mut env = Vec::with_capacity(8192);
        os::read_environ(codex.pid, &mut env)?;
        let markers: Arc<Markers> = Arc::new(TOOL_COMMAND_MARKERS.map(|k| environ_get(&env, k).map(<[u8]>::to_vec)));
        // Still that process (its start time): the environment read was of it.
        if os::ProcessKey::of(codex.pid)? != codex {
            return Err(std::io::Error::other("replaced while read"));
        }
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_CODEX_PROCESSES {
            map.clear();
        }
        map.insert(codex, Arc::clone(&markers));
        Ok(markers)
    }
}

pub(super) fn check(peer: &Peer, a: &Ancestry, known: &CodexMarkers) -> Result<(), Refusal> {
    let codex = &a.codex;
    let codex_markers = known
        .of(ProcessKey { pid: codex.pid, starttime: codex.starttime })
        .map_err(|e| Refusal::new(RefusalCode::AncestryChanged, format!("codex {} environ: {e}", codex.pid)))?;
    let mut env = Vec::with_capacity(8192);
    os::read_environ(peer.pid, &mut env).map_err(|e| Refusal::new(RefusalCode::PeerGone, format!("peer environ: {e}")))?;
    peer.still_alive("after environ")?;
    check_markers(&env, &codex_markers, "peer", peer.pid)?;
    for m in &a.chain {
        os::read_environ(m.pid, &mut env)
            .map_err(|e| Refusal::new(RefusalCode::AncestryChanged, format!("process {} environ: {e}", m.pid)))?;
        check_markers(&env, &codex_markers, "intermediate process", m.pid)?;
    }
    let peer_status = &a.peer_status;
    if peer_status.more_confined_than(&codex.status) {
        return Err(Refusal::new(
            RefusalCode::SandboxedCaller,
            format!(
                "peer NoNewPrivs={} Seccomp={} but codex NoNewPrivs={} Seccomp={}",
                peer_status.no_new_privs as u8, peer_status.seccomp, codex.status.no_new_privs as u8, codex.status.seccomp
            ),
        ));
    }
    if let Some(m) = a.chain.iter().find(|m| m.status.more_confined_than(&codex.status)) {
        return Err(Refusal::new(RefusalCode::SandboxedCaller, format!("intermediate process {} is confined, codex is not", m.pid)));
    }
    Ok(())
}

fn check_markers(env: &[u8], codex: &Markers, who: &str, pid: i32) -> Result<(), Refusal> {
    for (key, codex_value) in TOOL_COMMAND_MARKERS.iter().zip(codex) {
        if let Some(v) = environ_get(env, key) {
            if codex_value.as_deref() != Some(v) {
                return Err(Refusal::new(
                    RefusalCode::ToolCommandEnv,
                    format!("{who} {pid} has {key}, which codex's own environment lacks or sets differently"),
                ));
            }
        }
    }
    Ok(())
}
