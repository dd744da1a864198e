//! Gate step 5, thread binding. `transcript_path` (SubagentStop: `agent_transcript_path`) is
//! canonical, under `$CODEX_HOME/sessions/`, and names the thread UUID; once the rollout is read
//! (step 6), its `session_meta` id is that UUID, codex holds it open for append and holds
//! `thread-writer-locks/<thread>.lock`, both through fds it opened itself (`holder.rs`), and the
//! payload's `agent_id` and `session_id` agree.

use super::holder::{self, HolderScan, ScanFor};
use super::{Binding, Prover, RolloutRead, Transcript};
use crate::os;
use crate::refusal::{Refusal, RefusalCode};
use codex_format::hook::{HookEvent, HookPayload};
use codex_format::rollout::thread_id_from_path;
use courier_shared::ids::ThreadId;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// `$CODEX_HOME/sessions` as last resolved: its canonical path and the directory's identity.
/// Resolving it (`realpath`: a `readlink` per component) on every hook call cost more than the
/// rest of the path check; two `statx` now tell whether the answer still holds.
#[derive(Default)]
pub(super) struct SessionsDir(Mutex<Option<(PathBuf, os::FileId)>>);

impl SessionsDir {
    /// The canonical path of `$CODEX_HOME/sessions`. The cached one while the directory
    /// `$CODEX_HOME/sessions` leads to and the one at the cached path (no symlink followed at its
    /// end) are both still the directory it was resolved as; a symlink anywhere else on the
    /// cached path refuses the rollout when it is opened (step 6), as for any other. Resolved
    /// again otherwise.
    fn canonical(&self, codex_home: &Path) -> std::io::Result<PathBuf> {
        let given = codex_home.join("sessions");
        let now = os::statx_path(&given)?;
        let mut cached = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((path, id)) = cached.as_ref() {
            if id.same_file(&now) && os::statx_path_nofollow(path).is_ok_and(|at| at.same_file(id)) {
                return Ok(path.clone());
            }
        }
        let path = std::fs::canonicalize(&given)?;
        // Filed under the identity read before the resolution: if the directory changed in
        // between, the next call finds the identities differ and resolves again.
        *cached = Some((path.clone(), now));
        Ok(path)
    }
}

/// The transcript path is absolute, canonical and inside `$CODEX_HOME/sessions/` (symlinks on
/// the way are refused when the file is opened, step 6).
pub(super) fn check_path<'a>(codex_home: &Path, sessions_dir: &SessionsDir, path_str: &'a str) -> Result<&'a Path, Refusal> {
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
    let sessions =
        sessions_dir.canonical(codex_home).map_err(|e| Refusal::new(RefusalCode::TranscriptPath, format!("$CODEX_HOME/sessions: {e}")))?;
    if !path.starts_with(&sessions) || path == sessions {
        return Err(Refusal::new(RefusalCode::TranscriptPath, format!("{path_str:?} is outside {:?}", sessions)));
    }
    Ok(path)
}

impl Prover {
    /// The transcript path `event` names in `payload`, and the thread UUID of its file name.
    pub fn transcript<'p>(&self, event: HookEvent, payload: &'p HookPayload) -> Result<Transcript<'p>, Refusal> {
        let text =
            event.transcript_path(payload).ok_or_else(|| Refusal::new(RefusalCode::TranscriptPath, "no transcript path in payload"))?;
        let thread_id = thread_id_from_path(text)
            .and_then(|id| ThreadId::parse(id).ok())
            .ok_or_else(|| Refusal::new(RefusalCode::TranscriptPath, format!("{text:?} is not rollout-*-<uuid>.jsonl")))?;
        Ok(Transcript { text, thread_id })
    }

    /// The rollout read names the thread, `codex` holds it and the thread's writer lock, and the
    /// payload's `agent_id` and `session_id` agree.
    pub fn bind_thread(
        &self,
        codex: os::ProcessKey,
        payload: &HookPayload,
        transcript: &Transcript,
        read: &RolloutRead,
    ) -> Result<Binding, Refusal> {
        let (path_str, thread_id) = (transcript.text, transcript.thread_id.as_str());
        let meta = read
            .snapshot
            .session_meta
            .clone()
            .ok_or_else(|| Refusal::new(RefusalCode::ThreadMismatch, format!("{path_str:?} does not start with a session_meta")))?;
        if meta.id != thread_id {
            return Err(Refusal::new(
                RefusalCode::ThreadMismatch,
                format!("session_meta id {} is not file name thread {thread_id}", meta.id),
            ));
        }
        self.check_holder(codex, transcript, (read.file.dev, read.file.ino))?;
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

    /// Codex holds the rollout (`rollout_file`: its device and inode) for append and the
    /// thread's writer lock, through fds it opened itself.
    fn check_holder(&self, codex: os::ProcessKey, transcript: &Transcript, rollout_file: (u64, u64)) -> Result<(), Refusal> {
        let lock_path = self.writer_lock_dir().join(format!("{}.lock", transcript.thread_id));
        // The file at the lock path now, if any. None is not yet a refusal: the real holder keeps
        // its claim when someone removed or replaced the path under it (holder.rs, "Which lock file").
        let lock_file = os::statx_path_nofollow(&lock_path).ok().filter(|id| os::is_regular(id.mode)).map(|id| (id.dev, id.ino));
        // The fds that held the rollout and the lock last time are re-checked first; a scan (newest
        // fd first, stopping at the proof) only when those moved. How many threads codex runs is
        // counted later, and only when a SessionStart has something to deliver (`sole_thread`).
        if lock_file.is_some_and(|lock| holder::hinted_holds(&self.fd_hints, codex.pid, codex.starttime, rollout_file, lock)) {
            return Ok(());
        }
        let lock_dir = self.writer_lock_dir();
        let lock_dir = std::fs::canonicalize(&lock_dir).unwrap_or(lock_dir); // fd targets are canonical
        let scan =
            holder::scan(codex.pid, rollout_file, lock_file, transcript.thread_id.as_str(), &lock_dir, ScanFor::Proof).map_err(|e| {
                if os::is_gone(&e) {
                    Refusal::new(RefusalCode::AncestryChanged, format!("codex {} fds: {e}", codex.pid))
                } else {
                    Refusal::new(RefusalCode::NotRolloutHolder, format!("codex {} fds: {e}", codex.pid))
                }
            })?;
        refuse_unheld(&scan, codex.pid, transcript.text, &lock_path, lock_file.is_some())?;
        if let Some(lock) = lock_file {
            self.fd_hints.learn(codex.pid, codex.starttime, rollout_file, lock, &scan);
        }
        Ok(())
    }
}

/// The refusal a scan that found no proof gets: what codex has of the rollout, then of the lock.
fn refuse_unheld(scan: &HolderScan, pid: i32, path_str: &str, lock_path: &Path, lock_file_there: bool) -> Result<(), Refusal> {
    if !scan.holds_rollout_append {
        let how = if scan.rollout_inherited {
            "open for append only through an fd inherited across exec (no O_CLOEXEC): codex did not open it"
        } else if scan.holds_rollout_other {
            "open, but not writable with O_APPEND"
        } else {
            "not open"
        };
        return Err(Refusal::new(RefusalCode::NotRolloutHolder, format!("codex {pid} has {path_str:?} {how}")));
    }
    if !scan.holds_thread_lock {
        let how = if scan.thread_lock_inherited {
            "only through an fd inherited across exec (no O_CLOEXEC): codex did not lock it"
        } else if !lock_file_there {
            "(no lock file there, and none unlinked from there is held)"
        } else {
            "(nor on an unlinked file that was there)"
        };
        return Err(Refusal::new(
            RefusalCode::NoWriterLock,
            format!("codex {pid} holds no FLOCK WRITE lock on {} {how}", lock_path.display()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::SessionsDir;
    use std::os::unix::fs::symlink;

    /// The cached sessions path is the one `realpath` gives now, whatever was moved: the link
    /// repointed, the directory moved away and another made at its old path.
    #[test]
    fn the_sessions_directory_is_resolved_again_when_what_it_names_moved() {
        let root = courier_shared::scratch::dir("courier-sessions");
        let (home, real, other) = (root.join("home"), root.join("real"), root.join("other"));
        for d in [&home, &real, &other] {
            std::fs::create_dir_all(d).unwrap();
        }
        let root = std::fs::canonicalize(&root).unwrap();
        let dir = SessionsDir::default();
        symlink(&real, home.join("sessions")).unwrap();
        assert_eq!(dir.canonical(&home).unwrap(), root.join("real"));
        assert_eq!(dir.canonical(&home).unwrap(), root.join("real"), "cached");
        // The link now names another directory.
        std::fs::remove_file(home.join("sessions")).unwrap();
        symlink(&other, home.join("sessions")).unwrap();
        assert_eq!(dir.canonical(&home).unwrap(), root.join("other"));
        // The directory moved, the link follows it, and a new directory sits at its old path:
        // the link's target is the cached identity, but the cached path is no longer it.
        std::fs::rename(&other, root.join("moved")).unwrap();
        std::fs::create_dir(&other).unwrap();
        std::fs::remove_file(home.join("sessions")).unwrap();
        symlink(root.join("moved"), home.join("sessions")).unwrap();
        assert_eq!(dir.canonical(&home).unwrap(), root.join("moved"));
        // A plain directory in the link's place.
        std::fs::remove_file(home.join("sessions")).unwrap();
        std::fs::create_dir(home.join("sessions")).unwrap();
        assert_eq!(dir.canonical(&home).unwrap(), root.join("home/sessions"));
        let _ = std::fs::remove_dir_all(root);
    }
}
