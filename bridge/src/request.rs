//! One request from the host's stream, as `serve` and the drain of the shared layout
//! (`legacy.rs`) both handle it: written down in the bridge's record, queued locally with its
//! publisher's key, recorded, and only then acked; a refusal gets a `refused` receipt and an ack,
//! a local failure a nak (retried after a second). See `serve.rs` for why.
//!
//! It holds what handling needs (`Ctx`), so `legacy.rs` needs nothing of `serve.rs` (which
//! starts the drain).

use crate::local::{self, Local, Source};
use crate::log::{failpoint, log};
use crate::receipts;
use crate::track::Track;
use anyhow::Result;
use async_nats::jetstream::{self, AckKind};
use std::path::PathBuf;
use std::sync::mpsc as smpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What handling a request needs.
pub struct Ctx {
    pub host: String,
    pub js: jetstream::Context,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    pub codex_home: PathBuf,
    /// The bridge's own record (`track.rs`).
    pub track: Arc<Mutex<Track>>,
    /// Wakes the receipt watcher.
    pub poke: smpsc::Sender<()>,
}

impl Ctx {
    /// Runs `f` on the bridge's record, off the async thread.
    async fn on_track<T: Send + 'static>(&self, f: impl FnOnce(&mut Track) -> Result<T> + Send + 'static) -> Result<T> {
        let track = Arc::clone(&self.track);
        tokio::task::spawn_blocking(move || f(&mut track.lock().unwrap_or_else(|e| e.into_inner()))).await.map_err(anyhow::Error::from)?
    }
}

/// One request: written down, queued locally, recorded, acked (see the module docs).
pub async fn handle(ctx: &Arc<Ctx>, m: jetstream::Message, source: Source) {
    let seq = m.info().map(|i| i.stream_sequence).unwrap_or(0);
    let header = |k: &str| m.headers.as_ref().and_then(|h| h.get(k)).map(|v| v.as_str().to_string());
    let t = local::taken_of(&ctx.host, source, m.subject.as_str(), header, &m.payload, seq);
    let local = match local::local_request(&m.payload, &t) {
        Err((code, message)) => Local::Refused { code, message },
        Ok(req) => {
            let taken = t.clone();
            if let Err(e) = ctx.on_track(move |tr| tr.take(&taken)).await {
                log(format!("recording request {seq} failed ({e:#}); NATS will redeliver it"));
                let _ = m.ack_with(AckKind::Nak(Some(Duration::from_secs(1)))).await;
                return;
            }
            failpoint("after_take");
            let (socket, state_dir, codex_home) = (ctx.socket.clone(), ctx.state_dir.clone(), ctx.codex_home.clone());
            tokio::task::spawn_blocking(move || local::enqueue(&socket, &state_dir, &codex_home, req))
                .await
                .unwrap_or_else(|e| Local::Retry(e.to_string()))
        }
    };
    let key = &t.key;
    match local {
        Local::Queued { id, thread, duplicate } => {
            let (taken, mid) = (t.clone(), id.clone());
            if let Err(e) = ctx.on_track(move |tr| tr.note(&mid, &thread, &taken)).await {
                log(format!("recording {id} (key {key:?}) failed ({e:#}); NATS will redeliver it"));
                let _ = m.ack_with(AckKind::Nak(Some(Duration::from_secs(1)))).await;
                return;
            }
            let _ = ctx.poke.send(());
            failpoint("after_enqueue");
            if let Err(e) = m.double_ack().await {
                log(format!("ack of {key:?} (message {id}) failed: {e}; a redelivery finds the same message"));
            }
            if duplicate {
                log(format!("{key:?} from {} was queued before as {id}", t.origin));
            }
        }
        Local::Refused { code, message } => {
            log(format!("refused {key:?} from {}: {code}: {message}", t.origin));
            receipts::publish(&ctx.js, &receipts::refusal(&ctx.host, &t, &code, &message)).await;
            let _ = ctx.on_track(move |tr| tr.forget(seq)).await;
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
