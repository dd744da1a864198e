//! `courier-bridge serve`: one host's bridge between NATS JetStream and its local broker.
//!
//! **In.** A durable pull consumer (`courier-bridge-NAME`) on the host's own stream
//! `COURIER_TO_NAME` (subjects `courier.to.NAME.PUBLISHER`). Each message is one socket `send`
//! request (JSON); the publisher is its subject's last token, which the NATS server's
//! permissions vouch for, and its key (the body's `key`) is scoped to that publisher in the
//! local queue (`nats:PUBLISHER:KEY`), so no producer can take another's key. The bridge writes
//! the request down in its own record (`track.rs`), queues it locally with that key (through the
//! broker socket's `send`, or the store directly when no broker runs, as `broker send` does),
//! records the message, and only then acks the NATS message. A crash anywhere before the ack
//! means a redelivery, which the local key answers with the same message: never a second one. A
//! request the broker refuses (unknown thread, too large, bad field) is answered with a
//! `refused` receipt and then acked: it is never redelivered. A local failure (database, broker
//! stopped mid-request) is nak'ed and retried after a second.
//!
//! **Out.** Receipts (`receipts.rs`), to `courier.receipt.NAME.PUBLISHER`.
//!
//! **Threads.** Requests on `courier.threads.NAME` get the host's `broker threads` list.
//!
//! **Approvals.** Pending ones published, approvers' answers taken (`approvals.rs`).
//!
//! The bridge is a producer of the local broker like `broker send`: it never reaches the hook
//! path, and the sender it shows the model is `nats:<publisher>/<label>`.

use crate::legacy;
use crate::local::Source;
use crate::log::log;
use crate::nats::{self, Conn, SendLimits};
use crate::receipts::{self, Receipt};
use crate::request::{handle, Ctx};
use crate::track::Track;
use anyhow::{Context, Result};
use async_nats::jetstream;
use courier_shared::paths;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::sync::mpsc as smpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

pub struct ServeOptions {
    pub conn: Conn,
    pub host: String,
    /// How long NATS waits for an ack before it redelivers.
    pub ack_wait: Duration,
    /// The host stream's limits, when given (else an existing stream keeps its own).
    pub limits: Option<SendLimits>,
    /// NATS users whose answers to this host's approvals are taken (approvals.rs).
    pub approvers: Vec<String>,
}

/// The bridge's lock (`bridge-NAME.lock`, which names its pid: `broker uninstall` stops the
/// bridge a profile line started).
fn lock(state_dir: &std::path::Path, host: &str) -> Result<nix::fcntl::Flock<std::fs::File>> {
    use std::io::Write;
    let lock_path = state_dir.join(format!("bridge-{host}.lock"));
    let lock_file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path)?;
    let lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| anyhow::anyhow!("another courier-bridge for host {host} runs already ({}: {e})", lock_path.display()))?;
    lock.set_len(0)?;
    (&*lock).write_all(format!("{}\n", std::process::id()).as_bytes())?;
    Ok(lock)
}

/// The receipt watcher thread (poked by inotify on the queue database and by each request)
/// and the publisher task it feeds.
fn start_receipts(ctx: &Ctx, poke_rx: smpsc::Receiver<()>) -> Result<Option<notify::RecommendedWatcher>> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Receipt>();
    let notify_poke = ctx.poke.clone();
    let db = broker::store::DB_NAME;
    let watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if ev.is_ok_and(|ev| ev.paths.iter().any(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(db)))) {
            let _ = notify_poke.send(());
        }
    })
    .and_then(|mut w| {
        use notify::Watcher;
        w.watch(&ctx.state_dir, notify::RecursiveMode::NonRecursive).map(|()| w)
    });
    let watcher = match watcher {
        Ok(w) => Some(w),
        Err(e) => {
            log(format!("cannot watch {} ({e}); receipts follow within 1 s", ctx.state_dir.display()));
            None
        }
    };
    let (sd, host) = (ctx.state_dir.clone(), ctx.host.clone());
    std::thread::Builder::new().name("receipts".into()).spawn(move || {
        if let Err(e) = receipts::watch(sd, host, poke_rx, tx) {
            log(format!("receipt watcher stopped: {e:#}"));
            std::process::exit(1);
        }
    })?;
    let (js, track) = (ctx.js.clone(), Arc::clone(&ctx.track));
    tokio::spawn(async move {
        while let Some(r) = rx.recv().await {
            receipts::publish(&js, &r).await;
            if let Some((id, epoch, state)) = r.track.clone() {
                let track = Arc::clone(&track);
                let _ = tokio::task::spawn_blocking(move || {
                    if let Err(e) =
                        track.lock().unwrap_or_else(|e| e.into_inner()).published(&id, epoch, crate::track::Published::Receipt(state))
                    {
                        log(format!("recording receipt {id} {state}: {e:#}"));
                    }
                })
                .await;
            }
        }
    });
    Ok(watcher)
}

/// Answers `courier.threads.NAME` with the host's thread list.
async fn start_threads(client: &async_nats::Client, host: &str) -> Result<()> {
    let mut sub = client.subscribe(nats::threads_subject(host)).await?;
    let (client, host) = (client.clone(), host.to_string());
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
    Ok(())
}

pub async fn serve(o: ServeOptions) -> Result<()> {
    nats::check_host(&o.host)?;
    let state_dir = paths::state_dir();
    broker::dirs::ensure_private_dir(&state_dir)?;
    let _lock = lock(&state_dir, &o.host)?;
    let track = Arc::new(Mutex::new(Track::open(&state_dir, &o.host)?));
    let client = o.conn.connect_with_events(&format!("courier-bridge {}", o.host), true, None, true).await?;
    let js = jetstream::new(client.clone());
    let stream = nats::ensure_send_stream(&js, &o.host, o.limits).await?;
    nats::ensure_stream(&js, nats::receipt_stream_config()).await?;
    let (poke, poke_rx) = smpsc::channel::<()>();
    let ctx = Arc::new(Ctx {
        host: o.host.clone(),
        js,
        socket: paths::socket_path(&paths::runtime_dir()),
        state_dir,
        codex_home: paths::codex_home(),
        track,
        poke,
    });
    let _watcher = start_receipts(&ctx, poke_rx)?;
    start_threads(&client, &o.host).await?;
    crate::approvals::start(&client, &o.host, o.approvers, ctx.socket.clone()).await?;
    tokio::spawn(legacy::drain(Arc::clone(&ctx)));
    consume(&ctx, &stream, o.ack_wait).await
}

/// The consumer loop: made again after an error (the server restarted, the consumer deleted).
/// `ready:` is logged once the consumer exists.
async fn consume(ctx: &Arc<Ctx>, stream: &jetstream::stream::Stream, ack_wait: Duration) -> Result<()> {
    let durable = nats::durable_name(&ctx.host);
    let mut pause = Duration::from_millis(200);
    let mut ready = Some(format!(
        "host {}: ready: consuming {} (stream {}), receipts to {}, threads on {}",
        ctx.host,
        nats::send_filter(&ctx.host),
        nats::send_stream(&ctx.host),
        nats::receipt_subject(&ctx.host, "*"),
        nats::threads_subject(&ctx.host)
    ));
    loop {
        let messages = match stream.get_or_create_consumer(&durable, nats::consumer_config(&ctx.host, ack_wait)).await {
            Ok(c) => {
                let c: jetstream::consumer::PullConsumer = c;
                c.messages().await.map_err(anyhow::Error::from)
            }
            Err(e) => Err(e.into()),
        };
        let mut messages = match messages {
            Ok(m) => m,
            Err(e) => {
                log(format!("consumer {durable}: {e:#}; retrying in {pause:?}"));
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        pause = Duration::from_millis(200);
        if let Some(line) = ready.take() {
            log(line);
        }
        while let Some(next) = messages.next().await {
            match next {
                Ok(m) => handle(ctx, m, Source::Current).await,
                Err(e) => {
                    log(format!("pulling: {e}"));
                    if matches!(e.kind(), jetstream::consumer::pull::MessagesErrorKind::ConsumerDeleted) {
                        break;
                    }
                }
            }
        }
        tokio::time::sleep(pause).await;
    }
}

/// `courier-bridge check`: the connection, the stream and the consumer's lag, as one JSON object.
pub async fn check(conn: &Conn, host: &str) -> Result<Value> {
    nats::check_host(host)?;
    let client = tokio::time::timeout(Duration::from_secs(8), conn.connect(&format!("courier-bridge check {host}"), false))
        .await
        .context("connecting to NATS timed out")??;
    let js = jetstream::new(client.clone());
    let stream_name = nats::send_stream(host);
    let mut stream =
        js.get_stream(&stream_name).await.with_context(|| format!("stream {stream_name} (has this host's bridge ever run?)"))?;
    let msgs = stream.info().await?.state.messages;
    let mut consumer: jetstream::consumer::PullConsumer = stream
        .get_consumer(&nats::durable_name(host))
        .await
        .map_err(|e| anyhow::anyhow!("consumer {} (has this host's bridge ever run?): {e}", nats::durable_name(host)))?;
    let info = consumer.info().await?;
    let state_dir = paths::state_dir();
    let tracked = state_dir.join(format!("bridge-{host}.sqlite")).exists();
    let in_flight = if tracked { crate::track::Track::open(&state_dir, host).and_then(|t| t.in_flight()).ok() } else { None };
    Ok(json!({
        "ok": true, "server": client.server_info().server_name, "version": client.server_info().version,
        "stream_messages": msgs, "consumer": info.name, "pending": info.num_pending,
        "ack_pending": info.num_ack_pending, "redelivered": info.num_redelivered, "waiting": info.num_waiting,
        "receipts_open": in_flight,
    }))
}
