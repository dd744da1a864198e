//! Confirmation of Claude Code hand-offs from the session's transcript. Claude Code records each
//! request it sends: an `api-request-blob` holding the exact text of a message sent (hook context
//! included), then an `api-request` whose `tail` names the blobs by hash (probed on 2.1.332). A
//! hand-off is `confirmed` when, after its offset, a blob's text holds every byte of the message
//! as rendered and an `api-request` after it names that blob; `uncertain` (`claude_exited`) when
//! its claude exited first.
//!
//! `uncertain` (`claude_answer_lost`) while claude lives on, when the hook's answer never reached
//! it (the broker stopped before writing it, the hook timed out, the person interrupted the turn
//! while the hook ran): after the offset, a main-conversation `api-request` was written (claude
//! is past the hook: it sends nothing until every PostToolUse of the step has answered) and no
//! record at all holds the message, neither the `hook_additional_context` attachment claude writes
//! when it takes an answer, nor a blob. A context claude took is sent with its next request, or
//! with the next prompt's after an interrupted turn; one it never took is never sent. Probed on
//! 2.1.332: a sub-agent's requests go to its own transcript (`agentId`), side queries (titles)
//! write none. An answer claude took but has not sent keeps the hand-off `handed` until a request
//! carries it or claude exits.
//!
//! A message handed in parts (`store::Part`) is `confirmed` when every part is shown so, each
//! after its own hand-off's offset; `uncertain` `part_unseen` when a later part is shown and an
//! earlier one is not (that part's hook was never answered: it can no longer come), else
//! `claude_answer_lost` when a part's answer was never taken, else `claude_exited` when the
//! claude of a part not shown exited.

use crate::reason::{DeliveryReason, Reason};
use crate::store::{SettledBy, Settlement, State, Store};
use anyhow::Result;
use courier_shared::ids::ThreadId;
use serde_json::Value;
use std::io::{Read, Seek, SeekFrom};
use std::sync::Mutex;

/// Most bytes of a transcript one pass reads (from the oldest open hand-off's offset).
const MAX_READ: u64 = 16 << 20;

/// What one pass of [`reconcile`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// Hand-offs that reached a final state.
    pub settled: usize,
    /// Hand-offs still open: their transcripts are read again next pass.
    pub open: usize,
}

/// Settles the Claude Code hand-offs of `session` (or all): the store is locked to list them and
/// to settle, never across a transcript read.
pub fn reconcile(store: &Mutex<Store>, session: Option<&ThreadId>) -> Result<Pass> {
    let by_transcript = crate::store::lock(store).handed_pieces(session, SettledBy::ClaudeTranscript)?;
    let mut pass = Pass { settled: 0, open: by_transcript.values().map(Vec::len).sum() };
    for (path, handed) in by_transcript {
        // Whose claude is gone is decided before the read: then the read saw all it will write.
        let dead: Vec<Vec<bool>> =
            handed.iter().map(|(_, pieces)| pieces.iter().map(|p| !p.owner.is_some_and(|k| k.is_alive())).collect()).collect();
        let from = handed.iter().flat_map(|(_, pieces)| pieces.iter().map(|p| p.offset)).min().unwrap_or(0);
        let window = read_window(&path, from);
        for ((m, pieces), dead) in handed.iter().zip(dead) {
            let offset = m.scan_offset.unwrap_or(0) as u64;
            let seen: Vec<Verdict> = pieces.iter().map(|p| window.verdict(p.offset, &p.text)).collect();
            let Some((state, reason)) = verdict(&seen, &dead) else { continue };
            let settlement = Settlement { id: m.id.clone(), lease: m.lease, state: Some(state), reason, scan_offset: offset };
            if crate::store::lock(store).settle(&settlement)? {
                crate::log_info!("claude: {} {state} in session {}", m.id, m.thread);
                pass.settled += 1;
                pass.open -= 1;
            }
        }
    }
    Ok(pass)
}

/// What the transcript says of one hand-off.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Verdict {
    /// A request carried it: the model was sent it.
    Shown,
    /// Claude is past the hook and never took it: no request will carry it.
    Lost,
    /// Neither yet.
    Open,
}

/// A message's final state from what the transcript says of each of its pieces and whether each
/// one's claude is `dead`, in order; None while it may still be shown.
fn verdict(pieces: &[Verdict], dead: &[bool]) -> Option<(State, Option<Reason>)> {
    let shown = |i: usize| pieces[i] == Verdict::Shown;
    let unseen = |i: usize| !shown(i) && (i + 1..pieces.len()).any(shown);
    if (0..pieces.len()).all(shown) {
        Some((State::Confirmed, None))
    } else if (0..pieces.len()).any(unseen) {
        // The model saw some of it: say so first, whatever kept a part from it.
        Some((State::Uncertain, Some(DeliveryReason::PartUnseen.into())))
    } else if pieces.contains(&Verdict::Lost) {
        Some((State::Uncertain, Some(DeliveryReason::ClaudeAnswerLost.into())))
    } else if (0..pieces.len()).any(|i| !shown(i) && dead[i]) {
        Some((State::Uncertain, Some(DeliveryReason::ClaudeExited.into())))
    } else {
        None
    }
}

/// One transcript record the scan looks at, with the offset it starts at.
struct Record {
    at: u64,
    kind: Kind,
}

enum Kind {
    /// `api-request-blob`: its hash and the texts of its message's content.
    Blob { hash: String, texts: Vec<String> },
    /// `api-request`: the blob hashes its `tail` names; `main` unless a sub-agent's (`agentId`).
    Request { tail: Vec<String>, main: bool },
}

/// The whole lines of a transcript from `from` (at most [`MAX_READ`] bytes), and its blob and
/// request records.
struct Window {
    from: u64,
    bytes: Vec<u8>,
    records: Vec<Record>,
}

impl Window {
    /// What the records from `offset` say of the hand-off of `text`.
    fn verdict(&self, offset: u64, text: &str) -> Verdict {
        if shown(&self.records, offset, text) {
            Verdict::Shown
        } else if self.requested_since(offset) && !self.mentions_since(offset, text) {
            Verdict::Lost
        } else {
            Verdict::Open
        }
    }

    /// A main-conversation request was written at or after `offset`.
    fn requested_since(&self, offset: u64) -> bool {
        self.records.iter().any(|r| r.at >= offset && matches!(r.kind, Kind::Request { main: true, .. }))
    }

    /// Some record at or after `offset` holds `text`: as a string (an attachment's content, a
    /// blob's text) or as a string inside one (a hook's recorded stdout, JSON in a string).
    fn mentions_since(&self, offset: u64, text: &str) -> bool {
        let bytes = &self.bytes[(offset.saturating_sub(self.from) as usize).min(self.bytes.len())..];
        let once = json_escaped(text);
        let twice = json_escaped(&once);
        [text, &once, &twice].iter().any(|form| bytes.windows(form.len()).any(|w| w == form.as_bytes()))
    }
}

/// `text` as it stands inside a JSON string (without the quotes).
fn json_escaped(text: &str) -> String {
    let quoted = serde_json::to_string(text).unwrap_or_default();
    quoted.get(1..quoted.len().saturating_sub(1)).unwrap_or_default().to_string()
}

/// The [`Window`] of `path` from `from`; empty when it cannot be read.
fn read_window(path: &str, from: u64) -> Window {
    let mut bytes = Vec::new();
    let read = std::fs::File::open(path).and_then(|mut f| {
        f.seek(SeekFrom::Start(from))?;
        f.take(MAX_READ).read_to_end(&mut bytes)
    });
    if read.is_err() {
        bytes.clear();
    }
    // Whole lines only: a record claude is still writing is looked at next pass.
    bytes.truncate(bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1));
    let records = read_records(&bytes, from);
    Window { from, bytes, records }
}

/// The blob and request records of `bytes`, whole lines read from offset `from`.
fn read_records(bytes: &[u8], from: u64) -> Vec<Record> {
    let mut out = Vec::new();
    let mut at = from;
    for line in bytes.split_inclusive(|b| *b == b'\n') {
        let start = at;
        at += line.len() as u64;
        // Cheap filter first: most records are neither.
        if !line.windows(11).any(|w| w == b"api-request") {
            continue;
        }
        let Ok(v) = serde_json::from_slice::<Value>(line) else { continue };
        let strings = |p: &str| -> Vec<String> {
            v.pointer(p).and_then(Value::as_array).into_iter().flatten().filter_map(|x| x.as_str().map(String::from)).collect()
        };
        let kind = match v.get("type").and_then(Value::as_str) {
            Some("api-request-blob") => Kind::Blob {
                hash: v.get("hash").and_then(Value::as_str).unwrap_or_default().to_string(),
                texts: v
                    .pointer("/message/content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c.get("text").and_then(Value::as_str).map(String::from))
                    .collect(),
            },
            Some("api-request") => Kind::Request { tail: strings("/tail"), main: v.get("agentId").is_none() },
            _ => continue,
        };
        out.push(Record { at: start, kind });
    }
    out
}

/// A blob at or after `offset` holds `text` whole in one of its texts, and a request after it
/// names the blob.
fn shown(records: &[Record], offset: u64, text: &str) -> bool {
    records.iter().enumerate().any(|(i, r)| match &r.kind {
        Kind::Blob { hash, texts } if r.at >= offset && !hash.is_empty() && texts.iter().any(|t| t.contains(text)) => {
            records[i + 1..].iter().any(|q| matches!(&q.kind, Kind::Request { tail, .. } if tail.contains(hash)))
        }
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::ProcessKey;
    use crate::store::{Channel, HandOff, NewMessage};
    use std::io::Write;

    /// A store in a fresh directory with one message handed to `owner` through the Claude
    /// channel at the start of `transcript`; returns the store, the message and its rendering.
    fn handed(owner: ProcessKey) -> (Mutex<Store>, std::path::PathBuf, String, String) {
        let dir = courier_shared::scratch::dir("courier-claude-confirm");
        let mut store = Store::open(&dir).unwrap();
        let sid = &ThreadId::from_static("0c6b4b3e-8f2a-4b7e-9d1a-2f3c4d5e6f70");
        let new = NewMessage {
            thread: sid,
            body: "hello claude",
            sender: Some("ci"),
            verified: false,
            key: None,
            ttl_ms: None,
            wake: true,
            mode: Default::default(),
            held: false,
        };
        let crate::store::Enqueued::New(id) = store.enqueue_message(&new).unwrap() else { panic!("a new message") };
        let lease = store.lease(sid, Channel::Claude, Some("p1"), 10_000, 8_000).unwrap().unwrap();
        let transcript = dir.join("t.jsonl");
        std::fs::write(&transcript, "").unwrap();
        assert!(store.hand_off(lease.token, &HandOff::at(&transcript.to_string_lossy(), 0, owner)).unwrap());
        let text = lease.messages[0].wrapped();
        (Mutex::new(store), transcript, id, text)
    }

    fn append(path: &std::path::Path, v: serde_json::Value) {
        let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
        writeln!(f, "{v}").unwrap();
    }

    fn state(store: &Mutex<Store>, id: &str) -> (String, Option<String>) {
        let m = crate::store::lock(store).message(id).unwrap().unwrap();
        (m.state.to_string(), m.reason)
    }

    #[test]
    fn confirmed_only_by_a_blob_holding_the_text_and_a_request_naming_it() {
        let (store, transcript, id, text) = handed(ProcessKey::of(std::process::id() as i32).unwrap());
        let blob = |hash: &str, t: &str| serde_json::json!({"type": "api-request-blob", "hash": hash, "message": {"content": [{"type": "text", "text": t}]}});
        // Part of the text, a blob no request names, a request naming another blob: not shown.
        append(&transcript, blob("h1", &format!("PostToolUse:Bash hook additional context: {}", &text[..text.len() - 3])));
        append(&transcript, blob("h2", &format!("PostToolUse:Bash hook additional context: {text}")));
        append(&transcript, serde_json::json!({"type": "api-request", "tail": ["h1"]}));
        assert_eq!(reconcile(&store, None).unwrap().settled, 0);
        assert_eq!(state(&store, &id).0, "handed", "a live claude keeps it handed");
        append(&transcript, serde_json::json!({"type": "api-request", "tail": ["h0", "h2"]}));
        assert_eq!(reconcile(&store, None).unwrap().settled, 1);
        assert_eq!(state(&store, &id), ("confirmed".into(), None));
    }

    /// A hook answer claude never took: a main-conversation request went out after the hand-off
    /// and no record holds the message. Claude lives on; the hand-off is settled anyway.
    #[test]
    fn a_request_after_the_hand_off_with_no_record_of_it_is_uncertain_claude_answer_lost() {
        let (store, transcript, id, _) = handed(ProcessKey::of(std::process::id() as i32).unwrap());
        append(
            &transcript,
            serde_json::json!({"type": "attachment", "attachment": {"type": "hook_non_blocking_error",
            "hookName": "PostToolUse:Bash", "hookEvent": "PostToolUse", "stderr": "socket hang up"}}),
        );
        assert_eq!(reconcile(&store, None).unwrap().settled, 0, "claude may still be in the hook");
        // A sub-agent's request says nothing of the main conversation's hook.
        append(&transcript, serde_json::json!({"type": "api-request", "agentId": "a1", "tail": ["h9"]}));
        assert_eq!(reconcile(&store, None).unwrap().settled, 0);
        assert_eq!(state(&store, &id).0, "handed");
        append(&transcript, serde_json::json!({"type": "api-request", "tail": ["h1", "h2"]}));
        assert_eq!(reconcile(&store, None).unwrap().settled, 1);
        assert_eq!(state(&store, &id), ("uncertain".into(), Some("claude_answer_lost".into())));
    }

    /// An answer claude took (its attachment or its recorded stdout holds the message) and has not
    /// sent yet is not lost: the next prompt's request may carry it.
    #[test]
    fn an_answer_claude_took_keeps_the_hand_off_handed_until_a_request_carries_it() {
        for record in [
            |t: &str| serde_json::json!({"type": "attachment", "attachment": {"type": "hook_additional_context", "content": [t]}}),
            |t: &str| {
                let answer = serde_json::json!({"hookSpecificOutput": {"additionalContext": t}}).to_string();
                serde_json::json!({"type": "attachment", "attachment": {"type": "hook_success", "stdout": answer}})
            },
        ] {
            let (store, transcript, id, text) = handed(ProcessKey::of(std::process::id() as i32).unwrap());
            append(&transcript, record(&text));
            append(&transcript, serde_json::json!({"type": "api-request", "tail": ["h1"]}));
            assert_eq!(reconcile(&store, None).unwrap().settled, 0);
            assert_eq!(state(&store, &id).0, "handed");
        }
    }

    /// A message in parts: confirmed only with every part shown; a part not shown while a later
    /// one is can never come (`part_unseen`); else it waits for its claude, or its exit.
    #[test]
    fn parts_are_confirmed_only_all_together() {
        use Verdict::{Lost, Open as O, Shown as S};
        let (t, f) = (true, false);
        let lost = Some((State::Uncertain, Some(DeliveryReason::ClaudeAnswerLost.into())));
        let confirmed = Some((State::Confirmed, None));
        let unseen = Some((State::Uncertain, Some(DeliveryReason::PartUnseen.into())));
        let exited = Some((State::Uncertain, Some(DeliveryReason::ClaudeExited.into())));
        assert_eq!(verdict(&[S, S, S], &[f, f, f]), confirmed);
        assert_eq!(verdict(&[S, S, S], &[t, t, t]), confirmed);
        assert_eq!(verdict(&[O, S, S], &[f, f, f]), unseen);
        assert_eq!(verdict(&[S, O, S], &[t, t, t]), unseen);
        assert_eq!(verdict(&[S, Lost, O], &[f, f, f]), lost, "a part claude never took");
        assert_eq!(verdict(&[Lost, S, S], &[f, f, f]), unseen, "the model saw a later part");
        assert_eq!(verdict(&[S, S, O], &[f, f, f]), None, "the last part may still be sent");
        assert_eq!(verdict(&[S, S, O], &[f, f, t]), exited);
        assert_eq!(verdict(&[O], &[f]), None);
    }

    #[test]
    fn a_dead_claude_with_no_request_carrying_it_is_uncertain_claude_exited() {
        // Pid 1's start time is never 1: a process that is not alive.
        let (store, _transcript, id, _) = handed(ProcessKey { pid: 1, starttime: 1 });
        assert_eq!(reconcile(&store, None).unwrap().settled, 1);
        assert_eq!(state(&store, &id), ("uncertain".into(), Some("claude_exited".into())));
    }
}
