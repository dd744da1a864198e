//! The verification gate: decides whether a hook request really comes from a trusted Codex
//! process's hook for the thread and turn it names (courier-design.md, steps 1-7). Anything doubtful
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
//! # Checks, in order
//! 1. peer uid = broker uid; peer alive (its pidfd).
//! 2. peer executable (device+inode of `/proc/<pid>/exe`) is an installed hook-client; request pid
//!    = peer pid and the MAC verifies; timestamp within [`MAX_CLOCK_SKEW_MS`]; payload parses.
//! 3. ancestry: parents of the peer (at most [`MAX_ANCESTRY`] levels, all of the broker's uid,
//!    start times consistent) reach a process whose executable's SHA-256 is trusted: "codex".
//! 4. the caller is a hook, not a model-run command: no tool-command environment markers
//!    ([`TOOL_COMMAND_MARKERS`]) that codex's own environment lacks, on the peer or any process
//!    between it and codex; none of them more confined (NoNewPrivs, seccomp) than codex.
//! 5. thread binding: `transcript_path` (SubagentStop: `agent_transcript_path`) is canonical, under
//!    `$CODEX_HOME/sessions/`, names the thread UUID; the rollout read (6) is intact and its
//!    `session_meta` id is that UUID; codex holds it open for append and holds
//!    `thread-writer-locks/<thread>.lock` (its fd's fdinfo `lock:` line), both through fds it
//!    opened itself (`O_CLOEXEC`, see `holder.rs`); `agent_id`, `session_id` agree.
//! 6. rollout identity (device, inode, birth time, canonical path) equal before and after reading.
//! 7. turn affinity: payload `turn_id` = the rollout's open turn (SessionStart: none needed;
//!    [`Verified::sole_thread`] tells the caller whether it may deliver).
//!
//! Finally the start times of every process in the chain are re-read: a pid that now names a
//! different process refuses the request. Step 8, one ticket per Codex action, is [`ticket`]
//! (its codes `no_ticket`, `ticket_used` are in [`ticket::TICKET_REASON_CODES`]).
//!
//! # Refusal reason codes (stable; shown by `broker inspect`)
//! | code | step | meaning |
//! |---|---|---|
//! | `peer_uid` | 1 | the connecting process (SO_PEERCRED, or its /proc status uids) is not the broker's uid |
//! | `peer_gone` | 1-7 | the peer exited (pidfd readable), could not be pinned with a pidfd, or is in another pid namespace |
//! | `client_exe` | 2 | the peer's executable is not an installed hook-client (device+inode) |
//! | `bad_mac` | 2 | request pid is not the peer's pid, or the HMAC does not verify under the per-login secret |
//! | `stale_request` | 2 | request timestamp further than `MAX_CLOCK_SKEW_MS` from the broker clock |
//! | `bad_payload` | 2 | the payload is not a hook payload JSON object |
//! | `unsupported_event` | 2 | a hook event Courier does not register (SessionEnd, PreCompact, ...) |
//! | `foreign_ancestor` | 3 | an ancestor before the trusted codex runs under another uid |
//! | `untrusted_codex` | 3 | no trusted ancestor, but a codex-named one whose SHA-256 is not trusted |
//! | `digest_pending` | 3 | no trusted ancestor yet: a Codex binary the broker expects (a new release of the user's `codex`) was still being hashed when the call's deadline came |
//! | `no_codex_ancestor` | 3 | no trusted executable within `MAX_ANCESTRY` parents |
//! | `ancestry_changed` | 3-7 | an ancestor exited or its pid was reused while checking (start time changed, parent younger than child, peer re-parented) |
//! | `tool_command_env` | 4 | the peer or an intermediate process has a Codex tool-command marker variable codex itself lacks (or with another value) |
//! | `sandboxed_caller` | 4 | the peer or an intermediate process has NoNewPrivs or seccomp while codex has not |
//! | `transcript_path` | 5 | transcript path missing, relative, non-canonical (symlink, `..`), outside `$CODEX_HOME/sessions/`, not `rollout-*-<uuid>.jsonl`, not a regular file |
//! | `rollout_changed` | 6 | the rollout's identity or canonical path changed around the read, or it could not be read |
//! | `thread_mismatch` | 5 | the rollout's first record is not a `session_meta` whose `id` is the file name's thread UUID |
//! | `not_rollout_holder` | 5 | the codex process has no fd on that rollout (same inode) opened writable with O_APPEND by itself (O_CLOEXEC; an fd inherited across exec does not count) |
//! | `no_writer_lock` | 5 | the codex pid holds no FLOCK WRITE lock, through an fd it opened itself (O_CLOEXEC), on the file at `thread-writer-locks/<thread>.lock` or on one unlinked from there |
//! | `agent_mismatch` | 5 | `agent_id` is present and is not the thread id |
//! | `session_mismatch` | 5 | `session_id` is missing or neither the thread id nor its `session_meta.session_id` (root) |
//! | `turn_mismatch` | 7 | the payload `turn_id` is missing (events other than SessionStart) or not the rollout's open turn, or no turn is open |

pub mod digest;
mod holder;
pub mod peer;
mod sys;
pub mod ticket;
#[cfg(test)]
mod tests;

use crate::rollout::{RolloutIdentity, RolloutTracker};
use courier_shared::auth::{self, Secret, MAX_CLOCK_SKEW_MS};
use courier_shared::hook::{HookEvent, HookPayload};
use courier_shared::paths::environ_get;
use courier_shared::rollout::thread_id_from_path;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

pub use digest::DigestCache;
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
    /// The Codex process holds this thread's writer lock and no other thread's. Computed for
    /// SessionStart only (the one event whose delivery depends on it); `false` for the others.
    pub sole_thread: bool,
    /// The rollout's open turn when verified (for SessionStart, the turn it fired in, if any).
    pub open_turn: Option<String>,
    /// `session_meta.session_id` of the rollout: the root thread (== `thread_id` for a root thread).
    pub root_thread_id: Option<String>,
    /// Start time (clock ticks, /proc stat field 22) of the codex process: with `codex_pid`, it names it.
    pub codex_starttime: u64,
    /// Number of thread-writer locks the codex process holds (1 when `sole_thread`). SessionStart
    /// only, like `sole_thread`; 0 for the other events.
    pub thread_locks: usize,
    /// What the open turn's records say Codex is doing: the state [`ticket::bind`] checks.
    pub actions: crate::rollout::Actions,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// Stable reason code, shown by `broker inspect` (see README, "Refusal reason codes").
    pub code: &'static str,
    pub detail: String,
    pub thread: Option<String>,
    pub event: Option<String>,
}

impl Refusal {
    pub fn new(code: &'static str, detail: impl Into<String>) -> Refusal {
        Refusal { code, detail: detail.into(), thread: None, event: None }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.detail)
    }
}

/// Every reason code [`Gate::verify`] and [`peer::identify`] can return.
pub const REASON_CODES: [&str; 22] = [
    "peer_uid",
    "peer_gone",
    "client_exe",
    "bad_mac",
    "stale_request",
    "bad_payload",
    "unsupported_event",
    "foreign_ancestor",
    "untrusted_codex",
    "digest_pending",
    "no_codex_ancestor",
    "ancestry_changed",
    "tool_command_env",
    "sandboxed_caller",
    "transcript_path",
    "rollout_changed",
    "thread_mismatch",
    "not_rollout_holder",
    "no_writer_lock",
    "agent_mismatch",
    "session_mismatch",
    "turn_mismatch",
];

/// What the gate asks about Codex binaries. The server answers from the trusted set in the store
/// and the upgrade follower's resolutions; a plain closure over digests serves tests.
pub trait CodexTrust {
    /// Whether a hex SHA-256 is a trusted Codex binary.
    fn is_trusted(&self, sha256: &str) -> bool;
    /// Whether the executable at `path` is one the broker expects to be Codex (a trusted
    /// binary's path, what the user's `codex` resolves to, a managed-daemon release): a hook whose
    /// ancestor it is waits for its hash instead of being refused while it is computed.
    fn is_expected(&self, path: &Path) -> bool;
    /// A digest recorded for a file of exactly this identity (by a trust command, install or
    /// the follower), so it need not be hashed at all.
    fn known_digest(&self, _key: &digest::ExeKey) -> Option<String> {
        None
    }
}

impl<F: Fn(&str) -> bool> CodexTrust for F {
    fn is_trusted(&self, sha256: &str) -> bool {
        self(sha256)
    }
    fn is_expected(&self, _: &Path) -> bool {
        true
    }
}

/// How long a hook call waits at most for an expected Codex binary's hash, counted from the
/// client's timestamp (hook-client gives up at 500 ms by default).
pub const DIGEST_WAIT_MS: u64 = 450;

/// Environment variables Codex sets only for commands the model runs (codex-facts.md §3).
pub const TOOL_COMMAND_MARKERS: [&str; 4] = ["CODEX_TOOL_CALL_ID", "CODEX_THREAD_ID", "CODEX_SESSION_ID", "CODEX_CI"];

/// Parents walked from the peer looking for the trusted codex process.
pub const MAX_ANCESTRY: usize = 8;

/// A process between the peer and codex, or codex itself.
#[derive(Debug, Clone)]
struct Member {
    pid: i32,
    ppid: i32,
    starttime: u64,
    status: sys::ProcStatus,
}

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
    tracker: RolloutTracker,
    fd_hints: holder::FdHints,
    #[cfg(test)]
    test_hook: std::sync::Mutex<Option<TestHook>>,
}

#[cfg(test)]
type TestHook = Box<dyn Fn(Stage) + Send + Sync>;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn codexish(name: &str) -> bool {
    name.to_ascii_lowercase().contains("codex")
}

impl Gate {
    pub fn new(config: GateConfig) -> Gate {
        Gate {
            config,
            uid: courier_shared::paths::uid(),
            digests: DigestCache::default(),
            tracker: RolloutTracker::new(),
            fd_hints: holder::FdHints::default(),
            #[cfg(test)]
            test_hook: std::sync::Mutex::new(None),
        }
    }

    pub fn config(&self) -> &GateConfig {
        &self.config
    }

    /// The incremental rollout reader (its byte counters are diagnostics).
    pub fn tracker(&self) -> &RolloutTracker {
        &self.tracker
    }

    pub fn digests(&self) -> &DigestCache {
        &self.digests
    }

    #[cfg(test)]
    pub(crate) fn set_test_hook(&self, hook: Option<TestHook>) {
        *self.test_hook.lock().unwrap() = hook;
    }

    #[cfg(test)]
    fn stage(&self, s: Stage) {
        if let Some(h) = self.test_hook.lock().unwrap().as_ref() {
            h(s)
        }
    }

    /// Runs every check of courier-design.md's verification gate, in order. `is_trusted` answers
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

    fn verify_inner(
        &self,
        peer: &Peer,
        req: &HookRequest,
        trust: &dyn CodexTrust,
        ctx: &mut Ctx,
    ) -> Result<Verified, Refusal> {
        let alive = |what: &str| -> Result<(), Refusal> {
            if peer.is_alive() {
                Ok(())
            } else {
                Err(Refusal::new("peer_gone", format!("peer {} exited ({what})", peer.pid)))
            }
        };

        // 1. Peer identity.
        if peer.uid != self.uid {
            return Err(Refusal::new("peer_uid", format!("peer uid {} is not broker uid {}", peer.uid, self.uid)));
        }
        alive("at start")?;

        // 2. Installed client, MAC, freshness, payload.
        let exe = sys::exe_id(peer.pid).map_err(|e| {
            if sys::is_gone(&e) {
                Refusal::new("peer_gone", format!("peer exe: {e}"))
            } else {
                Refusal::new("client_exe", format!("cannot stat peer exe: {e}"))
            }
        })?;
        alive("after exe")?;
        if !self.config.installed_clients.contains(&exe) {
            return Err(Refusal::new(
                "client_exe",
                format!("peer executable dev {} ino {} is not an installed hook-client", exe.0, exe.1),
            ));
        }
        if req.pid as i64 != peer.pid as i64 {
            return Err(Refusal::new("bad_mac", format!("request pid {} is not peer pid {}", req.pid, peer.pid)));
        }
        if !auth::verify(&self.config.secret, req.pid, req.ts_ms, req.payload.as_bytes(), req.mac) {
            return Err(Refusal::new("bad_mac", "MAC does not verify"));
        }
        let now = now_ms();
        if now.abs_diff(req.ts_ms) > MAX_CLOCK_SKEW_MS {
            return Err(Refusal::new(
                "stale_request",
                format!("timestamp {} is {} ms from broker clock", req.ts_ms, now.abs_diff(req.ts_ms)),
            ));
        }
        let payload: HookPayload =
            serde_json::from_str(req.payload).map_err(|e| Refusal::new("bad_payload", format!("payload: {e}")))?;
        ctx.event = Some(payload.hook_event_name.clone());
        let event = payload.event();
        if event == HookEvent::Other {
            return Err(Refusal::new("unsupported_event", format!("event {:?} is not handled", payload.hook_event_name)));
        }

        // 3. Trusted ancestry.
        let peer_stat = sys::read_stat(peer.pid).map_err(|e| Refusal::new("peer_gone", format!("peer stat: {e}")))?;
        let peer_status =
            sys::read_status(peer.pid).map_err(|e| Refusal::new("peer_gone", format!("peer status: {e}")))?;
        alive("after stat")?;
        if !peer_status.all_uids_are(self.uid) {
            return Err(Refusal::new("peer_uid", format!("peer uids {:?} are not all {}", peer_status.uids, self.uid)));
        }
        let wait_ms = (req.ts_ms + DIGEST_WAIT_MS).saturating_sub(now_ms()).min(DIGEST_WAIT_MS);
        let digest_deadline = std::time::Instant::now() + std::time::Duration::from_millis(wait_ms);
        let (chain, codex) = self.walk_ancestry(&peer_stat, trust, digest_deadline)?;

        // 4. A hook, not a model-run command.
        let mut codex_env = Vec::with_capacity(8192);
        sys::read_environ(codex.pid, &mut codex_env)
            .map_err(|e| Refusal::new("ancestry_changed", format!("codex {} environ: {e}", codex.pid)))?;
        let mut env = Vec::with_capacity(8192);
        sys::read_environ(peer.pid, &mut env).map_err(|e| Refusal::new("peer_gone", format!("peer environ: {e}")))?;
        alive("after environ")?;
        check_markers(&env, &codex_env, "peer", peer.pid)?;
        for m in &chain {
            sys::read_environ(m.pid, &mut env)
                .map_err(|e| Refusal::new("ancestry_changed", format!("process {} environ: {e}", m.pid)))?;
            check_markers(&env, &codex_env, "intermediate process", m.pid)?;
        }
        if peer_status.more_confined_than(&codex.status) {
            return Err(Refusal::new(
                "sandboxed_caller",
                format!(
                    "peer NoNewPrivs={} Seccomp={} but codex NoNewPrivs={} Seccomp={}",
                    peer_status.no_new_privs as u8, peer_status.seccomp, codex.status.no_new_privs as u8, codex.status.seccomp
                ),
            ));
        }
        if let Some(m) = chain.iter().find(|m| m.status.more_confined_than(&codex.status)) {
            return Err(Refusal::new("sandboxed_caller", format!("intermediate process {} is confined, codex is not", m.pid)));
        }

        // 5. Thread binding: the path.
        let subagent_stop = event == HookEvent::SubagentStop;
        let path_str = if subagent_stop { payload.agent_transcript_path.as_deref() } else { payload.transcript_path.as_deref() }
            .ok_or_else(|| Refusal::new("transcript_path", "no transcript path in payload"))?;
        let thread_id = thread_id_from_path(path_str)
            .ok_or_else(|| Refusal::new("transcript_path", format!("{path_str:?} is not rollout-*-<uuid>.jsonl")))?
            .to_string();
        ctx.thread = Some(thread_id.clone());
        let path = Path::new(path_str);
        if !path.is_absolute() {
            return Err(Refusal::new("transcript_path", format!("{path_str:?} is not absolute")));
        }
        // Lexically normal (no `.`, `..`, repeated or trailing `/`), under the sessions directory,
        // and (at open) no symlink anywhere on the way: the path is canonical.
        let normal: PathBuf = path.components().collect();
        if normal.as_os_str() != path.as_os_str() || path.components().any(|c| c == std::path::Component::ParentDir) {
            return Err(Refusal::new("transcript_path", format!("{path_str:?} is not canonical")));
        }
        let sessions = std::fs::canonicalize(self.config.codex_home.join("sessions"))
            .map_err(|e| Refusal::new("transcript_path", format!("$CODEX_HOME/sessions: {e}")))?;
        if !path.starts_with(&sessions) || path == sessions {
            return Err(Refusal::new("transcript_path", format!("{path_str:?} is outside {:?}", sessions)));
        }

        // 6. Rollout identity around an incremental read.
        let file = match sys::open_no_symlinks(path) {
            Ok(Some(file)) => file,
            Err(e) if sys::errno(&e) == nix::libc::ELOOP => {
                return Err(Refusal::new("transcript_path", format!("{path_str:?} is not canonical (a symlink on the way)")))
            }
            Err(e) => return Err(Refusal::new("transcript_path", format!("open {path_str:?}: {e}"))),
            Ok(None) => {
                // No openat2: resolve the path instead.
                let canonical = std::fs::canonicalize(path)
                    .map_err(|e| Refusal::new("transcript_path", format!("{path_str:?}: {e}")))?;
                if canonical != path {
                    return Err(Refusal::new(
                        "transcript_path",
                        format!("{path_str:?} is not canonical (resolves to {:?})", canonical),
                    ));
                }
                sys::open_nofollow(path).map_err(|e| Refusal::new("transcript_path", format!("open {path_str:?}: {e}")))?
            }
        };
        let before = sys::statx_fd(&file).map_err(|e| Refusal::new("rollout_changed", format!("statx: {e}")))?;
        if !sys::is_regular(before.mode) {
            return Err(Refusal::new("transcript_path", format!("{path_str:?} is not a regular file")));
        }
        let identity = |id: &sys::FileId| RolloutIdentity {
            dev: id.dev,
            ino: id.ino,
            btime_sec: id.btime_sec,
            btime_nsec: id.btime_nsec,
        };
        let check_identity = |when: &str| -> Result<(), Refusal> {
            let changed = |why: String| Refusal::new("rollout_changed", format!("{when}: {why}"));
            let at_path = sys::statx_path_nofollow(path).map_err(|e| changed(format!("{path_str:?}: {e}")))?;
            if !at_path.same_file(&before) {
                return Err(changed(format!("{path_str:?} is no longer the file that was opened")));
            }
            let fd_path = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
                .map_err(|e| changed(format!("fd path: {e}")))?;
            if fd_path != path {
                return Err(changed(format!("opened file now resolves to {fd_path:?}")));
            }
            let now = sys::statx_fd(&file).map_err(|e| changed(format!("statx: {e}")))?;
            if !now.same_file(&before) {
                return Err(changed("fd identity changed".into()));
            }
            Ok(())
        };
        check_identity("before read")?;
        let snap = self
            .tracker
            .update(path, &file, identity(&before), before.size)
            .map_err(|e| Refusal::new("rollout_changed", format!("reading {path_str:?}: {e}")))?;
        #[cfg(test)]
        self.stage(Stage::AfterRolloutRead);
        // Also proves the path still canonical: the opened file's own path (/proc/self/fd) is it.
        check_identity("after read")?;

        // 5 (continued). The rollout names the thread; codex holds it and the thread's lock.
        let meta = snap
            .session_meta
            .clone()
            .ok_or_else(|| Refusal::new("thread_mismatch", format!("{path_str:?} does not start with a session_meta")))?;
        if meta.id != thread_id {
            return Err(Refusal::new(
                "thread_mismatch",
                format!("session_meta id {} is not file name thread {thread_id}", meta.id),
            ));
        }
        let lock_dir = self.config.codex_home.join("thread-writer-locks");
        let lock_path = lock_dir.join(format!("{thread_id}.lock"));
        // The file at the lock path now, if any. None is not yet a refusal: the real holder keeps
        // its claim when someone removed or replaced the path under it (holder.rs, "Which lock file").
        let lock_file = sys::statx_path_nofollow(&lock_path)
            .ok()
            .filter(|id| sys::is_regular(id.mode))
            .map(|id| (id.dev, id.ino));
        let rollout_file = (before.dev, before.ino);
        // Only SessionStart's delivery depends on how many threads codex runs; other events re-check
        // the fds that held the rollout and the lock last time, and scan only when those moved.
        let counted = event == HookEvent::SessionStart;
        let (sole_thread, thread_locks) = if !counted
            && lock_file.is_some_and(|lock| {
                holder::hinted_holds(&self.fd_hints, codex.pid, codex.starttime, rollout_file, lock)
            }) {
            (false, 0)
        } else {
            let lock_dir_canon = std::fs::canonicalize(&lock_dir).unwrap_or_else(|_| lock_dir.clone());
            let scan = holder::scan(codex.pid, rollout_file, lock_file, &thread_id, &lock_dir_canon).map_err(|e| {
                if sys::is_gone(&e) {
                    Refusal::new("ancestry_changed", format!("codex {} fds: {e}", codex.pid))
                } else {
                    Refusal::new("not_rollout_holder", format!("codex {} fds: {e}", codex.pid))
                }
            })?;
            if !scan.holds_rollout_append {
                let how = if scan.rollout_inherited {
                    "open for append only through an fd inherited across exec (no O_CLOEXEC): codex did not open it"
                } else if scan.holds_rollout_other {
                    "open, but not writable with O_APPEND"
                } else {
                    "not open"
                };
                return Err(Refusal::new(
                    "not_rollout_holder",
                    format!("codex {} has {path_str:?} {how}", codex.pid),
                ));
            }
            if !scan.holds_thread_lock {
                let how = if scan.thread_lock_inherited {
                    "only through an fd inherited across exec (no O_CLOEXEC): codex did not lock it"
                } else if lock_file.is_none() {
                    "(no lock file there, and none unlinked from there is held)"
                } else {
                    "(nor on an unlinked file that was there)"
                };
                return Err(Refusal::new(
                    "no_writer_lock",
                    format!("codex {} holds no FLOCK WRITE lock on {} {how}", codex.pid, lock_path.display()),
                ));
            }
            if let Some(lock) = lock_file {
                self.fd_hints.learn(codex.pid, codex.starttime, rollout_file, lock, &scan);
            }
            if counted {
                (scan.thread_locks == 1, scan.thread_locks)
            } else {
                (false, 0)
            }
        };
        if let Some(agent) = payload.agent_id.as_deref() {
            if agent != thread_id {
                return Err(Refusal::new("agent_mismatch", format!("agent_id {agent} is not thread {thread_id}")));
            }
        }
        match payload.session_id.as_deref() {
            Some(s) if s == thread_id || Some(s) == meta.session_id.as_deref() => {}
            other => {
                return Err(Refusal::new(
                    "session_mismatch",
                    format!("session_id {other:?} is neither thread {thread_id} nor its root {:?}", meta.session_id),
                ))
            }
        }

        // 7. Turn affinity.
        let open = snap.open_turn.clone();
        let turn_id = match (event, payload.turn_id.as_deref()) {
            (HookEvent::SessionStart, None) => None,
            (_, Some(t)) if open.as_deref() == Some(t) => Some(t.to_string()),
            (_, t) => {
                return Err(Refusal::new(
                    "turn_mismatch",
                    format!("payload turn {t:?} is not the rollout's open turn {open:?}"),
                ))
            }
        };

        // Finally: nothing in the chain was replaced while we looked.
        alive("at end")?;
        match sys::read_stat(peer.pid) {
            Ok(s) if s.ppid == peer_stat.ppid && s.starttime == peer_stat.starttime => {}
            Ok(_) => return Err(Refusal::new("ancestry_changed", "peer was re-parented")),
            Err(e) => return Err(Refusal::new("peer_gone", format!("peer stat: {e}"))),
        }
        for m in chain.iter().chain(std::iter::once(&codex)) {
            match sys::read_stat(m.pid) {
                Ok(s) if s.starttime == m.starttime && s.ppid == m.ppid => {}
                Ok(_) => return Err(Refusal::new("ancestry_changed", format!("pid {} now names another process or parent", m.pid))),
                Err(e) => return Err(Refusal::new("ancestry_changed", format!("process {} gone: {e}", m.pid))),
            }
        }

        Ok(Verified {
            event,
            thread_id,
            turn_id,
            codex_pid: codex.pid,
            rollout_path: path.to_path_buf(),
            rollout_offset: snap.offset,
            sole_thread,
            open_turn: open,
            root_thread_id: meta.session_id.clone(),
            codex_starttime: codex.starttime,
            thread_locks,
            actions: snap.actions.clone(),
            payload,
        })
    }

    /// Walks parents from the peer to the nearest trusted executable. Returns the processes in
    /// between (nearest first) and the codex process.
    fn walk_ancestry(
        &self,
        peer_stat: &sys::ProcStat,
        trust: &dyn CodexTrust,
        digest_deadline: std::time::Instant,
    ) -> Result<(Vec<Member>, Member), Refusal> {
        let mut chain = Vec::new();
        let mut child_start = peer_stat.starttime;
        let mut ppid = peer_stat.ppid;
        let mut codexish_seen: Option<String> = None;
        let mut pending: Option<String> = None;
        for _ in 0..MAX_ANCESTRY {
            if ppid <= 0 {
                break;
            }
            let gone = |e: std::io::Error| Refusal::new("ancestry_changed", format!("ancestor {ppid}: {e}"));
            let st = sys::read_stat(ppid).map_err(gone)?;
            if st.starttime > child_start {
                return Err(Refusal::new(
                    "ancestry_changed",
                    format!("ancestor {ppid} started after its child: pid reused"),
                ));
            }
            let status = sys::read_status(ppid).map_err(gone)?;
            if !status.all_uids_are(self.uid) {
                return Err(Refusal::new(
                    "foreign_ancestor",
                    format!("ancestor {ppid} ({}) runs as uids {:?}", st.comm, status.uids),
                ));
            }
            // Hashing is never done here (digest.rs): an expected Codex binary not hashed yet is
            // waited for until the deadline, anything else is queued and passed over for now.
            let exe_name = || {
                std::fs::read_link(format!("/proc/{ppid}/exe"))
                    .ok()
                    .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                    .unwrap_or_default()
            };
            let waited_for = std::cell::Cell::new(false);
            let expected = |p: &Path| {
                let e = trust.is_expected(p);
                waited_for.set(waited_for.get() | e);
                e
            };
            let known = |k: &digest::ExeKey| trust.known_digest(k);
            let digest = match self.digests.lookup(ppid, &known, &expected, digest_deadline) {
                Ok(digest::Lookup::Digest(d)) => Some(d),
                Ok(digest::Lookup::Pending) => {
                    if waited_for.get() && pending.is_none() {
                        pending = Some(format!("{ppid} ({})", exe_name()));
                    }
                    None
                }
                Ok(digest::Lookup::Unhashable) | Err(_) => None,
            };
            let exe_name = exe_name();
            // The pid must still name the process whose stat we read.
            match sys::read_stat(ppid) {
                Ok(again) if again.starttime == st.starttime => {}
                Ok(_) => return Err(Refusal::new("ancestry_changed", format!("ancestor {ppid} replaced while checked"))),
                Err(e) => return Err(gone(e)),
            }
            let member = Member { pid: ppid, ppid: st.ppid, starttime: st.starttime, status };
            if digest.as_deref().is_some_and(|d| trust.is_trusted(d)) {
                return Ok((chain, member));
            }
            if codexish_seen.is_none() && (codexish(&st.comm) || codexish(&exe_name)) {
                codexish_seen = Some(format!(
                    "{ppid} ({}, sha256 {})",
                    if exe_name.is_empty() { &st.comm } else { &exe_name },
                    digest.as_deref().unwrap_or("unreadable")
                ));
            }
            chain.push(member);
            child_start = st.starttime;
            ppid = st.ppid;
        }
        if let Some(who) = pending {
            return Err(Refusal::new(
                "digest_pending",
                format!("Codex binary of ancestor {who} is new and was still being hashed; later calls will be verified"),
            ));
        }
        Err(match codexish_seen {
            Some(who) => Refusal::new("untrusted_codex", format!("codex-named ancestor {who} is not trusted")),
            None => Refusal::new(
                "no_codex_ancestor",
                format!("no trusted Codex executable within {MAX_ANCESTRY} parents"),
            ),
        })
    }
}

#[derive(Default)]
struct Ctx {
    thread: Option<String>,
    event: Option<String>,
}

fn check_markers(env: &[u8], codex_env: &[u8], who: &str, pid: i32) -> Result<(), Refusal> {
    for key in TOOL_COMMAND_MARKERS {
        if let Some(v) = environ_get(env, key) {
            if environ_get(codex_env, key) != Some(v) {
                return Err(Refusal::new(
                    "tool_command_env",
                    format!("{who} {pid} has {key}, which codex's own environment lacks or sets differently"),
                ));
            }
        }
    }
    Ok(())
}

/// (device, inode) of the `hook-client` next to `broker_exe`, plus each of `extra` that exists.
pub fn installed_client_ids(broker_exe: &Path, extra: &[PathBuf]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let beside = broker_exe.parent().map(|d| d.join("hook-client"));
    for p in beside.iter().chain(extra.iter()) {
        if let Ok(m) = std::fs::metadata(p) {
            if m.is_file() && !out.contains(&(m.dev(), m.ino())) {
                out.push((m.dev(), m.ino()));
            }
        }
    }
    out
}
