//! The GitHub Copilot CLI sessions of `broker threads`: the sessions of the user's Copilot home
//! (`copilot/session.rs`), live while a process holds the flock of an `inuse.<pid>.hold` there.
//! A listing, not a proof: what is delivered to a session rests on the Copilot gate alone.

use super::{Host, ProcessInfo, ProcessKind, ThreadInfo, ThreadState};
use crate::copilot::session::{self, Status};
use courier_producer_proto::ThreadStatus;
use courier_shared::ids::ThreadId;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;

/// Where `broker send`'s target stands when it is a session of the user's Copilot CLI (its hooks
/// deliver), with the note for an ended one; `None` when no Copilot session has that id.
pub fn send_status(thread: &ThreadId) -> Option<(ThreadStatus, Option<String>)> {
    Some(match session::status(thread.as_str())? {
        Status::Live => (ThreadStatus::Live, None),
        Status::Ended => (
            ThreadStatus::Ended,
            Some(format!("Copilot CLI session {thread} has ended; the message waits until it is resumed (`copilot --resume {thread}`)")),
        ),
    })
}

/// The live sessions and, with `all`, up to `limit` ended ones.
pub fn sessions(all: bool, limit: usize) -> Vec<ThreadInfo> {
    let mut ended = 0;
    let mut out = Vec::new();
    for s in session::all() {
        let live = s.status == Status::Live;
        if !live && (!all || ended >= limit) {
            continue;
        }
        ended += usize::from(!live);
        out.push(describe(&s));
    }
    out
}

fn describe(s: &session::Session) -> ThreadInfo {
    let cwd = |pid: i32| crate::os::cwd_path(pid).ok().map(|p| p.display().to_string());
    let exe = |pid: i32| crate::os::exe_path(pid).ok().map(|p| p.display().to_string());
    let mtime = std::fs::metadata(&s.events).ok().map(|m| m.mtime() * 1000 + m.mtime_nsec() / 1_000_000);
    ThreadInfo {
        id: s.id.clone(),
        name: None,
        host: Host::Copilot,
        state: if s.holder.is_some() { ThreadState::Live } else { ThreadState::Ended },
        turn_id: None,
        parent: None,
        root: None,
        children: Vec::new(),
        cwd: s.holder.and_then(cwd),
        title: None,
        agent_nickname: None,
        originator: None,
        cli_version: None,
        process: s.holder.map(|pid| ProcessInfo { pid, kind: ProcessKind::Copilot, exe: exe(pid).unwrap_or_default() }),
        rollout: s.events.display().to_string(),
        last_activity_at: mtime,
        pending: 0,
        undelivered: 0,
        messages: BTreeMap::new(),
        waiting_on_approval: Vec::new(),
        not_woken: s.holder.is_some().then(|| NO_WAKE.to_string()),
    }
}

/// Copilot CLI has no idle wake Courier can use (docs/copilot-cli.md): said for every live session.
const NO_WAKE: &str = "Copilot CLI offers no idle wake: a message reaches a live session at its next tool call, at the end \
    of its turn, or with its next prompt";
