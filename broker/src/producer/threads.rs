//! `broker threads`: the Codex threads Courier can reach, found from what Codex itself holds,
//! never from a registry anyone could write.
//!
//! A thread is **live** when a trusted codex process (its executable's SHA-256 is in the trusted
//! set, the same digests the gate uses) holds both its rollout open for append and its
//! `thread-writer-locks/<thread>.lock` flock, through fds it opened itself: the gate's step-5
//! evidence (`gate/holder.rs`). Candidates come from `/proc/locks` (who holds an flock on a file
//! in the lock directory), so only those few processes' fds are read. For each live thread the
//! rollout's `session_meta` gives parent, cwd and originator, the rollout tracker
//! (`rollout.rs`) the open turn (`busy` with it, else `idle`), and the first user prompt becomes
//! its title. `--all` adds ended threads from the rollout files, most recently active first, bounded.
//!
//! The JSON field names are a stable interface (README, "For producers").

use crate::gate::digest::{DigestCache, ExeKey, Lookup};
use crate::gate::holder;
use crate::os;
use crate::rollout::{RolloutIdentity, RolloutTracker};
use crate::store::Store;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Ended threads `--all` lists at most by default (newest first).
pub const DEFAULT_ENDED_LIMIT: usize = 50;
/// How far into a rollout the title (first user prompt) is looked for.
const TITLE_SCAN_MAX: u64 = 4 << 20;
/// Longest first line (`session_meta`) read.
const META_MAX: usize = 4 << 20;
/// Characters of a title kept.
const TITLE_CHARS: usize = 80;

/// Which kind of codex process runs a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProcessKind {
    /// `codex exec` (non-interactive; no app-server endpoint).
    Exec,
    /// `codex app-server` (stdio or `--listen`).
    AppServer,
    /// The interactive TUI's managed daemon (`app-server --managed-daemon`), which runs its hooks.
    TuiDaemon,
    /// The TUI itself (`--no-daemon`), or a codex whose command line says nothing else.
    Tui,
}

impl ProcessKind {
    /// From the process's argv (NUL-separated `/proc/<pid>/cmdline`).
    pub fn of_cmdline(cmdline: &[u8]) -> ProcessKind {
        // Codex's global options that take a separate value (`--enable f exec ...`).
        const VALUED: [&[u8]; 16] = [
            b"-c",
            b"--config",
            b"--enable",
            b"--disable",
            b"-m",
            b"--model",
            b"-p",
            b"--profile",
            b"-C",
            b"--cd",
            b"-s",
            b"--sandbox",
            b"-a",
            b"--ask-for-approval",
            b"-i",
            b"--image",
        ];
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).skip(1).filter(|a| !a.is_empty()).collect();
        let mut sub = None;
        let mut i = 0;
        while i < args.len() {
            let a = args[i];
            if VALUED.contains(&a) {
                i += 2;
                continue;
            }
            if !a.starts_with(b"-") {
                sub = Some(a);
                break;
            }
            i += 1;
        }
        match sub {
            Some(b"exec" | b"e") => ProcessKind::Exec,
            Some(b"app-server") if args.iter().any(|a| *a == b"--managed-daemon") => ProcessKind::TuiDaemon,
            Some(b"app-server") => ProcessKind::AppServer,
            _ => ProcessKind::Tui,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ProcessKind::Exec => "exec",
            ProcessKind::AppServer => "app-server",
            ProcessKind::TuiDaemon => "tui-daemon",
            ProcessKind::Tui => "tui",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub pid: i32,
    pub kind: ProcessKind,
    /// The executable (`/proc/<pid>/exe`).
    pub exe: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThreadState {
    /// A turn is open (`turn_id` names it).
    Busy,
    /// Live, no turn open.
    Idle,
    /// No trusted codex process holds it; a message for it waits until it is resumed.
    Ended,
}

impl ThreadState {
    pub fn as_str(self) -> &'static str {
        match self {
            ThreadState::Busy => "busy",
            ThreadState::Idle => "idle",
            ThreadState::Ended => "ended",
        }
    }
}

/// One thread of `broker threads --json` (`threads[]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadInfo {
    pub id: String,
    pub state: ThreadState,
    /// The open turn (busy threads).
    pub turn_id: Option<String>,
    /// Parent thread of a sub-agent.
    pub parent: Option<String>,
    /// The root thread (`session_meta.session_id`; the thread itself for a root).
    pub root: Option<String>,
    /// Listed threads whose parent this is.
    pub children: Vec<String>,
    pub cwd: Option<String>,
    /// The first user prompt, on one line, at most 80 characters.
    pub title: Option<String>,
    /// A sub-agent's nickname (`session_meta.agent_nickname`).
    pub agent_nickname: Option<String>,
    /// `session_meta.originator` (`codex_exec`, `codex_cli_rs`, ...).
    pub originator: Option<String>,
    pub cli_version: Option<String>,
    /// The trusted codex process that holds it (live threads).
    pub process: Option<ProcessInfo>,
    pub rollout: String,
    /// The rollout's last modification, Unix ms.
    pub last_activity_at: Option<i64>,
    /// Messages queued and not yet handed (`pending` + `leased`).
    pub pending: u64,
    /// Messages that ended without reaching the model (`uncertain` + `expired`).
    pub undelivered: u64,
    /// Context messages per state, as `inspect --json`'s `threads` map.
    pub messages: BTreeMap<String, u64>,
}

/// What the first line of a rollout says about its thread.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionInfo {
    pub id: String,
    pub root: Option<String>,
    pub parent: Option<String>,
    pub cwd: Option<String>,
    pub originator: Option<String>,
    pub cli_version: Option<String>,
    pub agent_nickname: Option<String>,
}

impl SessionInfo {
    /// From a `session_meta` record; `None` for any other line.
    pub fn parse(line: &[u8]) -> Option<SessionInfo> {
        let v: Value = serde_json::from_slice(line).ok()?;
        if v.get("type")?.as_str()? != "session_meta" {
            return None;
        }
        let p = v.get("payload")?;
        let s = |k: &str| p.get(k).and_then(Value::as_str).map(str::to_string);
        let spawned_by = p.pointer("/source/subagent/thread_spawn/parent_thread_id").and_then(Value::as_str).map(str::to_string);
        Some(SessionInfo {
            id: s("id")?,
            root: s("session_id"),
            parent: s("parent_thread_id").or(spawned_by),
            cwd: s("cwd"),
            originator: s("originator"),
            cli_version: s("cli_version"),
            agent_nickname: s("agent_nickname")
                .or_else(|| p.pointer("/source/subagent/thread_spawn/agent_nickname").and_then(Value::as_str).map(str::to_string)),
        })
    }
}

/// Reads the first line of `file` (at most [`META_MAX`] bytes). Returns it and the offset after it.
fn first_line(file: &File) -> Option<(Vec<u8>, u64)> {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = file.read_at(&mut chunk, buf.len() as u64).ok()?;
        if n == 0 {
            return None;
        }
        let old = buf.len();
        buf.extend_from_slice(&chunk[..n]);
        if let Some(nl) = buf[old..].iter().position(|b| *b == b'\n') {
            buf.truncate(old + nl);
            let next = buf.len() as u64 + 1;
            return Some((buf, next));
        }
        if buf.len() > META_MAX {
            return None;
        }
    }
}

/// The text of a user prompt record: the `UserMessage` item Codex completes for what the person
/// (or `codex exec`) typed, or an `event_msg` `user_message`. Hook prompts and environment
/// context are other record kinds.
fn user_prompt(line: &[u8]) -> Option<String> {
    let head = &line[..line.len().min(200)];
    let has = |n: &[u8]| head.windows(n.len()).any(|w| w == n);
    if !has(b"\"event_msg\"") || !(has(b"\"item_completed\"") || has(b"\"user_message\"")) {
        return None;
    }
    let v: Value = serde_json::from_slice(line).ok()?;
    let p = v.get("payload")?;
    match p.get("type")?.as_str()? {
        "user_message" => p.get("message")?.as_str().map(str::to_string),
        "item_completed" => {
            let item = p.get("item")?;
            if item.get("type")?.as_str()? != "UserMessage" {
                return None;
            }
            let parts: Vec<&str> = item.get("content")?.as_array()?.iter().filter_map(|c| c.get("text")?.as_str()).collect();
            Some(parts.join(" "))
        }
        _ => None,
    }
}

/// One line, control characters dropped, at most [`TITLE_CHARS`] characters (`…` when cut).
pub fn one_line(text: &str) -> String {
    let words: Vec<&str> = text.split_whitespace().collect();
    let flat: String = words.join(" ").chars().filter(|c| !c.is_control()).collect();
    if flat.chars().count() <= TITLE_CHARS {
        flat
    } else {
        let mut s: String = flat.chars().take(TITLE_CHARS - 1).collect();
        s.push('…');
        s
    }
}

/// The first user prompt of a rollout, from `from` on (after the `session_meta` line), read
/// forward at most [`TITLE_SCAN_MAX`] bytes. `(title, complete)`: `complete` is false when the
/// scan reached the end of what is written so far without a prompt (a later call may find one).
fn find_title(file: &File, from: u64) -> (Option<String>, bool) {
    let mut chunk = vec![0u8; 64 * 1024];
    let mut line: Vec<u8> = Vec::new();
    let mut skipping = false;
    let mut pos = from;
    while pos - from < TITLE_SCAN_MAX {
        let n = match file.read_at(&mut chunk, pos) {
            Ok(0) | Err(_) => return (None, false),
            Ok(n) => n,
        };
        pos += n as u64;
        let mut data = &chunk[..n];
        while let Some(nl) = data.iter().position(|b| *b == b'\n') {
            if !skipping {
                line.extend_from_slice(&data[..nl]);
                if let Some(t) = user_prompt(&line) {
                    return (Some(one_line(&t)), true);
                }
            }
            line.clear();
            skipping = false;
            data = &data[nl + 1..];
        }
        if !skipping {
            line.extend_from_slice(data);
            if line.len() > (1 << 20) {
                line.clear();
                skipping = true;
            }
        }
    }
    (None, true)
}

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
    expected: Box<dyn Fn(&Path) -> bool + Send + Sync>,
    digest_wait: Duration,
}

impl Lister {
    pub fn new(
        codex_home: PathBuf,
        digests: DigestCache,
        expected: Box<dyn Fn(&Path) -> bool + Send + Sync>,
        digest_wait: Duration,
    ) -> Lister {
        Lister { codex_home, tracker: RolloutTracker::new(), digests, facts: Mutex::new(HashMap::new()), expected, digest_wait }
    }

    /// A lister for a one-shot CLI command: its own digest cache, any codex hashed if need be.
    pub fn for_cli(codex_home: PathBuf) -> Lister {
        Lister::new(codex_home, DigestCache::default(), Box::new(|_| true), Duration::from_secs(10))
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
        let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
        let mut pids: Vec<i32> = holder::all_flock_writes(&locks)
            .into_iter()
            .filter(|l| lock_files.contains(&(nix::libc::makedev(l.major, l.minor), l.ino)))
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
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map(|p| p.display().to_string()).unwrap_or_default();
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
        })
    }

    /// `broker threads`: the live threads and, with `all`, up to `limit` ended ones (newest
    /// rollouts first); with queue counts, children filled in, ordered for reading.
    pub fn list(&self, store: &Store, all: bool, limit: usize) -> anyhow::Result<Vec<ThreadInfo>> {
        let mut threads = self.live(store);
        if all {
            let live: HashSet<String> = threads.iter().map(|t| t.id.clone()).collect();
            let mut ended = 0;
            // Most recently active first: a resumed thread appends to its old rollout (in its
            // old day directory), so the modification time decides, not the file name.
            let mut paths: Vec<(i64, PathBuf)> = rollouts_newest_first(&self.sessions())
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
                let Some(id) = path.to_str().and_then(courier_shared::rollout::thread_id_from_path) else { continue };
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
        }
        let counts = super::counts_by_thread(store)?;
        for t in &mut threads {
            if let Some(c) = counts.get(&t.id) {
                let n = |s: &str| c.get(s).copied().unwrap_or(0);
                t.pending = n("pending") + n("leased");
                t.undelivered = n("uncertain") + n("expired");
                t.messages = c.clone();
            }
        }
        Ok(order(threads))
    }
}

/// Fills in `children` and orders the list: live before ended, then by last activity (newest
/// first), each sub-agent right after its parent.
pub fn order(mut threads: Vec<ThreadInfo>) -> Vec<ThreadInfo> {
    let ids: HashSet<String> = threads.iter().map(|t| t.id.clone()).collect();
    let mut children: HashMap<String, Vec<String>> = HashMap::new();
    for t in &threads {
        if let Some(p) = &t.parent {
            children.entry(p.clone()).or_default().push(t.id.clone());
        }
    }
    for t in &mut threads {
        t.children = children.remove(&t.id).unwrap_or_default();
        t.children.sort();
    }
    threads.sort_by(|a, b| {
        (a.state == ThreadState::Ended, std::cmp::Reverse(a.last_activity_at), &a.id).cmp(&(
            b.state == ThreadState::Ended,
            std::cmp::Reverse(b.last_activity_at),
            &b.id,
        ))
    });
    let by_id: HashMap<String, ThreadInfo> = threads.iter().map(|t| (t.id.clone(), t.clone())).collect();
    let mut out = Vec::with_capacity(threads.len());
    let mut placed: HashSet<String> = HashSet::new();
    fn place(t: &ThreadInfo, by_id: &HashMap<String, ThreadInfo>, placed: &mut HashSet<String>, out: &mut Vec<ThreadInfo>) {
        if !placed.insert(t.id.clone()) {
            return;
        }
        out.push(t.clone());
        for c in &t.children {
            if let Some(child) = by_id.get(c) {
                place(child, by_id, placed, out);
            }
        }
    }
    for t in &threads {
        // Roots (and sub-agents whose parent is not listed) start a group.
        if t.parent.as_ref().is_none_or(|p| !ids.contains(p)) {
            place(t, &by_id, &mut placed, &mut out);
        }
    }
    for t in &threads {
        place(t, &by_id, &mut placed, &mut out); // cycles, if a rollout lies
    }
    out
}

/// Every rollout file under `sessions` (its `YYYY/MM/DD` directories, and any directly inside),
/// newest first: by directory name, then file name (which starts with the start time).
pub fn rollouts_newest_first(sessions: &Path) -> impl Iterator<Item = PathBuf> {
    fn sorted(dir: &Path) -> Vec<(String, PathBuf, bool)> {
        let mut v: Vec<(String, PathBuf, bool)> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let ft = e.file_type().ok()?;
                Some((e.file_name().to_string_lossy().into_owned(), e.path(), ft.is_dir()))
            })
            .collect();
        v.sort_by(|a, b| b.0.cmp(&a.0));
        v
    }
    fn walk(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
        // Files of this directory first (newest name first), then its subdirectories.
        let entries = sorted(dir);
        for (name, path, is_dir) in &entries {
            if !is_dir && name.starts_with("rollout-") && name.ends_with(".jsonl") {
                out.push(path.clone());
            }
        }
        if depth < 3 {
            for (_, path, is_dir) in entries {
                if is_dir {
                    walk(&path, depth + 1, out);
                }
            }
        }
    }
    // Lazily by day directory would be nicer; a listing is bounded by the caller anyway.
    let mut out = Vec::new();
    walk(sessions, 0, &mut out);
    let (mut flat, mut dated): (Vec<PathBuf>, Vec<PathBuf>) = out.into_iter().partition(|p| p.parent() == Some(sessions));
    // Dated directories sort by date; files placed directly in `sessions` by their own name.
    flat.sort_by(|a, b| b.file_name().cmp(&a.file_name()));
    dated.extend(flat);
    dated.into_iter()
}

/// The Unix ms a UUIDv7 was made at (its first 48 bits), if it is one.
pub fn uuid_v7_ms(id: &str) -> Option<i64> {
    if !courier_shared::rollout::is_uuid(id) || id.as_bytes().get(14) != Some(&b'7') {
        return None;
    }
    let hex: String = id[..13].chars().filter(|c| *c != '-').collect();
    i64::from_str_radix(&hex, 16).ok()
}

/// `(year, month, day)` of a day count since 1970-01-01 (proleptic Gregorian).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn rollout_in(dir: &Path, thread: &str) -> Option<PathBuf> {
    let suffix = format!("-{thread}.jsonl");
    std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
        let name = e.file_name();
        let name = name.to_str()?;
        (name.starts_with("rollout-") && name.ends_with(&suffix)).then(|| e.path())
    })
}

/// The rollout of `thread` under `$CODEX_HOME/sessions`, if any: first in the day directories
/// its UUIDv7 time names (the day before and after too, for time zones), then anywhere there.
pub fn find_rollout(codex_home: &Path, thread: &str) -> Option<PathBuf> {
    if !courier_shared::rollout::is_uuid(thread) {
        return None;
    }
    let sessions = codex_home.join("sessions");
    if let Some(ms) = uuid_v7_ms(thread) {
        let day = ms.div_euclid(86_400_000);
        for d in [day, day - 1, day + 1] {
            let (y, m, dd) = civil_from_days(d);
            if let Some(p) = rollout_in(&sessions.join(format!("{y:04}/{m:02}/{dd:02}")), thread) {
                return Some(p);
            }
        }
    }
    let suffix = format!("-{thread}.jsonl");
    rollouts_newest_first(&sessions).find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with(&suffix)))
}

/// Whether some process holds `thread`'s writer lock now (a quick look for `broker send`'s note,
/// not a verification: delivery is decided by the gate).
pub fn lock_held(codex_home: &Path, thread: &str) -> bool {
    let Ok(m) = std::fs::symlink_metadata(codex_home.join("thread-writer-locks").join(format!("{thread}.lock"))) else {
        return false;
    };
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    holder::all_flock_writes(&locks).iter().any(|l| nix::libc::makedev(l.major, l.minor) == m.dev() && l.ino == m.ino())
}

fn short_age(now: i64, at: Option<i64>) -> String {
    let Some(at) = at else { return "-".into() };
    let s = (now - at).max(0) / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m", s / 60),
        3600..=86_399 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// The table `broker threads` prints for people.
pub fn render_table(threads: &[ThreadInfo], now: i64) -> String {
    use std::fmt::Write;
    if threads.is_empty() {
        return "no live Codex threads Courier can reach (`broker threads --all` adds ended ones)\n".into();
    }
    let esc = |s: &str| crate::inspect::escape(s).into_owned();
    let mut rows: Vec<[String; 7]> = vec![["THREAD", "STATE", "PROCESS", "QUEUED", "LAST", "CWD", "TITLE"].map(String::from)];
    for t in threads {
        let process = t.process.as_ref().map_or("-".to_string(), |p| format!("{} {}", p.kind.as_str(), p.pid));
        let queued = if t.undelivered > 0 { format!("{} ({} undelivered)", t.pending, t.undelivered) } else { t.pending.to_string() };
        let title = match (&t.parent, &t.agent_nickname) {
            (Some(_), Some(n)) => format!("↳ {}: {}", esc(n), esc(t.title.as_deref().unwrap_or(""))),
            (Some(_), None) => format!("↳ {}", esc(t.title.as_deref().unwrap_or(""))),
            _ => esc(t.title.as_deref().unwrap_or("")),
        };
        rows.push([
            t.id.clone(),
            t.state.as_str().into(),
            process,
            queued,
            short_age(now, t.last_activity_at),
            esc(t.cwd.as_deref().unwrap_or("-")),
            title,
        ]);
    }
    let widths: Vec<usize> = (0..6).map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in rows {
        for (i, w) in widths.iter().enumerate() {
            let _ = write!(out, "{:<w$}  ", r[i], w = *w);
        }
        let _ = writeln!(out, "{}", r[6]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_kind_from_argv() {
        let k = |argv: &[&str]| ProcessKind::of_cmdline(argv.join("\0").as_bytes());
        assert_eq!(k(&["/x/codex", "exec", "--skip-git-repo-check", "hi"]), ProcessKind::Exec);
        assert_eq!(k(&["/x/codex", "--enable", "f", "exec", "resume", "t"]), ProcessKind::Exec);
        assert_eq!(k(&["codex", "app-server", "--listen", "unix://", "--managed-daemon"]), ProcessKind::TuiDaemon);
        assert_eq!(k(&["codex", "app-server"]), ProcessKind::AppServer);
        assert_eq!(k(&["codex", "--no-daemon"]), ProcessKind::Tui);
        assert_eq!(k(&["codex"]), ProcessKind::Tui);
    }

    #[test]
    fn session_meta_of_a_sub_agent() {
        let line = br#"{"type":"session_meta","payload":{"id":"c","session_id":"r","cwd":"/w","originator":"codex_exec","cli_version":"0.171.0","source":{"subagent":{"thread_spawn":{"parent_thread_id":"p","agent_nickname":"Euler"}}}}}"#;
        let s = SessionInfo::parse(line).unwrap();
        assert_eq!((s.id.as_str(), s.root.as_deref(), s.parent.as_deref()), ("c", Some("r"), Some("p")));
        assert_eq!((s.cwd.as_deref(), s.agent_nickname.as_deref()), (Some("/w"), Some("Euler")));
        assert!(SessionInfo::parse(br#"{"type":"event_msg","payload":{}}"#).is_none());
    }

    #[test]
    fn titles_come_from_user_prompts_only() {
        let item = br#"{"timestamp":"t","type":"event_msg","payload":{"type":"item_completed","item":{"type":"UserMessage","content":[{"type":"text","text":"fix\nthe   tests"}]}}}"#;
        assert_eq!(user_prompt(item).map(|t| one_line(&t)).as_deref(), Some("fix the tests"));
        let old = br#"{"timestamp":"t","type":"event_msg","payload":{"type":"user_message","message":"hello"}}"#;
        assert_eq!(user_prompt(old).as_deref(), Some("hello"));
        let hook =
            br#"{"timestamp":"t","type":"event_msg","payload":{"type":"item_completed","item":{"type":"HookPrompt","fragments":[]}}}"#;
        assert_eq!(user_prompt(hook), None);
        assert_eq!(one_line(&"x".repeat(200)).chars().count(), TITLE_CHARS);
        assert_eq!(one_line("a\u{1b}[31mb"), "a[31mb");
    }

    #[test]
    fn uuid_v7_time_and_days() {
        // 2026-11-29T08:03:04.113Z (a thread id from the reference rollouts).
        let ms = uuid_v7_ms("01a22654-3b31-76f3-a48c-b65aa7d0db68").unwrap();
        let (y, m, d) = civil_from_days(ms.div_euclid(86_400_000));
        assert_eq!((y, m, d), (2026, 11, 29));
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(uuid_v7_ms("2b0c2c5e-3c3d-4f7e-9d1a-5b6c7d8e9f00"), None, "v4");
    }

    #[test]
    fn find_rollout_by_date_then_anywhere() {
        let home = std::env::temp_dir().join(format!("courier-find-rollout-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&home);
        let t7 = "01a22654-3b31-76f3-a48c-b65aa7d0db68";
        let t4 = "2b0c2c5e-3c3d-4f7e-9d1a-5b6c7d8e9f00";
        let day = home.join("sessions/2026/11/29");
        std::fs::create_dir_all(&day).unwrap();
        let p7 = day.join(format!("rollout-2026-11-29T08-03-04-{t7}.jsonl"));
        std::fs::write(&p7, "{}\n").unwrap();
        let p4 = home.join(format!("sessions/rollout-2026-01-01T00-00-00-{t4}.jsonl"));
        std::fs::write(&p4, "{}\n").unwrap();
        assert_eq!(find_rollout(&home, t7), Some(p7.clone()));
        assert_eq!(find_rollout(&home, t4), Some(p4.clone()));
        assert_eq!(find_rollout(&home, "01a22654-3b31-76f3-a48c-b65aa7d0db69"), None);
        assert_eq!(find_rollout(&home, "../../etc"), None);
        let all: Vec<PathBuf> = rollouts_newest_first(&home.join("sessions")).collect();
        assert_eq!(all, [p7, p4]);
        std::fs::remove_dir_all(&home).unwrap();
    }

    fn info(id: &str, parent: Option<&str>, state: ThreadState, at: i64) -> ThreadInfo {
        ThreadInfo {
            id: id.into(),
            state,
            turn_id: None,
            parent: parent.map(Into::into),
            root: None,
            children: vec![],
            cwd: None,
            title: None,
            agent_nickname: None,
            originator: None,
            cli_version: None,
            process: None,
            rollout: String::new(),
            last_activity_at: Some(at),
            pending: 0,
            undelivered: 0,
            messages: BTreeMap::new(),
        }
    }

    #[test]
    fn order_puts_live_first_and_children_after_parents() {
        let got = order(vec![
            info("old-ended", None, ThreadState::Ended, 50),
            info("child", Some("parent"), ThreadState::Busy, 40),
            info("parent", None, ThreadState::Idle, 10),
            info("newest", None, ThreadState::Busy, 30),
        ]);
        let ids: Vec<&str> = got.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids, ["newest", "parent", "child", "old-ended"]);
        assert_eq!(got[1].children, ["child"]);
        let table = render_table(&got, 60_000);
        assert!(table.lines().next().unwrap().starts_with("THREAD"), "{table}");
        assert_eq!(table.lines().count(), 5, "{table}");
    }
}
