//! The Codex threads of `broker threads`: the threads a trusted codex process holds (live) and,
//! with `--all`, the ended ones from the rollout files (the module docs of `mod.rs` say how); and
//! for `broker send`, whether a thread's rollout exists (or is about to).

use super::facts::{find_title, first_line};
use super::{Host, ProcessInfo, ProcessKind, SessionInfo, ThreadInfo, ThreadState};
use crate::codex::proof::holder;
use crate::codex::rollout::{find_rollout, uuid_v7_ms, RolloutIdentity, RolloutTracker};
use crate::exe::digest::{DigestCache, Lookup};
use crate::exe::ExeKey;
use crate::os;
use crate::store::Store;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// An id minted this recently may name a thread whose rollout is about to appear.
pub const NEW_THREAD_GRACE_MS: i64 = 30_000;
/// How long `send` waits for such a rollout.
pub const NEW_THREAD_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// What a rollout says, cached per file identity (titles and `session_meta` never change).
#[derive(Clone)]
struct RolloutFacts {
    info: SessionInfo,
    title: Option<String>,
    title_done: bool,
    meta_end: u64,
}

/// Reads threads from `/proc` and rollouts. One per broker (its caches live across calls); the
/// CLI makes one per command.
pub struct Lister {
    pub codex_home: PathBuf,
    tracker: RolloutTracker,
    digests: DigestCache,
    facts: Mutex<HashMap<(u64, u64), RolloutFacts>>,
    /// Whether a codex executable not hashed yet may be hashed while the caller waits (the
    /// broker: only binaries it expects to be Codex; the CLI: any, it is the caller's time).
    expected: Box<crate::exe::digest::SharedExpected>,
    digest_wait: Duration,
}

impl Lister {
    pub fn new(
        codex_home: PathBuf,
        digests: DigestCache,
        expected: Box<crate::exe::digest::SharedExpected>,
        digest_wait: Duration,
    ) -> Lister {
        Lister { codex_home, tracker: RolloutTracker::new(), digests, facts: Mutex::new(HashMap::new()), expected, digest_wait }
    }

    /// A lister for a one-shot CLI command: its own digest cache, any codex hashed if need be.
    pub fn for_cli(codex_home: PathBuf) -> Lister {
        Lister::new(codex_home, DigestCache::default(), Box::new(|_, _| true), Duration::from_secs(10))
    }

    fn sessions(&self) -> PathBuf {
        let s = self.codex_home.join("sessions");
        std::fs::canonicalize(&s).unwrap_or(s)
    }

    fn lock_dir(&self) -> PathBuf {
        let d = self.codex_home.join("thread-writer-locks");
        std::fs::canonicalize(&d).unwrap_or(d)
    }

    /// Is `pid` a trusted Codex binary (by SHA-256, as the gate decides)?
    fn trusted(&self, store: &Store, pid: i32) -> bool {
        let known = |k: &ExeKey| store.codex_file_digest(k).ok().flatten();
        match self.digests.lookup(pid, &known, &*self.expected, Instant::now() + self.digest_wait) {
            Ok(Lookup::Digest(d)) => store.is_trusted_codex(&d).unwrap_or(false),
            _ => false,
        }
    }

    /// The live threads: held by a trusted codex process of this uid.
    pub fn live(&self, store: &Store) -> Vec<ThreadInfo> {
        let uid = courier_shared::paths::uid();
        let lock_dir = self.lock_dir();
        let sessions = self.sessions();
        // (dev, ino) of every lock file there now.
        let mut lock_files: HashSet<(u64, u64)> = HashSet::new();
        if let Ok(dir) = std::fs::read_dir(&lock_dir) {
            for e in dir.flatten() {
                if let Ok(m) = std::fs::symlink_metadata(e.path()) {
                    if m.is_file() {
                        lock_files.insert((m.dev(), m.ino()));
                    }
                }
            }
        }
        let mut pids: Vec<i32> = os::locks::flock_writes()
            .unwrap_or_default()
            .into_iter()
            .filter(|l| lock_files.contains(&(l.file.dev, l.file.ino)))
            .map(|l| l.pid)
            .collect();
        pids.sort_unstable();
        pids.dedup();
        let mut out = Vec::new();
        for pid in pids {
            let Ok(stat) = os::read_stat(pid) else { continue };
            if !os::read_status(pid).is_ok_and(|s| s.all_uids_are(uid)) || !self.trusted(store, pid) {
                continue;
            }
            let Ok(held) = holder::held_threads(pid, &sessions, &lock_dir) else { continue };
            // The pid must still name the process whose fds were read.
            if !os::read_stat(pid).is_ok_and(|s| s.starttime == stat.starttime) {
                continue;
            }
            let cmdline = os::read_cmdline(pid).unwrap_or_default();
            let exe = os::exe_path(pid).map(|p| p.display().to_string()).unwrap_or_default();
            let process = ProcessInfo { pid, kind: ProcessKind::of_cmdline(&cmdline), exe };
            for h in held {
                if let Some(t) = self.describe(&h.rollout, Some(process.clone())) {
                    if t.id == h.thread {
                        out.push(t);
                    }
                }
            }
        }
        out
    }

    /// A thread from its rollout; live when `process` is given (then the open turn decides
    /// busy/idle).
    fn describe(&self, path: &Path, process: Option<ProcessInfo>) -> Option<ThreadInfo> {
        let file = File::open(path).ok()?;
        let id = os::statx_fd(&file).ok()?;
        let key = (id.dev, id.ino);
        let cached = self.facts.lock().unwrap_or_else(|e| e.into_inner()).get(&key).cloned();
        let mut facts = match cached {
            Some(f) => f,
            None => {
                let (line, meta_end) = first_line(&file)?;
                RolloutFacts { info: SessionInfo::parse(&line)?, title: None, title_done: false, meta_end }
            }
        };
        if !facts.title_done {
            (facts.title, facts.title_done) = find_title(&file, facts.meta_end);
        }
        {
            let mut map = self.facts.lock().unwrap_or_else(|e| e.into_inner());
            if map.len() > 4096 {
                map.clear();
            }
            map.insert(key, facts.clone());
        }
        let (state, turn_id) = match &process {
            None => (ThreadState::Ended, None),
            Some(_) => {
                let identity = RolloutIdentity { dev: id.dev, ino: id.ino, btime_sec: id.btime_sec, btime_nsec: id.btime_nsec };
                let snap = self.tracker.update(path, &file, identity, id.size).ok()?;
                match snap.open_turn {
                    Some(t) => (ThreadState::Busy, Some(t)),
                    None => (ThreadState::Idle, None),
                }
            }
        };
        let mtime = file.metadata().ok().map(|m| m.mtime() * 1000 + m.mtime_nsec() / 1_000_000);
        let info = facts.info;
        Some(ThreadInfo {
            id: info.id,
            name: None,
            host: Host::Codex,
            state,
            turn_id,
            parent: info.parent,
            root: info.root,
            children: Vec::new(),
            cwd: info.cwd,
            title: facts.title,
            agent_nickname: info.agent_nickname,
            originator: info.originator,
            cli_version: info.cli_version,
            process,
            rollout: path.display().to_string(),
            last_activity_at: mtime,
            pending: 0,
            undelivered: 0,
            messages: BTreeMap::new(),
            waiting_on_approval: Vec::new(),
            not_woken: None,
        })
    }

    /// Up to `limit` ended threads not in `live`, most recently active first.
    pub(super) fn ended(&self, live: &HashSet<String>, limit: usize) -> Vec<ThreadInfo> {
        let mut threads = Vec::new();
        let mut ended = 0;
        // Most recently active first: a resumed thread appends to its old rollout (in its
        // old day directory), so the modification time decides, not the file name.
        let mut paths: Vec<(i64, PathBuf)> = crate::codex::rollout::rollouts_newest_first(&self.sessions())
            .filter_map(|p| {
                let m = std::fs::metadata(&p).ok()?;
                Some((m.mtime() * 1_000_000_000 + m.mtime_nsec(), p))
            })
            .collect();
        paths.sort_by_key(|p| std::cmp::Reverse(p.0));
        for (_, path) in paths {
            if ended >= limit {
                break;
            }
            let Some(id) = path.to_str().and_then(codex_format::rollout::thread_id_from_path) else { continue };
            if live.contains(id) {
                continue;
            }
            if let Some(t) = self.describe(&path, None) {
                if t.id == id {
                    threads.push(t);
                    ended += 1;
                }
            }
        }
        threads
    }
}

/// Whether some process holds `thread`'s writer lock now (a quick look for `broker send`'s note,
/// not a verification: delivery is decided by the gate).
pub fn lock_held(codex_home: &Path, thread: &str) -> bool {
    let Ok(m) = std::fs::symlink_metadata(codex_home.join("thread-writer-locks").join(format!("{thread}.lock"))) else {
        return false;
    };
    let file = os::FileKey { dev: m.dev(), ino: m.ino() };
    os::locks::flock_writes().is_ok_and(|locks| locks.iter().any(|l| l.file == file))
}

/// Whether a rollout under `codex_home` has `thread` (a Codex thread that ran, live or ended).
pub fn has_rollout(codex_home: &Path, thread: &str) -> bool {
    find_rollout(codex_home, thread).is_some()
}

/// The rollout of `thread`. For an id minted in the last [`NEW_THREAD_GRACE_MS`] (Codex prints a
/// new thread's id before its rollout exists: it is born 0.1-0.3 s after the process starts), a
/// rollout not there yet is waited for, at most [`NEW_THREAD_WAIT`].
pub fn rollout_of(codex_home: &Path, thread: &str) -> Option<PathBuf> {
    if let Some(p) = find_rollout(codex_home, thread) {
        return Some(p);
    }
    let fresh = uuid_v7_ms(thread).is_some_and(|ms| (-5_000..NEW_THREAD_GRACE_MS).contains(&(crate::store::now_ms() - ms)));
    if !fresh {
        return None;
    }
    let deadline = std::time::Instant::now() + NEW_THREAD_WAIT;
    while std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
        if let Some(p) = find_rollout(codex_home, thread) {
            return Some(p);
        }
    }
    None
}
