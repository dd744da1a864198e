//! What a rollout says about its thread: its `session_meta` and its title (the first user prompt).

use crate::lines::{self, FirstLine, WholeLines};
use serde_json::Value;
use std::fs::File;
use std::ops::ControlFlow;

/// How far into a rollout the title (first user prompt) is looked for.
const TITLE_SCAN_MAX: u64 = 4 << 20;
/// Longest first line (`session_meta`) read.
pub(super) const META_MAX: usize = 4 << 20;
/// Longest line looked at for the title.
const TITLE_LINE_MAX: usize = 1 << 20;
/// Characters of a title kept.
pub(super) const TITLE_CHARS: usize = 80;

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
pub(super) fn first_line(file: &File) -> Option<(Vec<u8>, u64)> {
    match lines::first_line(file, META_MAX).ok()?.0 {
        FirstLine::Line(line) => {
            let next = line.len() as u64 + 1;
            Some((line, next))
        }
        FirstLine::Unfinished | FirstLine::TooLong(_) => None,
    }
}

/// The text of a user prompt record: the `UserMessage` item Codex completes for what the person
/// (or `codex exec`) typed, or an `event_msg` `user_message`. Hook prompts and environment
/// context are other record kinds.
pub(super) fn user_prompt(line: &[u8]) -> Option<String> {
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
pub(super) fn find_title(file: &File, from: u64) -> (Option<String>, bool) {
    let mut lines = WholeLines::at(from, TITLE_LINE_MAX);
    let mut title = None;
    let until = from + TITLE_SCAN_MAX;
    let read = lines.read(file, until, |line, _, _| match line.and_then(user_prompt) {
        Some(t) => {
            title = Some(one_line(&t));
            ControlFlow::Break(())
        }
        None => ControlFlow::Continue(()),
    });
    match (read, title) {
        (_, Some(t)) => (Some(t), true),
        (Ok(_), None) => (None, lines.cursor.consumed >= until),
        (Err(_), None) => (None, false),
    }
}
