//! Incremental reading of Codex rollouts for the verification gate (its steps 6 and 7: the
//! rollout's identity around the read, and its open turn).
//!
//! Rollouts can grow to gigabytes and every hook call needs two facts from one: the thread it
//! belongs to (`session_meta`, the first line) and the open turn (the last `task_started` not yet
//! closed by `task_complete`/`turn_aborted`). [`RolloutTracker`] keeps, per path and file identity
//! (device, inode, birth time), the byte offset read so far, any partial trailing line, the
//! `session_meta` and the open turn; each call reads only the bytes appended since the last one.
//!
//! The first time a large rollout is seen (a broker restart, a long `exec resume`), it is not read
//! whole: after the first line, the tail is scanned BACKWARDS to the last turn record, which alone
//! decides the open turn. When the identity changes (the file was replaced at the same path), the
//! cached state is dropped and rebuilt from the new file's own `session_meta`: nothing about the
//! new file is trusted because of its path.

use courier_shared::rollout::{classify_line, RolloutEvent};
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Which file a cached state belongs to. Size is deliberately absent: rollouts grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RolloutIdentity {
    pub dev: u64,
    pub ino: u64,
    pub btime_sec: i64,
    pub btime_nsec: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionMeta {
    /// The thread id.
    pub id: String,
    /// The root thread id (equals `id` for a root thread).
    pub session_id: Option<String>,
    pub parent_thread_id: Option<String>,
}

/// What one [`RolloutTracker::update`] learned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub identity: RolloutIdentity,
    /// `None` when the first line is missing, incomplete, or not a `session_meta` record.
    pub session_meta: Option<SessionMeta>,
    pub open_turn: Option<String>,
    /// End of the last complete line read: everything before it has been accounted for.
    pub offset: u64,
    /// Bytes read from the file by this call.
    pub bytes_read: u64,
    /// The cached state was (re)built from scratch by this call.
    pub rebuilt: bool,
}

/// Read granularity.
const CHUNK: usize = 64 * 1024;
/// Longest first line (`session_meta`) accepted.
const MAX_META_LINE: usize = 4 << 20;
/// A line longer than this whose head is not a record the tracker needs is skipped, not buffered.
const MAX_BUFFERED_LINE: usize = 64 * 1024;
/// Even an interesting-looking line is not buffered past this.
const MAX_INTERESTING_LINE: usize = 1 << 20;
/// On first sight, more unread bytes than this after the first line are scanned backwards.
const BACKSCAN_THRESHOLD: u64 = 256 * 1024;
/// The backward scan gives up (no open turn known) after this many bytes.
const MAX_BACKSCAN: u64 = 64 << 20;
/// Cached rollouts kept before the cache is cleared.
const MAX_STATES: usize = 4096;
/// How much of a line's start decides its kind (as in `courier_shared::rollout::classify_line`).
const HEAD: usize = 160;

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The line's head names one of the record kinds the tracker needs (cheap pre-filter: most lines
/// are never JSON-parsed).
fn head_is_turn_or_meta(line: &[u8]) -> bool {
    let head = &line[..line.len().min(HEAD)];
    [&b"\"session_meta\""[..], b"\"task_started\"", b"\"task_complete\"", b"\"turn_aborted\""]
        .iter()
        .any(|n| contains(head, n))
}

fn turn_event(line: &[u8]) -> Option<RolloutEvent> {
    if !head_is_turn_or_meta(line) {
        return None;
    }
    match classify_line(line)? {
        e @ (RolloutEvent::TurnStarted { .. } | RolloutEvent::TurnClosed { .. }) => Some(e),
        _ => None,
    }
}

#[derive(Debug)]
struct State {
    identity: RolloutIdentity,
    meta: Option<SessionMeta>,
    /// The first line has been consumed (whatever it was).
    meta_done: bool,
    /// Bytes consumed from the file.
    offset: u64,
    /// Start of the line being accumulated (== offset when no partial line is pending).
    line_start: u64,
    partial: Vec<u8>,
    /// The pending line is being skipped (too long and not interesting).
    skipping: bool,
    open_turn: Option<String>,
}

impl State {
    fn new(identity: RolloutIdentity) -> State {
        State {
            identity,
            meta: None,
            meta_done: false,
            offset: 0,
            line_start: 0,
            partial: Vec::new(),
            skipping: false,
            open_turn: None,
        }
    }

    fn apply(&mut self, line: &[u8]) {
        match turn_event(line) {
            Some(RolloutEvent::TurnStarted { turn_id }) => self.open_turn = Some(turn_id),
            Some(RolloutEvent::TurnClosed { turn_id }) if self.open_turn.as_deref() == Some(turn_id.as_str()) => {
                self.open_turn = None;
            }
            _ => {}
        }
    }

    /// Reads the first line. Returns bytes read. Leaves `meta_done` false if it is not complete yet.
    fn read_meta(&mut self, file: &File) -> io::Result<u64> {
        let mut buf = Vec::new();
        let mut chunk = vec![0u8; CHUNK];
        let mut read = 0u64;
        loop {
            let n = read_at_retry(file, &mut chunk, buf.len() as u64)?;
            read += n as u64;
            if n == 0 {
                return Ok(read); // no complete first line yet
            }
            let old = buf.len();
            buf.extend_from_slice(&chunk[..n]);
            if let Some(nl) = buf[old..].iter().position(|b| *b == b'\n') {
                let end = old + nl;
                self.meta = match classify_line(&buf[..end]) {
                    Some(RolloutEvent::SessionMeta { id, session_id, parent_thread_id }) => {
                        Some(SessionMeta { id, session_id, parent_thread_id })
                    }
                    _ => None,
                };
                self.meta_done = true;
                self.offset = end as u64 + 1;
                self.line_start = self.offset;
                return Ok(read);
            }
            if buf.len() > MAX_META_LINE {
                // Not a rollout Codex wrote: remember that, consume nothing more.
                self.meta = None;
                self.meta_done = true;
                self.offset = buf.len() as u64;
                self.line_start = self.offset;
                self.skipping = true;
                return Ok(read);
            }
        }
    }

    /// Reads forward from `offset` to EOF, applying every complete line. Returns bytes read.
    fn read_forward(&mut self, file: &File) -> io::Result<u64> {
        let mut chunk = vec![0u8; CHUNK];
        let mut read = 0u64;
        loop {
            let n = read_at_retry(file, &mut chunk, self.offset)?;
            if n == 0 {
                return Ok(read);
            }
            read += n as u64;
            let data = &chunk[..n];
            let mut seg_start = 0usize;
            for (i, b) in data.iter().enumerate() {
                if *b != b'\n' {
                    continue;
                }
                let seg = &data[seg_start..i];
                if self.skipping {
                    self.skipping = false;
                } else if self.partial.is_empty() {
                    self.apply(seg);
                } else {
                    let mut line = std::mem::take(&mut self.partial);
                    line.extend_from_slice(seg);
                    self.apply(&line);
                    line.clear();
                    self.partial = line;
                }
                seg_start = i + 1;
                self.line_start = self.offset + seg_start as u64;
            }
            if !self.skipping && seg_start < n {
                self.partial.extend_from_slice(&data[seg_start..]);
                let limit = if head_is_turn_or_meta(&self.partial) { MAX_INTERESTING_LINE } else { MAX_BUFFERED_LINE };
                if self.partial.len() > limit {
                    self.partial = Vec::new();
                    self.skipping = true;
                }
            }
            self.offset += n as u64;
        }
    }

    /// First sight of a large rollout: find the open turn from the last turn record, reading the
    /// tail backwards, then continue forward from the last complete line. Returns bytes read.
    fn scan_backwards(&mut self, file: &File, len: u64) -> io::Result<u64> {
        let start = self.offset;
        let mut pos = len;
        let mut carry: Vec<u8> = Vec::new();
        let mut carry_oversized = false;
        let mut closed: HashSet<String> = HashSet::new();
        let mut last_line_end: Option<u64> = None;
        let mut decided: Option<Option<String>> = None;
        let mut read = 0u64;
        let mut chunk = vec![0u8; CHUNK];

        let consider = |line: &[u8], oversized: bool, closed: &mut HashSet<String>| -> Option<Option<String>> {
            if oversized {
                return None;
            }
            match turn_event(line) {
                Some(RolloutEvent::TurnStarted { turn_id }) => {
                    Some(if closed.contains(&turn_id) { None } else { Some(turn_id) })
                }
                Some(RolloutEvent::TurnClosed { turn_id }) => {
                    closed.insert(turn_id);
                    None
                }
                _ => None,
            }
        };

        'outer: while pos > start {
            if len - pos >= MAX_BACKSCAN {
                decided = Some(None);
                break;
            }
            let n = CHUNK.min((pos - start) as usize);
            pos -= n as u64;
            read_exact_at_retry(file, &mut chunk[..n], pos)?;
            read += n as u64;
            let mut combined = Vec::with_capacity(n + carry.len());
            combined.extend_from_slice(&chunk[..n]);
            combined.extend_from_slice(&carry);
            let mut line_end = combined.len();
            let mut oversized = carry_oversized;
            for i in (0..n).rev() {
                if combined[i] != b'\n' {
                    continue;
                }
                if last_line_end.is_none() {
                    // Bytes after the last newline are an incomplete line: not a record yet.
                    last_line_end = Some(pos + i as u64 + 1);
                } else if let Some(d) = consider(&combined[i + 1..line_end], oversized, &mut closed) {
                    decided = Some(d);
                    break 'outer;
                }
                line_end = i;
                oversized = false;
            }
            if line_end > MAX_BUFFERED_LINE {
                // A long line: keep only its (growing) beginning, enough to know it is not a turn record.
                carry = combined[..HEAD.min(line_end)].to_vec();
                carry_oversized = true;
            } else {
                carry = combined[..line_end].to_vec();
                carry_oversized = oversized && !carry.is_empty();
            }
        }
        if decided.is_none() && last_line_end.is_some() && pos <= start {
            // `carry` is the first complete line after the session_meta.
            decided = consider(&carry, carry_oversized, &mut closed);
        }
        self.open_turn = decided.flatten();
        let resume = last_line_end.unwrap_or(start);
        self.offset = resume;
        self.line_start = resume;
        self.partial.clear();
        self.skipping = false;
        Ok(read)
    }
}

fn read_at_retry(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    loop {
        match file.read_at(buf, at) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

fn read_exact_at_retry(file: &File, buf: &mut [u8], at: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let n = read_at_retry(file, &mut buf[done..], at + done as u64)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "rollout shrank while reading"));
        }
        done += n;
    }
    Ok(())
}

/// Per-rollout incremental read state, shared by all connection threads.
#[derive(Default)]
pub struct RolloutTracker {
    states: Mutex<HashMap<PathBuf, Arc<Mutex<State>>>>,
    /// Bytes read from rollouts over the tracker's life.
    pub total_bytes_read: AtomicU64,
}

impl RolloutTracker {
    pub fn new() -> RolloutTracker {
        RolloutTracker::default()
    }

    /// Brings the cached state of `path` up to date by reading `file` (an fd opened on that path,
    /// whose identity the caller captured as `identity` and whose length it saw as `len`).
    pub fn update(&self, path: &Path, file: &File, identity: RolloutIdentity, len: u64) -> io::Result<Snapshot> {
        let cell = {
            let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
            if states.len() >= MAX_STATES && !states.contains_key(path) {
                states.clear();
            }
            states.entry(path.to_path_buf()).or_insert_with(|| Arc::new(Mutex::new(State::new(identity)))).clone()
        };
        let mut state = cell.lock().unwrap_or_else(|p| p.into_inner());
        let mut rebuilt = false;
        // A different file at this path, or one that shrank: forget everything about the old one.
        if state.identity != identity || len < state.offset || !state.meta_done {
            *state = State::new(identity);
            rebuilt = true;
        }
        let result = (|| -> io::Result<u64> {
            let mut read = 0;
            if !state.meta_done {
                read += state.read_meta(file)?;
                if !state.meta_done {
                    return Ok(read);
                }
                if len > state.offset && len - state.offset > BACKSCAN_THRESHOLD {
                    read += state.scan_backwards(file, len)?;
                }
            }
            read += state.read_forward(file)?;
            Ok(read)
        })();
        let read = match result {
            Ok(r) => r,
            Err(e) => {
                // Half-applied state is not to be trusted next time.
                *state = State::new(identity);
                return Err(e);
            }
        };
        self.total_bytes_read.fetch_add(read, Ordering::Relaxed);
        Ok(Snapshot {
            identity,
            session_meta: state.meta.clone(),
            open_turn: state.open_turn.clone(),
            offset: state.line_start,
            bytes_read: read,
            rebuilt,
        })
    }

    pub fn cached_paths(&self) -> usize {
        self.states.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;

    const T: &str = "01a22652-96c4-7652-bf64-6f7bc9883ce2";

    fn meta_line() -> String {
        format!(r#"{{"timestamp":"t","ordinal":0,"type":"session_meta","payload":{{"id":"{T}","session_id":"{T}","cwd":"/w"}}}}"#) + "\n"
    }
    fn started(turn: &str) -> String {
        format!(r#"{{"timestamp":"t","ordinal":1,"type":"event_msg","payload":{{"type":"task_started","turn_id":"{turn}"}}}}"#) + "\n"
    }
    fn closed(turn: &str) -> String {
        format!(r#"{{"timestamp":"t","ordinal":2,"type":"event_msg","payload":{{"type":"task_complete","turn_id":"{turn}"}}}}"#) + "\n"
    }
    fn filler(n: usize) -> String {
        format!(r#"{{"timestamp":"t","ordinal":3,"type":"response_item","payload":{{"type":"message","role":"assistant","content":[{{"type":"output_text","text":"{}"}}]}}}}"#, "x".repeat(n)) + "\n"
    }

    fn ident(f: &File) -> (RolloutIdentity, u64) {
        let m = f.metadata().unwrap();
        (RolloutIdentity { dev: m.dev(), ino: m.ino(), btime_sec: 0, btime_nsec: 0 }, m.len())
    }

    fn tmpfile(name: &str) -> (PathBuf, File) {
        let dir = std::env::temp_dir().join(format!("courier-rollout-test-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(format!("rollout-2026-11-29T08-01-16-{T}.jsonl"));
        let f = std::fs::OpenOptions::new().create(true).truncate(true).write(true).open(&p).unwrap();
        (p, f)
    }

    #[test]
    fn reads_only_appended_bytes_and_tracks_turns() {
        let (p, mut w) = tmpfile("append");
        w.write_all(meta_line().as_bytes()).unwrap();
        w.write_all(started("T1").as_bytes()).unwrap();
        let r = File::open(&p).unwrap();
        let tr = RolloutTracker::new();
        let (id, len) = ident(&r);
        let s1 = tr.update(&p, &r, id, len).unwrap();
        assert_eq!(s1.session_meta.as_ref().unwrap().id, T);
        assert_eq!(s1.open_turn.as_deref(), Some("T1"));
        assert_eq!(s1.offset, len);
        assert!(s1.rebuilt);

        // A partial line is not a record yet; completing it is.
        let tail = closed("T1");
        w.write_all(&tail.as_bytes()[..20]).unwrap();
        let (_, len2) = ident(&r);
        let s2 = tr.update(&p, &r, id, len2).unwrap();
        assert_eq!(s2.bytes_read, 20);
        assert_eq!(s2.offset, len);
        assert_eq!(s2.open_turn.as_deref(), Some("T1"));
        w.write_all(&tail.as_bytes()[20..]).unwrap();
        let (_, len3) = ident(&r);
        let s3 = tr.update(&p, &r, id, len3).unwrap();
        assert_eq!(s3.bytes_read, (tail.len() - 20) as u64);
        assert_eq!(s3.open_turn, None);
        assert_eq!(s3.offset, len3);
        assert!(!s3.rebuilt);
        let _ = std::fs::remove_dir_all(p.parent().unwrap());
    }

    #[test]
    fn large_rollout_is_scanned_backwards_not_whole() {
        let (p, mut w) = tmpfile("large");
        w.write_all(meta_line().as_bytes()).unwrap();
        w.write_all(started("T0").as_bytes()).unwrap();
        w.write_all(closed("T0").as_bytes()).unwrap();
        for _ in 0..40 {
            w.write_all(filler(50_000).as_bytes()).unwrap(); // 2 MB of long lines
        }
        w.write_all(started("T1").as_bytes()).unwrap();
        w.write_all(filler(1000).as_bytes()).unwrap();
        w.write_all(b"{\"partial").unwrap();
        let r = File::open(&p).unwrap();
        let (id, len) = ident(&r);
        let tr = RolloutTracker::new();
        let s = tr.update(&p, &r, id, len).unwrap();
        assert_eq!(s.open_turn.as_deref(), Some("T1"));
        assert!(s.bytes_read < 200_000, "read {} of {len}", s.bytes_read);
        assert_eq!(s.offset, len - "{\"partial".len() as u64);

        // Closing T1 then opening T2 later is seen incrementally.
        w.write_all(b"\"}\n").unwrap();
        w.write_all(closed("T1").as_bytes()).unwrap();
        let (_, len2) = ident(&r);
        let s2 = tr.update(&p, &r, id, len2).unwrap();
        assert_eq!(s2.open_turn, None);
        assert_eq!(s2.bytes_read, len2 - len);

        // Backward scan honours a close after the last start.
        let tr2 = RolloutTracker::new();
        let s3 = tr2.update(&p, &r, id, len2).unwrap();
        assert_eq!(s3.open_turn, None);
        let _ = std::fs::remove_dir_all(p.parent().unwrap());
    }

    #[test]
    fn long_uninteresting_lines_are_not_buffered_and_identity_change_resets() {
        let (p, mut w) = tmpfile("long");
        w.write_all(meta_line().as_bytes()).unwrap();
        w.write_all(started("T1").as_bytes()).unwrap();
        let r = File::open(&p).unwrap();
        let (id, len) = ident(&r);
        let tr = RolloutTracker::new();
        tr.update(&p, &r, id, len).unwrap();
        let big = filler(300_000);
        w.write_all(&big.as_bytes()[..200_000]).unwrap();
        let (_, l2) = ident(&r);
        let s = tr.update(&p, &r, id, l2).unwrap();
        assert_eq!(s.offset, len);
        w.write_all(&big.as_bytes()[200_000..]).unwrap();
        w.write_all(closed("T1").as_bytes()).unwrap();
        let (_, l3) = ident(&r);
        let s = tr.update(&p, &r, id, l3).unwrap();
        assert_eq!(s.open_turn, None);
        assert_eq!(s.offset, l3);

        let other = RolloutIdentity { ino: id.ino + 1, ..id };
        let s = tr.update(&p, &r, other, l3).unwrap();
        assert!(s.rebuilt);
        let _ = std::fs::remove_dir_all(p.parent().unwrap());
    }

    #[test]
    fn first_line_that_is_not_session_meta_gives_no_meta() {
        let (p, mut w) = tmpfile("nometa");
        w.write_all(started("T1").as_bytes()).unwrap();
        let r = File::open(&p).unwrap();
        let (id, len) = ident(&r);
        let s = RolloutTracker::new().update(&p, &r, id, len).unwrap();
        assert_eq!(s.session_meta, None);
        let _ = std::fs::remove_dir_all(p.parent().unwrap());
    }
}
