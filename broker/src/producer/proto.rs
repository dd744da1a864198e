//! The producers' request format on the broker socket: JSON lines.
//!
//! A client connects to `$COURIER_RUNTIME_DIR/broker.sock`, writes ONE request, a JSON object on
//! one line (ending in `\n`, at most [`MAX_LINE`] bytes), and reads ONE reply line; the broker
//! then closes the connection. Hook calls share the socket but use length-prefixed frames
//! (`courier_shared::wire`): a connection whose first byte is `{` speaks this format instead.
//! Only the broker's own uid can connect (the runtime directory is 0700, and the peer's
//! `SO_PEERCRED` uid is checked at accept).
//!
//! Requests (`op`; an optional `"v": 1`; unknown fields are refused), typed as the protocol's
//! `courier_producer_proto::Request`, which the clients (the CLI's waits, MCP) write:
//! - `{"op":"send","thread":UUID | "cwd":PATH | "to":NAME,"text":T,"key"?,"ttl_ms"?,"from"?,"future_thread"?,
//!   "verify_sender"?,"sender"?:{"thread","call_id"},"wake"?:"auto"|"never","mode"?:"steer"|"next-turn"|"interrupt",
//!   "wait"?:"handed"|"confirmed","timeout_ms"?}`; the sender's class for the receiving thread's
//!   inbound policy is what the broker proves of the peer (`agent`, `person`, else `local`); with `verify_sender` (claims from the peer's environment: a command the
//!   model ran) or `sender` (claims given: an MCP server Codex started), and no `from`, the broker
//!   proves which thread's Codex tool call the connecting process is and names it `thread:<id>`
//!   (`gate/sender.rs`) -> `{"ok":true,"id","thread","duplicate","note"}`;
//!   with `wait`, the reply comes when the message settles or the timeout ends, and adds
//!   `outcome` and `messages` as a `wait` reply does.
//! - `{"op":"status","id":ID}` -> `{"ok":true,"message":RECORD}`.
//! - `{"op":"wait","ids":[ID...],"for"?:"handed"|"confirmed","timeout_ms"?}` ->
//!   `{"ok":true,"outcome":"reached"|"timed_out"|"ended","for","messages":[RECORD...]}`.
//! - `{"op":"threads","all"?:bool,"limit"?:N}` -> `{"ok":true,"threads":[THREAD...]}`.
//! - `{"op":"approvals","all"?:bool}` -> `{"ok":true,"approvals":[APPROVAL...]}`: the approvals
//!   still waiting on a person (with `all`, every one), as `broker approvals --json` lists them.
//!   Read-only: answering is `server/approvals.rs`'s own request, from a person's process only.
//! - `{"op":"nudge"}` -> `{"ok":true}`: the peer queued rows in the database itself (`broker
//!   send`, `broker effort`); the idle wake channel and maintenance pass look at once instead of
//!   at their fallback (`store::QUEUED`). A hint: it changes nothing but when they look.
//!
//! Errors: `{"ok":false,"error":CODE,"message":TEXT}`; `CODE` is stable (docs/producers.md).

use super::line::{error, write_line, ErrorCode};
use super::send::{self, SendError, SendOptions, Target};
use super::threads::{Lister, ThreadInfo};
use super::wait::Waiters;
use crate::gate::sender::ToolSender;
use crate::store::{now_ms, Store};
use anyhow::{Context, Result};
use courier_producer_proto::request::{Request, SenderClaim, WakeMode};
use courier_producer_proto::SenderClass;
use serde_json::{json, Map, Value};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Proves which thread's Codex tool call the peer of a stream is (`gate/sender.rs`), from the
/// claims given or, with none, from the peer's environment.
pub type Verify<'a> = dyn Fn(&UnixStream, Option<(&str, &str)>) -> Result<ToolSender, String> + 'a;

/// What the broker proves of a producer's peer: which thread's tool call it is ([`Verify`]), and
/// whether it is a process of the user that runs unconfined (`Gate::verify_unconfined_user`);
/// and whether it can interrupt a thread's running turn (`wake::interrupt::check`).
pub struct Checks<'a> {
    pub sender: &'a Verify<'a>,
    pub unconfined_user: &'a (dyn Fn(&UnixStream) -> bool + 'a),
    pub interrupt: &'a send::Interruptible<'a>,
}

/// A request line, parsed (`Request::parse`); `Err` is the error reply.
fn parse(line: &[u8]) -> Result<Request, Value> {
    Request::parse(line).map_err(|why| error(ErrorCode::BadRequest, &why))
}

fn duration_ms(ms: Option<u64>) -> Option<Duration> {
    ms.map(|ms| Duration::from_millis(ms.min(crate::cli::MAX_DURATION.as_millis() as u64)))
}

/// The broker's side of the producer protocol: one per broker, shared by its workers.
pub struct Service {
    codex_home: PathBuf,
    store: Mutex<Store>,
    /// `threads` requests read `/proc` and may wait for a digest: their own connection, so a
    /// listing never holds up a send.
    lister_store: Mutex<Store>,
    lister: Lister,
    waiters: Arc<Waiters>,
    last_sweep: Mutex<Option<std::time::Instant>>,
}

/// How often the broker looks for messages whose thread never appeared.
const SWEEP_INTERVAL: Duration = Duration::from_secs(600);

impl Service {
    pub fn start(state_dir: &Path, codex_home: PathBuf, lister: Lister) -> Result<Arc<Service>> {
        Ok(Arc::new(Service {
            store: Mutex::new(Store::open(state_dir).context("opening the queue for producer requests")?),
            lister_store: Mutex::new(Store::open(state_dir).context("opening the queue for thread listings")?),
            waiters: Waiters::start(state_dir)?,
            lister,
            codex_home,
            last_sweep: Mutex::new(None),
        }))
    }

    /// The broker's maintenance pass (every 500 ms): parked waits look again (the pass may have
    /// expired, released or confirmed messages), and now and then messages whose thread never
    /// appeared are expired ([`super::expire_never_appeared`]).
    pub fn maintain(&self) {
        self.waiters.poke();
        let due = {
            let mut last = self.last_sweep.lock().unwrap_or_else(|e| e.into_inner());
            let due = last.is_none_or(|t| t.elapsed() >= SWEEP_INTERVAL);
            if due {
                *last = Some(std::time::Instant::now());
            }
            due
        };
        if due {
            let mut store = crate::store::lock(&self.store);
            match super::expire_never_appeared(&mut store, &self.codex_home) {
                Ok(0) => {}
                Ok(n) => crate::log_info!("expired {n} message(s) whose thread never appeared under $CODEX_HOME/sessions"),
                Err(e) => crate::log_error!("expiring messages of threads that never appeared: {e:#}"),
            }
        }
    }

    /// The broker changed some message's state: parked waits look again.
    pub fn changed(&self) {
        self.waiters.poke();
    }

    pub fn parked_waits(&self) -> usize {
        self.waiters.parked()
    }

    fn threads(&self, all: bool, limit: usize) -> Result<Vec<ThreadInfo>> {
        let store = crate::store::lock(&self.lister_store);
        self.lister.list(&store, all, limit)
    }

    /// Serves one request line on `stream` (a worker thread calls this; a wait parks the stream
    /// with the waiter thread and returns at once). `verify` proves which thread's Codex tool
    /// command the peer is (`gate/sender.rs`), for a `send` with `verify_sender`.
    pub fn serve(&self, mut stream: UnixStream, line: &[u8], checks: &Checks<'_>) {
        let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
        let reply = match parse(line) {
            Err(reply) => reply,
            Ok(Request::Nudge {}) => {
                crate::store::QUEUED.bump(1);
                json!({"ok": true})
            }
            Ok(Request::Status { id }) => {
                let store = crate::store::lock(&self.store);
                match super::load(&store, &id) {
                    Ok(Some(m)) => json!({"ok": true, "message": super::record(&m, now_ms())}),
                    Ok(None) => error(ErrorCode::NotFound, &super::wait::not_found(&id)),
                    Err(e) => error(ErrorCode::Failed, &format!("{e:#}")),
                }
            }
            Ok(Request::Wait { ids, want, timeout_ms }) => {
                if ids.is_empty() || ids.len() > super::wait::MAX_IDS {
                    error(ErrorCode::BadRequest, &format!("ids: between 1 and {} message ids", super::wait::MAX_IDS))
                } else {
                    return self.waiters.park(stream, ids, want, duration_ms(timeout_ms), Map::new());
                }
            }
            Ok(Request::Threads { all, limit }) => match self.threads(all, limit.unwrap_or(super::threads::DEFAULT_ENDED_LIMIT)) {
                Ok(threads) => json!({"ok": true, "threads": threads}),
                Err(e) => error(ErrorCode::Failed, &format!("{e:#}")),
            },
            Ok(Request::Approvals { all }) => match crate::store::lock(&self.store).approvals(all) {
                Ok(list) => json!({"ok": true, "approvals": list}),
                Err(e) => error(ErrorCode::Failed, &format!("{e:#}")),
            },
            Ok(send @ Request::Send { .. }) => return self.send(stream, send, checks),
        };
        reply_to(&mut stream, &reply);
    }

    /// A `send` request: queued and answered, or (with `wait`) parked until it settles.
    fn send(&self, mut stream: UnixStream, request: Request, checks: &Checks<'_>) {
        let Request::Send {
            thread,
            cwd,
            to,
            agent,
            text,
            key,
            ttl_ms,
            from,
            future_thread,
            verify_sender,
            sender,
            wake,
            mode,
            wait,
            timeout_ms,
        } = request
        else {
            return;
        };
        let target = match (thread, cwd, to) {
            (Some(parent), None, None) if agent.is_some() => Target::Agent { parent, name: agent.unwrap_or_default() },
            (Some(t), None, None) => Target::Thread(t),
            (None, Some(c), None) if agent.is_none() => Target::Cwd(PathBuf::from(c)),
            (None, None, Some(name)) if agent.is_none() => Target::Name(name),
            _ => return reply_to(&mut stream, &error(ErrorCode::BadRequest, "give exactly one of thread, cwd and to")),
        };
        if timeout_ms.is_some() && wait.is_none() {
            return reply_to(&mut stream, &error(ErrorCode::BadRequest, "timeout_ms needs wait"));
        }
        let wake = wake != Some(WakeMode::Never);
        let (from, verified_sender) = match sender_of(&stream, from, verify_sender, sender, checks.sender) {
            Ok(named) => named,
            Err(refused) => return reply_to(&mut stream, &refused),
        };
        // The class is what the broker proved here, never what the request says.
        let class = match verified_sender {
            true => SenderClass::Agent,
            false if (checks.unconfined_user)(&stream) => SenderClass::Person,
            false => SenderClass::Local,
        };
        let mode = mode.unwrap_or_default();
        let opts = SendOptions { target, text, key, ttl_ms, from, verified_sender, future_thread, wake, mode, class };
        let sent = {
            let mut store = crate::store::lock(&self.store);
            send::send(&mut store, &self.codex_home, &|| self.threads(false, 0), &opts, Some(checks.interrupt))
        };
        let reply = match sent {
            Err(SendError::Refused { code, message }) => error(code, &message),
            Err(SendError::Failed(e)) => error(ErrorCode::Failed, &format!("{e:#}")),
            Ok(sent) => {
                let fields = serde_json::to_value(&sent).unwrap_or_default();
                match wait {
                    None => {
                        let mut r = json!({"ok": true});
                        if let (Value::Object(r), Value::Object(f)) = (&mut r, fields) {
                            r.extend(f);
                        }
                        r
                    }
                    Some(want) => {
                        let Value::Object(extra) = fields else { unreachable!() };
                        self.changed();
                        return self.waiters.park(stream, vec![sent.id], want, duration_ms(timeout_ms), extra);
                    }
                }
            }
        };
        reply_to(&mut stream, &reply);
    }
}

/// Who a `send` names as its sender: `from` as given, or (`verify_sender`, or a `sender` claim
/// from a tool command) the thread the broker proves is on the other end, or the refusal to
/// answer with.
fn sender_of(
    stream: &UnixStream,
    from: Option<String>,
    verify_sender: bool,
    sender: Option<SenderClaim>,
    verify: &Verify<'_>,
) -> Result<(Option<String>, bool), Value> {
    if !verify_sender && sender.is_none() {
        return Ok((from, false));
    }
    if from.is_some() || (verify_sender && sender.is_some()) {
        return Err(error(ErrorCode::BadRequest, "verify_sender or sender names the sender: no from, and not both"));
    }
    match verify(stream, sender.as_ref().map(|s| (s.thread.as_str(), s.call_id.as_str()))) {
        Ok(s) => Ok((Some(format!("{}{}", send::VERIFIED_PREFIX, s.thread)), true)),
        Err(why) => Err(error(ErrorCode::SenderNotVerified, &why)),
    }
}

fn reply_to(stream: &mut UnixStream, reply: &Value) {
    let _ = write_line(stream, reply);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::producer::line::ErrorReply;

    /// A line that is no request (the protocol's parse says why) is a `bad_request` reply.
    #[test]
    fn a_line_that_is_no_request_is_a_bad_request() {
        assert!(matches!(parse(br#"{"op":"status","id":"m_1"}"#), Ok(Request::Status { .. })));
        for bad in [&br#"{"op":"send","thred":"x","text":"hi"}"#[..], br#"{"v":2,"op":"threads"}"#, b"not json"] {
            let e = parse(bad).unwrap_err();
            assert_eq!(ErrorReply::of(&e).map(|e| e.error), Some(ErrorCode::BadRequest), "{}: {e}", String::from_utf8_lossy(bad));
        }
    }
}
