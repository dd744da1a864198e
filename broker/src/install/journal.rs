//! The install journal: every change one `broker install` run makes, recorded as it is made
//! (files with their bytes before, binaries with a backup, directories, units, broker starts and
//! stops), so that a failed step can undo the run (`undo.rs`).

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// One change an install run made. When a step fails, the changes are undone newest first
/// (a broker the run stopped is started again at the very end, from the restored binaries).
#[derive(Debug)]
pub(super) enum Change {
    /// A file written or removed: its bytes and mode before (`None`: it did not exist).
    File { path: PathBuf, before: Option<(Vec<u8>, u32)> },
    /// A binary put in place: the previous one, kept as a hard link at `backup` (`None`: none).
    Binary { path: PathBuf, backup: Option<PathBuf> },
    /// A directory created.
    Dir(PathBuf),
    /// `systemctl --user enable --now` of units this run wrote first.
    Enabled,
    /// `systemctl --user disable --now` of the units of an earlier install.
    Disabled,
    /// A broker this run started (its executable).
    Started(PathBuf),
    /// A broker this run stopped: started again with `exe serve --daemonize`.
    Stopped { exe: PathBuf, codex_home: PathBuf },
}

thread_local! {
    /// The running install's changes; `None` outside `install` (uninstall is not journaled).
    static JOURNAL: std::cell::RefCell<Option<Vec<Change>>> = const { std::cell::RefCell::new(None) };
}

/// Starts journaling this thread's changes (one install run).
pub(super) fn begin_journal() {
    JOURNAL.with(|j| *j.borrow_mut() = Some(Vec::new()));
}

/// Ends the run's journal: the changes it made, oldest first.
pub(super) fn end_journal() -> Vec<Change> {
    JOURNAL.with(|j| j.borrow_mut().take()).unwrap_or_default()
}

pub(super) fn journal(change: Change) {
    JOURNAL.with(|j| {
        if let Some(v) = j.borrow_mut().as_mut() {
            v.push(change);
        }
    });
}

/// Journals `path`'s bytes before this run first changes it.
pub(super) fn journal_file(path: &Path) {
    JOURNAL.with(|j| {
        if let Some(v) = j.borrow_mut().as_mut() {
            if !v.iter().any(|c| matches!(c, Change::File { path: p, .. } if p == path)) {
                let before = fs::read(path).ok().zip(fs::metadata(path).ok().map(|m| m.mode() & 0o7777));
                v.push(Change::File { path: path.to_path_buf(), before });
            }
        }
    });
}
