//! Gate step 6, rollout identity. The transcript is opened with no symlink on the way (and kept
//! open for the thread's next hooks), read incrementally (`crate::codex::rollout::RolloutTracker`),
//! and after the read the path still names that file (device, inode, birth time) and the file's
//! own path is still the transcript path: a file replaced or moved during the read is refused,
//! and a replaced file is re-read from its start, never trusted from the cache.

use super::{binding, Prover, RolloutRead, Transcript};
use crate::codex::rollout::RolloutIdentity;
use crate::os::{self, FileId};
use crate::refusal::{Refusal, RefusalCode};
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Rollouts kept open between hook calls: a thread's hooks read the same file again and again,
/// and opening it (a walk of its long path) and closing it were a tenth of an idle hook's work.
/// A kept file is read only while its path still names it (checked after every read, as a new
/// one is); [`Prover::prune_kept`] lets go of files whose path names another file, or none.
#[derive(Default)]
pub(super) struct KeptRollouts(Mutex<HashMap<PathBuf, Arc<Kept>>>);

pub(super) struct Kept {
    file: File,
    /// Its identity when opened (device, inode and birth time never change while it is open).
    id: FileId,
}

/// Rollouts kept open at most (all let go of when full: a reopen costs one call).
const MAX_KEPT: usize = 64;

impl KeptRollouts {
    fn get(&self, path: &Path) -> Option<Arc<Kept>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).get(path).cloned()
    }

    fn keep(&self, path: &Path, kept: &Arc<Kept>) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_KEPT && !map.contains_key(path) {
            map.clear();
        }
        map.insert(path.to_path_buf(), Arc::clone(kept));
    }

    fn forget(&self, path: &Path, kept: &Arc<Kept>) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if map.get(path).is_some_and(|k| Arc::ptr_eq(k, kept)) {
            map.remove(path);
        }
    }
}

impl Prover {
    /// Reads the rollout at a canonical transcript path incrementally, its identity unchanged
    /// around the read.
    pub fn read_rollout(&self, transcript: &Transcript) -> Result<RolloutRead, Refusal> {
        let path = binding::check_path(&self.codex_home, &self.sessions_dir, transcript.text)?;
        if let Some(kept) = self.kept.get(path) {
            match self.read_from(path, transcript.text, &kept) {
                Ok(read) => return Ok(read),
                // The path names another file now (or none): read it as a first sight.
                Err(_) => self.kept.forget(path, &kept),
            }
        }
        let kept = Arc::new(open(path, transcript.text)?);
        let read = self.read_from(path, transcript.text, &kept)?;
        self.kept.keep(path, &kept);
        Ok(read)
    }

    /// Lets go of kept rollouts whose path no longer names them (deleted, replaced): their
    /// space is freed. The maintenance pass calls it.
    pub fn prune_kept(&self) {
        let kept: Vec<(PathBuf, Arc<Kept>)> =
            self.kept.0.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(p, k)| (p.clone(), Arc::clone(k))).collect();
        for (path, k) in kept {
            if !os::statx_path_nofollow(&path).is_ok_and(|now| now.same_file(&k.id)) {
                self.kept.forget(&path, &k);
            }
        }
    }

    /// Reads `kept`, the file opened at `path`, incrementally; then checks `path` still names
    /// it and it is still at `path`. The content read is that file's whatever happened to the
    /// path meanwhile, so the one look after the read is what ties it to the path.
    fn read_from(&self, path: &Path, path_str: &str, kept: &Kept) -> Result<RolloutRead, Refusal> {
        let file = &kept.file;
        let now = os::statx_fd(file).map_err(|e| Refusal::new(RefusalCode::RolloutChanged, format!("statx: {e}")))?;
        let id = &kept.id;
        let identity = RolloutIdentity { dev: id.dev, ino: id.ino, btime_sec: id.btime_sec, btime_nsec: id.btime_nsec };
        let snap = self
            .tracker
            .update(path, file, identity, now.size)
            .map_err(|e| Refusal::new(RefusalCode::RolloutChanged, format!("reading {path_str:?}: {e}")))?;
        #[cfg(test)]
        if let Some(hook) = self.after_read.lock().unwrap().as_ref() {
            hook()
        }
        let changed = |why: String| Refusal::new(RefusalCode::RolloutChanged, format!("after read: {why}"));
        let at_path = os::statx_path_nofollow(path).map_err(|e| changed(format!("{path_str:?}: {e}")))?;
        if !at_path.same_file(id) {
            return Err(changed(format!("{path_str:?} is no longer the file that was opened")));
        }
        // Also proves the path canonical: the opened file's own path (/proc/self/fd) is it.
        let fd_path = os::fd::own_fd_target(file.as_raw_fd()).map_err(|e| changed(format!("fd path: {e}")))?;
        if fd_path != path {
            return Err(changed(format!("opened file now resolves to {fd_path:?}")));
        }
        Ok(RolloutRead { snapshot: snap, file: FileId { size: now.size, ..*id } })
    }
}

/// Opens the rollout at `path` with no symlink on the way, a regular file.
fn open(path: &Path, path_str: &str) -> Result<Kept, Refusal> {
    let file = match os::open_no_symlinks(path) {
        Ok(Some(file)) => file,
        Err(e) if os::errno(&e) == nix::libc::ELOOP => {
            return Err(Refusal::new(RefusalCode::TranscriptPath, format!("{path_str:?} is not canonical (a symlink on the way)")))
        }
        Err(e) => return Err(Refusal::new(RefusalCode::TranscriptPath, format!("open {path_str:?}: {e}"))),
        Ok(None) => {
            // No openat2: resolve the path instead.
            let canonical =
                std::fs::canonicalize(path).map_err(|e| Refusal::new(RefusalCode::TranscriptPath, format!("{path_str:?}: {e}")))?;
            if canonical != path {
                return Err(Refusal::new(
                    RefusalCode::TranscriptPath,
                    format!("{path_str:?} is not canonical (resolves to {:?})", canonical),
                ));
            }
            os::open_nofollow(path).map_err(|e| Refusal::new(RefusalCode::TranscriptPath, format!("open {path_str:?}: {e}")))?
        }
    };
    let id = os::statx_fd(&file).map_err(|e| Refusal::new(RefusalCode::RolloutChanged, format!("statx: {e}")))?;
    if !os::is_regular(id.mode) {
        return Err(Refusal::new(RefusalCode::TranscriptPath, format!("{path_str:?} is not a regular file")));
    }
    Ok(Kept { file, id })
}
