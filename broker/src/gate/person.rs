//! Who may answer an approval: a person's process, never a command a model runs. The reverse of
//! `sender.rs` (which proves a peer IS a Codex tool command), with the same evidence, failing
//! closed: the peer is refused when
//!
//! 1. any of its uids is not the broker's;
//! 2. it is confined the way Codex confines the commands a model runs (NoNewPrivs, seccomp);
//! 3. its environment carries a tool-command marker (`CODEX_THREAD_ID`, ...);
//! 4. walking its parents reaches a trusted Codex process, or a Codex-named one not trusted, or
//!    a binary still being hashed, or the chain changes while walked. Reaching the top, or a
//!    process of another uid (a login's sshd), with no Codex on the way, passes.
//!
//! What this cannot stop: a model's command that runs unconfined (danger-full-access, or an
//! approved escalation), clears its environment and re-parents itself away from Codex
//! (`setsid` and a double fork) looks like any other process of the user. The app-server itself
//! lets any process of the uid answer (docs/approvals.md).

use super::{CodexTrust, Gate, Peer};
use crate::codex::TOOL_COMMAND_MARKERS;
use crate::os;
use crate::refusal::RefusalCode;
use courier_shared::paths::environ_get;
use std::time::{Duration, Instant};

impl Gate {
    /// `Ok(who)` (`uid U pid P (comm)`, for the answer record) when `peer` may answer an
    /// approval, else why not.
    pub fn verify_person(&self, peer: &Peer, trust: &dyn CodexTrust) -> Result<String, String> {
        let stat = os::read_stat(peer.pid).map_err(|e| format!("peer stat: {e}"))?;
        let status = os::read_status(peer.pid).map_err(|e| format!("peer status: {e}"))?;
        if !status.all_uids_are(self.uid) {
            return Err(format!("peer uids {:?} are not all {}", status.uids, self.uid));
        }
        if status.no_new_privs || status.seccomp != 0 {
            return Err(format!(
                "the process is confined as Codex confines a model's commands (NoNewPrivs={} Seccomp={})",
                status.no_new_privs as u8, status.seccomp
            ));
        }
        let mut env = Vec::with_capacity(8192);
        os::read_environ(peer.pid, &mut env).map_err(|e| format!("peer environ: {e}"))?;
        if let Some(k) = TOOL_COMMAND_MARKERS.iter().find(|k| environ_get(&env, k).is_some()) {
            return Err(format!("the process carries {k}: it runs for a Codex tool call"));
        }
        match self.walk_ancestry(&stat, trust, Instant::now() + Duration::from_secs(2)) {
            Ok((_, codex)) => return Err(format!("Codex process {} is its ancestor: a model's tool command", codex.pid)),
            Err(r) if matches!(r.code, RefusalCode::NoCodexAncestor | RefusalCode::ForeignAncestor) => {}
            Err(r) => return Err(format!("{}: {}", r.code, r.detail)),
        }
        if !peer.is_alive() || !os::read_stat(peer.pid).is_ok_and(|s| s.starttime == stat.starttime) {
            return Err("the process exited while checked".into());
        }
        Ok(format!("uid {} pid {} ({})", peer.uid, peer.pid, stat.comm))
    }
}
