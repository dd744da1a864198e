//! The proof that a hook call is Copilot CLI's own hook for the session its payload names, in
//! named steps after the gate's kernel (`Gate::verify_host_call`: the peer, an installed
//! hook-client with a fresh MAC, its parents up to a trusted copilot binary). Each step rests on
//! a probe of 1.0.102 (docs/copilot-cli.md):
//!
//! 1. `payload` (`copilot_payload`): an event Courier registers, its camelCase payload with a
//!    `sessionId` UUID (`payload.rs`);
//! 2. `trusted_copilot` (`untrusted_copilot`): the kernel's walk found a trusted native binary;
//! 3. `parent` (`copilot_parent`): the hook's parent is that copilot process itself: Copilot
//!    starts a hook as its direct child (`bash -c` execs the command);
//! 4. `session` (`copilot_session`): the hook is in copilot's session. Copilot runs a model's
//!    command in a new session (`setsid`), and no descendant of it can rejoin copilot's: a
//!    model's command running hook-client is refused here, whatever payload it copied;
//! 5. `stdout_pipe` (`copilot_pipe`): the hook's stdout is a pipe whose read end copilot holds
//!    (pipes carry no peer credentials; the fd table does);
//! 6. `dist_dir` (`copilot_dist`): the dist dir copilot holds its `inuse.<pid>.hold` lock in
//!    has the trusted code (`trust.rs`);
//! 7. `session_lock` (`copilot_session_lock`): copilot holds the exclusive flock of
//!    `session-state/<sessionId>/inuse.<pid>.hold`: it runs that session now. Its session
//!    record (`events.jsonl`, where confirmation reads) is beside that lock;
//!
//! then the kernel's recheck (every process checked is still the one it was).

use super::fds;
use super::payload::{self, Payload};
use crate::gate::{Gate, HookRequest, Peer};
use crate::os::ProcessKey;
use crate::refusal::{Refusal, RefusalCode};
use crate::store::Store;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A hook call proven to be its copilot's own for the session it names.
#[derive(Debug, Clone)]
pub struct Proven {
    pub payload: Payload,
    /// The copilot process that runs the session and ran the hook.
    pub copilot: ProcessKey,
    /// `session-state/<sessionId>/events.jsonl` beside the lock copilot holds.
    pub events: PathBuf,
}

/// Runs the kernel and every step above, in order.
pub fn verify(gate: &Gate, store: &Mutex<Store>, peer: &Peer, req: &HookRequest, event: &str) -> Result<Proven, Refusal> {
    let payload = payload::parse(event, req.payload)?; // 1
    let trust = super::trust::StoreTrust(store);
    let call = gate.verify_host_call(peer, req, &trust).map_err(as_copilot)?; // 2 (with the kernel)
    let copilot = call.host();
    if !call.direct_child() {
        // 3
        return Err(Refusal::new(RefusalCode::CopilotParent, format!("the hook's parent is not copilot {} itself", copilot.pid)));
    }
    same_session(peer.pid, copilot.pid)?; // 4
    let held =
        fds::scan(copilot.pid).map_err(|e| Refusal::new(RefusalCode::AncestryChanged, format!("copilot {} fds: {e}", copilot.pid)))?;
    stdout_pipe(peer.pid, &held)?; // 5
    dist_dir(store, copilot.pid, &held)?; // 6
    let events = session_lock(copilot.pid, payload.session.as_str(), &held)?; // 7
    gate.recheck(peer, &call)?;
    Ok(Proven { payload, copilot, events })
}

/// The kernel's "no trusted ancestor" refusals, said as Copilot's.
fn as_copilot(r: Refusal) -> Refusal {
    match r.code {
        RefusalCode::NoCodexAncestor | RefusalCode::UntrustedCodex | RefusalCode::DigestPending => {
            Refusal { code: RefusalCode::UntrustedCopilot, ..r }
        }
        _ => r,
    }
}

fn same_session(peer: i32, copilot: i32) -> Result<(), Refusal> {
    let session = |pid: i32| crate::os::read_stat(pid).map(|s| s.session);
    let (Ok(mine), Ok(its)) = (session(peer), session(copilot)) else {
        return Err(Refusal::new(RefusalCode::AncestryChanged, "a process exited while its session was read"));
    };
    if mine != its {
        return Err(Refusal::new(
            RefusalCode::CopilotSession,
            format!("the hook runs in session {mine}, its copilot {copilot} in {its}: a command copilot started in a session of its own"),
        ));
    }
    Ok(())
}

fn stdout_pipe(peer: i32, held: &fds::Held) -> Result<(), Refusal> {
    let target = crate::os::fd::fd_target(peer, 1).map_err(|e| Refusal::new(RefusalCode::PeerGone, format!("the hook's stdout: {e}")))?;
    match fds::pipe_inode(&target) {
        Some(ino) if held.pipes_read.contains(&ino) => Ok(()),
        Some(ino) => Err(Refusal::new(RefusalCode::CopilotPipe, format!("copilot holds no read end of the hook's stdout pipe {ino}"))),
        None => Err(Refusal::new(RefusalCode::CopilotPipe, format!("the hook's stdout is {}, not a pipe", target.display()))),
    }
}

/// The dist dir: the directory of the `inuse.<copilot pid>.hold` copilot holds beside its
/// `.extraction-complete`.
pub(super) fn dist_dir(store: &Mutex<Store>, pid: i32, held: &fds::Held) -> Result<(), Refusal> {
    let name = format!("inuse.{pid}.hold");
    let dir = held
        .holds
        .iter()
        .filter(|p| p.file_name().is_some_and(|n| *n == *name))
        .filter_map(|p| p.parent())
        .find(|d| d.join(".extraction-complete").is_file())
        .ok_or_else(|| Refusal::new(RefusalCode::CopilotDist, format!("copilot {pid} holds no lock in an extracted dist dir")))?;
    match super::trust::dist_doubt(store, dir) {
        None => Ok(()),
        Some(why) => Err(Refusal::new(RefusalCode::CopilotDist, why)),
    }
}

/// The session record beside the lock copilot holds on session `session`.
pub(super) fn session_lock(pid: i32, session: &str, held: &fds::Held) -> Result<PathBuf, Refusal> {
    let name = format!("inuse.{pid}.hold");
    let lock = held.holds.iter().find(|p| {
        let dir = p.parent();
        p.file_name().is_some_and(|n| *n == *name)
            && dir.and_then(Path::file_name).is_some_and(|n| *n == *session)
            && dir.and_then(Path::parent).and_then(Path::file_name).is_some_and(|n| n == "session-state")
    });
    match lock {
        Some(l) => Ok(l.with_file_name("events.jsonl")),
        None => Err(Refusal::new(
            RefusalCode::CopilotSessionLock,
            format!("copilot {pid} holds no lock on session-state/{session}/{name}: it does not run that session"),
        )),
    }
}
