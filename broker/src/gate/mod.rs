//! The verification gate: decides whether a hook request really comes from a trusted Codex
//! process's hook for the thread and turn it names (courier-design.md, steps 1-7). Anything doubtful
//! is a [`Refusal`] with a stable reason code; a refusal changes no queue state.

use courier_shared::auth::Secret;
use courier_shared::hook::{HookEvent, HookPayload};
use std::os::fd::OwnedFd;
use std::path::PathBuf;

/// The connecting process, identified at accept time.
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
    /// Taken at once after accept; used to re-check the peer is still the same live process.
    pub pidfd: OwnedFd,
}

/// The fields of a `Request::Hook` frame.
pub struct HookRequest<'a> {
    pub pid: u32,
    pub ts_ms: u64,
    pub payload: &'a str,
    pub mac: &'a str,
}

pub struct GateConfig {
    pub codex_home: PathBuf,
    /// (device, inode) of every installed hook-client executable.
    pub installed_clients: Vec<(u64, u64)>,
    pub secret: Secret,
}

/// A hook call that passed every check.
#[derive(Debug, Clone)]
pub struct Verified {
    pub payload: HookPayload,
    pub event: HookEvent,
    pub thread_id: String,
    /// The payload's turn id, equal to the rollout's open turn. `None` only for SessionStart.
    pub turn_id: Option<String>,
    pub codex_pid: i32,
    pub rollout_path: PathBuf,
    /// Rollout length read up to: where the confirmation scan for what this call hands starts.
    pub rollout_offset: u64,
    /// The Codex process holds this thread's writer lock and no other thread's.
    pub sole_thread: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// Stable reason code, shown by `broker inspect` (see README, "Refusal reason codes").
    pub code: &'static str,
    pub detail: String,
    pub thread: Option<String>,
    pub event: Option<String>,
}

mod stub;
pub use stub::{installed_client_ids, peer, Gate};
