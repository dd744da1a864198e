//! Confirmation of Claude Code hand-offs from the session's transcript. Claude Code records each
//! request it sends: an `api-request-blob` holding the exact text of a message sent (hook context
//! included), then an `api-request` whose `tail` names the blobs by hash (probed on 2.1.332). A
//! hand-off is `confirmed` when, after its offset, a blob's text holds every byte of the message
//! as rendered and an `api-request` after it names that blob; `uncertain` (`claude_exited`) when
//! its claude exited first. Nothing else settles it: a claude that lives on keeps it `handed`.

use crate::os::ProcessKey;
use crate::reason::DeliveryReason;
use crate::store::{Channel, Message, Settlement, State, Store};
use anyhow::Result;
use courier_shared::ids::ThreadId;
use serde_json::Value;
use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::sync::Mutex;

/// Most bytes of a transcript one pass reads (from the oldest open hand-off's offset).
const MAX_READ: u64 = 16 << 20;

/// Settles the Claude Code hand-offs of `session` (or all): the store is locked to list them and
/// to settle, never across a transcript read. Returns how many reached a final state.
pub fn reconcile(store: &Mutex<Store>, session: Option<&ThreadId>) -> Result<usize> {
    let mut by_transcript: HashMap<String, Vec<(Message, Option<ProcessKey>)>> = HashMap::new();
    {
        let store = crate::store::lock(store);
        for m in store.handed(session)?.into_iter().filter(|m| m.event.is_some_and(Channel::is_claude)) {
            let owner = match m.lease {
                Some(t) => store.codex_of(t)?.map(|(pid, starttime)| ProcessKey { pid, starttime }),
                None => None,
            };
            if let Some(path) = m.rollout_path.clone() {
                by_transcript.entry(path).or_default().push((m, owner));
            }
        }
    }
    let mut settled = 0;
    for (path, handed) in by_transcript {
        // Whose claude is gone is decided before the read: then the read saw all it will write.
        let dead: Vec<bool> = handed.iter().map(|(_, owner)| !owner.is_some_and(|k| k.is_alive())).collect();
        let from = handed.iter().map(|(m, _)| m.scan_offset.unwrap_or(0) as u64).min().unwrap_or(0);
        let records = read_records(&path, from);
        for ((m, _), dead) in handed.iter().zip(dead) {
            let offset = m.scan_offset.unwrap_or(0) as u64;
            let (state, reason) = match (shown(&records, offset, &m.wrapped()), dead) {
                (true, _) => (State::Confirmed, None),
                (false, true) => (State::Uncertain, Some(DeliveryReason::ClaudeExited.into())),
                (false, false) => continue,
            };
            let settlement = Settlement { id: m.id.clone(), lease: m.lease, state: Some(state), reason, scan_offset: offset };
            if crate::store::lock(store).settle(&settlement)? {
                crate::log_info!("claude: {} {state} in session {}", m.id, m.thread);
                settled += 1;
            }
        }
    }
    Ok(settled)
}

/// One transcript record the scan looks at, with the offset it starts at.
struct Record {
    at: u64,
    kind: Kind,
}

enum Kind {
    /// `api-request-blob`: its hash and the texts of its message's content.
    Blob { hash: String, texts: Vec<String> },
    /// `api-request`: the blob hashes its `tail` names.
    Request { tail: Vec<String> },
}

/// The blob and request records of `path` from `from` (whole lines only, at most [`MAX_READ`]).
fn read_records(path: &str, from: u64) -> Vec<Record> {
    let mut buf = Vec::new();
    let read = std::fs::File::open(path).and_then(|mut f| {
        f.seek(SeekFrom::Start(from))?;
        f.take(MAX_READ).read_to_end(&mut buf)
    });
    if read.is_err() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut at = from;
    for line in buf.split_inclusive(|b| *b == b'\n').filter(|l| l.ends_with(b"\n")) {
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
            Some("api-request") => Kind::Request { tail: strings("/tail") },
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
            records[i + 1..].iter().any(|q| matches!(&q.kind, Kind::Request { tail } if tail.contains(hash)))
        }
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{HandOff, NewMessage};
    use std::io::Write;

    /// A store in a fresh directory with one message handed to `owner` through the Claude
    /// channel at the start of `transcript`; returns the store, the message and its rendering.
    fn handed(owner: ProcessKey) -> (Mutex<Store>, std::path::PathBuf, String, String) {
        let dir = std::env::temp_dir().join(format!("courier-claude-confirm-{}-{}", std::process::id(), crate::store::now_ms()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut store = Store::open(&dir).unwrap();
        let sid = &ThreadId::from_static("0c6b4b3e-8f2a-4b7e-9d1a-2f3c4d5e6f70");
        let new =
            NewMessage { thread: sid, body: "hello claude", sender: Some("ci"), verified: false, key: None, ttl_ms: None, wake: true };
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
        assert_eq!(reconcile(&store, None).unwrap(), 0);
        assert_eq!(state(&store, &id).0, "handed", "a live claude keeps it handed");
        append(&transcript, serde_json::json!({"type": "api-request", "tail": ["h0", "h2"]}));
        assert_eq!(reconcile(&store, None).unwrap(), 1);
        assert_eq!(state(&store, &id), ("confirmed".into(), None));
    }

    #[test]
    fn a_dead_claude_with_no_request_carrying_it_is_uncertain_claude_exited() {
        // Pid 1's start time is never 1: a process that is not alive.
        let (store, _transcript, id, _) = handed(ProcessKey { pid: 1, starttime: 1 });
        assert_eq!(reconcile(&store, None).unwrap(), 1);
        assert_eq!(state(&store, &id), ("uncertain".into(), Some("claude_exited".into())));
    }
}
