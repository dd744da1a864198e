//! `courier-bridge`: Courier across hosts over NATS JetStream (docs/many-hosts.md).
//!
//! - `courier-bridge serve --nats URL --host NAME`: this host's bridge (beside its broker);
//! - `courier-bridge send --nats URL --host NAME ...`: the remote producer;
//! - `courier-bridge threads --nats URL --host NAME`: a host's thread list;
//! - `courier-bridge check --nats URL --host NAME`: connection and consumer lag (for `broker doctor`).
//!
//! tokio and async-nats live only here: the broker and the hook-client never link them.

mod approvals;
mod legacy;
mod local;
mod log;
mod nats;
mod produce;
mod receipts;
mod request;
mod serve;
mod track;

use anyhow::{bail, Result};
use courier_producer_proto::{Exit, Want};
use lexopt::prelude::*;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::ffi::OsString;
use std::process::ExitCode;

const USAGE: &str = "courier-bridge: Courier across hosts over NATS JetStream

usage:
  courier-bridge serve   [--nats URL --host NAME] [--ack-wait D] [--max-bytes SIZE] [--max-per-producer N]
                         [--approvers USER,USER] [AUTH]
  courier-bridge send    --nats URL --host NAME (--thread UUID | --cwd PATH) [--key K] [--ttl D]
                         [--from LABEL] [--origin NAME] [--future-thread] [--wake auto|never]
                         [--wait handed|confirmed [--timeout D]] [--json] [AUTH] TEXT|-
  courier-bridge threads --nats URL --host NAME [--all] [--limit N] [--json] [AUTH]
  courier-bridge check   --nats URL --host NAME [AUTH]
  courier-bridge nkey    FILE    a new user NKey: its seed into FILE (0600, never overwritten),
                                 its public key (U...) on stdout, for nats-server.conf's users

AUTH: --creds FILE (a .creds file: user JWT + NKey seed), --nkey FILE (an NKey seed),
      --tls-ca FILE, --tls-cert FILE --tls-key FILE, --tls-required; user:password may be in the URL;
      --inbox-prefix P: reply inboxes under P (grant the user only P.>; serve's and check's
      default is _INBOX.courier-bridge-NAME, send's and threads' _INBOX).
Environment: COURIER_NATS_URL, COURIER_NATS_CREDS, COURIER_NATS_INBOX stand in for --nats, --creds
and --inbox-prefix. Without --nats or COURIER_NATS_URL, the [bridge] table of Courier's config
(nats, host, creds; `broker install --bridge` writes it) says where to connect. serve takes its
approvers from --approvers, else from that table's `approvers = [USER, ...]`.

serve creates the host's stream COURIER_TO_NAME when missing (256MiB, at most 1000 sends waiting per
producer, both refusing new sends when full); --max-bytes (e.g. 64MiB) and --max-per-producer set
them, on an existing stream too.
send publishes to courier.to.NAME.ORIGIN (--origin, default this machine's host name): the NATS
server must let this user publish there and nowhere else, since ORIGIN scopes its keys and
receipts and is the name the model sees (nats:ORIGIN/LABEL).
send prints the idempotency key at once (reuse it to retry safely); with --wait it exits as
`broker send --wait` does: 0 reached, 1 error, 2 refused (usage), 3 timed out, 4 ended without it.
";

struct UsageError(String);

fn main() -> ExitCode {
    match run() {
        Ok(code) => ExitCode::from(code),
        Err(e) => match e.downcast_ref::<UsageError>() {
            Some(UsageError(m)) => {
                eprintln!("courier-bridge: {m}\n(see courier-bridge --help)");
                ExitCode::from(Exit::Usage.code())
            }
            None => {
                eprintln!("courier-bridge: {e:#}");
                ExitCode::from(Exit::Error.code())
            }
        },
    }
}

impl std::fmt::Debug for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for UsageError {}

fn usage(m: impl Into<String>) -> anyhow::Error {
    UsageError(m.into()).into()
}

const FLAGS: [&str; 5] = ["future-thread", "json", "all", "tls-required", "help"];
const VALUES: [&str; 22] = [
    "approvers",
    "max-bytes",
    "max-per-producer",
    "nats",
    "host",
    "creds",
    "nkey",
    "tls-ca",
    "tls-cert",
    "tls-key",
    "ack-wait",
    "thread",
    "cwd",
    "key",
    "ttl",
    "from",
    "origin",
    "wake",
    "wait",
    "timeout",
    "limit",
    "inbox-prefix",
];

struct Args {
    values: HashMap<String, String>,
    flags: Vec<String>,
    positionals: Vec<String>,
}

impl Args {
    fn get(&self, k: &str) -> Option<String> {
        self.values.get(k).cloned()
    }
    fn flag(&self, k: &str) -> bool {
        self.flags.iter().any(|f| f == k)
    }
    fn duration(&self, k: &str) -> Result<Option<std::time::Duration>> {
        self.get(k).map(|v| broker::cli::parse_duration(&v).map_err(|e| usage(format!("--{k}: {e}")))).transpose()
    }
    /// Where to connect: the flags, else the environment, else the `[bridge]` table of
    /// Courier's config (what `broker install --bridge` writes, so its unit and profile line
    /// carry no URL or secret).
    fn conn(&mut self) -> Result<nats::Conn> {
        let url = match self.get("nats").or_else(|| std::env::var("COURIER_NATS_URL").ok().filter(|u| !u.is_empty())) {
            Some(u) => u,
            None => {
                let cfg = broker::config::load()?.config.bridge.ok_or_else(|| {
                    usage(format!("--nats URL is required (or a [bridge] table in {})", courier_shared::paths::config_path().display()))
                })?;
                self.values.entry("host".into()).or_insert(cfg.host);
                if let Some(c) = cfg.creds.filter(|_| !self.values.contains_key("creds")) {
                    self.values.insert("creds".into(), c.to_string_lossy().into_owned());
                }
                cfg.nats
            }
        };
        let host = self.get("host").ok_or_else(|| usage("--host NAME is required"))?;
        nats::check_host(&host).map_err(|e| usage(format!("--host: {e:#}")))?;
        let inbox_prefix = self.get("inbox-prefix").or_else(|| std::env::var("COURIER_NATS_INBOX").ok().filter(|v| !v.is_empty()));
        if let Some(p) = &inbox_prefix {
            nats::check_inbox_prefix(p).map_err(|e| usage(format!("--inbox-prefix: {e:#}")))?;
        }
        Ok(nats::Conn {
            inbox_prefix,
            url,
            creds: self.get("creds").or_else(|| std::env::var("COURIER_NATS_CREDS").ok()).map(Into::into),
            nkey: self.get("nkey").map(Into::into),
            tls_ca: self.get("tls-ca").map(Into::into),
            tls_cert: self.get("tls-cert").map(Into::into),
            tls_key: self.get("tls-key").map(Into::into),
            tls_required: self.flag("tls-required"),
        })
    }
}

fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Args> {
    let mut p = lexopt::Parser::from_args(args);
    let mut a = Args { values: HashMap::new(), flags: vec![], positionals: vec![] };
    while let Some(arg) = p.next().map_err(|e| usage(e.to_string()))? {
        match arg {
            Long(l) if FLAGS.contains(&l) => a.flags.push(l.to_string()),
            Long(l) if VALUES.contains(&l) => {
                let l = l.to_string();
                let v = p.value().map_err(|e| usage(e.to_string()))?.into_string().map_err(|_| usage(format!("--{l}: not UTF-8")))?;
                a.values.insert(l, v);
            }
            Short('h') => a.flags.push("help".into()),
            Value(v) => a.positionals.push(v.into_string().map_err(|_| usage("arguments must be UTF-8"))?),
            other => return Err(usage(other.unexpected().to_string())),
        }
    }
    Ok(a)
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

fn run() -> Result<u8> {
    let mut argv = std::env::args_os().skip(1);
    let cmd = argv.next().map(|c| c.to_string_lossy().into_owned());
    let cmd = match cmd.as_deref() {
        None | Some("--help" | "-h" | "help") => {
            print!("{USAGE}");
            return Ok(0);
        }
        Some("--version" | "-V") => {
            println!("courier-bridge {}", env!("CARGO_PKG_VERSION"));
            return Ok(0);
        }
        Some(c) => c.to_string(),
    };
    let mut a = parse(argv)?;
    if a.flag("help") {
        print!("{USAGE}");
        return Ok(0);
    }
    if cmd == "nkey" {
        return match (a.positionals.as_slice(), a.values.is_empty() && a.flags.is_empty()) {
            ([file], true) => new_nkey(std::path::Path::new(file)),
            _ => Err(usage("nkey FILE (and nothing else)")),
        };
    }
    let allowed: &[&str] = match cmd.as_str() {
        "serve" => &["ack-wait", "max-bytes", "max-per-producer", "approvers"],
        "send" => &["thread", "cwd", "key", "ttl", "from", "origin", "wake", "wait", "timeout", "future-thread", "json"],
        "threads" => &["all", "limit", "json"],
        "check" => &[],
        other => return Err(usage(format!("unknown command {other:?}"))),
    };
    let common = ["nats", "host", "creds", "nkey", "tls-ca", "tls-cert", "tls-key", "tls-required", "inbox-prefix"];
    for k in a.values.keys().chain(a.flags.iter()) {
        if !allowed.contains(&k.as_str()) && !common.contains(&k.as_str()) {
            return Err(usage(format!("{cmd}: --{k} does not apply")));
        }
    }
    let mut conn = a.conn()?;
    let host = a.get("host").unwrap_or_default();
    // serve and check (broker doctor's) run with the host's own credentials: its inboxes.
    if (cmd == "serve" || cmd == "check") && conn.inbox_prefix.is_none() {
        conn.inbox_prefix = Some(nats::bridge_inbox_prefix(&host));
    }
    match cmd.as_str() {
        "serve" => {
            if !a.positionals.is_empty() {
                return Err(usage("serve takes no arguments"));
            }
            let ack_wait = a.duration("ack-wait")?.unwrap_or(std::time::Duration::from_secs(30));
            let limits = send_limits(&a)?;
            let approvers = approvers(&a)?;
            runtime()?.block_on(serve::serve(serve::ServeOptions { conn, host, ack_wait, limits, approvers }))?;
            Ok(0)
        }
        "check" => {
            let v = runtime()?.block_on(serve::check(&conn, &host))?;
            println!("{v}");
            Ok(0)
        }
        "threads" => {
            let limit = a.get("limit").map(|l| l.parse::<u64>().map_err(|_| usage(format!("--limit {l:?}: a number")))).transpose()?;
            runtime()?.block_on(produce::threads(&conn, &host, a.flag("all"), limit, a.flag("json")))
        }
        "send" => runtime()?.block_on(produce::send(send_args(&a, conn, host)?)),
        _ => unreachable!(),
    }
}

/// `--max-bytes` and `--max-per-producer`, when either is given (the other keeps its default).
fn send_limits(a: &Args) -> Result<Option<nats::SendLimits>> {
    let bytes =
        a.get("max-bytes").map(|v| parse_size(&v).ok_or_else(|| usage(format!("--max-bytes {v:?}: a size like 64MiB")))).transpose()?;
    let per = a
        .get("max-per-producer")
        .map(|v| v.parse::<i64>().ok().filter(|n| *n > 0).ok_or_else(|| usage(format!("--max-per-producer {v:?}: a positive number"))))
        .transpose()?;
    if bytes.is_none() && per.is_none() {
        return Ok(None);
    }
    let d = nats::SendLimits::default();
    Ok(Some(nats::SendLimits { max_bytes: bytes.unwrap_or(d.max_bytes), max_per_publisher: per.unwrap_or(d.max_per_publisher) }))
}

/// `--approvers U1,U2`, else `[bridge] approvers` of Courier's config: the NATS users whose
/// answers to this host's approvals are taken (none by default). Each is one subject token. A
/// config that cannot be read grants no one (the bridge still serves messages, and says why).
fn approvers(a: &Args) -> Result<Vec<String>> {
    let Some(list) = a.get("approvers") else {
        return Ok(match broker::config::load() {
            Ok(loaded) => loaded.config.bridge.map(|b| b.approvers).unwrap_or_default(),
            Err(e) => {
                log::log(format!("no approvers: Courier's config could not be read ({e:#}); --approvers would override it"));
                Vec::new()
            }
        });
    };
    let users: Vec<String> = list.split(',').map(str::trim).filter(|u| !u.is_empty()).map(str::to_string).collect();
    for u in &users {
        nats::check_host(u).map_err(|e| usage(format!("--approvers {u:?}: {e}")))?;
    }
    Ok(users)
}

/// A byte size: a number, optionally with KiB, MiB or GiB (at least 64 KiB: one send).
fn parse_size(v: &str) -> Option<i64> {
    let (n, unit) = match v.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => (&v[..i], &v[i..]),
        None => (v, ""),
    };
    let mult: i64 = match unit {
        "" => 1,
        "KiB" | "K" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        _ => return None,
    };
    n.parse::<i64>().ok()?.checked_mul(mult).filter(|b| *b >= i64::from(nats::SEND_MAX_MSG))
}

/// `courier-bridge nkey FILE`: a fresh user key pair; the seed is written only to a new file.
fn new_nkey(file: &std::path::Path) -> Result<u8> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let kp = nkeys::KeyPair::new_user();
    let seed = kp.seed().map_err(|e| anyhow::anyhow!("making an NKey seed: {e}"))?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(file)
        .map_err(|e| anyhow::anyhow!("{}: {e} (an existing seed is never overwritten)", file.display()))?;
    f.write_all(format!("{seed}\n").as_bytes())?;
    f.sync_all()?;
    println!("{}", kp.public_key());
    Ok(0)
}

fn send_args(a: &Args, conn: nats::Conn, host: String) -> Result<produce::SendArgs> {
    let mut req = Map::new();
    match (a.get("thread"), a.get("cwd")) {
        (Some(t), None) => {
            let thread = courier_shared::ids::ThreadId::parse(&t)
                .map_err(|_| usage(format!("--thread {t:?} is not a thread id (a lowercase UUID)")))?;
            req.insert("thread".into(), json!(thread));
        }
        (None, Some(c)) => {
            req.insert("cwd".into(), json!(c));
        }
        (None, None) => return Err(usage("--thread UUID or --cwd PATH (on the target host) is required")),
        _ => return Err(usage("give --thread or --cwd, not both")),
    }
    let mut text = match a.positionals.as_slice() {
        [t] => t.clone(),
        [] => return Err(usage("the message text (or - for stdin) is required")),
        _ => return Err(usage("one message text, quoted")),
    };
    if text == "-" {
        use std::io::Read;
        let mut buf = Vec::new();
        std::io::stdin().lock().take(broker::store::MAX_BODY_BYTES as u64 + 1).read_to_end(&mut buf)?;
        if buf.len() > broker::store::MAX_BODY_BYTES {
            bail!("the message on stdin is over the limit of {} bytes; nothing was sent", broker::store::MAX_BODY_BYTES);
        }
        text = String::from_utf8(buf).map_err(|_| usage("the message on stdin is not UTF-8"))?;
    }
    if text.trim().is_empty() {
        return Err(usage("refusing to send an empty message"));
    }
    req.insert("text".into(), json!(text));
    let from = a.get("from").or_else(|| std::env::var("USER").ok()).unwrap_or_else(|| "cli".into());
    req.insert("from".into(), json!(from));
    if let Some(t) = a.duration("ttl")? {
        req.insert("ttl_ms".into(), json!(t.as_millis() as u64));
    }
    if a.flag("future-thread") {
        req.insert("future_thread".into(), json!(true));
    }
    if let Some(w) = a.get("wake") {
        if w != "auto" && w != "never" {
            return Err(usage(format!("--wake takes auto or never, not {w:?}")));
        }
        req.insert("wake".into(), Value::String(w));
    }
    let want = match a.get("wait") {
        None => None,
        Some(w) => {
            Some(Want::parse(&w).ok_or_else(|| usage(format!("--wait {w:?}: {} or {}", Want::Handed.as_str(), Want::Confirmed.as_str())))?)
        }
    };
    let timeout = a.duration("timeout")?;
    if timeout.is_some() && want.is_none() {
        return Err(usage("--timeout needs --wait"));
    }
    let origin = match a.get("origin") {
        Some(o) => o,
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .map(|h| h.replace(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'), "-"))
            .unwrap_or_else(|| "unknown".into()),
    };
    nats::check_host(&origin).map_err(|e| usage(format!("--origin: {e:#}")))?;
    let key = a.get("key");
    if key.as_deref().is_some_and(|k| k.is_empty() || k.len() > 200) {
        return Err(usage("--key: 1 to 200 bytes"));
    }
    Ok(produce::SendArgs { conn, host, origin, request: req, key, want, timeout, json: a.flag("json") })
}
