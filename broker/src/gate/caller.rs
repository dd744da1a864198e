//! Step 4: the caller is a hook, not a command the model ran. Codex sets tool-command markers
//! only in the environment of commands the model runs, and runs those under a sandbox
//! (NoNewPrivs, seccomp) it does not apply to hooks: neither may appear on the peer or any
//! process between it and codex unless codex itself has it. Which variables are markers is the
//! Codex wing's to say (`codex::TOOL_COMMAND_MARKERS`, handed in by `Gate::new`).

use super::ancestry::Ancestry;
use super::{Peer, Refusal, RefusalCode};
use crate::os::{self, ProcessKey};
use courier_shared::paths::environ_get;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What codex's own environment sets each marker to, in the order of the marker names.
type Markers = Vec<Option<Vec<u8>>>;

/// Codex's marker values by process: a codex process's environment is the one it was started
/// with, so it is read on the first hook of that process, not on every hook (the entry is keyed
/// by pid and start time, which no other process ever has).
pub(super) struct CodexMarkers {
    /// The variables Codex sets only for commands the model runs.
    names: &'static [&'static str],
    map: Mutex<HashMap<ProcessKey, Arc<Markers>>>,
}

/// Codex processes remembered at most (the map is cleared when full: a re-read costs one hook).
const MAX_CODEX_PROCESSES: usize = 256;

impl CodexMarkers {
    pub(super) fn new(names: &'static [&'static str]) -> CodexMarkers {
        assert!(names.len() <= 32, "check_markers keeps what it saw in a u32");
        CodexMarkers { names, map: Mutex::default() }
    }

    fn of(&self, codex: ProcessKey) -> std::io::Result<Arc<Markers>> {
        if let Some(m) = self.map.lock().unwrap_or_else(|e| e.into_inner()).get(&codex) {
            return Ok(Arc::clone(m));
        }
        let mut env = Vec::with_capacity(8192);
        os::read_environ(codex.pid, &mut env)?;
        let markers: Arc<Markers> = Arc::new(self.names.iter().map(|k| environ_get(&env, k).map(<[u8]>::to_vec)).collect());
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
    check_markers(&env, known.names, &codex_markers, "peer", peer.pid)?;
    for m in &a.chain {
        os::read_environ(m.pid, &mut env)
            .map_err(|e| Refusal::new(RefusalCode::AncestryChanged, format!("process {} environ: {e}", m.pid)))?;
        check_markers(&env, known.names, &codex_markers, "intermediate process", m.pid)?;
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

/// Each marker of `names` that `env` sets (its first entry, as [`environ_get`] finds it) has
/// codex's value. One pass over the environment for all the markers: a pass per marker was a
/// tenth of the broker's instructions per hook call.
fn check_markers(env: &[u8], names: &[&str], codex: &Markers, who: &str, pid: i32) -> Result<(), Refusal> {
    let mut seen = 0u32; // bit i: marker i's first entry was checked
    for entry in env.split(|b| *b == 0) {
        for (i, key) in names.iter().enumerate() {
            let Some(v) = entry.strip_prefix(key.as_bytes()).and_then(|rest| rest.strip_prefix(b"=")) else { continue };
            let bit = 1u32 << i;
            if seen & bit != 0 {
                continue; // a later entry of a key: the first one counts
            }
            seen |= bit;
            if codex[i].as_deref() != Some(v) {
                return Err(Refusal::new(
                    RefusalCode::ToolCommandEnv,
                    format!("{who} {pid} has {key}, which codex's own environment lacks or sets differently"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codex::TOOL_COMMAND_MARKERS;

    /// The one pass decides as a look-up of each marker's first entry would.
    #[test]
    fn markers_are_checked_as_their_first_entries_say() {
        let codex: Markers = vec![None, Some(b"t1".to_vec()), Some(b"t1".to_vec()), None];
        let verdict = |env: &[u8]| check_markers(env, &TOOL_COMMAND_MARKERS, &codex, "peer", 1).is_ok();
        let by_lookup =
            |env: &[u8]| TOOL_COMMAND_MARKERS.iter().zip(&codex).all(|(k, c)| environ_get(env, k).is_none_or(|v| c.as_deref() == Some(v)));
        let envs: [&[u8]; 8] = [
            b"PATH=/bin\0HOME=/h\0",
            b"CODEX_THREAD_ID=t1\0CODEX_SESSION_ID=t1\0",
            b"CODEX_THREAD_ID=t2\0",
            b"CODEX_TOOL_CALL_ID=call_1\0PATH=/bin\0",
            b"CODEX_CI=1",
            b"CODEX_THREAD_ID=t1\0CODEX_THREAD_ID=t2\0",
            b"CODEX_THREAD_ID=t2\0CODEX_THREAD_ID=t1\0",
            b"CODEX_THREAD_IDX=t2\0CODEX_THREAD_ID=t1\0CODEX_THREAD_ID\0",
        ];
        let got: Vec<bool> = envs.iter().map(|e| verdict(e)).collect();
        assert_eq!(got, envs.iter().map(|e| by_lookup(e)).collect::<Vec<_>>());
        assert_eq!(got, [true, true, false, false, false, true, false, true]);
    }
}
