//! What proves that a hook call belongs to the Codex session it names, read from what Codex
//! itself writes and holds: the rollout under `$CODEX_HOME/sessions`, the fds and the writer
//! lock of the codex process, the records Codex writes before each hook. The gate runs the
//! host-neutral steps (peer, client MAC, ancestry, caller) and asks this module the rest through
//! [`Prover`], in this order:
//!
//! 1. [`Prover::transcript`] (gate step 5): the path the event names, and the thread of its file
//!    name (`binding.rs`);
//! 2. [`Prover::read_rollout`] (steps 5 and 6): the path is canonical under
//!    `$CODEX_HOME/sessions`, and the rollout is read incrementally, the path still naming the
//!    file read after the read (`rollout_read.rs`);
//! 3. [`Prover::bind_thread`] (step 5): `session_meta` names the thread, the codex process holds
//!    the rollout and the thread's writer lock through fds it opened itself (`holder.rs`), the
//!    payload's `agent_id` and `session_id` agree (`binding.rs`);
//! 4. [`check_turn`] (step 7): the payload's turn is the rollout's open turn (`turn.rs`);
//!
//! and, once the gate has verified the call, [`ticket::ticket_key`] (step 8): which Codex action
//! the rollout's records show the hook follows. Every answer is a [`crate::refusal::Refusal`] with the gate's
//! codes, so a refusal reads the same whichever side found it.

mod binding;
pub mod holder;
mod rollout_read;
pub mod ticket;
mod turn;

use crate::codex::rollout::{RolloutTracker, SessionMeta, Snapshot};
use crate::os;
use courier_shared::ids::ThreadId;
use std::path::{Path, PathBuf};

pub use turn::check_turn;

/// The Codex side of the hook gate: its caches (rollout read state, the fds that held each
/// thread's files last time) and where Codex keeps its sessions. The gate holds one.
pub struct Prover {
    codex_home: PathBuf,
    tracker: RolloutTracker,
    fd_hints: holder::FdHints,
    /// `$CODEX_HOME/sessions`, resolved.
    sessions_dir: binding::SessionsDir,
    /// Rollouts kept open between calls.
    kept: rollout_read::KeptRollouts,
    #[cfg(test)]
    after_read: std::sync::Mutex<Option<AfterRead>>,
}

/// What a test runs between the rollout read and the identity re-check.
#[cfg(test)]
pub(crate) type AfterRead = Box<dyn Fn() + Send + Sync>;

/// The rollout a hook's payload names: its path as given and the thread of its file name.
pub struct Transcript<'p> {
    /// The path as the payload has it (what a refusal quotes).
    pub text: &'p str,
    pub thread_id: ThreadId,
}

impl Transcript<'_> {
    pub fn path(&self) -> &Path {
        Path::new(self.text)
    }
}

/// The rollout as read for one call: what is known of it, and the file that was read.
pub struct RolloutRead {
    pub snapshot: Snapshot,
    pub file: os::FileId,
}

/// What the binding found: the rollout's `session_meta`.
pub struct Binding {
    pub meta: SessionMeta,
}

impl Prover {
    pub fn new(codex_home: PathBuf) -> Prover {
        Prover {
            codex_home,
            tracker: RolloutTracker::new(),
            fd_hints: holder::FdHints::default(),
            sessions_dir: binding::SessionsDir::default(),
            kept: rollout_read::KeptRollouts::default(),
            #[cfg(test)]
            after_read: std::sync::Mutex::new(None),
        }
    }

    /// The incremental rollout reader (its byte counters are diagnostics).
    pub fn tracker(&self) -> &RolloutTracker {
        &self.tracker
    }

    /// `$CODEX_HOME/thread-writer-locks`: where the writer lock of each thread is.
    pub fn writer_lock_dir(&self) -> PathBuf {
        self.codex_home.join("thread-writer-locks")
    }

    #[cfg(test)]
    pub(crate) fn set_after_read(&self, hook: Option<AfterRead>) {
        *self.after_read.lock().unwrap() = hook;
    }
}

/// The codex process holds the writer lock of exactly one thread (`writer_lock_dir`'s files):
/// a scan of every fd it has, for a SessionStart with something to deliver.
pub fn sole_thread(codex: os::ProcessKey, writer_lock_dir: &Path) -> bool {
    let dir = std::fs::canonicalize(writer_lock_dir).unwrap_or_else(|_| writer_lock_dir.to_path_buf());
    holder::thread_locks(codex.pid, codex.starttime, &dir) == Some(1)
}
