//! The one way the broker reads an append-only log (a Codex rollout) in lines: complete lines
//! forward from an offset
//! ([`LineCursor`], whole lines with [`WholeLines`], the first with [`first_line`]), the complete
//! lines at a rollout's end ([`tail`]), and the positioned reads under them (`EINTR` retried).
//!
//! Host-neutral (only `std`): the Codex wing's rollout reader, delivery's confirmation scan,
//! effort and `broker threads` all read through it.
//!
//! Codex appends to a rollout while it is read: only bytes up to a `\n` make a line; the bytes of
//! one being written are consumed and the line is finished by a later read from the same cursor.

use std::fs::File;
use std::io;
use std::ops::ControlFlow;
use std::os::unix::fs::FileExt;

/// Read granularity.
pub const CHUNK: usize = 64 * 1024;

/// The bytes of a line as they are read: the middle of one (`Part`, no line end in it yet), or
/// its last bytes (`End`: the `\n` excluded; the line began at `start`, the next begins at `next`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seg<'a> {
    Part(&'a [u8]),
    End { bytes: &'a [u8], start: u64, next: u64 },
}

thread_local! {
    /// Each thread's read buffer: a hook call used to allocate and zero 64 KiB to find nothing new
    /// (65k of its 337k instructions).
    static CHUNK_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with a [`CHUNK`]-byte buffer: the thread's own, or a fresh one for a read started
/// inside another read's callback.
fn with_chunk<R>(f: impl FnOnce(&mut [u8]) -> R) -> R {
    CHUNK_BUF.with(|b| match b.try_borrow_mut() {
        Ok(mut buf) => {
            if buf.len() < CHUNK {
                buf.resize(CHUNK, 0);
            }
            f(&mut buf[..CHUNK])
        }
        Err(_) => f(&mut vec![0u8; CHUNK]),
    })
}

/// Where a forward read of lines stands; the next read resumes there.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LineCursor {
    /// Start of the line being read: every line before it has been handed out.
    pub line_start: u64,
    /// Bytes consumed: past `line_start` by the start of a line not yet complete (handed out as
    /// [`Seg::Part`]).
    pub consumed: u64,
}

impl LineCursor {
    /// A cursor at a line start.
    pub fn at(offset: u64) -> LineCursor {
        LineCursor { line_start: offset, consumed: offset }
    }

    /// Reads from `consumed` up to `until` (or the end of the file), handing `f` every line's bytes
    /// in order. `f` returning `Break` for an `End` stops right after that line (its result for a
    /// `Part` is ignored). Returns the bytes read.
    pub fn read(&mut self, file: &File, until: u64, f: impl FnMut(Seg<'_>) -> ControlFlow<()>) -> io::Result<u64> {
        if self.consumed >= until {
            return Ok(0);
        }
        with_chunk(|chunk| self.read_with(chunk, file, until, f))
    }

    fn read_with(&mut self, chunk: &mut [u8], file: &File, until: u64, mut f: impl FnMut(Seg<'_>) -> ControlFlow<()>) -> io::Result<u64> {
        let mut read = 0u64;
        while self.consumed < until {
            let want = (until - self.consumed).min(CHUNK as u64) as usize;
            let n = read_at_retry(file, &mut chunk[..want], self.consumed)?;
            if n == 0 {
                break;
            }
            read += n as u64;
            let mut data = &chunk[..n];
            while let Some(nl) = newline(data) {
                let start = self.line_start;
                self.consumed += nl as u64 + 1;
                self.line_start = self.consumed;
                let flow = f(Seg::End { bytes: &data[..nl], start, next: self.line_start });
                data = &data[nl + 1..];
                if flow.is_break() {
                    return Ok(read);
                }
            }
            if !data.is_empty() {
                let _ = f(Seg::Part(data));
            }
            self.consumed += data.len() as u64;
        }
        Ok(read)
    }
}

/// Complete lines read forward, each handed out whole; a line longer than `max` is handed out as
/// `None` (its bytes are not kept). Resumable: a line being written is finished by a later read.
#[derive(Debug, Clone)]
pub struct WholeLines {
    pub cursor: LineCursor,
    /// The start of the line being read, unless it is being skipped (longer than `max`).
    partial: Vec<u8>,
    skipping: bool,
    max: usize,
}

impl WholeLines {
    pub fn at(offset: u64, max: usize) -> WholeLines {
        WholeLines { cursor: LineCursor::at(offset), partial: Vec::new(), skipping: false, max }
    }

    /// As [`LineCursor::read`]; `f(line, start, next)`.
    pub fn read(&mut self, file: &File, until: u64, mut f: impl FnMut(Option<&[u8]>, u64, u64) -> ControlFlow<()>) -> io::Result<u64> {
        let WholeLines { cursor, partial, skipping, max } = self;
        let max = *max;
        cursor.read(file, until, |seg| match seg {
            Seg::Part(b) => {
                if *skipping {
                } else if partial.len() + b.len() > max {
                    *partial = Vec::new();
                    *skipping = true;
                } else {
                    partial.extend_from_slice(b);
                }
                ControlFlow::Continue(())
            }
            Seg::End { bytes, start, next } => {
                let flow = if std::mem::take(skipping) || partial.len() + bytes.len() > max {
                    f(None, start, next)
                } else if partial.is_empty() {
                    f(Some(bytes), start, next)
                } else {
                    partial.extend_from_slice(bytes);
                    f(Some(partial), start, next)
                };
                partial.clear();
                flow
            }
        })
    }
}

/// What a file's first line is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirstLine {
    /// Its bytes (without the `\n`); the next line starts after them.
    Line(Vec<u8>),
    /// No line end yet.
    Unfinished,
    /// Longer than the bound: this many bytes of it were consumed.
    TooLong(u64),
}

/// Reads the first line of `file`, at most `max` bytes of it. Returns it and the bytes read.
pub fn first_line(file: &File, max: usize) -> io::Result<(FirstLine, u64)> {
    let mut lines = WholeLines::at(0, max);
    let mut got = None;
    let read = lines.read(file, max as u64 + 1, |line, _, _| {
        got = Some(line.map(<[u8]>::to_vec));
        ControlFlow::Break(())
    })?;
    let first = match got {
        Some(Some(line)) => FirstLine::Line(line),
        _ if lines.cursor.consumed > max as u64 => FirstLine::TooLong(lines.cursor.consumed),
        _ => FirstLine::Unfinished,
    };
    Ok((first, read))
}

/// The lines among the last `window` bytes before `end` (a line end), oldest first, as bytes; a
/// line cut by the window's start is left out.
pub fn tail(file: &File, end: u64, window: u64) -> io::Result<Vec<u8>> {
    let start = end.saturating_sub(window);
    let mut buf = vec![0u8; (end - start) as usize];
    read_exact_at_retry(file, &mut buf, start)?;
    if start > 0 {
        // The byte before `start` decides whether the window starts a line.
        let mut before = [0u8];
        read_exact_at_retry(file, &mut before, start - 1)?;
        if before[0] != b'\n' {
            let cut = newline(&buf).map_or(buf.len(), |nl| nl + 1);
            buf.drain(..cut);
        }
    }
    Ok(buf)
}

/// The first `\n` in `buf` (libc's memchr: fast whatever the build profile).
pub fn newline(buf: &[u8]) -> Option<usize> {
    // SAFETY: memchr reads at most buf.len() bytes of a live slice.
    let p = unsafe { nix::libc::memchr(buf.as_ptr().cast(), b'\n' as i32, buf.len()) };
    (!p.is_null()).then(|| p as usize - buf.as_ptr() as usize)
}

/// The last `\n` in `buf`.
pub fn memrchr_newline(buf: &[u8]) -> Option<usize> {
    // SAFETY: memrchr reads at most buf.len() bytes of a live slice.
    let p = unsafe { nix::libc::memrchr(buf.as_ptr().cast(), b'\n' as i32, buf.len()) };
    (!p.is_null()).then(|| p as usize - buf.as_ptr() as usize)
}

pub fn read_at_retry(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    loop {
        match file.read_at(buf, at) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

pub fn read_exact_at_retry(file: &File, buf: &mut [u8], at: u64) -> io::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(name: &str, text: &[u8]) -> (std::path::PathBuf, File) {
        let p = std::env::temp_dir().join(format!("courier-lines-{}-{name}", std::process::id()));
        std::fs::write(&p, text).unwrap();
        let f = File::open(&p).unwrap();
        (p, f)
    }

    fn collect(lines: &mut WholeLines, f: &File, until: u64) -> Vec<(Option<String>, u64, u64)> {
        let mut got = Vec::new();
        lines
            .read(f, until, |l, a, b| {
                got.push((l.map(|l| String::from_utf8_lossy(l).into_owned()), a, b));
                ControlFlow::Continue(())
            })
            .unwrap();
        got
    }

    #[test]
    fn a_line_being_written_is_finished_by_the_next_read() {
        let (p, f) = file("resume", b"one\ntw");
        let mut lines = WholeLines::at(0, 100);
        assert_eq!(collect(&mut lines, &f, u64::MAX), [(Some("one".into()), 0, 4)]);
        assert_eq!(lines.cursor, LineCursor { line_start: 4, consumed: 6 });
        std::fs::OpenOptions::new().append(true).open(&p).unwrap().write_all(b"o\nthree\n").unwrap();
        assert_eq!(collect(&mut lines, &f, u64::MAX), [(Some("two".into()), 4, 8), (Some("three".into()), 8, 14)]);
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn long_lines_are_skipped_not_kept_and_bounds_and_breaks_hold() {
        let mut text = b"a\n".to_vec();
        text.extend(std::iter::repeat_n(b'x', 3 * CHUNK));
        text.extend(b"\nb\nc\n");
        let (p, f) = file("long", &text);
        let mut lines = WholeLines::at(0, CHUNK);
        let got = collect(&mut lines, &f, u64::MAX);
        let long_end = 2 + 3 * CHUNK as u64 + 1;
        assert_eq!(
            got,
            [
                (Some("a".into()), 0, 2),
                (None, 2, long_end),
                (Some("b".into()), long_end, long_end + 2),
                (Some("c".into()), long_end + 2, long_end + 4)
            ]
        );
        assert!(lines.partial.capacity() <= 2 * CHUNK, "a skipped line was buffered");
        // A bound stops the read; a Break stops right after its line.
        let mut bounded = WholeLines::at(0, CHUNK);
        assert_eq!(collect(&mut bounded, &f, 3), [(Some("a".into()), 0, 2)]);
        assert_eq!(bounded.cursor.consumed, 3);
        let mut cursor = LineCursor::at(long_end);
        cursor.read(&f, u64::MAX, |_| ControlFlow::Break(())).unwrap();
        assert_eq!(cursor, LineCursor::at(long_end + 2));
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn first_line_and_tail() {
        let (p, f) = file("first", b"meta\nx\n");
        assert_eq!(first_line(&f, 10).unwrap().0, FirstLine::Line(b"meta".to_vec()));
        assert_eq!(first_line(&f, 3).unwrap().0, FirstLine::TooLong(4));
        let (q, g) = file("unfinished", b"met");
        assert_eq!(first_line(&g, 10).unwrap().0, FirstLine::Unfinished);
        let (r, h) = file("tail", b"first line\nsecond\nthird\n");
        assert_eq!(tail(&h, 24, 10).unwrap(), b"third\n", "the line the window cuts is left out");
        assert_eq!(tail(&h, 24, 13).unwrap(), b"second\nthird\n", "a window starting a line keeps it");
        assert_eq!(tail(&h, 24, 100).unwrap(), b"first line\nsecond\nthird\n");
        for p in [p, q, r] {
            std::fs::remove_file(p).unwrap();
        }
    }
}
