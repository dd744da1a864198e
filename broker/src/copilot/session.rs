//! Copilot CLI sessions as the sending side sees them: `<Copilot home>/session-state/<id>/`
//! (`$COPILOT_HOME`, else `~/.copilot`), live while a copilot process holds the exclusive flock
//! of an `inuse.<pid>.hold` there (read from `/proc/locks`, never taken: a probe must not race
//! a copilot taking its own lock). Only a hint for `broker send` and `broker threads`: delivery
//! rests on the gate's proof, never on this.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// Where Copilot keeps its state for this user.
pub fn copilot_home() -> Option<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    env("COPILOT_HOME").or_else(|| env("HOME").map(|h| h.join(".copilot")))
}

/// Whether a Copilot session is there, and live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Live,
    Ended,
}

/// The status of session `id` in this user's Copilot home; `None` when it has none.
pub fn status(id: &str) -> Option<Status> {
    let dir = copilot_home()?.join("session-state").join(id);
    if !dir.is_dir() {
        return None;
    }
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    let live = std::fs::read_dir(&dir).into_iter().flatten().flatten().any(|e| {
        let name = e.file_name();
        let is_hold = name.to_str().is_some_and(|n| n.starts_with("inuse.") && n.ends_with(".hold"));
        is_hold && e.metadata().is_ok_and(|m| flock_held(&locks, m.ino()))
    });
    Some(if live { Status::Live } else { Status::Ended })
}

/// `/proc/locks` has an exclusive flock on inode `ino` (`N: FLOCK ADVISORY WRITE pid maj:min:ino ...`).
fn flock_held(locks: &str, ino: u64) -> bool {
    locks.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 5 && f[1] == "FLOCK" && f[3] == "WRITE" && f[5].rsplit(':').next().and_then(|i| i.parse::<u64>().ok()) == Some(ino)
    })
}

/// Every session in this user's Copilot home, with its status.
pub fn all() -> Vec<(String, Status)> {
    let Some(home) = copilot_home() else { return Vec::new() };
    let Ok(dir) = std::fs::read_dir(home.join("session-state")) else { return Vec::new() };
    let mut out: Vec<(String, Status)> = dir
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| courier_shared::ids::ThreadId::parse(n).is_ok())
        .filter_map(|n| status(&n).map(|s| (n, s)))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exclusive_flock_on_the_inode_is_found() {
        let locks = "1: FLOCK  ADVISORY  WRITE 2152 fe:00:5491583 0 EOF\n2: FLOCK  ADVISORY  READ 2153 fe:00:77 0 EOF\n3: POSIX  ADVISORY  WRITE 9 fe:00:88 0 EOF\n";
        assert!(flock_held(locks, 5491583));
        assert!(!flock_held(locks, 77), "a shared lock");
        assert!(!flock_held(locks, 88), "a POSIX lock");
        assert!(!flock_held(locks, 549158));
    }
}
