//! `courier-bridge serve`: one host's bridge between NATS JetStream and its local broker.
//!
//! **In.** A durable pull consumer (`courier-bridge-NAME`) on `courier.send.NAME` of stream
//! `COURIER`. Each message is one socket `send` request (JSON); its `Nats-Msg-Id` header is the
//! idempotency key. The bridge queues it locally with that same key (through the broker socket's
//! `send`, or the store directly when no broker runs, as `broker send` does), records it in its
//! own small table (`bridge-NAME.sqlite`: id, key, origin, which receipts went out), and only
//! then acks the NATS message. A crash anywhere before the ack means a redelivery, which the
//! local key answers with the same message: never a second one. A request the broker refuses
//! (unknown thread, too large, bad field) is answered with a `refused` receipt and then acked: it
//! is never redelivered. A local failure (database, broker stopped mid-request) is nak'ed and
//! retried after a second.
//!
//! **Out.** The watcher thread looks at the bridged messages' states when the queue database
//! changes (inotify on the state directory, and SQLite's `PRAGMA data_version`, so nothing is
//! read unless some connection committed; a 1 s tick as the floor) and hands every new state to
//! the publisher, which publishes a receipt to `courier.receipt.NAME` (stream `COURIER_RECEIPTS`,
//! `Nats-Msg-Id` = `ID.STATE.SEQ`, so a receipt re-sent after a crash is dropped by JetStream),
//! waits for JetStream's ack, and only then records it as sent.
//!
//! **Threads.** Requests on `courier.threads.NAME` get the host's `broker threads` list.
//!
//! The bridge is a producer of the local broker like `broker send`: it never reaches the hook
//! path, and the sender it shows the model is `nats:<origin>/<label>`.

use crate::nats::{self, Conn};
use anyhow::{Context, Result};
use async_nats::jetstream::{self, AckKind};
use broker::producer::send::{self as psend, SendError, SendOptions, Target};
use broker::store::{now_ms, Store};
use courier_shared::paths;
use courier_shared::wire::ErrorReply;
use futures_util::StreamExt;
use rusqlite::{params, Connection};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc as smpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

pub struct ServeOptions {
    pub conn: Conn,
    pub host: String,
    /// How long NATS waits for an ack before it redelivers.
    pub ack_wait: Duration,
}

/// Receipt states, in the order a message passes them (`leased` is not one: it is internal
/// and may go back to `pending`).
const RECEIPT_STATES: [&str; 6] = ["pending", "handed", "confirmed", "uncertain", "expired", "cancelled"];
const FINAL: [&str; 4] = ["confirmed", "uncertain", "expired", "cancelled"];

fn failpoint(name: &str) {
    if std::env::var("COURIER_BRIDGE_FAILPOINTS").is_ok_and(|v| v.split(',').any(|p| p.trim() == name)) {
        eprintln!("courier-bridge: failpoint {name}: killing myself");
        let _ = nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGKILL);
    }
}

fn log(msg: impl std::fmt::Display) {
    eprintln!("courier-bridge: {msg}");
}

/// The bridge's own record of the messages it queued.
struct Track {
    conn: Connection,
}

/// One unsettled row of the bridge's own table: (id, key, origin, epoch, last state published).
type OpenRow = (String, String, String, i64, Option<String>);

impl Track {
    /// `broker inspect` reads `bridged(id, origin)` of every `bridge-*.sqlite` for its origin
    /// column (`broker::inspect::bridged_origins`): keep those two columns.
    fn open(state_dir: &Path, host: &str) -> Result<Track> {
        let path = state_dir.join(format!("bridge-{host}.sqlite"));
        let conn = Connection::open(&path).with_context(|| format!("opening {}", path.display()))?;
        conn.busy_timeout(Duration::from_secs(5))?;
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;
             CREATE TABLE IF NOT EXISTS bridged (
               id TEXT PRIMARY KEY, key TEXT NOT NULL, origin TEXT NOT NULL, thread TEXT NOT NULL,
               epoch INTEGER NOT NULL, published TEXT, done INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL);
             CREATE INDEX IF NOT EXISTS bridged_open ON bridged(done);",
        )?;
        Ok(Track { conn })
    }

    /// Records a queued message. `epoch` is the NATS stream sequence of the request: a
    /// redelivery has the same one (nothing changes); a new publish of the same key (past
    /// JetStream's duplicate window) opens the message's receipts again, so that producer hears.
    fn note(&self, id: &str, key: &str, origin: &str, thread: &str, epoch: u64) -> Result<()> {
        self.conn.execute(
            "INSERT INTO bridged (id, key, origin, thread, epoch, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT(id) DO UPDATE SET epoch = excluded.epoch, published = NULL, done = 0 WHERE bridged.epoch != excluded.epoch",
            params![id, key, origin, thread, epoch as i64, now_ms()],
        )?;
        Ok(())
    }

    /// Bridged messages not settled yet: (id, key, origin, epoch, last state published).
    fn open_rows(&self) -> Result<Vec<OpenRow>> {
        let mut st = self.conn.prepare_cached("SELECT id, key, origin, epoch, published FROM bridged WHERE done = 0")?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn published(&self, id: &str, epoch: i64, state: &str) -> Result<()> {
        let done = FINAL.contains(&state) || state == "gone";
        self.conn
            .execute("UPDATE bridged SET published = ?3, done = ?4 WHERE id = ?1 AND epoch = ?2", params![id, epoch, state, done as i64])?;
        Ok(())
    }

    fn in_flight(&self) -> Result<i64> {
        Ok(self.conn.query_row("SELECT count(*) FROM bridged WHERE done = 0", [], |r| r.get(0))?)
    }
}

/// One receipt to publish.
#[derive(Debug)]
struct Receipt {
    /// `Nats-Msg-Id` of the receipt.
    msg_id: String,
    body: Value,
    /// What to record as published once JetStream has it (`None`: a refusal, nothing tracked).
    track: Option<(String, i64, String)>,
}

enum Local {
    Queued { id: String, thread: String, duplicate: bool },
    Refused { code: String, message: String },
    Retry(String),
}

const FIELDS: [&str; 9] = ["op", "v", "thread", "cwd", "text", "key", "ttl_ms", "from", "future_thread"];

/// Builds the local `send` request from a NATS message body, or the refusal.
fn local_request(body: &[u8], key: &str, origin: &str) -> Result<Map<String, Value>, (String, String)> {
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
            return Err(bad(format!("key {k} differs from the Nats-Msg-Id header {key:?}")));
        }
    }
    let label = match obj.get("from") {
        None | Some(Value::Null) => "remote".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(bad(format!("from {other}: a string"))),
    };
    let from = format!("nats:{origin}/{label}");
    broker::store::check_from(&from).map_err(|e| bad(format!("the sender label {from:?}: {e:#}")))?;
    obj.insert("op".into(), json!("send"));
    obj.insert("key".into(), json!(key));
    obj.insert("from".into(), json!(from));
    Ok(obj)
}

/// Queues one request on this host, through the broker when it runs, else in the store.
fn enqueue(socket: &Path, state_dir: &Path, codex_home: &Path, req: Map<String, Value>) -> Local {
    let req = Value::Object(req);
    match broker::producer::line::call(socket, &req, Some(Duration::from_secs(30))) {
        Ok(Some(r)) if r["ok"] == json!(true) => {
            let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
            Local::Queued { id: s("id"), thread: s("thread"), duplicate: r["duplicate"] == json!(true) }
        }
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
    let target = match (s("thread"), s("cwd")) {
        (Some(t), None) => Target::Thread(t),
        (None, Some(c)) => Target::Cwd(PathBuf::from(c)),
        _ => return refused("give exactly one of thread and cwd"),
    };
    let Some(text) = s("text") else { return refused("text: a string is required") };
    let ttl_ms = match req.get("ttl_ms") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(t) => Some(t.min(broker::cli::MAX_DURATION.as_millis() as u64) as i64),
            None => return refused("ttl_ms: a number of milliseconds"),
        },
    };
    let wake = match req.get("wake").and_then(Value::as_str) {
        None | Some("auto") => true,
        Some("never") => false,
        Some(w) => return refused(&format!("wake {w:?}: auto or never")),
    };
    let future_thread = req.get("future_thread").and_then(Value::as_bool).unwrap_or(false);
    let opts = SendOptions { target, text, key: s("key"), ttl_ms, from: s("from"), verified_sender: false, future_thread, wake };
    let mut store = match Store::open(state_dir) {
        Ok(s) => s,
        Err(e) => return Local::Retry(format!("opening the queue: {e:#}")),
    };
    match psend::send(&mut store, codex_home, &|| broker::producer::cli::fetch_threads(false, 0), &opts) {
        Ok(sent) => Local::Queued { id: sent.id, thread: sent.thread, duplicate: sent.duplicate },
        Err(SendError::Refused { code, message }) => Local::Refused { code: code.as_str().into(), message },
        Err(SendError::Failed(e)) => Local::Retry(format!("{e:#}")),
    }
}

fn refusal_receipt(host: &str, origin: &str, key: &str, seq: u64, code: &str, message: &str) -> Receipt {
    Receipt {
        msg_id: format!("refused.{seq}"),
        body: json!({
            "v": 1, "id": null, "key": key, "thread": null, "state": "refused", "reason": code,
            "message": message, "at": now_ms(), "host": host, "origin": origin,
        }),
        track: None,
    }
}

/// Publishes `r` until JetStream has it (NATS may be down: the publish is retried).
async fn publish(js: &jetstream::Context, subject: &str, r: &Receipt) {
    let mut pause = Duration::from_millis(200);
    loop {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", r.msg_id.as_str());
        let payload = bytes::Bytes::from(r.body.to_string());
        let sent = match js.publish_with_headers(subject.to_string(), headers, payload).await {
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
/// reports `handed`).
fn receipts_for(m: &broker::store::Message, published: Option<&str>) -> Vec<&'static str> {
    let state = m.state.as_str();
    let state = if state == "leased" { "pending" } else { state };
    let Some(pos) = RECEIPT_STATES.iter().position(|s| *s == state) else { return vec![] };
    let rank = |s: Option<&str>| s.and_then(|s| RECEIPT_STATES.iter().position(|x| *x == s));
    let done = rank(published);
    if done == Some(pos) {
        return vec![];
    }
    let mut out = Vec::new();
    if published.is_none() && pos > 0 {
        out.push("pending");
    }
    if matches!(state, "confirmed" | "uncertain") && m.handed_at.is_some() && done.is_none_or(|d| d < 1) {
        out.push("handed");
    }
    out.push(RECEIPT_STATES[pos]);
    out
}

fn state_time(m: &broker::store::Message, state: &str) -> i64 {
    match state {
        "handed" => m.handed_at.unwrap_or(m.updated_at),
        "confirmed" => m.confirmed_at.unwrap_or(m.updated_at),
        "pending" => m.created_at,
        _ => m.updated_at,
    }
}

/// The watcher thread (see the module docs).
fn watch(state_dir: PathBuf, host: String, pokes: smpsc::Receiver<()>, out: mpsc::UnboundedSender<Receipt>) -> Result<()> {
    let store = Store::open(&state_dir)?;
    let track = Track::open(&state_dir, &host)?;
    // What was handed to the publisher (id -> (epoch, state)), beyond what it recorded yet.
    let mut emitted: HashMap<String, (i64, String)> = HashMap::new();
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
        let rows = match track.open_rows() {
            Ok(r) => r,
            Err(e) => {
                log(format!("reading bridge-{host}.sqlite: {e:#}"));
                continue;
            }
        };
        for (id, key, origin, epoch, published) in rows {
            let m = match broker::producer::load(&store, &id) {
                Ok(m) => m,
                Err(e) => {
                    log(format!("reading message {id}: {e:#}"));
                    continue;
                }
            };
            let Some(m) = m else {
                // Pruned after retention_days: nothing more will happen to it.
                let _ = track.published(&id, epoch, "gone");
                continue;
            };
            let seen = emitted.get(&id).filter(|(e, _)| *e == epoch).map(|(_, s)| s.as_str()).or(published.as_deref());
            for state in receipts_for(&m, seen) {
                let body = json!({
                    "v": 1, "id": m.id, "key": key, "thread": m.thread, "state": state,
                    "reason": if state == m.state.as_str() { m.reason.clone() } else { None },
                    "at": state_time(&m, state), "host": host, "origin": origin, "from": m.from,
                    "event": m.event, "turn_id": m.turn_id,
                });
                let r =
                    Receipt { msg_id: format!("{}.{state}.{epoch}", m.id), body, track: Some((m.id.clone(), epoch, state.to_string())) };
                if out.send(r).is_err() {
                    return Ok(());
                }
                emitted.insert(id.clone(), (epoch, state.to_string()));
            }
        }
    }
}

pub async fn serve(o: ServeOptions) -> Result<()> {
    nats::check_host(&o.host)?;
    let state_dir = paths::state_dir();
    broker::dirs::ensure_private_dir(&state_dir)?;
    let lock_path = state_dir.join(format!("bridge-{}.lock", o.host));
    let lock_file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path)?;
    let lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| anyhow::anyhow!("another courier-bridge for host {} runs already ({}: {e})", o.host, lock_path.display()))?;
    // The lock file names the holder: `broker uninstall` stops the bridge a profile line started.
    {
        use std::io::Write;
        lock.set_len(0)?;
        (&*lock).write_all(format!("{}\n", std::process::id()).as_bytes())?;
    }
    let socket = paths::socket_path(&paths::runtime_dir());
    let codex_home = paths::codex_home();
    let track = Arc::new(Mutex::new(Track::open(&state_dir, &o.host)?));

    let client = o.conn.connect_with_events(&format!("courier-bridge {}", o.host), true, None, true).await?;
    let js = jetstream::new(client.clone());
    let stream = nats::ensure_stream(&js, nats::send_stream_config()).await?;
    nats::ensure_stream(&js, nats::receipt_stream_config()).await?;

    // Receipts: watcher thread -> publisher task.
    let (tx, mut rx) = mpsc::unbounded_channel::<Receipt>();
    let (poke_tx, poke_rx) = smpsc::channel::<()>();
    let notify_poke = poke_tx.clone();
    let db = broker::store::DB_NAME;
    let watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if ev.is_ok_and(|ev| ev.paths.iter().any(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(db)))) {
            let _ = notify_poke.send(());
        }
    })
    .and_then(|mut w| {
        use notify::Watcher;
        w.watch(&state_dir, notify::RecursiveMode::NonRecursive).map(|()| w)
    });
    let _watcher = match watcher {
        Ok(w) => Some(w),
        Err(e) => {
            log(format!("cannot watch {} ({e}); receipts follow within 1 s", state_dir.display()));
            None
        }
    };
    {
        let (sd, host, tx) = (state_dir.clone(), o.host.clone(), tx.clone());
        std::thread::Builder::new().name("receipts".into()).spawn(move || {
            if let Err(e) = watch(sd, host, poke_rx, tx) {
                log(format!("receipt watcher stopped: {e:#}"));
                std::process::exit(1);
            }
        })?;
    }
    {
        let (js, subject, track) = (js.clone(), nats::receipt_subject(&o.host), Arc::clone(&track));
        tokio::spawn(async move {
            while let Some(r) = rx.recv().await {
                publish(&js, &subject, &r).await;
                if let Some((id, epoch, state)) = r.track.clone() {
                    let track = Arc::clone(&track);
                    let _ = tokio::task::spawn_blocking(move || {
                        if let Err(e) = track.lock().unwrap_or_else(|e| e.into_inner()).published(&id, epoch, &state) {
                            log(format!("recording receipt {id} {state}: {e:#}"));
                        }
                    })
                    .await;
                }
            }
        });
    }
    // Threads: request/reply.
    {
        let mut sub = client.subscribe(nats::threads_subject(&o.host)).await?;
        let (client, host) = (client.clone(), o.host.clone());
        tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                let Some(reply) = m.reply.clone() else { continue };
                let ask: Value = serde_json::from_slice(&m.payload).unwrap_or(json!({}));
                let all = ask["all"].as_bool().unwrap_or(false);
                let limit = ask["limit"].as_u64().map_or(broker::producer::threads::DEFAULT_ENDED_LIMIT, |l| l.clamp(1, 10_000) as usize);
                let listed = tokio::task::spawn_blocking(move || broker::producer::cli::fetch_threads(all, limit)).await;
                let answer = match listed {
                    Ok(Ok(t)) => json!({"ok": true, "host": host, "threads": t}),
                    Ok(Err(e)) => json!({"ok": false, "host": host, "error": "failed", "message": format!("{e:#}")}),
                    Err(e) => json!({"ok": false, "host": host, "error": "failed", "message": e.to_string()}),
                };
                let _ = client.publish(reply, answer.to_string().into()).await;
            }
        });
    }

    log(format!(
        "host {}: ready: consuming {} (stream {}), receipts to {}, threads on {}",
        o.host,
        nats::send_subject(&o.host),
        nats::SEND_STREAM,
        nats::receipt_subject(&o.host),
        nats::threads_subject(&o.host)
    ));
    let mut pause = Duration::from_millis(200);
    loop {
        let consumer = match stream.get_or_create_consumer(&nats::durable_name(&o.host), nats::consumer_config(&o.host, o.ack_wait)).await {
            Ok(c) => c,
            Err(e) => {
                log(format!("consumer {}: {e}; retrying in {pause:?}", nats::durable_name(&o.host)));
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        let consumer: jetstream::consumer::PullConsumer = consumer;
        let mut messages = match consumer.messages().await {
            Ok(m) => m,
            Err(e) => {
                log(format!("pulling from {}: {e}; retrying in {pause:?}", nats::durable_name(&o.host)));
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        pause = Duration::from_millis(200);
        while let Some(next) = messages.next().await {
            let m = match next {
                Ok(m) => m,
                Err(e) => {
                    log(format!("pulling: {e}"));
                    if matches!(e.kind(), jetstream::consumer::pull::MessagesErrorKind::ConsumerDeleted) {
                        break;
                    }
                    continue;
                }
            };
            handle(&o.host, &js, &socket, &state_dir, &codex_home, &track, &poke_tx, m).await;
        }
        tokio::time::sleep(pause).await;
    }
}

#[allow(clippy::too_many_arguments)]
async fn handle(
    host: &str,
    js: &jetstream::Context,
    socket: &Path,
    state_dir: &Path,
    codex_home: &Path,
    track: &Arc<Mutex<Track>>,
    poke: &smpsc::Sender<()>,
    m: jetstream::Message,
) {
    let seq = m.info().map(|i| i.stream_sequence).unwrap_or(0);
    let header = |k: &str| m.headers.as_ref().and_then(|h| h.get(k)).map(|v| v.as_str().to_string());
    let key = header("Nats-Msg-Id").filter(|k| !k.is_empty()).unwrap_or_else(|| format!("nats-{host}-{seq}"));
    let origin = header(nats::ORIGIN_HEADER).filter(|o| nats::check_host(o).is_ok()).unwrap_or_else(|| "unknown".into());
    let local = match local_request(&m.payload, &key, &origin) {
        Err((code, message)) => Local::Refused { code, message },
        Ok(req) => {
            let (socket, state_dir, codex_home) = (socket.to_path_buf(), state_dir.to_path_buf(), codex_home.to_path_buf());
            tokio::task::spawn_blocking(move || enqueue(&socket, &state_dir, &codex_home, req))
                .await
                .unwrap_or_else(|e| Local::Retry(e.to_string()))
        }
    };
    match local {
        Local::Queued { id, thread, duplicate } => {
            let noted = {
                let (track, id, key, origin, thread) = (Arc::clone(track), id.clone(), key.clone(), origin.clone(), thread.clone());
                tokio::task::spawn_blocking(move || track.lock().unwrap_or_else(|e| e.into_inner()).note(&id, &key, &origin, &thread, seq))
                    .await
            };
            if let Err(e) = noted.map_err(anyhow::Error::from).and_then(|r| r) {
                log(format!("recording {id} (key {key:?}) failed ({e:#}); NATS will redeliver it"));
                let _ = m.ack_with(AckKind::Nak(Some(Duration::from_secs(1)))).await;
                return;
            }
            let _ = poke.send(());
            failpoint("after_enqueue");
            if let Err(e) = m.double_ack().await {
                log(format!("ack of {key:?} (message {id}) failed: {e}; a redelivery finds the same message"));
            }
            if duplicate {
                log(format!("{key:?} was queued before as {id}"));
            }
        }
        Local::Refused { code, message } => {
            log(format!("refused {key:?} from {origin}: {code}: {message}"));
            publish(js, &nats::receipt_subject(host), &refusal_receipt(host, &origin, &key, seq, &code, &message)).await;
            if let Err(e) = m.double_ack().await {
                log(format!("ack of refused {key:?} failed: {e}"));
            }
        }
        Local::Retry(why) => {
            log(format!("could not queue {key:?} ({why}); NATS redelivers it in 1 s"));
            let _ = m.ack_with(AckKind::Nak(Some(Duration::from_secs(1)))).await;
        }
    }
}

/// `courier-bridge check`: the connection, the stream and the consumer's lag, as one JSON object.
pub async fn check(conn: &Conn, host: &str) -> Result<Value> {
    nats::check_host(host)?;
    let client = tokio::time::timeout(Duration::from_secs(8), conn.connect(&format!("courier-bridge check {host}"), false))
        .await
        .context("connecting to NATS timed out")??;
    let js = jetstream::new(client.clone());
    let mut stream =
        js.get_stream(nats::SEND_STREAM).await.with_context(|| format!("stream {} (has a bridge ever run?)", nats::SEND_STREAM))?;
    let msgs = stream.info().await?.state.messages;
    let mut consumer: jetstream::consumer::PullConsumer = stream
        .get_consumer(&nats::durable_name(host))
        .await
        .map_err(|e| anyhow::anyhow!("consumer {} (has this host's bridge ever run?): {e}", nats::durable_name(host)))?;
    let info = consumer.info().await?;
    let state_dir = paths::state_dir();
    let tracked = state_dir.join(format!("bridge-{host}.sqlite")).exists();
    let in_flight = if tracked { Track::open(&state_dir, host).and_then(|t| t.in_flight()).ok() } else { None };
    Ok(json!({
        "ok": true, "server": client.server_info().server_name, "version": client.server_info().version,
        "stream_messages": msgs, "consumer": info.name, "pending": info.num_pending,
        "ack_pending": info.num_ack_pending, "redelivered": info.num_redelivered, "waiting": info.num_waiting,
        "receipts_open": in_flight,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(state: &str, handed: bool) -> broker::store::Message {
        broker::store::Message {
            id: "m_1".into(),
            thread: "t".into(),
            kind: broker::store::Kind::parse("message").unwrap(),
            state: broker::store::State::parse(state).unwrap(),
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
        }
    }

    #[test]
    fn every_state_passed_is_reported_once() {
        assert_eq!(receipts_for(&msg("pending", false), None), ["pending"]);
        assert_eq!(receipts_for(&msg("leased", false), Some("pending")), Vec::<&str>::new());
        assert_eq!(receipts_for(&msg("confirmed", true), None), ["pending", "handed", "confirmed"]);
        assert_eq!(receipts_for(&msg("confirmed", true), Some("pending")), ["handed", "confirmed"]);
        assert_eq!(receipts_for(&msg("confirmed", true), Some("handed")), ["confirmed"]);
        assert_eq!(receipts_for(&msg("confirmed", true), Some("confirmed")), Vec::<&str>::new());
        assert_eq!(receipts_for(&msg("expired", false), Some("pending")), ["expired"]);
        assert_eq!(receipts_for(&msg("uncertain", true), Some("pending")), ["handed", "uncertain"]);
    }

    #[test]
    fn requests_are_checked_and_labelled() {
        let r = local_request(br#"{"thread":"t","text":"hi","from":"ci"}"#, "k1", "hostb").unwrap();
        assert_eq!(r["from"], "nats:hostb/ci");
        assert_eq!(r["key"], "k1");
        assert_eq!(r["op"], "send");
        let r = local_request(br#"{"op":"send","v":1,"cwd":"/w","text":"hi","key":"k1"}"#, "k1", "b").unwrap();
        assert_eq!(r["from"], "nats:b/remote");
        for bad in [
            &br#"{"thread":"t","text":"hi","key":"other"}"#[..],
            br#"{"thread":"t","text":"hi","wait":"confirmed"}"#,
            br#"{"op":"threads"}"#,
            br#"{"thread":"t","text":"hi","from":"a\u0007b"}"#,
            br#"[1]"#,
            b"nope",
        ] {
            let (code, _) = local_request(bad, "k1", "b").unwrap_err();
            assert_eq!(code, "bad_request", "{}", String::from_utf8_lossy(bad));
        }
        let long = format!(r#"{{"thread":"t","text":"hi","from":"{}"}}"#, "x".repeat(60));
        assert!(local_request(long.as_bytes(), "k", "b").is_err(), "the label with its prefix must fit --from's cap");
    }
}
