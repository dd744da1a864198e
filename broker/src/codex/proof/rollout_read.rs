//! Gate step 6, rollout identity. The transcript is opened with no symlink on the way, and its
//! identity (device, inode, birth time) and canonical path are the same before and after the
//! incremental read (`crate::codex::rollout::RolloutTracker`): a file replaced or moved during the read
//! is refused, and a replaced file is re-read from its start, never trusted from the cache.

use super::{binding, Prover, RolloutRead, Transcript};
use crate::codex::rollout::RolloutIdentity;
use crate::os;
use crate::refusal::{Refusal, RefusalCode};
use std::os::fd::AsRawFd;
use std::path::Path;

impl Prover {
    /// Reads the rollout at a canonical transcript path incrementally, its identity unchanged
    /// around the read.
    pub fn read_rollout(&self, transcript: &Transcript) -> Result<RolloutRead, Refusal> {
        let path = binding::check_path(&self.codex_home, &self.sessions_dir, transcript.text)?;
        self.read(path, transcript.text)
    }

    /// Reads the rollout at `path` incrementally; returns what is known of it and its identity.
    fn read(&self, path: &Path, path_str: &str) -> Result<RolloutRead, Refusal> {
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
        let before = os::statx_fd(&file).map_err(|e| Refusal::new(RefusalCode::RolloutChanged, format!("statx: {e}")))?;
        if !os::is_regular(before.mode) {
            return Err(Refusal::new(RefusalCode::TranscriptPath, format!("{path_str:?} is not a regular file")));
        }
        let identity = |id: &os::FileId| RolloutIdentity { dev: id.dev, ino: id.ino, btime_sec: id.btime_sec, btime_nsec: id.btime_nsec };
        let check_identity = |when: &str| -> Result<(), Refusal> {
            let changed = |why: String| Refusal::new(RefusalCode::RolloutChanged, format!("{when}: {why}"));
            let at_path = os::statx_path_nofollow(path).map_err(|e| changed(format!("{path_str:?}: {e}")))?;
            if !at_path.same_file(&before) {
                return Err(changed(format!("{path_str:?} is no longer the file that was opened")));
            }
            let fd_path =
                std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).map_err(|e| changed(format!("fd path: {e}")))?;
            if fd_path != path {
                return Err(changed(format!("opened file now resolves to {fd_path:?}")));
            }
            // The fd's own identity needs no second look: an open file keeps its inode (device,
            // inode and birth time) for as long as it is open.
            Ok(())
        };
        check_identity("before read")?;
        let snap = self
            .tracker
            .update(path, &file, identity(&before), before.size)
            .map_err(|e| Refusal::new(RefusalCode::RolloutChanged, format!("reading {path_str:?}: {e}")))?;
        #[cfg(test)]
        if let Some(hook) = self.after_read.lock().unwrap().as_ref() {
            hook()
        }
        // Also proves the path still canonical: the opened file's own path (/proc/self/fd) is it.
        check_identity("after read")?;
        Ok(RolloutRead { snapshot: snap, file: before })
    }
}
