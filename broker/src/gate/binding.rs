//! Step 5: thread binding. `transcript_path` (SubagentStop: `agent_transcript_path`) is canonical,
//! under `$CODEX_HOME/sessions/`, and names the thread UUID; once the rollout is read (step 6),
//! its `session_meta` id is that UUID, codex holds it open for append and holds
//! `thread-writer-locks/<thread>.lock`, both through fds it opened itself (`holder.rs`), and the
//! payload's `agent_id` and `session_id` agree.

use super::ancestry::Member;
use super::holder::{self, ScanFor};
use super::{Gate, Refusal, RefusalCode};
use crate::codex::rollout::{SessionMeta, Snapshot};
use crate::os;
use codex_format::hook::{HookEvent, HookPayload};
use codex_format::rollout::thread_id_from_path;
use courier_shared::ids::ThreadId;
use std::path::{Path, PathBuf};

/// The transcript path the event names, and the thread UUID of its file name.
pub(super) fn transcript(event: HookEvent, payload: &HookPayload) -> Result<(&str, ThreadId), Refusal> {
    let path_str =
        event.transcript_path(payload).ok_or_else(|| Refusal::new(RefusalCode::TranscriptPath, "no transcript path in payload"))?;
    let thread_id = thread_id_from_path(path_str)
        .and_then(|id| ThreadId::parse(id).ok())
        .ok_or_else(|| Refusal::new(RefusalCode::TranscriptPath, format!("{path_str:?} is not rollout-*-<uuid>.jsonl")))?;
    Ok((path_str, thread_id))
}

/// The transcript path is absolute, canonical and inside `$CODEX_HOME/sessions/` (symlinks on
/// the way are refused when the file is opened, step 6).
pub(super) fn check_path<'a>(codex_home: &Path, path_str: &'a str) -> Result<&'a Path, Refusal> {
    let path = Path::new(path_str);
    if !path.is_absolute() {
        return Err(Refusal::new(RefusalCode::TranscriptPath, format!("{path_str:?} is not absolute")));
    }
    // Lexically normal (no `.`, `..`, repeated or trailing `/`), under the sessions directory,
    // and (at open) no symlink anywhere on the way: the path is canonical.
    let normal: PathBuf = path.components().collect();
    if normal.as_os_str() != path.as_os_str() || path.components().any(|c| c == std::path::Component::ParentDir) {
        return Err(Refusal::new(RefusalCode::TranscriptPath, format!("{path_str:?} is not canonical")));
    }
    let sessions = std::fs::canonicalize(codex_home.join("sessions"))
        .map_err(|e| Refusal::new(RefusalCode::TranscriptPath, format!("$CODEX_HOME/sessions: {e}")))?;
    if !path.starts_with(&sessions) || path == sessions {
        return Err(Refusal::new(RefusalCode::TranscriptPath, format!("{path_str:?} is outside {:?}", sessions)));
    }
    Ok(path)
}

/// What the binding found: the rollout's `session_meta`.
pub(super) struct Binding {
    pub(super) meta: SessionMeta,
}

impl Gate {
    /// `$CODEX_HOME/thread-writer-locks`, canonical (fd targets are): read only when scanning.
    pub(super) fn lock_dir_canon(&self) -> PathBuf {
        let dir = self.config.codex_home.join("thread-writer-locks");
        std::fs::canonicalize(&dir).unwrap_or(dir)
    }

    /// The rollout read in step 6 names the thread, and codex holds it and the thread's lock.
    /// `rollout_file`: (device, inode) of the opened rollout.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn bind_thread(
        &self,
        codex: &Member,
        payload: &HookPayload,
        path_str: &str,
        thread_id: &str,
        snap: &Snapshot,
        rollout_file: (u64, u64),
    ) -> Result<Binding, Refusal> {
        let meta = snap
            .session_meta
            .clone()
            .ok_or_else(|| Refusal::new(RefusalCode::ThreadMismatch, format!("{path_str:?} does not start with a session_meta")))?;
        if meta.id != thread_id {
            return Err(Refusal::new(
                RefusalCode::ThreadMismatch,
                format!("session_meta id {} is not file name thread {thread_id}", meta.id),
            ));
        }
        let lock_dir = self.config.codex_home.join("thread-writer-locks");
        let lock_path = lock_dir.join(format!("{thread_id}.lock"));
        // The file at the lock path now, if any. None is not yet a refusal: the real holder keeps
        // its claim when someone removed or replaced the path under it (holder.rs, "Which lock file").
        let lock_file = os::statx_path_nofollow(&lock_path).ok().filter(|id| os::is_regular(id.mode)).map(|id| (id.dev, id.ino));
        // The fds that held the rollout and the lock last time are re-checked first; a scan (newest
        // fd first, stopping at the proof) only when those moved. How many threads codex runs is
        // counted later, and only when a SessionStart has something to deliver (`Verified::sole_thread`).
        let hinted = lock_file.is_some_and(|lock| holder::hinted_holds(&self.fd_hints, codex.pid, codex.starttime, rollout_file, lock));
        if !hinted {
            let scan =
                holder::scan(codex.pid, rollout_file, lock_file, thread_id, &self.lock_dir_canon(), ScanFor::Proof).map_err(|e| {
                    if os::is_gone(&e) {
                        Refusal::new(RefusalCode::AncestryChanged, format!("codex {} fds: {e}", codex.pid))
                    } else {
                        Refusal::new(RefusalCode::NotRolloutHolder, format!("codex {} fds: {e}", codex.pid))
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
                return Err(Refusal::new(RefusalCode::NotRolloutHolder, format!("codex {} has {path_str:?} {how}", codex.pid)));
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
                    RefusalCode::NoWriterLock,
                    format!("codex {} holds no FLOCK WRITE lock on {} {how}", codex.pid, lock_path.display()),
                ));
            }
            if let Some(lock) = lock_file {
                self.fd_hints.learn(codex.pid, codex.starttime, rollout_file, lock, &scan);
            }
        }
        if let Some(agent) = payload.agent_id.as_deref() {
            if agent != thread_id {
                return Err(Refusal::new(RefusalCode::AgentMismatch, format!("agent_id {agent} is not thread {thread_id}")));
            }
        }
        match payload.session_id.as_deref() {
            Some(s) if s == thread_id || Some(s) == meta.session_id.as_deref() => {}
            other => {
                return Err(Refusal::new(
                    RefusalCode::SessionMismatch,
                    format!("session_id {other:?} is neither thread {thread_id} nor its root {:?}", meta.session_id),
                ))
            }
        }
        Ok(Binding { meta })
    }
}
