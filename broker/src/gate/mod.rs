//! The verification gate: decides whether a hook request really comes from a trusted Codex
//! process's hook for the thread and turn it names, in seven steps. Anything doubtful
//! is a [`Refusal`] with a stable reason code; a refusal changes no queue state.
//!
//! # Use
//! ```ignore
//! let peer = gate::peer::identify(&stream)?;          // at accept time: SO_PEERCRED + pidfd
//! let verified = gate.verify(&peer, &req, &|sha: &str| trusted.contains(sha))?; // or any CodexTrust
//! ```
//! [`Gate`] is `Send + Sync`; one instance serves every connection thread. It caches executable
//! digests (by file identity) and per-rollout read state (by path and file identity).
//!
//! # Checks, in order ([`Gate::verify`]; each step in its own file)
//! 1. `peer.rs`: peer uid = broker uid; peer alive (its pidfd), re-checked after every /proc read.
//! 2. `client.rs`: peer executable (device+inode of `/proc/<pid>/exe`) is an installed
//!    hook-client; request pid = peer pid and the MAC verifies; timestamp within
//!    `MAX_CLOCK_SKEW_MS`; payload parses; the event is one Courier registers.
//! 3. `ancestry.rs`: parents of the peer (at most [`MAX_ANCESTRY`] levels, all of the broker's
//!    uid, start times consistent) reach a process whose executable's SHA-256 is trusted: "codex"
//!    (`digest.rs` hashes, never on the hook path).
//! 4. `caller.rs`: the caller is a hook, not a model-run command: no tool-command environment
//!    markers (`codex::TOOL_COMMAND_MARKERS`) that codex's own environment lacks, on the peer or any
//!    process between it and codex; none of them more confined (NoNewPrivs, seccomp) than codex.
//!
//! Steps 5 to 7 are the Codex wing's (`codex::proof`, one file each there), asked through its
//! [`Prover`]; the gate holds one:
//! 5. `Prover::transcript`, `Prover::bind_thread`: thread binding: `transcript_path`
//!    (SubagentStop: `agent_transcript_path`) is canonical, under `$CODEX_HOME/sessions/`, names
//!    the thread UUID; the rollout read (6) is intact and its `session_meta` id is that UUID;
//!    codex holds it open for append and holds `thread-writer-locks/<thread>.lock` (its fd's
//!    fdinfo `lock:` line), both through fds it opened itself (`O_CLOEXEC`, see
//!    `codex::proof::holder`); `agent_id`, `session_id` agree.
//! 6. `Prover::read_rollout`: rollout identity: the file read (opened with no symlink on the way,
//!    kept open for the thread's next calls) is, after reading, still the one the path names
//!    (device, inode, birth time) and still at that canonical path.
//! 7. `proof::check_turn`: turn affinity: payload `turn_id` = the rollout's open turn
//!    (SessionStart: none needed; [`Verified::sole_thread`], asked only when there is something
//!    to deliver, tells the caller whether it may).
//!
//! Finally (`ancestry::recheck`) the start times of every process in the chain are re-read: a
//! pid that now names a different process refuses the request.
//!
//! Step 8, one ticket per Codex action, follows `verify` (the caller runs it, before anything is
//! claimed): `Verified::ticket` turns the Codex action the wing finds (`codex::proof::ticket`)
//! into a ticket, `crate::tickets` takes each once.
//!
//! The gate reads `/proc` and the rollout, never the queue: what it asks about trust goes
//! through [`CodexTrust`] (`exe/trust.rs`).
//!
//! # Refusal reason codes
//! Every refusal carries a [`RefusalCode`]; `crate::refusal` documents each with its step.

mod ancestry;
mod caller;
mod client;
pub mod peer;
pub mod person;
pub mod sender;
pub mod session_sender;
#[cfg(test)]
mod tests;

use crate::codex::owner::{Looking, NoOwner, Owner};
use crate::codex::proof::{self, Prover};
use crate::codex::rollout::RolloutTracker;
pub use crate::codex::Verified;
use crate::exe::digest::DigestCache;
use crate::exe::CodexTrust;
pub use crate::refusal::{Refusal, RefusalCode};
use courier_shared::auth::Secret;
use courier_shared::ids::ThreadId;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

pub use ancestry::MAX_ANCESTRY;
pub use client::installed_client_ids;
pub use peer::identify;

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
    pub installed_clients: Vec<crate::os::FileKey>,
    pub secret: Secret,
}

/// How long a hook call waits at most for an expected Codex binary's hash, counted from the
/// client's timestamp (hook-client gives up at 500 ms by default).
pub const DIGEST_WAIT_MS: u64 = 450;

/// Points where tests can act in the middle of a verification.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    AfterRolloutRead,
}

pub struct Gate {
    config: GateConfig,
    uid: u32,
    digests: DigestCache,
    /// The Codex wing's steps (5 to 7) and their caches.
    prover: Prover,
    codex_markers: caller::CodexMarkers,
    proc_files: crate::os::ProcFiles,
}

#[cfg(test)]
type TestHook = Box<dyn Fn(Stage) + Send + Sync>;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl Gate {
    pub fn new(config: GateConfig) -> Gate {
        Gate {
            prover: Prover::new(config.codex_home.clone()),
            config,
            uid: courier_shared::paths::uid(),
            digests: DigestCache::default(),
            codex_markers: caller::CodexMarkers::new(&crate::codex::TOOL_COMMAND_MARKERS),
            proc_files: crate::os::ProcFiles::default(),
        }
    }

    /// The incremental rollout reader (its byte counters are diagnostics).
    pub fn tracker(&self) -> &RolloutTracker {
        self.prover.tracker()
    }

    pub fn digests(&self) -> &DigestCache {
        &self.digests
    }

    /// The trusted Codex process that owns `thread` now, found with the gate's caches
    /// (`codex::owner`).
    pub fn thread_owner(&self, thread: &ThreadId, trust: &dyn CodexTrust) -> Result<Owner, NoOwner> {
        let looking = Looking { codex_home: &self.config.codex_home, uid: self.uid, digests: &self.digests, tracker: self.tracker() };
        looking.thread_owner(thread, trust)
    }

    /// The `CODEX_HOME` whose threads it proves.
    pub fn codex_home(&self) -> &std::path::Path {
        &self.config.codex_home
    }

    /// Lets go of the files the gate keeps open whose path names another file now, or none (a
    /// deleted rollout's space is freed). Run by the maintenance pass.
    pub fn prune(&self) {
        self.prover.prune_kept();
    }

    #[cfg(test)]
    pub(crate) fn set_test_hook(&self, hook: Option<TestHook>) {
        self.prover.set_after_read(hook.map(|h| -> proof::AfterRead { Box::new(move || h(Stage::AfterRolloutRead)) }));
    }

    /// Runs every check of the gate, in order (module documentation). `is_trusted` answers
    /// whether a hex SHA-256 is a trusted Codex binary.
    pub fn verify(&self, peer: &Peer, req: &HookRequest, trust: &dyn CodexTrust) -> Result<Verified, Refusal> {
        let mut ctx = Ctx::default();
        self.verify_inner(peer, req, trust, &mut ctx).map_err(|mut r| {
            if r.thread.is_none() {
                r.thread = ctx.thread.take();
            }
            if r.event.is_none() {
                r.event = ctx.event.take();
            }
            r
        })
    }

    /// The steps, in order (module documentation); `ctx` collects the thread and event a
    /// refusal is recorded with.
    fn verify_inner(&self, peer: &Peer, req: &HookRequest, trust: &dyn CodexTrust, ctx: &mut Ctx) -> Result<Verified, Refusal> {
        peer::check(peer, self.uid)?; // 1
        let payload = client::check(&self.config, peer, req)?; // 2
        ctx.event = Some(payload.hook_event_name.clone());
        let event = client::event(&payload)?;
        let ancestry = self.trusted_ancestry(peer, req, trust)?; // 3
        caller::check(peer, &ancestry, &self.codex_markers)?; // 4
        let transcript = self.prover.transcript(event, &payload)?; // 5: the thread the path names
        ctx.thread = Some(transcript.thread_id.to_string());
        let read = self.prover.read_rollout(&transcript)?; // 5, 6: canonical, read intact
        let codex = ancestry.codex.key();
        let binding = self.prover.bind_thread(codex, &payload, &transcript, &read)?; // 5
        let turn_id = proof::check_turn(event, &payload, &read.snapshot)?; // 7
        ancestry::recheck(peer, &ancestry, &self.proc_files)?;
        let snap = read.snapshot;
        Ok(Verified {
            event,
            rollout_path: transcript.path().to_path_buf(),
            thread_id: transcript.thread_id,
            turn_id,
            codex_pid: codex.pid,
            rollout_offset: snap.offset,
            open_turn: snap.open_turn,
            root_thread_id: binding.meta.session_id,
            codex_starttime: codex.starttime,
            writer_lock_dir: self.prover.writer_lock_dir(),
            actions: snap.actions,
            payload,
        })
    }
}

/// A hook call of a host other than Codex that passed the gate's kernel (steps 1 to 3: peer,
/// installed client with a fresh MAC, parents up to a trusted host binary), its payload not read:
/// the host's wing runs its own steps on it (`copilot/gate.rs`), then [`Gate::recheck`].
pub struct HostCall {
    ancestry: ancestry::Ancestry,
}

impl HostCall {
    /// The trusted host process the walk stopped at.
    pub fn host(&self) -> crate::os::ProcessKey {
        self.ancestry.codex.key()
    }

    /// Whether the peer's parent is that host process itself (nothing in between).
    pub fn direct_child(&self) -> bool {
        self.ancestry.chain.is_empty()
    }
}

impl Gate {
    /// Steps 1 to 3 for a host whose wing proves the rest (module documentation), with `trust`
    /// answering for that host's binaries.
    pub fn verify_host_call(&self, peer: &Peer, req: &HookRequest, trust: &dyn CodexTrust) -> Result<HostCall, Refusal> {
        peer::check(peer, self.uid)?; // 1
        client::authenticate(&self.config, peer, req)?; // 2
        let ancestry = self.trusted_ancestry(peer, req, trust)?; // 3
        Ok(HostCall { ancestry })
    }

    /// The last check of a [`HostCall`]: the peer and every process up to the host are still
    /// the ones checked ([`ancestry::recheck`]).
    pub fn recheck(&self, peer: &Peer, call: &HostCall) -> Result<(), Refusal> {
        ancestry::recheck(peer, &call.ancestry, &self.proc_files)
    }
}

#[derive(Default)]
struct Ctx {
    thread: Option<String>,
    event: Option<String>,
}
