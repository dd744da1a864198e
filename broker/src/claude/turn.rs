//! The turn a Claude Code transcript shows its session in: the `promptId` of the newest
//! main-conversation `user` record (the person's prompt, a tool result, a woken turn's
//! notification all carry the turn's id; probed on 2.1.332).
//!
//! Why the gate asks: a prompt the person submits while the ending turn's Stop hooks still run
//! is queued by Claude Code, and its UserPromptSubmit repeats the *ending* turn's `prompt_id`;
//! the turn it then opens has an id no UserPromptSubmit named. Claude Code writes that turn's
//! prompt record (`promptSource: "queued"`, the new `promptId`) before the turn's first request,
//! so before any of its hooks. `session::session_owner` moves the pin to a hook's turn only when
//! this reads it as the newest: a turn the transcript proves began, never a guess.
//!
//! What it rests on: only the session's pinned claude reaches the question (every kernel step
//! and the pin passed), and claude's hooks carry the turn it runs. A same-uid writer of the
//! transcript can append a record, but cannot make claude send a hook naming it: a forged record
//! can only make a genuine hook's turn not the newest, i.e. refused as before (fail closed).

use serde_json::Value;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::{Duration, Instant};

/// Most bytes read back from the transcript's end: the prompt record precedes its turn's first
/// hook by one request (`api-request-blob`s hold whole requests, so a large context can sit
/// between them); a turn further back than this is not proven, and the hook is refused.
pub const MAX_BACK: u64 = 8 << 20;

/// How often [`wait_shown`] looks at the transcript's length while it waits for a record.
const LOOK_EVERY: Duration = Duration::from_millis(10);

/// The `promptId` of the newest main-conversation `user` record within [`MAX_BACK`] of the end
/// of the transcript at `path`, if any. A line still being written does not parse and is skipped.
pub fn newest(path: &Path) -> std::io::Result<Option<String>> {
    Tail::open(path)?.read_on(None)
}

/// Whether the transcript shows turn `prompt_id` as its newest, waiting for it until `until`.
///
/// Why wait: Claude Code writes a queued prompt's record before the turn's first request, but
/// its transcript writes are batched, so at the turn's first tool hook the record is often not
/// on disk yet (seen in most runs of the TUI test). The record follows within the batch's flush;
/// the hook's budget bounds the wait, and a turn still not shown by then is not proven (the hook
/// is refused, the session carries on). Only appended lines are read while waiting.
pub fn wait_shown(path: &Path, prompt_id: &str, until: Instant) -> std::io::Result<Shown> {
    let (start, mut tail) = (Instant::now(), Tail::open(path)?);
    let mut newest = tail.read_on(None)?;
    loop {
        if newest.as_deref() == Some(prompt_id) {
            return Ok(Shown::Yes { waited: start.elapsed() });
        }
        if Instant::now() >= until {
            return Ok(Shown::No(newest));
        }
        std::thread::sleep(LOOK_EVERY.min(until.saturating_duration_since(Instant::now())));
        newest = tail.read_on(newest)?;
    }
}

/// What [`wait_shown`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Shown {
    /// Shown, after waiting this long for its record.
    Yes { waited: Duration },
    /// Not by the deadline: the turn the transcript's newest record names instead, if any.
    No(Option<String>),
}

/// A transcript read forward from [`MAX_BACK`] before its end, complete lines only.
struct Tail {
    file: std::fs::File,
    /// Where the next unread line begins.
    at: u64,
    /// The first line read may begin mid-line (the read starts at an arbitrary byte).
    skip_first: bool,
}

impl Tail {
    fn open(path: &Path) -> std::io::Result<Tail> {
        let file = std::fs::File::open(path)?;
        let at = file.metadata()?.len().saturating_sub(MAX_BACK);
        Ok(Tail { file, at, skip_first: at > 0 })
    }

    /// The newest turn among the lines appended since the last read, else `newest` (the last
    /// read's answer). A trailing line without its newline is left for the next read.
    fn read_on(&mut self, newest: Option<String>) -> std::io::Result<Option<String>> {
        let len = self.file.metadata()?.len();
        if len <= self.at {
            return Ok(newest);
        }
        self.file.seek(SeekFrom::Start(self.at))?;
        let mut bytes = Vec::with_capacity((len - self.at) as usize);
        (&mut self.file).take(len - self.at).read_to_end(&mut bytes)?;
        let Some(end) = bytes.iter().rposition(|b| *b == b'\n') else { return Ok(newest) };
        self.at += end as u64 + 1;
        let mut lines: Vec<&[u8]> = bytes[..end].split(|b| *b == b'\n').collect();
        if std::mem::take(&mut self.skip_first) && !lines.is_empty() {
            lines.remove(0);
        }
        let found = lines.into_iter().rev().filter(|l| l.windows(PROMPT_ID.len()).any(|w| w == PROMPT_ID)).find_map(prompt_of_user_record);
        Ok(found.or(newest))
    }
}

/// What a line holding a prompt record has somewhere (the cheap filter before parsing it).
const PROMPT_ID: &[u8] = b"\"promptId\"";

/// The `promptId` of a main-conversation `user` record (a top-level field: text inside a record
/// is escaped, so only a record's own keys parse as keys here).
fn prompt_of_user_record(line: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(line).ok()?;
    if v["type"] != "user" || v["isSidechain"] == true {
        return None;
    }
    v["promptId"].as_str().filter(|p| !p.is_empty()).map(String::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn transcript(name: &str, records: &[Value]) -> std::path::PathBuf {
        let p = courier_shared::scratch::dir("courier-turn").join(format!("{name}.jsonl"));
        let text: String = records.iter().map(|r| format!("{r}\n")).collect();
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn the_newest_user_record_names_the_turn() {
        // As 2.1.332 writes a prompt queued during Stop hooks: the ending turn's records, the
        // queue operations, then the new turn's prompt record and its tool result.
        let p = transcript(
            "queued",
            &[
                json!({"type": "user", "promptId": "T1", "message": {"role": "user", "content": "first"}, "isSidechain": false}),
                json!({"type": "assistant", "message": {"content": [{"type": "text", "text": "done"}]}}),
                json!({"type": "queue-operation", "operation": "enqueue", "content": "second"}),
                json!({"type": "queue-operation", "operation": "dequeue"}),
                json!({"type": "user", "promptId": "T2", "promptSource": "queued", "message": {"role": "user", "content": "second"}}),
                json!({"type": "attachment", "attachment": {"type": "hook_success", "hookEvent": "PreToolUse"}}),
            ],
        );
        assert_eq!(newest(&p).unwrap().as_deref(), Some("T2"));
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn text_quoting_a_record_and_a_sidechain_record_name_no_turn() {
        // A tool's output holding a record's bytes is escaped inside its line: not a record.
        let quoted = r#"{"type":"user","promptId":"FORGED"}"#;
        let p = transcript(
            "quoted",
            &[
                json!({"type": "user", "promptId": "T1", "message": {"role": "user", "content": "first"}}),
                json!({"type": "assistant", "message": {"content": [{"type": "text", "text": quoted}]}}),
                json!({"type": "user", "promptId": "SUB", "isSidechain": true, "message": {"role": "user", "content": "x"}}),
            ],
        );
        assert_eq!(newest(&p).unwrap().as_deref(), Some("T1"));
        // A line still being written is skipped.
        std::fs::write(&p, format!("{}\n{{\"type\":\"user\",\"promptId\":\"T9", json!({"type": "user", "promptId": "T1"}))).unwrap();
        assert_eq!(newest(&p).unwrap().as_deref(), Some("T1"));
        std::fs::remove_file(p).unwrap();
    }
}
