//! Receipts: the watcher thread looks at the bridged messages' states when the queue database
//! changes (inotify on the state directory, and SQLite's `PRAGMA data_version`, so nothing is
//! read unless some connection committed; a 1 s tick as the floor) and hands every new state to
//! the publisher, which publishes a receipt to the request's receipt subject
//! (`courier.receipt.HOST.PUBLISHER`, stream `COURIER_RECEIPTS`, `Nats-Msg-Id` =
//! `HOST.ID.STATE.SEQ`, so a receipt re-sent after a crash is dropped by JetStream), waits for
//! JetStream's ack, and only then records it as sent.
//!
//! Each pass first looks up the requests the bridge took but whose message it never learned
//! (killed while the local `send` waited): the queue has it under its local key, or not yet.

use crate::log::log;
use crate::track::{OpenRow, Published, Taken, Track};
use async_nats::jetstream;
use broker::store::{now_ms, Message, Store};
use courier_producer_proto::ReceiptState;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc as smpsc;
use std::time::Duration;
use tokio::sync::mpsc;

/// One receipt to publish.
#[derive(Debug)]
pub struct Receipt {
    pub subject: String,
    /// `Nats-Msg-Id` of the receipt.
    pub msg_id: String,
    pub body: Value,
    /// What to record as published once JetStream has it (`None`: a refusal, nothing tracked).
    pub track: Option<(String, i64, ReceiptState)>,
}

/// The receipt subject of the shared layout, for rows recorded then.
pub fn legacy_receipt_subject(host: &str) -> String {
    format!("courier.receipt.{host}")
}

pub fn refusal(host: &str, t: &Taken, code: &str, message: &str) -> Receipt {
    Receipt {
        subject: t.receipts.clone(),
        msg_id: format!("{host}.refused.{}", t.seq),
        body: json!({
            "v": 1, "id": null, "key": t.key, "seq": t.seq, "thread": null, "state": ReceiptState::Refused, "reason": code,
            "message": message, "at": now_ms(), "host": host, "origin": t.origin,
        }),
        track: None,
    }
}

/// Publishes `r` until JetStream has it (NATS may be down: the publish is retried).
pub async fn publish(js: &jetstream::Context, r: &Receipt) {
    let mut pause = Duration::from_millis(200);
    loop {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", r.msg_id.as_str());
        let payload = bytes::Bytes::from(r.body.to_string());
        let sent = match js.publish_with_headers(r.subject.clone(), headers, payload).await {
            Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match sent {
            Ok(()) => return,
            Err(e) => {
                log(format!("publishing receipt {} failed ({e}); retrying in {pause:?}", r.msg_id));
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// The receipts a message's state calls for, after `published` went out: every state passed
/// since, in order (a message that went from pending to confirmed between two looks also
/// reports `handed`; one never handed reports no `handed`, so a remote wait judges `uncertain` as
/// the local one does).
pub fn receipts_for(m: &Message, published: Option<ReceiptState>) -> Vec<ReceiptState> {
    let Some(state) = ReceiptState::of(m.state) else { return vec![] };
    let rank = |s: ReceiptState| ReceiptState::PASSED.iter().position(|x| *x == s);
    let Some(pos) = rank(state) else { return vec![] };
    let done = published.and_then(rank);
    if done == Some(pos) {
        return vec![];
    }
    let mut out = Vec::new();
    if published.is_none() && state != ReceiptState::Pending {
        out.push(ReceiptState::Pending);
    }
    let past_handed = matches!(state, ReceiptState::Confirmed | ReceiptState::Uncertain);
    if past_handed && m.handed_at.is_some() && done < rank(ReceiptState::Handed) {
        out.push(ReceiptState::Handed);
    }
    out.push(state);
    out
}

fn state_time(m: &Message, state: ReceiptState) -> i64 {
    match state {
        ReceiptState::Handed => m.handed_at.unwrap_or(m.updated_at),
        ReceiptState::Confirmed => m.confirmed_at.unwrap_or(m.updated_at),
        ReceiptState::Pending => m.created_at,
        _ => m.updated_at,
    }
}

/// The queue, opened again until it opens: a queue locked when the bridge starts must not
/// stop its receipts.
fn open_store(state_dir: &Path) -> Store {
    loop {
        match Store::open(state_dir) {
            Ok(s) => return s,
            Err(e) => {
                log(format!("opening the queue for receipts: {e:#}; trying again in 1 s"));
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// The messages of requests taken but never recorded: found by their local key, noted.
fn resolve_taken(store: &Store, track: &mut Track) {
    let taken = match track.taken() {
        Ok(t) => t,
        Err(e) => return log(format!("reading the taken requests: {e:#}")),
    };
    for t in taken {
        match store.message_by_key(&t.local_key) {
            Ok(Some(m)) => {
                if let Err(e) = track.note(&m.id, m.thread.as_str(), &t) {
                    log(format!("recording {} (key {:?}): {e:#}", m.id, t.key));
                }
            }
            // Not queued (yet): the broker may still be on it, or NATS redelivers the request.
            Ok(None) => {}
            Err(e) => log(format!("looking up key {:?}: {e:#}", t.local_key)),
        }
    }
}

/// What a pass knows was handed to the publisher (id -> (epoch, state)), beyond what it recorded.
type Emitted = HashMap<String, (i64, ReceiptState)>;

/// The receipts `row` calls for, to `out`; false once the publisher is gone.
fn report(store: &Store, track: &Track, host: &str, row: OpenRow, emitted: &mut Emitted, out: &mpsc::UnboundedSender<Receipt>) -> bool {
    let m = match store.message(&row.id) {
        Ok(Some(m)) => m,
        Ok(None) => {
            // Pruned after retention_days: nothing more will happen to it.
            let _ = track.published(&row.id, row.epoch, Published::Gone);
            return true;
        }
        Err(e) => {
            log(format!("reading message {}: {e:#}", row.id));
            return true;
        }
    };
    let seen = emitted.get(&row.id).filter(|(e, _)| *e == row.epoch).map(|(_, s)| *s).or(row.published);
    let subject = row.receipts.clone().unwrap_or_else(|| legacy_receipt_subject(host));
    for state in receipts_for(&m, seen) {
        let body = json!({
            "v": 1, "id": m.id, "key": row.key, "seq": row.epoch, "thread": m.thread, "state": state,
            "reason": if Some(state) == ReceiptState::of(m.state) { m.reason.clone() } else { None },
            "at": state_time(&m, state), "host": host, "origin": row.origin, "from": m.from,
            "event": m.event, "turn_id": m.turn_id,
        });
        let r = Receipt {
            subject: subject.clone(),
            msg_id: format!("{host}.{}.{state}.{}", m.id, row.epoch),
            body,
            track: Some((m.id.clone(), row.epoch, state)),
        };
        if out.send(r).is_err() {
            return false;
        }
        emitted.insert(row.id.clone(), (row.epoch, state));
    }
    true
}

/// The watcher thread (see the module docs).
pub fn watch(state_dir: PathBuf, host: String, pokes: smpsc::Receiver<()>, out: mpsc::UnboundedSender<Receipt>) -> anyhow::Result<()> {
    let store = open_store(&state_dir);
    let mut track = Track::open(&state_dir, &host)?;
    let mut emitted = Emitted::new();
    let mut last_version: Option<i64> = None;
    let mut first = true;
    loop {
        let poked = first || pokes.recv_timeout(Duration::from_secs(1)).is_ok();
        first = false;
        while pokes.try_recv().is_ok() {}
        let version: Option<i64> = store.data_version();
        if !poked && version == last_version && version.is_some() {
            continue;
        }
        last_version = version;
        resolve_taken(&store, &mut track);
        let rows = match track.open_rows() {
            Ok(r) => r,
            Err(e) => {
                log(format!("reading bridge-{host}.sqlite: {e:#}"));
                continue;
            }
        };
        for row in rows {
            if !report(&store, &track, &host, row, &mut emitted, &out) {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use courier_producer_proto::State;

    fn msg(state: State, handed: bool) -> Message {
        Message {
            id: "m_1".into(),
            thread: courier_shared::ids::ThreadId::from_static("01a22652-96c4-7652-bf64-6f7bc9883ce2"),
            kind: broker::store::Kind::Message,
            state,
            body: String::new(),
            from: None,
            key: None,
            created_at: 1,
            updated_at: 2,
            expires_at: None,
            event: None,
            turn_id: None,
            lease: None,
            handed_at: handed.then_some(3),
            confirmed_at: None,
            reason: None,
            attempts: 0,
            rollout_path: None,
            scan_offset: None,
            alarms: Vec::new(),
            shown_by: None,
            sender_check: None,
            mode: Default::default(),
        }
    }

    #[test]
    fn every_state_passed_is_reported_once() {
        use ReceiptState as R;
        assert_eq!(receipts_for(&msg(State::Pending, false), None), [R::Pending]);
        assert_eq!(receipts_for(&msg(State::Leased, false), Some(R::Pending)), Vec::<R>::new());
        assert_eq!(receipts_for(&msg(State::Confirmed, true), None), [R::Pending, R::Handed, R::Confirmed]);
        assert_eq!(receipts_for(&msg(State::Confirmed, true), Some(R::Pending)), [R::Handed, R::Confirmed]);
        assert_eq!(receipts_for(&msg(State::Confirmed, true), Some(R::Handed)), [R::Confirmed]);
        assert_eq!(receipts_for(&msg(State::Confirmed, true), Some(R::Confirmed)), Vec::<R>::new());
        assert_eq!(receipts_for(&msg(State::Expired, false), Some(R::Pending)), [R::Expired]);
        assert_eq!(receipts_for(&msg(State::Uncertain, true), Some(R::Pending)), [R::Handed, R::Uncertain]);
        assert_eq!(receipts_for(&msg(State::Uncertain, false), Some(R::Pending)), [R::Uncertain], "never handed: no handed receipt");
        assert_eq!(receipts_for(&msg(State::Applied, false), None), Vec::<R>::new(), "effort rows are never bridged");
    }
}
