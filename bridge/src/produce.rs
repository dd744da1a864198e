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
use courier_producer_proto::rule::receipt_outcome;
use courier_producer_proto::{Outcome, ReceiptState, Want};
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::io::Write;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedReceiver;

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

/// The end of a wait: its outcome, the line for stderr, and the last receipt of this publish.
struct Ended {
    outcome: Outcome,
    line: Option<String>,
    last: Option<Value>,
}

pub async fn send(a: SendArgs) -> Result<u8> {
    nats::check_host(&a.host)?;
    let key = a.key.clone().unwrap_or_else(new_key);
    let (re_tx, reconnected) = tokio::sync::mpsc::unbounded_channel();
    let client = a.conn.connect_with_events(&format!("courier-bridge send from {}", a.origin), false, Some(re_tx), false).await?;
    let js = jetstream::new(client);
    // Receipts are read from the sequence the stream had before the publish, so none can slip past.
    let feed = match a.want {
        Some(_) => Some(Feed::before_publish(&js, nats::receipt_subject(&a.host, &a.origin)).await?),
        None => None,
    };
    let seq = publish(&js, &a, &key).await?;
    if !a.json {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{key}").and_then(|()| out.flush());
    }
    let (Some(want), Some(feed)) = (a.want, feed) else {
        if a.json {
            println!("{}", json!({"key": key, "host": a.host, "seq": seq}));
        }
        return Ok(0);
    };
    let wait = Wait { key: &key, host: &a.host, seq, want, deadline: a.timeout.map(|t| Instant::now() + t), handed: false };
    let end = wait.run(feed, reconnected).await?;
    Ok(report(&a, &key, end))
}

/// Publishes the request with its key; the stream sequence of the publish.
async fn publish(js: &jetstream::Context, a: &SendArgs, key: &str) -> Result<u64> {
    let subject = nats::send_subject(&a.host, &a.origin);
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
    Ok(ack.sequence)
}

/// Prints how the wait ended (the JSON line with `--json`, the reason on stderr); the exit code.
fn report(a: &SendArgs, key: &str, end: Ended) -> u8 {
    if a.json {
        let mut v = end.last.unwrap_or(json!({"key": key, "state": null}));
        v["outcome"] = json!(end.outcome);
        println!("{v}");
    }
    if let Some(l) = end.line {
        eprintln!("courier-bridge send: {l}");
    }
    end.outcome.exit().code()
}

/// This publisher's receipts: an ordered consumer on `COURIER_RECEIPTS`, made again after an
/// error (the server restarted: the ordered consumer was in its memory) from the sequence after
/// the last receipt seen.
struct Feed {
    stream: jetstream::stream::Stream,
    subject: String,
    next_seq: u64,
    messages: Option<consumer::pull::Ordered>,
}

/// What the feed gave.
enum Got {
    Receipt(Box<jetstream::Message>),
    /// The feed broke (or the connection came back): make it again.
    Broken,
    /// The deadline passed.
    TimedOut,
}

impl Feed {
    /// Notes where the receipt stream is before the publish; the consumer is made after it.
    async fn before_publish(js: &jetstream::Context, subject: String) -> Result<Feed> {
        let mut stream = nats::ensure_stream(js, nats::receipt_stream_config()).await?;
        let next_seq = stream.info().await.context("reading the receipt stream")?.state.last_sequence + 1;
        Ok(Feed { stream, subject, next_seq, messages: None })
    }

    async fn open(&self) -> Result<consumer::pull::Ordered> {
        let c = self
            .stream
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subject: self.subject.clone(),
                deliver_policy: consumer::DeliverPolicy::ByStartSequence { start_sequence: self.next_seq },
                ..Default::default()
            })
            .await
            .context("reading receipts (an ordered consumer on COURIER_RECEIPTS)")?;
        c.messages().await.context("reading receipts")
    }

    /// The next receipt, or why there is none; a connection that came back breaks the feed.
    async fn next(&mut self, deadline: Option<Instant>, reconnected: &mut UnboundedReceiver<()>) -> Result<Got> {
        let messages = self.messages.as_mut().expect("the feed is open");
        let step = async {
            tokio::select! {
                n = messages.next() => Some(n),
                _ = reconnected.recv() => None,
            }
        };
        let next = match deadline {
            None => step.await,
            Some(d) => match tokio::time::timeout(d.saturating_duration_since(Instant::now()), step).await {
                Ok(n) => n,
                Err(_) => return Ok(Got::TimedOut),
            },
        };
        match next {
            Some(None) => anyhow::bail!("the receipt feed ended"),
            Some(Some(Ok(m))) => {
                if let Ok(info) = m.info() {
                    self.next_seq = info.stream_sequence + 1;
                }
                Ok(Got::Receipt(Box::new(m)))
            }
            None | Some(Some(Err(_))) => Ok(Got::Broken),
        }
    }

    /// Made again from where it stopped, until it works or the deadline passes (a timeout while
    /// NATS is away is still exit 3).
    async fn reopen(&mut self, deadline: Option<Instant>) {
        while deadline.is_none_or(|d| Instant::now() < d) {
            match self.open().await {
                Ok(f) => {
                    self.messages = Some(f);
                    return;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
    }
}

/// One publish's wait for its receipts.
struct Wait<'a> {
    key: &'a str,
    host: &'a str,
    /// The stream sequence of the publish.
    seq: u64,
    want: Want,
    deadline: Option<Instant>,
    /// A `handed` receipt of this publish came: the message passed `handed` (receipts report
    /// every state passed, in order), as a local row's `handed_at` says.
    handed: bool,
}

impl Wait<'_> {
    async fn run(mut self, mut feed: Feed, mut reconnected: UnboundedReceiver<()>) -> Result<Ended> {
        feed.messages = Some(feed.open().await?);
        let mut last: Option<Value> = None;
        // The first connection's event is no news.
        while reconnected.try_recv().is_ok() {}
        loop {
            let m = match feed.next(self.deadline, &mut reconnected).await? {
                Got::Receipt(m) => m,
                Got::Broken => {
                    feed.reopen(self.deadline).await;
                    continue;
                }
                Got::TimedOut => return Ok(Ended { outcome: Outcome::TimedOut, line: Some(self.timed_out(&last)), last }),
            };
            let Ok(r) = serde_json::from_slice::<Value>(&m.payload) else { continue };
            if !self.is_mine(&r) {
                continue;
            }
            match self.judge(&r) {
                None => last = Some(r),
                Some((outcome, line)) => return Ok(Ended { outcome, line, last: Some(r) }),
            }
        }
    }

    /// Only this publish's receipts: its key (the subject is this publisher's own), reported for
    /// its stream sequence or a later publish of the same key (the same message).
    fn is_mine(&self, r: &Value) -> bool {
        r["key"].as_str() == Some(self.key) && r["seq"].as_u64().is_some_and(|s| s >= self.seq)
    }

    /// What a receipt of this publish ends the wait with, if anything (`None`: still on its
    /// way), by the protocol's one rule ([`receipt_outcome`]).
    fn judge(&mut self, r: &Value) -> Option<(Outcome, Option<String>)> {
        let text = r["state"].as_str().unwrap_or_default();
        let id = r["id"].as_str().unwrap_or(self.key);
        let reason = r["reason"].as_str().unwrap_or("no reason recorded");
        let outcome = match ReceiptState::parse(text) {
            Some(state) => {
                self.handed |= state == ReceiptState::Handed;
                receipt_outcome(state, self.handed, self.want)?
            }
            // A state this side does not know (a newer host's): not the one wanted.
            None => Outcome::Ended,
        };
        let line = match outcome {
            Outcome::Reached => None,
            Outcome::Refused => {
                let message = r["message"].as_str().unwrap_or_default();
                Some(format!("host {} refused {}: {reason}: {message}", self.host, self.key))
            }
            _ => Some(format!("{id} {text} without reaching {} ({reason})", self.want.as_str())),
        };
        Some((outcome, line))
    }

    fn timed_out(&self, last: &Option<Value>) -> String {
        match last {
            None => format!(
                "{}: no receipt from host {} yet (timed out; is its bridge running? the message waits in stream {} and is delivered once when it is)",
                self.key,
                self.host,
                nats::send_stream(self.host)
            ),
            Some(r) => format!("{} still {} (timed out)", r["id"].as_str().unwrap_or(self.key), r["state"].as_str().unwrap_or("?")),
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

    fn receipt(state: ReceiptState) -> Value {
        json!({"v": 1, "id": "m_1", "key": "k", "seq": 7, "state": state, "reason": "reoffer_limit"})
    }

    /// The outcome a remote wait ends with after `states`, in order (`None`: still waiting).
    fn after(states: &[ReceiptState], want: Want) -> Option<Outcome> {
        let mut wait = Wait { key: "k", host: "h", seq: 7, want, deadline: None, handed: false };
        states.iter().find_map(|s| wait.judge(&receipt(*s))).map(|(o, _)| o)
    }

    /// Receipts as the bridge sends them (every state passed) end a remote wait as the local
    /// wait ends on the same message.
    #[test]
    fn receipts_end_the_wait_as_the_local_wait_would() {
        use Outcome::*;
        use ReceiptState as R;
        for (states, handed, confirmed) in [
            (&[R::Pending][..], None, None),
            (&[R::Pending, R::Handed], Some(Reached), None),
            (&[R::Pending, R::Handed, R::Confirmed], Some(Reached), Some(Reached)),
            (&[R::Pending, R::Handed, R::Uncertain], Some(Reached), Some(Ended)),
            (&[R::Pending, R::Expired], Some(Ended), Some(Ended)),
            (&[R::Pending, R::Cancelled], Some(Ended), Some(Ended)),
            (&[R::Refused], Some(Refused), Some(Refused)),
        ] {
            assert_eq!(after(states, Want::Handed), handed, "{states:?}");
            assert_eq!(after(states, Want::Confirmed), confirmed, "{states:?}");
        }
        assert_ne!(new_key(), new_key());
        let codes = [Reached, Refused, TimedOut, Ended].map(|o| o.exit().code());
        assert_eq!(codes, [0, 2, 3, 4], "the exit codes of a local `broker send --wait`");
    }

    /// A message that ends `uncertain` without ever being handed did not pass `handed`: a local
    /// wait says `ended` (its `handed_at` is empty), and the remote wait must agree (no `handed`
    /// receipt of this publish came first).
    #[test]
    fn uncertain_never_handed_did_not_reach_handed() {
        let mut wait = Wait { key: "k", host: "h", seq: 7, want: Want::Handed, deadline: None, handed: false };
        assert_eq!(wait.judge(&receipt(ReceiptState::Pending)), None);
        let ended = wait.judge(&receipt(ReceiptState::Uncertain)).map(|(o, _)| o);
        assert_eq!(ended, Some(Outcome::Ended), "never handed: uncertain did not reach handed");
    }
}
