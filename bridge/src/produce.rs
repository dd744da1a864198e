//! The remote producer: `courier-bridge send` and `courier-bridge threads`.
//!
//! `send` publishes one socket `send` request to `courier.to.HOST.ORIGIN` (ORIGIN: `--origin`,
//! the publisher name the NATS server lets this user publish under) carrying its key (generated
//! when not given; printed on stdout at once, so a retry can reuse it: the host's queue answers a
//! repeat with the same message). No `Nats-Msg-Id`: JetStream's duplicate window is one per
//! stream, not per publisher, so a key there could be taken by another publisher first.
//! With `--wait handed|confirmed` it reads `courier.receipt.HOST.ORIGIN` (an ordered consumer
//! created before the publish, so no receipt can slip past) for receipts of its own publish (its
//! key, and the stream sequence of its publish or a later one of the same key), and exits as
//! a local `broker send --wait` does: 0 reached (or passed), 1 an error, 2 refused by the host
//! (a usage error there: unknown thread, too large, ...), 3 the timeout ran out with the message
//! still queued or handed (or no receipt yet: the host's bridge may be down; the message waits
//! in the stream and is delivered once when it returns), 4 it ended without reaching the state.

use crate::nats::{self, Conn};
use anyhow::{Context, Result};
use async_nats::jetstream::{self, consumer};
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::io::Write;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Want {
    Handed,
    Confirmed,
}

pub struct SendArgs {
    pub conn: Conn,
    pub host: String,
    pub origin: String,
    /// The socket `send` request (thread or cwd, text, from, ttl_ms, future_thread, wake).
    pub request: serde_json::Map<String, Value>,
    pub key: Option<String>,
    pub want: Option<Want>,
    pub timeout: Option<Duration>,
    pub json: bool,
}

/// A fresh key: unique per call (a NUID).
pub fn new_key() -> String {
    format!("nats-{}", nuid::next())
}

/// What a receipt means for a wait.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    InFlight,
    Reached,
    Ended,
    Refused,
}

pub fn verdict(state: &str, want: Want) -> Verdict {
    match state {
        "confirmed" => Verdict::Reached,
        "handed" if want == Want::Handed => Verdict::Reached,
        // `uncertain` was handed: it passed `handed`, never reached `confirmed`.
        "uncertain" if want == Want::Handed => Verdict::Reached,
        "pending" | "leased" | "handed" => Verdict::InFlight,
        "refused" => Verdict::Refused,
        _ => Verdict::Ended,
    }
}

async fn receipts(stream: &jetstream::stream::Stream, subject: &str, start_sequence: u64) -> Result<consumer::pull::Ordered> {
    let policy = consumer::DeliverPolicy::ByStartSequence { start_sequence };
    let c = stream
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: subject.to_string(),
            deliver_policy: policy,
            ..Default::default()
        })
        .await
        .context("reading receipts (an ordered consumer on COURIER_RECEIPTS)")?;
    c.messages().await.context("reading receipts")
}

pub async fn send(a: SendArgs) -> Result<u8> {
    nats::check_host(&a.host)?;
    let key = a.key.clone().unwrap_or_else(new_key);
    let (re_tx, mut reconnected) = tokio::sync::mpsc::unbounded_channel();
    let client = a.conn.connect_with_events(&format!("courier-bridge send from {}", a.origin), false, Some(re_tx), false).await?;
    let js = jetstream::new(client);
    let (subject, receipt_subject) = (nats::send_subject(&a.host, &a.origin), nats::receipt_subject(&a.host, &a.origin));
    // Receipts are read from the sequence the stream had before the publish, so none can slip
    // past; after an error (the server restarted: the ordered consumer was in its memory) the
    // feed is made again from the sequence after the last receipt seen.
    let mut rstream = None;
    let mut next_seq = 1;
    if a.want.is_some() {
        let mut s = nats::ensure_stream(&js, nats::receipt_stream_config()).await?;
        next_seq = s.info().await.context("reading the receipt stream")?.state.last_sequence + 1;
        rstream = Some(s);
    }
    let mut body = a.request.clone();
    body.insert("key".into(), json!(key));
    let ack = js
        .publish(subject.clone(), Value::Object(body).to_string().into())
        .await
        .context("publishing")?
        .await
        .with_context(|| {
            format!(
                "publishing to {subject} (is there a stream {} (host {}'s bridge creates it), and may this NATS user publish to {subject}?)",
                nats::send_stream(&a.host),
                a.host
            )
        })?;
    if ack.duplicate {
        // Never for a publish without Nats-Msg-Id; if a stream dedupes it anyway, this publish is
        // not in the stream, and whatever answers for it is not this producer's.
        anyhow::bail!("JetStream dropped this publish as a duplicate of sequence {}: nothing was sent", ack.sequence);
    }
    if !a.json {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{key}").and_then(|()| out.flush());
    }
    let Some(want) = a.want else {
        if a.json {
            println!("{}", json!({"key": key, "host": a.host, "seq": ack.sequence}));
        }
        return Ok(0);
    };
    let rstream = rstream.expect("receipt stream");
    let mut feed = receipts(&rstream, &receipt_subject, next_seq).await?;
    let deadline = a.timeout.map(|t| Instant::now() + t);
    let mut last: Option<Value> = None;
    let finish = |code: u8, line: Option<String>, last: &Option<Value>| {
        if a.json {
            let mut v = last.clone().unwrap_or(json!({"key": key, "state": null}));
            v["outcome"] = json!(match code {
                0 => "reached",
                3 => "timed_out",
                2 => "refused",
                _ => "ended",
            });
            println!("{v}");
        }
        if let Some(l) = line {
            eprintln!("courier-bridge send: {l}");
        }
        Ok(code)
    };
    // The first connection's event is no news.
    while reconnected.try_recv().is_ok() {}
    loop {
        let step = async {
            tokio::select! {
                n = feed.next() => Some(n),
                _ = reconnected.recv() => None,
            }
        };
        let next = match deadline {
            None => step.await,
            Some(d) => match tokio::time::timeout(d.saturating_duration_since(Instant::now()), step).await {
                Ok(n) => n,
                Err(_) => {
                    let line = match &last {
                        None => format!(
                            "{key}: no receipt from host {} yet (timed out; is its bridge running? the message waits in stream {} and is delivered once when it is)",
                            a.host,
                            nats::send_stream(&a.host)
                        ),
                        Some(r) => format!("{} still {} (timed out)", r["id"].as_str().unwrap_or(&key), r["state"].as_str().unwrap_or("?")),
                    };
                    return finish(3, Some(line), &last);
                }
            },
        };
        // Reconnected (the server restarted: the ordered consumer lived in its memory): the
        // feed is made again from the sequence after the last receipt seen.
        let next = next.unwrap_or(Some(Err(async_nats::jetstream::consumer::pull::OrderedError::new(
            async_nats::jetstream::consumer::pull::OrderedErrorKind::Other,
        ))));
        let m = match next {
            None => anyhow::bail!("the receipt feed ended"),
            Some(Err(_)) => {
                // Made again from where it stopped (bounded by the deadline above: a timeout
                // while NATS is away is still exit 3).
                let again = loop {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        break None;
                    }
                    match receipts(&rstream, &receipt_subject, next_seq).await {
                        Ok(f) => break Some(f),
                        Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
                    }
                };
                if let Some(f) = again {
                    feed = f;
                }
                continue;
            }
            Some(Ok(m)) => m,
        };
        if let Ok(info) = m.info() {
            next_seq = info.stream_sequence + 1;
        }
        let Ok(r) = serde_json::from_slice::<Value>(&m.payload) else { continue };
        // Only this publish's receipts: its key (the subject is this publisher's own), reported
        // for its stream sequence or a later publish of the same key (the same message).
        if r["key"].as_str() != Some(key.as_str()) || r["seq"].as_u64().is_none_or(|s| s < ack.sequence) {
            continue;
        }
        let state = r["state"].as_str().unwrap_or_default().to_string();
        let id = r["id"].as_str().unwrap_or(&key).to_string();
        let reason = r["reason"].as_str().unwrap_or("no reason recorded").to_string();
        match verdict(&state, want) {
            Verdict::InFlight => {
                last = Some(r);
            }
            Verdict::Reached => return finish(0, None, &Some(r)),
            Verdict::Ended => {
                let line =
                    format!("{id} {state} without reaching {} ({reason})", if want == Want::Handed { "handed" } else { "confirmed" });
                return finish(4, Some(line), &Some(r));
            }
            Verdict::Refused => {
                let line = format!("host {} refused {key}: {reason}: {}", a.host, r["message"].as_str().unwrap_or_default());
                return finish(2, Some(line), &Some(r));
            }
        }
    }
}

/// `courier-bridge threads`: the host's bridge answers with its `broker threads` list.
pub async fn threads(conn: &Conn, host: &str, all: bool, limit: Option<u64>, json_out: bool) -> Result<u8> {
    nats::check_host(host)?;
    let client = conn.connect(&format!("courier-bridge threads {host}"), false).await?;
    let ask = json!({"all": all, "limit": limit});
    let reply = tokio::time::timeout(Duration::from_secs(30), client.request(nats::threads_subject(host), ask.to_string().into()))
        .await
        .with_context(|| format!("host {host}'s bridge did not answer within 30 s"))?
        .map_err(|e| match e.kind() {
            async_nats::RequestErrorKind::NoResponders => {
                anyhow::anyhow!("no bridge answers for host {host} (nothing subscribes to {})", nats::threads_subject(host))
            }
            _ => anyhow::anyhow!("asking host {host}'s bridge: {e}"),
        })?;
    let v: Value = serde_json::from_slice(&reply.payload).context("the bridge's reply is not JSON")?;
    if v["ok"] != json!(true) {
        anyhow::bail!("host {host}: {}", v["message"].as_str().unwrap_or("the bridge could not list threads"));
    }
    let text = if json_out {
        broker::terminal::terminal_safe_json(&serde_json::to_string_pretty(&json!({"host": host, "threads": v["threads"]}))?) + "\n"
    } else {
        let list: Vec<broker::producer::threads::ThreadInfo> =
            serde_json::from_value(v["threads"].clone()).context("the thread list does not parse")?;
        broker::producer::threads::render_table(&list, broker::store::now_ms())
    };
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_match_the_local_wait() {
        use Verdict::*;
        for (state, handed, confirmed) in [
            ("pending", InFlight, InFlight),
            ("handed", Reached, InFlight),
            ("confirmed", Reached, Reached),
            ("uncertain", Reached, Ended),
            ("expired", Ended, Ended),
            ("cancelled", Ended, Ended),
            ("refused", Refused, Refused),
        ] {
            assert_eq!(verdict(state, Want::Handed), handed, "{state}");
            assert_eq!(verdict(state, Want::Confirmed), confirmed, "{state}");
        }
        assert_ne!(new_key(), new_key());
    }
}
