//! Copilot CLI sessions as the sending side sees them: `<Copilot home>/session-state/<id>/`
//! (`$COPILOT_HOME`, else `~/.copilot`), live while a copilot process holds the exclusive flock
//! of an `inuse.<pid>.hold` there (read from the lock table, never taken: a probe must not race
//! a copilot taking its own lock). Only a hint for `broker send` and `broker threads`: delivery
//! rests on the gate's proof, never on this.

use crate::os::locks::FlockWrite;
use crate::os::FileKey;
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

/// One session of the user's Copilot home.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub id: String,
    pub status: Status,
    /// The pid holding its lock, while live.
    pub holder: Option<i32>,
    /// Its session record.
    pub events: PathBuf,
}

/// The status of session `id` in this user's Copilot home; `None` when it has none.
pub fn status(id: &str) -> Option<Status> {
    session(id, &crate::os::locks::flock_writes().unwrap_or_default()).map(|s| s.status)
}

fn session(id: &str, locks: &[FlockWrite]) -> Option<Session> {
    let dir = copilot_home()?.join("session-state").join(id);
    if !dir.is_dir() {
        return None;
    }
    let holder = std::fs::read_dir(&dir).into_iter().flatten().flatten().find_map(|e| {
        let name = e.file_name();
        let is_hold = name.to_str().is_some_and(|n| n.starts_with("inuse.") && n.ends_with(".hold"));
        if !is_hold {
            return None;
        }
        e.metadata().ok().and_then(|m| flock_holder(locks, FileKey { dev: m.dev(), ino: m.ino() }))
    });
    let status = if holder.is_some() { Status::Live } else { Status::Ended };
    Some(Session { id: id.to_string(), status, holder, events: dir.join("events.jsonl") })
}

/// The pid holding an exclusive flock on `file`.
fn flock_holder(locks: &[FlockWrite], file: FileKey) -> Option<i32> {
    locks.iter().find(|l| l.file == file).map(|l| l.pid)
}

/// Every session in this user's Copilot home, by id.
pub fn all() -> Vec<Session> {
    let Some(home) = copilot_home() else { return Vec::new() };
    let Ok(dir) = std::fs::read_dir(home.join("session-state")) else { return Vec::new() };
    let locks = crate::os::locks::flock_writes().unwrap_or_default();
    let mut out: Vec<Session> = dir
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| courier_shared::ids::ThreadId::parse(n).is_ok())
        .filter_map(|n| session(&n, &locks))
        .collect();
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_is_the_pid_locking_that_very_file() {
        let locks = crate::os::locks::parse_flock_writes(
            "1: FLOCK  ADVISORY  WRITE 2152 fe:00:5491583 0 EOF\n2: FLOCK  ADVISORY  READ 2153 fe:00:77 0 EOF\n",
        );
        let key = |ino| FileKey { dev: nix::libc::makedev(0xfe, 0), ino };
        assert_eq!(flock_holder(&locks, key(5491583)), Some(2152));
        assert_eq!(flock_holder(&locks, key(77)), None, "a shared lock");
        assert_eq!(flock_holder(&locks, FileKey { dev: 1, ino: 5491583 }), None, "another device");
    }
}
