//! The shared layout before per-host streams: one stream `COURIER` on `courier.send.>` for every
//! host, the publisher's name in a header (`Courier-Origin`) and the key in `Nats-Msg-Id`.
//!
//! A bridge of this version never reads it for new sends. At start it drains what still waits
//! there for its host (through its old durable consumer `courier-bridge-NAME`, the way the old
//! bridge did: origin and key as published, receipts to `courier.receipt.NAME`), so nothing a
//! producer was acked for is lost, then deletes that consumer. The stream itself is left to the
//! operator (other hosts may still drain it): `nats stream rm COURIER` once every bridge runs
//! this version, so an old producer's publish fails instead of waiting there unread.

use crate::local::Source;
use crate::log::log;
use crate::nats;
use crate::request::{handle, Ctx};
use async_nats::jetstream::consumer::PullConsumer;
use futures_util::StreamExt;
use std::sync::Arc;
use std::time::Duration;

pub const LEGACY_STREAM: &str = "COURIER";

/// Drains host `ctx.host`'s sends from `COURIER` (see the module docs); returns when there is
/// nothing (left) to drain.
pub async fn drain(ctx: Arc<Ctx>) {
    // Missing, or this user may not look (then it has no consumer there to drain either).
    let Ok(stream) = ctx.js.get_stream(LEGACY_STREAM).await else { return };
    let durable = nats::durable_name(&ctx.host);
    let Ok(mut consumer) = stream.get_consumer::<async_nats::jetstream::consumer::pull::Config>(&durable).await else {
        log(format!(
            "stream {LEGACY_STREAM} of the shared layout exists; host {} has no consumer there (or no right to look at it)",
            ctx.host
        ));
        return;
    };
    let consumer: &mut PullConsumer = &mut consumer;
    log(format!("draining host {}'s sends from stream {LEGACY_STREAM} (the shared layout)", ctx.host));
    let mut drained = 0;
    loop {
        let mut got = 0;
        if let Ok(mut batch) = consumer.fetch().max_messages(64).expires(Duration::from_secs(1)).messages().await {
            while let Some(Ok(m)) = batch.next().await {
                got += 1;
                handle(&ctx, m, Source::Legacy).await;
            }
        }
        drained += got;
        if got > 0 {
            continue;
        }
        // Nothing came: done when nothing waits or is unacked (a nak'ed one comes back).
        match consumer.info().await {
            Ok(i) if i.num_pending == 0 && i.num_ack_pending == 0 => break,
            Ok(_) => tokio::time::sleep(Duration::from_secs(1)).await,
            Err(e) => {
                log(format!("draining {LEGACY_STREAM}: {e}; stopped (the next start goes on)"));
                return;
            }
        }
    }
    match stream.delete_consumer(&durable).await {
        Ok(_) => log(format!(
            "drained {drained} send(s) of host {} from stream {LEGACY_STREAM}; its consumer {durable} is deleted \
             (remove the stream once every host's bridge runs this version: nats stream rm {LEGACY_STREAM})",
            ctx.host
        )),
        Err(e) => log(format!("drained {drained} send(s) from {LEGACY_STREAM}; deleting consumer {durable}: {e} (delete it by hand)")),
    }
}
