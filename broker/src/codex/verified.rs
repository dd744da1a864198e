//! What a Codex hook call proved: the gate's verdict ([`Verified`]) on a call of Codex's hook,
//! declared in the wing (it carries what the rollout says Codex is doing) and below the gate, so
//! the wing's own steps after `verify` (the ticket, effort) need nothing of the gate.

use super::proof;
use super::rollout::Actions;
use crate::refusal::Refusal;
use crate::store::Ticket;
use codex_format::hook::{HookEvent, HookPayload};
use courier_shared::ids::ThreadId;
use std::path::PathBuf;

/// A Codex hook call that passed every check of the gate (`Gate::verify`): what it proved, for
/// delivery, tickets, approvals and effort.
#[derive(Debug, Clone)]
pub struct Verified {
    pub payload: HookPayload,
    pub event: HookEvent,
    pub thread_id: ThreadId,
    /// The payload's turn id, equal to the rollout's open turn. `None` only for SessionStart.
    pub turn_id: Option<String>,
    pub codex_pid: i32,
    pub rollout_path: PathBuf,
    /// Rollout length read up to: where the confirmation scan for what this call hands starts.
    pub rollout_offset: u64,
    /// The rollout's open turn when verified (for SessionStart, the turn it fired in, if any).
    pub open_turn: Option<String>,
    /// `session_meta.session_id` of the rollout: the root thread (== `thread_id` for a root thread).
    pub root_thread_id: Option<String>,
    /// Start time (clock ticks, /proc stat field 22) of the codex process: with `codex_pid`, it names it.
    pub codex_starttime: u64,
    /// `$CODEX_HOME/thread-writer-locks`: where [`Verified::sole_thread`] counts.
    pub writer_lock_dir: PathBuf,
    /// What the open turn's records say Codex is doing: the state [`Verified::ticket`] checks.
    pub actions: Actions,
}

impl Verified {
    /// The Codex process holds this thread's writer lock and no other thread's. Asked only when
    /// a SessionStart has something to deliver: it scans every fd of the codex process, which a
    /// hook with nothing to deliver (nearly all of them) should not pay for.
    pub fn sole_thread(&self) -> bool {
        proof::sole_thread(crate::os::ProcessKey { pid: self.codex_pid, starttime: self.codex_starttime }, &self.writer_lock_dir)
    }

    /// Step 8 of the gate: the ticket of this call (`proof::ticket::bind`), which
    /// `crate::tickets::take` accepts once.
    pub fn ticket(&self) -> Result<Option<Ticket>, Refusal> {
        proof::ticket::bind(self)
    }
}
