//! Incremental reading of Codex rollouts for the verification gate (its steps 6 and 7: the
//! rollout's identity around the read, and its open turn).
//!
//! Rollouts can grow to gigabytes and every hook call needs two facts from one: the thread it
//! belongs to (`session_meta`, the first line) and the open turn (the last `task_started` not yet
//! closed by `task_complete`/`turn_aborted`). [`RolloutTracker`] keeps, per path and file identity
//! (device, inode, birth time), the byte offset read so far, the head and tail of any partial
//! trailing line, the `session_meta` and the open turn; each call reads only the bytes appended
//! since the last one.
//!
//! # First sight of a large rollout (a broker restart, a long `exec resume`)
//! It is not read whole: after the first line, the tail is read BACKWARDS, at most
//! [`MAX_BACKSCAN`] bytes, to the last turn record, which alone decides the open turn. A turn can
//! have been opened further back than that (one turn of many large tool outputs): the open turn
//! is then the turn named by the newest record Codex writes only *inside* its turn (a
//! `turn_context`, a `token_usage_record`, or model output, whose passthrough metadata carries
//! the turn id): no turn record after it means that turn has not closed, and no other turn has
//! opened. Such a record is written at every model response, so it is never far from the end
//! while a turn runs; if none is in the window either, the open turn stays unknown until the next
//! one is appended (forward reading adopts it the same way). No fixed window decides which turn
//! is open, and a call reads at most [`MAX_BACKSCAN`] bytes (plus two 4 KiB reads per line that
//! crosses a chunk boundary).
//!
//! When the identity changes (the file was replaced at the same path), the cached state is dropped
//! and rebuilt from the new file's own `session_meta`: nothing about the new file is trusted because
//! of its path.
//!
//! # Reading lines
//! Codex writes compact JSON, one record per line, its fields in a fixed order. Only the start of a
//! line (the record and payload types, turn ids, call ids) and its end (model output's passthrough
//! turn id) matter here, so at most [`HEAD_KEEP`] + [`TAIL_KEEP`] bytes of any line are kept, however
//! long it is; lines are classified by their member names as bytes (`"type"`, `"turn_id"`), which
//! text inside a JSON string can never produce (its quotes are escaped). Spaces after `:` and `,`
//! are allowed (Codex writes none; other writers, such as the tests' stand-ins, may).

use courier_shared::rollout::{classify_line, RolloutEvent};
use std::collections::HashMap;
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
    /// What the open turn's records say Codex is doing (empty when no turn is open).
    pub actions: Actions,
}

/// Read granularity.
const CHUNK: usize = 64 * 1024;
/// Longest first line (`session_meta`) accepted.
const MAX_META_LINE: usize = 4 << 20;
/// Bytes kept of the start of a line.
pub const HEAD_KEEP: usize = 4096;
/// Bytes kept of the end of a line.
pub const TAIL_KEEP: usize = 4096;
/// On first sight, more unread bytes than this after the first line are scanned backwards.
const BACKSCAN_THRESHOLD: u64 = 256 * 1024;
/// The backward scan reads at most this much of a rollout's tail.
pub const MAX_BACKSCAN: u64 = 16 << 20;
/// Cached rollouts kept before the cache is cleared.
const MAX_STATES: usize = 4096;
/// How much of a line's start decides its kind.
const KIND_HEAD: usize = 200;

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t')) {
        i += 1;
    }
    i
}

/// Where the value of the member `"name":` whose opening quote is at `at` starts.
fn value_start(b: &[u8], at: usize, name: &str) -> Option<usize> {
    let i = skip_ws(b, at + name.len() + 2);
    (b.get(i) == Some(&b':')).then(|| skip_ws(b, i + 1))
}

/// Where the value of the first (or last) member named `name` starts. The quotes of a name
/// inside a JSON string are escaped (`\"name\"`), so only the line's own members match.
fn member(b: &[u8], name: &str, last: bool) -> Option<usize> {
    let pat = format!("\"{name}\"");
    let pat = pat.as_bytes();
    let mut hits = b.windows(pat.len()).enumerate().filter(|(_, w)| *w == pat).map(|(at, _)| at);
    if last {
        hits.filter_map(|at| value_start(b, at, name)).next_back()
    } else {
        hits.find_map(|at| value_start(b, at, name))
    }
}

/// The JSON string at `i` (its opening quote), if it is a plain token (ids, type names): no
/// escapes, at most 200 bytes.
fn string_at(b: &[u8], i: usize) -> Option<&str> {
    if b.get(i) != Some(&b'"') {
        return None;
    }
    let rest = &b[i + 1..];
    let end = rest.iter().take(201).position(|c| *c == b'"')?;
    let tok = &rest[..end];
    if tok.is_empty() || !tok.iter().all(|c| c.is_ascii_alphanumeric() || b"-_.:".contains(c)) {
        return None;
    }
    std::str::from_utf8(tok).ok()
}

/// The string value of the first (or last) member `name`.
fn value<'a>(b: &'a [u8], name: &str, last: bool) -> Option<&'a str> {
    member(b, name, last).and_then(|i| string_at(b, i))
}

/// At `i` an object opens whose first member is `name`: where its value starts.
fn first_member(b: &[u8], i: usize, name: &str) -> Option<usize> {
    if b.get(i) != Some(&b'{') {
        return None;
    }
    let at = skip_ws(b, i + 1);
    b[at..].starts_with(format!("\"{name}\"").as_bytes()).then(|| value_start(b, at, name)).flatten()
}

/// A record the tracker follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rec {
    /// `event_msg` `task_started`.
    Started(String),
    /// `event_msg` `task_complete` / `turn_aborted`.
    Closed(String),
    /// `turn_context`: the settings of a turn, written as it opens.
    Context(String),
    /// `token_usage_record`: a model response of this turn ended.
    Usage(String),
    /// A tool call: a response item `*_call` with a `call_id` (`function_call`, `custom_tool_call`,
    /// ...), with the turn from its passthrough metadata.
    Call { id: String, turn: Option<String> },
    /// Other model output: an assistant message, reasoning, or a `*_call` Codex does not answer
    /// (no `call_id`, as `web_search_call`).
    Said(Option<String>),
    /// A tool call's output: a response item `*_output` with a `call_id`.
    Output(String),
    /// `event_msg` `item_completed`: the item with this id finished (a tool call's item id is its call id).
    Completed(String),
}

impl Rec {
    /// The turn of a record Codex writes only while that turn is open: `turn_context`,
    /// `token_usage_record`, and model output with its passthrough turn id.
    fn in_turn(&self) -> Option<&str> {
        match self {
            Rec::Context(t) | Rec::Usage(t) => Some(t),
            Rec::Call { turn, .. } | Rec::Said(turn) => turn.as_deref(),
            _ => None,
        }
    }
}

/// What the open turn's records say Codex is doing: the state each hook follows (issue 14,
/// "one ticket per Codex action"; bound to hooks in `gate/ticket.rs`). Reset when a turn opens or
/// closes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Actions {
    /// Tool calls of the open turn with no output yet: (call id, its `item_completed` was written).
    pub calls: Vec<(String, bool)>,
    /// More calls were open at once than are kept ([`MAX_OPEN_CALLS`]): no call is known answered
    /// by all until the turn ends.
    pub overflow: bool,
    /// The model has produced output in the open turn (a response ended, a call, a message).
    pub spoke: bool,
    /// Where the newest model output after the turn's last tool call starts: the answer a Stop hook
    /// follows (`None` once a tool call follows it).
    pub said_at: Option<u64>,
}

/// Open tool calls kept per turn at most.
pub const MAX_OPEN_CALLS: usize = 256;

impl Actions {
    fn apply(&mut self, rec: &Rec, at: u64) {
        match rec {
            Rec::Usage(_) => self.spoke = true,
            Rec::Call { id, .. } => {
                self.spoke = true;
                self.said_at = None;
                if self.calls.iter().any(|(c, _)| c == id) {
                } else if self.calls.len() < MAX_OPEN_CALLS {
                    self.calls.push((id.clone(), false));
                } else {
                    self.overflow = true;
                }
            }
            Rec::Said(_) => {
                self.spoke = true;
                self.said_at = Some(at);
            }
            Rec::Output(id) => self.calls.retain(|(c, _)| c != id),
            Rec::Completed(id) => {
                if let Some(c) = self.calls.iter_mut().find(|(c, _)| c == id) {
                    c.1 = true;
                }
            }
            Rec::Started(_) | Rec::Closed(_) | Rec::Context(_) => {}
        }
    }
}

/// The record and payload types of a line (`("event_msg", Some("task_started"))`).
fn kinds(head: &[u8]) -> Option<(&str, Option<&str>)> {
    let head = &head[..head.len().min(KIND_HEAD)];
    let top = value(head, "type", false)?;
    let payload = member(head, "payload", false).and_then(|i| first_member(head, i, "type")).and_then(|i| string_at(head, i));
    Some((top, payload))
}

/// Classifies one complete line from its first bytes (`head`, up to [`HEAD_KEEP`]) and its last
/// (`tail`, up to [`TAIL_KEEP`]; the same bytes for a short line).
pub fn classify(head: &[u8], tail: &[u8]) -> Option<Rec> {
    let (top, payload) = kinds(head)?;
    let turn_id = || value(head, "turn_id", false).map(str::to_string);
    let passthrough_turn = || {
        let i = member(tail, "internal_chat_message_metadata_passthrough", true)?;
        string_at(tail, first_member(tail, i, "turn_id")?).map(str::to_string)
    };
    // The call id can follow a long `arguments` string: then it is in the line's last bytes.
    let call_id = |from_tail: bool| {
        value(head, "call_id", false).or_else(|| if from_tail { value(tail, "call_id", true) } else { None }).map(str::to_string)
    };
    match (top, payload) {
        ("event_msg", Some("task_started")) => turn_id().map(Rec::Started),
        ("event_msg", Some("task_complete" | "turn_aborted")) => turn_id().map(Rec::Closed),
        ("event_msg", Some("item_completed")) => {
            // `"item":{"type":"CommandExecution","id":"call_0002",...`
            let i = first_member(head, member(head, "item", false)?, "type")?;
            let kind = string_at(head, i)?;
            let after = skip_ws(head, i + kind.len() + 2);
            if head.get(after) != Some(&b',') {
                return None;
            }
            let at = skip_ws(head, after + 1);
            if !head[at..].starts_with(b"\"id\"") {
                return None;
            }
            string_at(head, value_start(head, at, "id")?).map(|id| Rec::Completed(id.into()))
        }
        ("turn_context", _) => turn_id().map(Rec::Context),
        ("token_usage_record", _) => turn_id().map(Rec::Usage),
        ("response_item", Some("message")) => (value(head, "role", false) == Some("assistant")).then(|| Rec::Said(passthrough_turn())),
        ("response_item", Some("reasoning")) => Some(Rec::Said(passthrough_turn())),
        ("response_item", Some(p)) if p.ends_with("_output") => call_id(false).map(Rec::Output),
        ("response_item", Some(p)) if p.ends_with("_call") => Some(match call_id(true) {
            Some(id) => Rec::Call { id, turn: passthrough_turn() },
            None => Rec::Said(passthrough_turn()),
        }),
        _ => None,
    }
}

/// What is known about the open turn.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Turn {
    /// No turn is open (none was opened, or the last one closed).
    Closed,
    Open(String),
    /// The backward scan found neither a turn record nor a record inside a turn.
    Unknown,
}

/// The line being read forward: its length so far, first and last bytes.
#[derive(Debug, Default)]
struct LineAcc {
    len: u64,
    head: Vec<u8>,
    tail: Vec<u8>,
}

impl LineAcc {
    fn push(&mut self, seg: &[u8]) {
        self.len += seg.len() as u64;
        if self.head.len() < HEAD_KEEP {
            let take = (HEAD_KEEP - self.head.len()).min(seg.len());
            self.head.extend_from_slice(&seg[..take]);
        }
        if seg.len() >= TAIL_KEEP {
            self.tail.clear();
            self.tail.extend_from_slice(&seg[seg.len() - TAIL_KEEP..]);
        } else {
            self.tail.extend_from_slice(seg);
            if self.tail.len() > TAIL_KEEP {
                let cut = self.tail.len() - TAIL_KEEP;
                self.tail.drain(..cut);
            }
        }
    }

    fn clear(&mut self) {
        self.len = 0;
        self.head.clear();
        self.tail.clear();
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
    line: LineAcc,
    /// The line being read started where this state does not know: it is not classified.
    skip_line: bool,
    turn: Turn,
    actions: Actions,
}

impl State {
    fn new(identity: RolloutIdentity) -> State {
        State {
            identity,
            meta: None,
            meta_done: false,
            offset: 0,
            line_start: 0,
            line: LineAcc::default(),
            skip_line: false,
            turn: Turn::Closed,
            actions: Actions::default(),
        }
    }

    fn open_turn(&self) -> Option<String> {
        match &self.turn {
            Turn::Open(t) => Some(t.clone()),
            _ => None,
        }
    }

    /// Applies the record that starts at offset `at`.
    fn apply(&mut self, rec: Rec, at: u64) {
        match &rec {
            Rec::Started(t) => {
                self.turn = Turn::Open(t.clone());
                self.actions = Actions::default();
                return;
            }
            Rec::Closed(t) => {
                if matches!(&self.turn, Turn::Open(o) if o == t) || self.turn == Turn::Unknown {
                    self.turn = Turn::Closed;
                    self.actions = Actions::default();
                }
                return;
            }
            _ => {}
        }
        if self.turn == Turn::Unknown {
            match rec.in_turn() {
                Some(t) => self.turn = Turn::Open(t.to_string()),
                None => return,
            }
        }
        if matches!(self.turn, Turn::Open(_)) {
            self.actions.apply(&rec, at);
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
            if let Some(nl) = newline(&buf[old..]) {
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
                // Not a rollout Codex wrote: remember that, consume nothing more of this line.
                self.meta = None;
                self.meta_done = true;
                self.offset = buf.len() as u64;
                self.line_start = self.offset;
                self.skip_line = true;
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
            let mut data = &chunk[..n];
            let mut consumed = 0usize;
            while let Some(nl) = newline(data) {
                self.line.push(&data[..nl]);
                if std::mem::take(&mut self.skip_line) {
                } else if let Some(rec) = classify(&self.line.head, &self.line.tail) {
                    self.apply(rec, self.line_start);
                }
                self.line.clear();
                consumed += nl + 1;
                self.line_start = self.offset + consumed as u64;
                data = &data[nl + 1..];
            }
            self.line.push(data);
            self.offset += n as u64;
        }
    }

    /// First sight of a large rollout: read the tail backwards (at most [`MAX_BACKSCAN`] bytes) to
    /// the last turn record, collecting the records after it; apply them oldest first; continue
    /// forward from the last complete line. Returns bytes read.
    fn scan_backwards(&mut self, file: &File, len: u64) -> io::Result<u64> {
        let start = self.offset;
        let mut read = 0u64;
        let mut chunk = vec![0u8; CHUNK];
        let mut cursor = len; // [cursor, len) has been read
        let mut line_end: Option<u64> = None; // the '\n' ending the line being traced back
        let mut resume: Option<u64> = None; // just after the last complete line
        let mut newer: Vec<(u64, Rec)> = Vec::new(); // records after the deciding one, newest first
        let mut base: Option<Turn> = None;
        let mut last_n = 0usize;

        'outer: while cursor > start && len - cursor < MAX_BACKSCAN {
            let n = CHUNK.min((cursor - start) as usize);
            cursor -= n as u64;
            read_exact_at_retry(file, &mut chunk[..n], cursor)?;
            read += n as u64;
            last_n = n;
            let mut hi = n;
            while let Some(i) = memrchr_newline(&chunk[..hi]) {
                let nl = cursor + i as u64;
                match line_end {
                    None => resume = Some(nl + 1),
                    Some(end) => {
                        let (rec, extra) = line_rec(file, &chunk[..n], cursor, nl + 1, end)?;
                        read += extra;
                        if let Some(d) = consider(rec, nl + 1, &mut newer) {
                            base = Some(d);
                            break 'outer;
                        }
                    }
                }
                line_end = Some(nl);
                hi = i;
            }
        }
        if base.is_none() && cursor <= start {
            // Reached the first line after the session_meta.
            if let Some(end) = line_end {
                let (rec, extra) = line_rec(file, &chunk[..last_n], cursor, start, end)?;
                read += extra;
                base = consider(rec, start, &mut newer);
            }
            base.get_or_insert(Turn::Closed);
        }
        self.turn = base.unwrap_or(Turn::Unknown);
        self.actions = Actions::default();
        for (at, rec) in newer.into_iter().rev() {
            self.apply(rec, at);
        }
        self.line.clear();
        let resume = match resume {
            Some(r) => r,
            // No line ends in the window: it is all inside one line whose start was not reached;
            // skip the rest of that line.
            None if cursor > start => {
                self.skip_line = true;
                len
            }
            None => start,
        };
        self.offset = resume;
        self.line_start = resume;
        Ok(read)
    }
}

/// A record found scanning backwards: a turn record decides the open turn (returned); any other is
/// kept to be applied after it.
fn consider(rec: Option<Rec>, at: u64, newer: &mut Vec<(u64, Rec)>) -> Option<Turn> {
    match rec? {
        Rec::Started(t) => Some(Turn::Open(t)),
        Rec::Closed(_) => Some(Turn::Closed),
        other => {
            if newer.len() < MAX_NEWER {
                newer.push((at, other));
            }
            None
        }
    }
}

/// Records kept from one backward scan at most.
const MAX_NEWER: usize = 1 << 16;

/// Classifies the complete line `[a, end)` (its `\n` at `end`) during the backward scan: its head and
/// tail come from `chunk` (the bytes at `chunk_at`) when they are in it, else are read. Returns the
/// record and the extra bytes read.
fn line_rec(file: &File, chunk: &[u8], chunk_at: u64, a: u64, end: u64) -> io::Result<(Option<Rec>, u64)> {
    let mut extra = 0u64;
    let mut range = |from: u64, to: u64| -> io::Result<Vec<u8>> {
        let chunk_end = chunk_at + chunk.len() as u64;
        if from >= chunk_at && to <= chunk_end {
            return Ok(chunk[(from - chunk_at) as usize..(to - chunk_at) as usize].to_vec());
        }
        let mut buf = vec![0u8; (to - from) as usize];
        read_exact_at_retry(file, &mut buf, from)?;
        extra += to - from;
        Ok(buf)
    };
    let head = range(a, end.min(a + HEAD_KEEP as u64))?;
    if kinds(&head).is_none() {
        return Ok((None, extra));
    }
    let tail = if end - a <= HEAD_KEEP as u64 { head.clone() } else { range(end - TAIL_KEEP as u64, end)? };
    Ok((classify(&head, &tail), extra))
}

/// The first `\n` in `buf` (libc's memchr: fast whatever the build profile).
fn newline(buf: &[u8]) -> Option<usize> {
    // SAFETY: memchr reads at most buf.len() bytes of a live slice.
    let p = unsafe { nix::libc::memchr(buf.as_ptr().cast(), b'\n' as i32, buf.len()) };
    (!p.is_null()).then(|| p as usize - buf.as_ptr() as usize)
}

/// The last `\n` in `buf`.
fn memrchr_newline(buf: &[u8]) -> Option<usize> {
    // SAFETY: memrchr reads at most buf.len() bytes of a live slice.
    let p = unsafe { nix::libc::memrchr(buf.as_ptr().cast(), b'\n' as i32, buf.len()) };
    (!p.is_null()).then(|| p as usize - buf.as_ptr() as usize)
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
            open_turn: state.open_turn(),
            offset: state.line_start,
            bytes_read: read,
            rebuilt,
            actions: state.actions.clone(),
        })
    }

    pub fn cached_paths(&self) -> usize {
        self.states.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests;
