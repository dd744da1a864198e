//! Which live, trusted Codex process owns a thread, when no hook call names one: the evidence the
//! wake channel needs before it may talk to an app-server about that thread. The same facts the
//! hook gate checks in steps 3 and 5, found from the thread's side instead of the caller's:
//!
//! 1. the process holding the `flock` on `$CODEX_HOME/thread-writer-locks/<thread>.lock`
//!    (`/proc/locks`), of the broker's uid;
//! 2. whose executable is a trusted Codex binary (the shared digest cache);
//! 3. which holds that lock and the thread's rollout (opened `O_APPEND`) through fds it opened
//!    itself (`O_CLOEXEC`: `codex::proof::holder`);
//! 4. and the rollout's `session_meta` names the thread; its open turn says busy or idle.
//!
//! The start time is read before and after: a pid reused meanwhile is refused.

use super::proof::holder;
use super::rollout::{find_rollout, RolloutIdentity, RolloutTracker};
use crate::exe::digest::{self, DigestCache};
use crate::exe::CodexTrust;
use crate::os;
use courier_shared::ids::ThreadId;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The process that owns a thread, and where the thread stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub pid: i32,
    pub starttime: u64,
    pub rollout: PathBuf,
    /// Rollout length when looked at: anything the owner writes later comes after it.
    pub rollout_len: u64,
    /// `Some` while a turn is open (busy): hooks will come.
    pub open_turn: Option<String>,
    /// The thread is a sub-agent (its `session_meta` names a parent).
    pub subagent: bool,
}

/// Why no owner was found: a stable code, shown on the waiting messages by `broker inspect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoOwner {
    /// No live process holds the thread's writer lock: the thread ended, or was never loaded.
    NotLoaded,
    /// A process holds it, but is not a trusted Codex (or is not yet hashed).
    Untrusted(String),
    /// The holder does not hold the rollout and lock as Codex does, or changed while checked.
    NotProven(String),
}

/// Where an owner is looked for and with what: the gate's caches (`Gate::thread_owner`).
pub struct Looking<'a> {
    pub codex_home: &'a Path,
    /// The broker's uid: the owner runs as it.
    pub uid: u32,
    pub digests: &'a DigestCache,
    pub tracker: &'a RolloutTracker,
}

impl Looking<'_> {
    /// The trusted Codex process that owns `thread` now (see the module docs).
    pub fn thread_owner(&self, thread: &ThreadId, trust: &dyn CodexTrust) -> Result<Owner, NoOwner> {
        use std::os::unix::fs::MetadataExt;
        let lock_dir = self.codex_home.join("thread-writer-locks");
        let lock_path = lock_dir.join(format!("{thread}.lock"));
        let lock = std::fs::metadata(&lock_path).map_err(|_| NoOwner::NotLoaded)?;
        let holders = os::locks::flock_writers_of(os::FileKey { dev: lock.dev(), ino: lock.ino() })
            .map_err(|e| NoOwner::NotProven(format!("the locks held: {e}")))?;
        let &[pid] = holders.as_slice() else {
            return Err(if holders.is_empty() {
                NoOwner::NotLoaded
            } else {
                NoOwner::NotProven(format!("several processes hold {}: {holders:?}", lock_path.display()))
            });
        };
        let stat = os::read_stat(pid).map_err(|_| NoOwner::NotLoaded)?;
        let status = os::read_status(pid).map_err(|_| NoOwner::NotLoaded)?;
        if !status.all_uids_are(self.uid) {
            return Err(NoOwner::Untrusted(format!("holder {pid} runs as uids {:?}", status.uids)));
        }
        let known = |k: &crate::exe::ExeKey| trust.known_digest(k);
        let expected = |p: &Path, size: u64| trust.is_expected(p, size);
        let until = Instant::now() + Duration::from_secs(2);
        match self.digests.lookup(pid, &known, &expected, until) {
            Ok(digest::Lookup::Digest(d)) if trust.is_trusted(&d) => {}
            Ok(digest::Lookup::Digest(d)) => return Err(NoOwner::Untrusted(format!("holder {pid} sha256 {} is not trusted", &d[..12]))),
            other => return Err(NoOwner::Untrusted(format!("holder {pid}: digest {other:?}"))),
        }
        let rollout =
            find_rollout(self.codex_home, thread.as_str()).ok_or_else(|| NoOwner::NotProven("no rollout under sessions/".into()))?;
        let file = os::open_nofollow(&rollout).map_err(|e| NoOwner::NotProven(format!("open rollout: {e}")))?;
        let id = os::statx_fd(&file).map_err(|e| NoOwner::NotProven(format!("statx rollout: {e}")))?;
        let scan = holder::scan(pid, (id.dev, id.ino), Some((lock.dev(), lock.ino())), thread.as_str(), &lock_dir, holder::ScanFor::Proof)
            .map_err(|_| NoOwner::NotLoaded)?;
        if !scan.holds_rollout_append || !scan.holds_thread_lock {
            return Err(NoOwner::NotProven(format!(
                "holder {pid} does not hold the rollout for append and the lock through its own fds ({scan:?})"
            )));
        }
        let len = file.metadata().map(|m| m.len()).map_err(|e| NoOwner::NotProven(format!("rollout: {e}")))?;
        let identity = RolloutIdentity { dev: id.dev, ino: id.ino, btime_sec: id.btime_sec, btime_nsec: id.btime_nsec };
        let snap = self.tracker.update(&rollout, &file, identity, len).map_err(|e| NoOwner::NotProven(format!("rollout read: {e}")))?;
        if snap.session_meta.as_ref().map(|m| m.id.as_str()) != Some(thread.as_str()) {
            return Err(NoOwner::NotProven("the rollout's session_meta is not this thread".into()));
        }
        match os::read_stat(pid) {
            Ok(again) if again.starttime == stat.starttime => {}
            _ => return Err(NoOwner::NotProven(format!("holder {pid} changed while checked"))),
        }
        let subagent = snap.session_meta.as_ref().is_some_and(|m| m.parent_thread_id.is_some());
        Ok(Owner { pid, starttime: stat.starttime, rollout, rollout_len: snap.offset, open_turn: snap.open_turn, subagent })
    }
}
