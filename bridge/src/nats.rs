//! What every side of the bridge agrees on: subjects, streams (with their limits), the consumer,
//! and how to connect (credentials, nkeys, TLS).
//!
//! | subject | stream | who publishes | who reads |
//! |---|---|---|---|
//! | `courier.to.HOST.PUB` | `COURIER_TO_HOST` (one per host) | producer PUB (the server lets each user publish only its own PUB) | HOST's bridge (durable pull consumer `courier-bridge-HOST`) |
//! | `courier.receipt.HOST.PUB` | `COURIER_RECEIPTS` | HOST's bridge | producer PUB (ordered consumers) |
//! | `courier.threads.HOST` | none (request/reply) | producers | HOST's bridge answers |
//!
//! PUB, the last token of a send's subject, is the publisher as the NATS server vouches for it
//! (its permissions), so it scopes what a producer can touch: its idempotency keys, its receipts
//! and the `nats:PUB/...` name the model sees. A stream per host, with `discard new`, keeps one
//! host's producers from evicting another host's pending sends.
//!
//! The shared layout before it (stream `COURIER` on `courier.send.>`, receipts on
//! `courier.receipt.HOST`) is only drained: see `legacy.rs`.

use anyhow::{bail, Context, Result};
use async_nats::jetstream::{self, consumer, stream};
use std::path::PathBuf;
use std::time::Duration;

pub const RECEIPT_STREAM: &str = "COURIER_RECEIPTS";

/// How long a send waits in its host's stream for the bridge (a host that is off for a week
/// loses its queue; the producer's wait has timed out long before).
pub const SEND_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// Largest send: a body is at most 7,800 bytes; JSON escaping and the other fields fit in 64 KiB.
pub const SEND_MAX_MSG: i32 = 64 * 1024;
/// How long receipts are kept: a producer that starts waiting later than this sees none.
pub const RECEIPT_MAX_AGE: Duration = Duration::from_secs(24 * 3600);
pub const RECEIPT_MAX_BYTES: i64 = 256 << 20;
pub const RECEIPT_DUPLICATE_WINDOW: Duration = Duration::from_secs(3600);

/// What a host's stream holds at most while its bridge does not take the sends; when full it
/// refuses new sends (the producer hears it) and never drops a pending one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendLimits {
    pub max_bytes: i64,
    /// Sends waiting from one publisher (one subject).
    pub max_per_publisher: i64,
}

impl Default for SendLimits {
    fn default() -> SendLimits {
        SendLimits { max_bytes: 256 << 20, max_per_publisher: 1000 }
    }
}

/// The stream of host `host`'s sends.
pub fn send_stream(host: &str) -> String {
    format!("COURIER_TO_{host}")
}
/// Where publisher `publisher` sends to host `host`.
pub fn send_subject(host: &str, publisher: &str) -> String {
    format!("courier.to.{host}.{publisher}")
}
/// Every publisher's sends to `host`.
pub fn send_filter(host: &str) -> String {
    format!("courier.to.{host}.*")
}
/// Where host `host`'s bridge reports the messages of publisher `publisher`.
pub fn receipt_subject(host: &str, publisher: &str) -> String {
    format!("courier.receipt.{host}.{publisher}")
}
pub fn threads_subject(host: &str) -> String {
    format!("courier.threads.{host}")
}
pub fn durable_name(host: &str) -> String {
    format!("courier-bridge-{host}")
}

/// A host name is one subject token and part of a consumer name: letters, digits, `-`, `_`.
/// So is a publisher's name.
pub fn check_host(name: &str) -> Result<()> {
    broker::config::check_bridge_host(name)
}

pub fn send_stream_config(host: &str, limits: SendLimits) -> stream::Config {
    stream::Config {
        name: send_stream(host),
        description: Some(format!("Courier: sends to host {host}, one subject per publisher (courier.to.{host}.PUBLISHER)")),
        subjects: vec![send_filter(host)],
        retention: stream::RetentionPolicy::Limits,
        storage: stream::StorageType::File,
        max_age: SEND_MAX_AGE,
        max_bytes: limits.max_bytes,
        max_messages_per_subject: limits.max_per_publisher,
        max_message_size: SEND_MAX_MSG,
        // Full: refuse the new send (its producer is told), never evict a pending one.
        discard: stream::DiscardPolicy::New,
        discard_new_per_subject: true,
        ..Default::default()
    }
}

pub fn receipt_stream_config() -> stream::Config {
    stream::Config {
        name: RECEIPT_STREAM.into(),
        description: Some("Courier: receipts (state changes of bridged messages), courier.receipt.HOST.PUBLISHER".into()),
        subjects: vec!["courier.receipt.>".into()],
        retention: stream::RetentionPolicy::Limits,
        storage: stream::StorageType::File,
        max_age: RECEIPT_MAX_AGE,
        max_bytes: RECEIPT_MAX_BYTES,
        max_message_size: SEND_MAX_MSG,
        duplicate_window: RECEIPT_DUPLICATE_WINDOW,
        discard: stream::DiscardPolicy::Old,
        ..Default::default()
    }
}

/// Host `host`'s send stream: created when missing; an existing one is used as it is (an
/// operator may have tuned it) unless `limits` were given, which it then gets.
pub async fn ensure_send_stream(js: &jetstream::Context, host: &str, limits: Option<SendLimits>) -> Result<stream::Stream> {
    let config = send_stream_config(host, limits.unwrap_or_default());
    let mut s = ensure_stream(js, config.clone()).await?;
    let Some(l) = limits else { return Ok(s) };
    let info = s.info().await.with_context(|| format!("reading stream {}", config.name))?;
    if info.config.max_bytes != l.max_bytes || info.config.max_messages_per_subject != l.max_per_publisher {
        js.update_stream(config).await.with_context(|| format!("setting the limits of stream {}", send_stream(host)))?;
    }
    Ok(s)
}

/// The stream, created with `config` when missing (an existing stream is used as it is: an
/// operator may have tuned its limits).
pub async fn ensure_stream(js: &jetstream::Context, config: stream::Config) -> Result<stream::Stream> {
    let name = config.name.clone();
    match js.get_stream(&name).await {
        Ok(s) => Ok(s),
        Err(e) if matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(_)) => {
            js.get_or_create_stream(config).await.with_context(|| format!("creating stream {name}"))
        }
        // A denied request only times out (the server reports the violation on the side).
        Err(e) => Err(e).with_context(|| {
            format!(
                "looking up stream {name} (is JetStream enabled: nats-server -js? may this NATS user publish $JS.API.STREAM.INFO.{name}?)"
            )
        }),
    }
}

/// The host's durable pull consumer on its stream.
pub fn consumer_config(host: &str, ack_wait: Duration) -> consumer::pull::Config {
    consumer::pull::Config {
        durable_name: Some(durable_name(host)),
        description: Some(format!("Courier bridge of host {host}")),
        filter_subject: send_filter(host),
        deliver_policy: consumer::DeliverPolicy::All,
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait,
        max_deliver: -1,
        max_ack_pending: 256,
        ..Default::default()
    }
}

/// How to reach NATS: URL (`nats://user:pass@host:4222`, `tls://...`) and credentials.
#[derive(Clone, Debug, Default)]
pub struct Conn {
    pub url: String,
    /// A `.creds` file (user JWT + NKey seed), as `nsc` writes it.
    pub creds: Option<PathBuf>,
    /// A file holding an NKey seed (`SU...`), for servers that list users by NKey.
    pub nkey: Option<PathBuf>,
    /// CA certificate(s) to verify the server with (PEM).
    pub tls_ca: Option<PathBuf>,
    /// Client certificate and key (PEM), for servers that verify clients.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_required: bool,
    /// The subject prefix of this client's reply inboxes (`_INBOX` when unset). Every reply a
    /// client gets (JetStream acks, pulled messages, receipts, thread lists) goes to an inbox,
    /// so a user allowed to subscribe `_INBOX.>` could read everyone's; with a prefix of its
    /// own, a user is granted only `PREFIX.>` (docs/many-hosts.md, "Security and permissions").
    pub inbox_prefix: Option<String>,
}

/// The bridge's inbox prefix when none is given: its own, so its NATS user can be granted
/// `_INBOX.courier-bridge-NAME.>` instead of `_INBOX.>`.
pub fn bridge_inbox_prefix(host: &str) -> String {
    format!("_INBOX.{}", durable_name(host))
}

/// An inbox prefix is a subject without wildcards: dot-separated non-empty tokens.
pub fn check_inbox_prefix(p: &str) -> Result<()> {
    if p.len() > 128 || p.split('.').any(|t| t.is_empty() || t.contains(|c: char| c.is_whitespace() || c == '*' || c == '>')) {
        bail!("inbox prefix {p:?}: dot-separated tokens without blanks or wildcards (e.g. _INBOX.ci-bot)");
    }
    Ok(())
}

impl Conn {
    pub async fn connect(&self, name: &str, retry: bool) -> Result<async_nats::Client> {
        self.connect_with_events(name, retry, None, false).await
    }

    /// As [`Conn::connect`]; `reconnected` hears of every (re)connection, and `log` writes
    /// connection events to stderr.
    pub async fn connect_with_events(
        &self,
        name: &str,
        retry: bool,
        reconnected: Option<tokio::sync::mpsc::UnboundedSender<()>>,
        log: bool,
    ) -> Result<async_nats::Client> {
        let mut o = async_nats::ConnectOptions::new().name(name).connection_timeout(Duration::from_secs(5));
        o = o.event_callback(move |ev| {
            let tx = reconnected.clone();
            async move {
                if log {
                    eprintln!("courier-bridge: NATS: {ev}");
                }
                if matches!(ev, async_nats::Event::Connected) {
                    if let Some(tx) = tx {
                        let _ = tx.send(());
                    }
                }
            }
        });
        match url_auth(&self.url)? {
            Some(UrlAuth::UserPassword(u, p)) => o = o.user_and_password(u, p),
            Some(UrlAuth::Token(t)) => o = o.token(t),
            None => {}
        }
        if let Some(c) = &self.creds {
            o = o.credentials_file(c).await.with_context(|| format!("reading NATS credentials {}", c.display()))?;
        }
        if let Some(n) = &self.nkey {
            let seed = std::fs::read_to_string(n).with_context(|| format!("reading NKey seed {}", n.display()))?;
            o = o.nkey(seed.trim().to_string());
        }
        if let Some(ca) = &self.tls_ca {
            o = o.add_root_certificates(ca.clone());
        }
        match (&self.tls_cert, &self.tls_key) {
            (Some(c), Some(k)) => o = o.add_client_certificate(c.clone(), k.clone()),
            (None, None) => {}
            _ => bail!("--tls-cert and --tls-key go together"),
        }
        if self.tls_required || self.url.starts_with("tls://") {
            o = o.require_tls(true);
        }
        if let Some(p) = &self.inbox_prefix {
            o = o.custom_inbox_prefix(p);
        }
        if retry {
            o = o.retry_on_initial_connect();
        }
        o.connect(self.url.as_str()).await.with_context(|| format!("connecting to NATS at {}", redact(&self.url)))
    }
}

/// Credentials written into the URL (`nats://user:password@host`, `nats://token@host`).
#[derive(Debug, PartialEq)]
enum UrlAuth {
    UserPassword(String, String),
    Token(String),
}

/// async-nats parses a URL's user:password but does not send them: they are taken from the
/// first URL (of a comma-separated list) that has them, percent-decoded.
fn url_auth(urls: &str) -> Result<Option<UrlAuth>> {
    for u in urls.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        let addr: async_nats::ServerAddr = u.parse().with_context(|| format!("NATS URL {:?}", redact(u)))?;
        if let Some(user) = addr.username() {
            let user = percent_decode(user)?;
            return Ok(Some(match addr.password() {
                Some(p) => UrlAuth::UserPassword(user, percent_decode(p)?),
                None => UrlAuth::Token(user),
            }));
        }
    }
    Ok(None)
}

fn percent_decode(s: &str) -> Result<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
            let Some(v) = hex else { bail!("a bad %-escape in the NATS URL's credentials") };
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).context("the NATS URL's credentials are not UTF-8")
}

/// The URL without a password.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(check_host("dev-box_1").is_ok());
        for bad in ["", "a.b", "a*", "a>", "a b", &"x".repeat(65)] {
            assert!(check_host(bad).is_err(), "{bad:?}");
        }
        assert_eq!(send_subject("a", "ci"), "courier.to.a.ci");
        assert_eq!(send_stream_config("a", SendLimits::default()).subjects, [send_filter("a")]);
        assert_eq!(redact("nats://u:p@h:4222"), "nats://***@h:4222");
        assert_eq!(redact("nats://h:4222"), "nats://h:4222");
        assert_eq!(url_auth("nats://h:4222").unwrap(), None);
        assert_eq!(
            url_auth("nats://h1:4222, nats://ci%40x:p%3Aw@h2:4222").unwrap(),
            Some(UrlAuth::UserPassword("ci@x".into(), "p:w".into()))
        );
        assert_eq!(url_auth("tls://s3cret@h:4222").unwrap(), Some(UrlAuth::Token("s3cret".into())));
        assert!(url_auth("nats://u:%zz@h").is_err());
        assert!(check_inbox_prefix("_INBOX.ci-bot").is_ok() && check_inbox_prefix(&bridge_inbox_prefix("h1")).is_ok());
        for bad in ["", "_INBOX.", "_INBOX.>", "a..b", "a.*", "a b"] {
            assert!(check_inbox_prefix(bad).is_err(), "{bad:?}");
        }
    }
}
