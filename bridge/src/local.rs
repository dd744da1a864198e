//! What a NATS request becomes on this host: who sent it (the publisher the subject names, which
//! the server vouches for), its key scoped to that publisher, and the local `send`.

use crate::nats;
use crate::receipts::legacy_receipt_subject;
use crate::track::Taken;
use broker::producer::send::{self as psend, SendError, SendOptions, Target};
use broker::store::Store;
use courier_producer_proto::{Mode, SenderClass, Sent};
use courier_shared::wire::ErrorReply;
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where a request came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// `courier.to.HOST.PUBLISHER` of the host's own stream.
    Current,
    /// `courier.send.HOST` of the shared stream `COURIER`, drained once (`legacy.rs`): the
    /// publisher is only what `Courier-Origin` states, and the key is the old unscoped one.
    Legacy,
}

/// The prefix of a scoped local key: `nats:PUBLISHER:KEY`.
const SCOPED: &str = "nats:";

/// The header that carried the publisher's own name in the shared layout.
const LEGACY_ORIGIN_HEADER: &str = "Courier-Origin";

/// A producer's key: 1 to 200 bytes.
fn usable_key(k: &str) -> bool {
    !k.is_empty() && k.len() <= 200
}

/// Who sent the request and under which key, from its subject, headers and body.
pub fn taken_of(host: &str, source: Source, subject: &str, header: impl Fn(&str) -> Option<String>, body: &[u8], seq: u64) -> Taken {
    let body_key = serde_json::from_slice::<Value>(body).ok().and_then(|v| v["key"].as_str().map(str::to_string)).filter(|k| usable_key(k));
    let fallback = || format!("nats-{host}-{seq}");
    match source {
        Source::Current => {
            // Checked by `local_request`: a name that is not one is refused, never renamed.
            let origin = subject.rsplit('.').next().unwrap_or_default().to_string();
            let key = body_key.unwrap_or_else(fallback);
            Taken { seq, local_key: format!("{SCOPED}{origin}:{key}"), receipts: nats::receipt_subject(host, &origin), origin, key }
        }
        Source::Legacy => {
            let origin = header(LEGACY_ORIGIN_HEADER).filter(|o| nats::check_host(o).is_ok()).unwrap_or_else(|| "unknown".into());
            let key = header("Nats-Msg-Id").filter(|k| !k.is_empty()).unwrap_or_else(fallback);
            Taken { seq, local_key: key.clone(), receipts: legacy_receipt_subject(host), origin, key }
        }
    }
}

pub enum Local {
    Queued { id: String, thread: String, duplicate: bool },
    Refused { code: String, message: String },
    Retry(String),
}

const FIELDS: [&str; 9] = ["op", "v", "thread", "cwd", "text", "key", "ttl_ms", "from", "future_thread"];

/// Builds the local `send` request from a NATS message body, or the refusal.
pub fn local_request(body: &[u8], t: &Taken) -> Result<Map<String, Value>, (String, String)> {
    let (key, origin) = (t.key.as_str(), t.origin.as_str());
    let bad = |m: String| ("bad_request".to_string(), m);
    let v: Value = serde_json::from_slice(body).map_err(|e| bad(format!("not a JSON object: {e}")))?;
    let Value::Object(mut obj) = v else { return Err(bad("not a JSON object".into())) };
    for k in obj.keys() {
        if !FIELDS.contains(&k.as_str()) && k != "wake" {
            let hint =
                if k == "wait" || k == "timeout_ms" { " (a remote producer waits on receipts: courier-bridge send --wait)" } else { "" };
            return Err(bad(format!("unknown field {k:?}{hint}")));
        }
    }
    match obj.remove("op") {
        None => {}
        Some(Value::String(s)) if s == "send" => {}
        Some(other) => return Err(bad(format!("op {other}: only send travels over NATS"))),
    }
    match obj.remove("v") {
        None => {}
        Some(Value::Number(n)) if n.as_u64() == Some(1) => {}
        Some(other) => return Err(bad(format!("unsupported version {other}"))),
    }
    if let Some(k) = obj.get("key") {
        if k.as_str() != Some(key) {
            return Err(bad(format!("key {k} differs from the request's key {key:?} (its Nats-Msg-Id header)")));
        }
    }
    // An unscoped key (the shared layout's) must not pass for another publisher's scoped one.
    if t.local_key == t.key && key.starts_with(SCOPED) {
        return Err(bad(format!("key {key:?}: keys starting with {SCOPED:?} are the bridge's own")));
    }
    nats::check_host(origin).map_err(|e| bad(format!("publisher name {origin:?} (the subject's last token): {e:#}")))?;
    let label = match obj.get("from") {
        None | Some(Value::Null) => "remote".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(bad(format!("from {other}: a string"))),
    };
    let from = format!("nats:{origin}/{label}");
    // Refused here already (the rules are `send`'s), so a bad label gets its receipt at once.
    let from = broker::envelope::label::check_producer(&from).map_err(|e| {
        let code = match e {
            broker::envelope::label::LabelError::Reserved(_) | broker::envelope::label::LabelError::Courier(_) => "reserved_from",
            broker::envelope::label::LabelError::Bad(_) => "bad_from",
        };
        (code.to_string(), format!("the sender label {from:?}: {e}"))
    })?;
    obj.insert("op".into(), json!("send"));
    obj.insert("key".into(), json!(t.local_key));
    obj.insert("from".into(), json!(from));
    Ok(obj)
}

/// Queues one request on this host, through the broker when it runs, else in the store.
pub fn enqueue(socket: &Path, state_dir: &Path, codex_home: &Path, req: Map<String, Value>) -> Local {
    let req = Value::Object(req);
    match broker::producer::line::call(socket, &req, Some(Duration::from_secs(30))) {
        Ok(Some(r)) if r["ok"] == json!(true) => match serde_json::from_value::<Sent>(r) {
            Ok(sent) => Local::Queued { id: sent.id, thread: sent.thread, duplicate: sent.duplicate },
            Err(e) => Local::Retry(format!("failed: the broker's reply to the send does not parse ({e})")),
        },
        Ok(Some(r)) => match ErrorReply::of(&r) {
            // A code this bridge does not know (a newer broker's) is passed on as it came.
            Some(ErrorReply { error, message, .. }) if !error.is_transient() => {
                Local::Refused { code: r["error"].as_str().unwrap_or(error.as_str()).into(), message }
            }
            Some(ErrorReply { error, message, .. }) => Local::Retry(format!("{}: {message}", error.as_str())),
            None => Local::Retry(format!("failed: the broker's reply is neither a result nor an error: {r}")),
        },
        Err(e) => Local::Retry(format!("the broker stopped mid-request: {e:#}")),
        Ok(None) => enqueue_in_store(state_dir, codex_home, &req),
    }
}

fn enqueue_in_store(state_dir: &Path, codex_home: &Path, req: &Value) -> Local {
    let refused = |m: &str| Local::Refused { code: "bad_request".into(), message: m.into() };
    let s = |k: &str| req.get(k).and_then(Value::as_str).map(str::to_string);
    let target = match (s("thread"), s("cwd"), s("to")) {
        (Some(t), None, None) => Target::Thread(t),
        (None, Some(c), None) => Target::Cwd(PathBuf::from(c)),
        (None, None, Some(name)) => Target::Name(name),
        _ => return refused("give exactly one of thread, cwd and to"),
    };
    let mode = match s("mode").as_deref().map(|m| Mode::parse(m).ok_or(m)) {
        None => Mode::Steer,
        Some(Ok(m)) => m,
        Some(Err(m)) => return refused(&format!("mode {m:?}: steer, next-turn or interrupt")),
    };
    let Some(text) = s("text") else { return refused("text: a string is required") };
    let ttl_ms = match req.get("ttl_ms") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            // Checked (more than 0, at most 365 days) by `send`, as on every path.
            Some(t) => Some(t),
            None => return refused("ttl_ms: a number of milliseconds"),
        },
    };
    let wake = match req.get("wake").and_then(Value::as_str) {
        None | Some("auto") => true,
        Some("never") => false,
        Some(w) => return refused(&format!("wake {w:?}: auto or never")),
    };
    let future_thread = req.get("future_thread").and_then(Value::as_bool).unwrap_or(false);
    // Queued by this bridge for a NATS publisher: the NATS class, whatever the label says.
    let class = SenderClass::Nats;
    let opts =
        SendOptions { target, text, key: s("key"), ttl_ms, from: s("from"), verified_sender: false, future_thread, wake, mode, class };
    let mut store = match Store::open(state_dir) {
        Ok(s) => s,
        Err(e) => return Local::Retry(format!("opening the queue: {e:#}")),
    };
    match psend::send(&mut store, codex_home, &|| broker::producer::cli::fetch_threads(false, 0), &opts, None) {
        Ok(sent) => Local::Queued { id: sent.id, thread: sent.thread, duplicate: sent.duplicate },
        Err(SendError::Refused { code, message }) => Local::Refused { code: code.as_str().into(), message },
        Err(SendError::Failed(e)) => Local::Retry(format!("{e:#}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn current(key: &str, origin: &str) -> Taken {
        let subject = nats::send_subject("h", origin);
        taken_of("h", Source::Current, &subject, |_| None, format!(r#"{{"key":"{key}"}}"#).as_bytes(), 5)
    }

    #[test]
    fn the_subject_names_the_publisher_and_scopes_its_key() {
        let t = current("k1", "hostb");
        assert_eq!((t.origin.as_str(), t.key.as_str(), t.local_key.as_str()), ("hostb", "k1", "nats:hostb:k1"));
        assert_eq!(t.receipts, "courier.receipt.h.hostb");
        // A header naming someone else changes nothing.
        let t = taken_of("h", Source::Current, "courier.to.h.mallory", |_| Some("victim".into()), br#"{"key":"k1"}"#, 5);
        assert_eq!((t.origin.as_str(), t.local_key.as_str()), ("mallory", "nats:mallory:k1"));
        let t = taken_of("h", Source::Current, "courier.to.h.ci", |_| None, b"{}", 9);
        assert_eq!(t.key, "nats-h-9");
        let odd = taken_of("h", Source::Current, "courier.to.h.a:b", |_| None, b"{}", 9);
        assert!(local_request(br#"{"thread":"t","text":"hi"}"#, &odd).is_err(), "a publisher name that is not one is refused");
        // The shared layout: the header's origin and key, unscoped, its receipts where they were.
        let hdr = |k: &str| Some(if k == "Nats-Msg-Id" { "old-key" } else { "hostb" }.to_string());
        let t = taken_of("h", Source::Legacy, "courier.send.h", hdr, b"{}", 3);
        assert_eq!((t.origin.as_str(), t.local_key.as_str(), t.receipts.as_str()), ("hostb", "old-key", "courier.receipt.h"));
        let squat = Taken { key: "nats:victim:k".into(), local_key: "nats:victim:k".into(), ..t };
        assert!(local_request(br#"{"thread":"t","text":"hi"}"#, &squat).is_err(), "an old key cannot pass for a scoped one");
    }

    #[test]
    fn requests_are_checked_and_labelled() {
        let r = local_request(br#"{"thread":"t","text":"hi","from":"ci","key":"k1"}"#, &current("k1", "hostb")).unwrap();
        assert_eq!(r["from"], "nats:hostb/ci");
        assert_eq!(r["key"], "nats:hostb:k1");
        assert_eq!(r["op"], "send");
        let r = local_request(br#"{"op":"send","v":1,"cwd":"/w","text":"hi","key":"k1"}"#, &current("k1", "b")).unwrap();
        assert_eq!(r["from"], "nats:b/remote");
        for bad in [
            &br#"{"thread":"t","text":"hi","key":"other"}"#[..],
            br#"{"thread":"t","text":"hi","wait":"confirmed"}"#,
            br#"{"op":"threads"}"#,
            br#"[1]"#,
            b"nope",
        ] {
            let (code, _) = local_request(bad, &current("k1", "b")).unwrap_err();
            assert_eq!(code, "bad_request", "{}", String::from_utf8_lossy(bad));
        }
        let long = format!(r#"{{"thread":"t","text":"hi","from":"{}"}}"#, "x".repeat(60));
        assert!(local_request(long.as_bytes(), &current("k", "b")).is_err(), "the label with its prefix must fit --from's cap");
        // The label rules are `send`'s (broker::label): look-alikes are refused here too.
        for (label, want) in [
            ("a\u{7}b", "bad_from"),
            ("ci\u{FF02} verified=\u{FF02}true", "bad_from"),
            ("ci\u{2236}x", "bad_from"),
            ("v\u{0435}rified", "reserved_from"),
        ] {
            let body = json!({"thread": "t", "text": "hi", "from": label, "key": "k1"}).to_string();
            let (code, _) = local_request(body.as_bytes(), &current("k1", "b")).unwrap_err();
            assert_eq!(code, want, "{label:?}");
        }
        let fullwidth = local_request(br#"{"thread":"t","text":"hi","from":"\uff43i","key":"k"}"#, &current("k", "b")).unwrap();
        assert_eq!(fullwidth["from"], "nats:b/ci");
    }

    /// The bridge's own store path (no broker running) meets `send`'s ttl check as every path
    /// does: 0 and values past 365 days are refused (`bad_ttl`), nothing is queued.
    #[test]
    fn ttl_is_checked_when_the_bridge_queues_itself() {
        let dir = std::env::temp_dir().join(format!("courier-bridge-ttl-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("codex/sessions")).unwrap();
        for ttl in [json!(0), json!(i64::MAX), json!(u64::MAX)] {
            let req = json!({"thread": "01a22654-3b31-76f3-a48c-b65aa7d0db68", "text": "hi", "ttl_ms": ttl, "from": "nats:b/ci"});
            match enqueue_in_store(&dir, &dir.join("codex"), &req) {
                Local::Refused { code, .. } => assert_eq!(code, "bad_ttl", "{ttl}"),
                Local::Queued { .. } => panic!("ttl_ms {ttl} queued"),
                Local::Retry(e) => panic!("ttl_ms {ttl}: {e}"),
            }
        }
        assert!(broker::store::Store::open(&dir).unwrap().messages(None).unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
