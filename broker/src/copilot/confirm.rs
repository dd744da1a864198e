//! Confirmation of Copilot CLI hand-offs from the session record, `session-state/<id>/
//! events.jsonl`. Copilot records what the model got: a call's result with the postToolUse
//! context appended (`tool.execution_complete`, `data.result.content`, already cut as the model
//! got it) and a new user message an agentStop `block` made (`user.message`, `data.content`).
//! A hand-off is `confirmed` when a record of those kinds after its offset holds every byte of
//! the text as rendered; `uncertain` (`copilot_exited`) when its copilot exited and the record,
//! read after the exit, shows none. A message in parts is confirmed when every part is shown,
//! `uncertain` `part_unseen` when a later part is and an earlier one is not.
//!
//! Copilot writes the record as the session goes, in `copilot -p` too (re-probed on 1.0.102: 31 KB
//! on disk at the first postToolUse of a `-p` run); a record not written yet keeps the hand-off
//! `handed` until its copilot exits. Whose copilot is gone is decided before the read, so the
//! read saw all it will write.

use crate::reason::{DeliveryReason, Reason};
use crate::store::{SettledBy, Settlement, State, Store};
use anyhow::Result;
use serde_json::Value;
use std::io::{Read, Seek, SeekFrom};
use std::sync::Mutex;

/// Most bytes of a session record one pass reads (from the oldest open hand-off's offset).
const MAX_READ: u64 = 32 << 20;

/// Settles the open Copilot hand-offs; returns how many are still open.
pub fn reconcile(store: &Mutex<Store>) -> Result<usize> {
    let by_record = crate::store::lock(store).handed_pieces(None, SettledBy::CopilotEvents)?;
    let mut open = by_record.values().map(Vec::len).sum();
    for (path, handed) in by_record {
        let dead: Vec<Vec<bool>> =
            handed.iter().map(|(_, pieces)| pieces.iter().map(|p| !p.owner.is_some_and(|k| k.is_alive())).collect()).collect();
        let from = handed.iter().flat_map(|(_, pieces)| pieces.iter().map(|p| p.offset)).min().unwrap_or(0);
        let shown_texts = read_shown(&path, from);
        for ((m, pieces), dead) in handed.iter().zip(dead) {
            let shown: Vec<bool> =
                pieces.iter().map(|p| shown_texts.iter().any(|(at, t)| *at >= p.offset && t.contains(&p.text))).collect();
            let Some((state, reason)) = verdict(&shown, &dead) else { continue };
            let settlement =
                Settlement { id: m.id.clone(), lease: m.lease, state: Some(state), reason, scan_offset: m.scan_offset.unwrap_or(0) as u64 };
            if crate::store::lock(store).settle(&settlement)? {
                crate::log_info!("copilot: {} {state} in session {}", m.id, m.thread);
                open -= 1;
            }
        }
    }
    Ok(open)
}

/// A message's final state from whether each piece is shown and whether its copilot is dead;
/// `None` while it may still be shown.
fn verdict(shown: &[bool], dead: &[bool]) -> Option<(State, Option<Reason>)> {
    let unseen = |i: usize| !shown[i] && (i + 1..shown.len()).any(|j| shown[j]);
    if shown.iter().all(|s| *s) {
        Some((State::Confirmed, None))
    } else if (0..shown.len()).any(unseen) {
        Some((State::Uncertain, Some(DeliveryReason::PartUnseen.into())))
    } else if (0..shown.len()).any(|i| !shown[i] && dead[i]) {
        Some((State::Uncertain, Some(DeliveryReason::CopilotExited.into())))
    } else {
        None
    }
}

/// The texts the model got, by the offset of their record, from the whole lines of the record
/// at `path` from `from` on (at most [`MAX_READ`] bytes): `tool.execution_complete` results and
/// `user.message` contents.
fn read_shown(path: &str, from: u64) -> Vec<(u64, String)> {
    let mut bytes = Vec::new();
    let read = std::fs::File::open(path).and_then(|mut f| {
        f.seek(SeekFrom::Start(from))?;
        f.take(MAX_READ).read_to_end(&mut bytes)
    });
    if read.is_err() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut at = from;
    for line in bytes.split_inclusive(|b| *b == b'\n') {
        let start = at;
        at += line.len() as u64;
        if line.last() != Some(&b'\n') {
            break; // a line still being written
        }
        let Ok(v) = serde_json::from_slice::<Value>(line) else { continue };
        let text = match v.get("type").and_then(Value::as_str) {
            Some("tool.execution_complete") => v.pointer("/data/result/content"),
            Some("user.message") => v.pointer("/data/content"),
            _ => None,
        };
        if let Some(t) = text.and_then(Value::as_str) {
            out.push((start, t.to_string()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_confirmed_only_when_every_part_is_shown() {
        assert_eq!(verdict(&[true, true], &[false, false]), Some((State::Confirmed, None)));
        assert_eq!(verdict(&[true, false], &[false, false]), None, "the last part may still come");
        assert_eq!(verdict(&[false, true], &[false, false]), Some((State::Uncertain, Some(DeliveryReason::PartUnseen.into()))));
        assert_eq!(verdict(&[true, false], &[false, true]), Some((State::Uncertain, Some(DeliveryReason::CopilotExited.into()))));
        assert_eq!(verdict(&[false], &[false]), None);
    }

    #[test]
    fn only_what_the_model_got_after_the_offset_counts() {
        let dir = std::env::temp_dir().join(format!("courier-copilot-confirm-{}-{}", std::process::id(), line!()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("events.jsonl");
        let lines = [
            r#"{"type":"hook.end","data":{"output":{"additionalContext":"MSG-A"}}}"#,
            r#"{"type":"tool.execution_complete","data":{"toolCallId":"c1","result":{"content":"out\n\nguidance:\nMSG-B"}}}"#,
            r#"{"type":"user.message","data":{"content":"MSG-C"}}"#,
            r#"{"type":"tool.execution_complete","data":{"result":{"content":"MSG-D"}}}"#,
        ];
        let text = lines.join("\n") + "\n" + r#"{"type":"user.message","data":{"content":"MSG-E"#;
        std::fs::write(&path, &text).unwrap();
        let got = read_shown(path.to_str().unwrap(), 0);
        let texts: Vec<&str> = got.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(texts, ["out\n\nguidance:\nMSG-B", "MSG-C", "MSG-D"], "hook output alone and a partial line are not shown");
        let from = (lines[0].len() + lines[1].len() + 2) as u64;
        let later = read_shown(path.to_str().unwrap(), from);
        assert_eq!(later.iter().map(|(_, t)| t.as_str()).collect::<Vec<_>>(), ["MSG-C", "MSG-D"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
