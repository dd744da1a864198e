//! The read state of one rollout: its first line, then forward from the cached offset, or on first
//! sight of a large one, backwards from its end (see the module docs of `rollout`).

use super::turn::{Actions, Turn};
use super::{RolloutIdentity, SessionMeta, HEAD_KEEP, MAX_BACKSCAN, TAIL_KEEP};
use crate::lines::{first_line, memrchr_newline, read_exact_at_retry, FirstLine, LineCursor, Seg, CHUNK};
use codex_format::rollout::{classify, classify_line, kinds, Rec, RolloutEvent};
use std::fs::File;
use std::io;
use std::ops::ControlFlow;

/// Longest first line (`session_meta`) accepted.
const MAX_META_LINE: usize = 4 << 20;

/// The line being read forward: its length so far, first and last bytes.
#[derive(Debug, Default)]
pub(super) struct LineAcc {
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
pub(super) struct State {
    pub(super) identity: RolloutIdentity,
    pub(super) meta: Option<SessionMeta>,
    /// The first line has been consumed (whatever it was).
    pub(super) meta_done: bool,
    /// Bytes consumed from the file.
    pub(super) offset: u64,
    /// Start of the line being accumulated (== offset when no partial line is pending).
    pub(super) line_start: u64,
    pub(super) line: LineAcc,
    /// The line being read started where this state does not know: it is not classified.
    pub(super) skip_line: bool,
    pub(super) turn: Turn,
    pub(super) actions: Actions,
}

impl State {
    pub(super) fn new(identity: RolloutIdentity) -> State {
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

    pub(super) fn open_turn(&self) -> Option<String> {
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
    pub(super) fn read_meta(&mut self, file: &File) -> io::Result<u64> {
        let (first, read) = first_line(file, MAX_META_LINE)?;
        match first {
            FirstLine::Unfinished => return Ok(read),
            FirstLine::Line(line) => {
                self.meta = match classify_line(&line) {
                    Some(RolloutEvent::SessionMeta { id, session_id, parent_thread_id }) => {
                        Some(SessionMeta { id, session_id, parent_thread_id })
                    }
                    _ => None,
                };
                self.offset = line.len() as u64 + 1;
            }
            FirstLine::TooLong(consumed) => {
                // Not a rollout Codex wrote: remember that, consume nothing more of this line.
                self.meta = None;
                self.offset = consumed;
                self.skip_line = true;
            }
        }
        self.meta_done = true;
        self.line_start = self.offset;
        Ok(read)
    }

    /// Reads forward from `offset` to EOF, applying every complete line. Returns bytes read.
    pub(super) fn read_forward(&mut self, file: &File) -> io::Result<u64> {
        let mut cursor = LineCursor { line_start: self.line_start, consumed: self.offset };
        let result = cursor.read(file, u64::MAX, |seg| {
            match seg {
                Seg::Part(bytes) => self.line.push(bytes),
                Seg::End { bytes, start, .. } => {
                    self.line.push(bytes);
                    if std::mem::take(&mut self.skip_line) {
                    } else if let Some(rec) = classify(&self.line.head, &self.line.tail) {
                        self.apply(rec, start);
                    }
                    self.line.clear();
                }
            }
            ControlFlow::Continue(())
        });
        (self.offset, self.line_start) = (cursor.consumed, cursor.line_start);
        result
    }

    /// First sight of a large rollout: read the tail backwards (at most [`MAX_BACKSCAN`] bytes) to
    /// the last turn record, collecting the records after it; apply them oldest first; continue
    /// forward from the last complete line. Returns bytes read.
    pub(super) fn scan_backwards(&mut self, file: &File, len: u64) -> io::Result<u64> {
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
