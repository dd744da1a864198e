//! Step 4: the caller is a hook, not a command the model ran. Codex sets tool-command markers
//! only in the environment of commands the model runs, and runs those under a sandbox
//! (NoNewPrivs, seccomp) it does not apply to hooks: neither may appear on the peer or any
//! process between it and codex unless codex itself has it.

use super::ancestry::Ancestry;
use super::{Peer, Refusal, RefusalCode};
use crate::os;
use courier_shared::paths::environ_get;

/// Environment variables Codex sets only for commands the model runs.
pub const TOOL_COMMAND_MARKERS: [&str; 4] = ["CODEX_TOOL_CALL_ID", "CODEX_THREAD_ID", "CODEX_SESSION_ID", "CODEX_CI"];

pub(super) fn check(peer: &Peer, a: &Ancestry) -> Result<(), Refusal> {
    let codex = &a.codex;
    let mut codex_env = Vec::with_capacity(8192);
    os::read_environ(codex.pid, &mut codex_env)
        .map_err(|e| Refusal::new(RefusalCode::AncestryChanged, format!("codex {} environ: {e}", codex.pid)))?;
    let mut env = Vec::with_capacity(8192);
    os::read_environ(peer.pid, &mut env).map_err(|e| Refusal::new(RefusalCode::PeerGone, format!("peer environ: {e}")))?;
    peer.still_alive("after environ")?;
    check_markers(&env, &codex_env, "peer", peer.pid)?;
    for m in &a.chain {
        os::read_environ(m.pid, &mut env)
            .map_err(|e| Refusal::new(RefusalCode::AncestryChanged, format!("process {} environ: {e}", m.pid)))?;
        check_markers(&env, &codex_env, "intermediate process", m.pid)?;
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

fn check_markers(env: &[u8], codex_env: &[u8], who: &str, pid: i32) -> Result<(), Refusal> {
    for key in TOOL_COMMAND_MARKERS {
        if let Some(v) = environ_get(env, key) {
            if environ_get(codex_env, key) != Some(v) {
                return Err(Refusal::new(
                    RefusalCode::ToolCommandEnv,
                    format!("{who} {pid} has {key}, which codex's own environment lacks or sets differently"),
                ));
            }
        }
    }
    Ok(())
}
