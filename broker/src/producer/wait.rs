//! Receipts without polling: waits parked in the broker until the messages they name settle.
//!
//! **Broker side** ([`Waiters`]): a `wait` request (or a `send` with `wait`) parks its connection
//! here, on one thread of its own, holding no worker. The broker pokes it ([`Waiters::poke`])
//! after every transition it makes (a hand-off acked, a maintenance pass that expired, released
//! or confirmed messages); the waiter then reads the parked messages' states once (one SELECT by
//! id, on its own read connection) and answers those that reached the wanted state or ended.
//! Changes made by other processes (`broker cancel`, an `inspect` that settled a hand-off) are
//! seen at the next [`TICK`] while a wait is parked (no file watch: every hook call's commit
//! would wake it). Each look first reads SQLite's `PRAGMA data_version`, which changes only when
//! another connection committed and touches no table: the states are read only after a commit.
//! A parked client that hangs up is dropped at the next look. Caps: at most
//! [`MAX_PARKED_PER_PEER`] waits per peer process (`SO_PEERCRED` pid), so one process cannot
//! take them all, and [`MAX_PARKED`] in all. A wait over either cap is answered at once with
//! `busy` (a `send` with `wait` instead with its result and `"parked": false`: it was queued);
//! the waiting clients (`broker wait`, `send --wait`, MCP) then poll instead of failing.
//!
//! **Client side** ([`wait_for`]): asks the broker over the socket; when no broker answers (or it
//! stops mid-wait, or answers `busy`) it falls back to a slow local poll ([`FALLBACK_POLL`]) that settles hand-offs
//! from the rollouts and retires messages whose `--ttl` ran out, as `inspect` would, and tries
//! the socket again each round.

use super::line::ErrorCode;
use super::{load_all, outcome, record, record_json, settled, Outcome, Record, WaitReply, Want};
use crate::store::{now_ms, Channel, Message, State, Store};
use anyhow::{Context, Result};
use courier_producer_proto::Request;
use courier_shared::ids::ThreadId;
use serde_json::{json, Map, Value};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How often parked waits look for changes made by other processes, and for clients that left.
pub const TICK: Duration = Duration::from_millis(250);
/// Waits parked at once; more are answered `busy` (and the client polls).
pub const MAX_PARKED: usize = 1024;
/// Waits one peer process may park; more are answered `busy`.
pub const MAX_PARKED_PER_PEER: usize = 64;
/// Ids one wait may name.
pub const MAX_IDS: usize = 256;
/// The client's poll interval when no broker runs.
pub const FALLBACK_POLL: Duration = Duration::from_secs(1);

struct Parked {
    stream: UnixStream,
    /// The peer process (`SO_PEERCRED` pid; 0 when unknown), for the per-peer cap.
    peer: i32,
    ids: Vec<String>,
    want: Want,
    deadline: Option<Instant>,
    /// Fields merged into the reply (a `send` with `wait` answers with its id, thread, note).
    extra: Map<String, Value>,
    /// Not evaluated yet.
    fresh: bool,
}

#[derive(Default)]
struct Shared {
    parked: Vec<Parked>,
    poked: bool,
    /// Waits parked per peer, and in all: counted here, since the waiter thread takes `parked`
    /// out while it looks.
    per_peer: std::collections::HashMap<i32, usize>,
    total: usize,
}

impl Shared {
    fn count(&mut self, peer: i32) {
        self.total += 1;
        *self.per_peer.entry(peer).or_default() += 1;
    }

    fn uncount(&mut self, peer: i32) {
        self.total = self.total.saturating_sub(1);
        if let std::collections::hash_map::Entry::Occupied(mut e) = self.per_peer.entry(peer) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }

    /// Why a wait of `peer` may not park now.
    fn full_for(&self, peer: i32) -> Option<String> {
        if self.per_peer.get(&peer).copied().unwrap_or(0) >= MAX_PARKED_PER_PEER {
            Some(format!("process {peer} has {MAX_PARKED_PER_PEER} waits parked already"))
        } else if self.total >= MAX_PARKED {
            Some(format!("{MAX_PARKED} waits are parked already"))
        } else {
            None
        }
    }
}

/// The pid of the process at the other end of `stream` (0 when it cannot be read).
fn peer_pid(stream: &UnixStream) -> i32 {
    nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials).map_or(0, |c| c.pid())
}

/// The broker's parked waits (see the module docs).
pub struct Waiters {
    shared: Mutex<Shared>,
    cv: Condvar,
}

impl Waiters {
    /// Starts the waiter thread on its own connection to the queue in `state_dir`. No watch on
    /// the database: every hook call's commit would wake one; the broker pokes after its own
    /// transitions, and other processes' commits are seen within [`TICK`].
    pub fn start(state_dir: &Path) -> Result<Arc<Waiters>> {
        let store = Store::open(state_dir).context("opening the queue for the waiter thread")?;
        let w = Arc::new(Waiters { shared: Mutex::new(Shared::default()), cv: Condvar::new() });
        let run = Arc::clone(&w);
        std::thread::Builder::new().name("waiter".into()).spawn(move || run.run(store))?;
        Ok(w)
    }

    /// Something may have changed: look now (cheap when nothing is parked).
    pub fn poke(&self) {
        let mut s = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        if !s.parked.is_empty() {
            s.poked = true;
            self.cv.notify_one();
        }
    }

    /// Parks `stream` until every message of `ids` reached `want` or ended, or until `timeout`.
    /// Over a cap it answers at once: `busy`, or for a `send` with `wait` (`extra` holds its
    /// result) that result with `"parked": false`, so the sender learns its id and polls.
    pub fn park(&self, mut stream: UnixStream, ids: Vec<String>, want: Want, timeout: Option<Duration>, extra: Map<String, Value>) {
        let peer = peer_pid(&stream);
        let mut s = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = s.full_for(peer) {
            drop(s);
            let reply = if extra.is_empty() {
                super::line::error(ErrorCode::Busy, &format!("{why}; poll instead (broker status), or try again later"))
            } else {
                let mut r = json!({"ok": true, "parked": false, "wait_note": format!("{why}: not waited for; poll its status")});
                if let Value::Object(r) = &mut r {
                    r.extend(extra);
                }
                r
            };
            let _ = super::line::write_line(&mut stream, &reply);
            return;
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        s.count(peer);
        s.parked.push(Parked { stream, peer, ids, want, deadline, extra, fresh: true });
        s.poked = true;
        self.cv.notify_one();
    }

    /// Waits parked now (for `inspect`'s broker counters and tests).
    pub fn parked(&self) -> usize {
        self.shared.lock().unwrap_or_else(|e| e.into_inner()).total
    }

    fn run(&self, store: Store) {
        let mut last_version: Option<i64> = None;
        loop {
            let mut parked = {
                let mut s = self.shared.lock().unwrap_or_else(|e| e.into_inner());
                while !s.poked {
                    if s.parked.is_empty() {
                        s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
                        continue;
                    }
                    let now = Instant::now();
                    let next =
                        s.parked.iter().filter_map(|p| p.deadline).min().map_or(TICK, |d| d.saturating_duration_since(now).min(TICK));
                    let (g, timeout) = self.cv.wait_timeout(s, next).unwrap_or_else(|e| e.into_inner());
                    s = g;
                    if timeout.timed_out() {
                        break;
                    }
                }
                s.poked = false;
                std::mem::take(&mut s.parked)
            };
            let mut gone: Vec<i32> = Vec::new();
            parked.retain(|p| {
                let left = hung_up(&p.stream);
                if left {
                    gone.push(p.peer);
                }
                !left
            });
            let now = Instant::now();
            let version = store.data_version();
            let changed = version != last_version || version.is_none();
            last_version = version;
            let mut keep = Vec::with_capacity(parked.len());
            for mut p in parked {
                let due = p.deadline.is_some_and(|d| now >= d);
                if !(changed || due || p.fresh) {
                    keep.push(p);
                    continue;
                }
                p.fresh = false;
                match answer(&store, &p.ids, p.want, due) {
                    Ok(None) => keep.push(p),
                    Ok(Some(mut reply)) => {
                        if let Value::Object(r) = &mut reply {
                            r.extend(p.extra.clone());
                        }
                        let _ = p.stream.set_write_timeout(Some(Duration::from_secs(2)));
                        let _ = super::line::write_line(&mut p.stream, &reply);
                        gone.push(p.peer);
                    }
                    Err(e) => {
                        crate::log_error!("waiter: reading message states: {e:#}");
                        keep.push(p); // asked again at the next change or tick
                    }
                }
            }
            let mut s = self.shared.lock().unwrap_or_else(|e| e.into_inner());
            s.parked.extend(keep);
            for peer in gone {
                s.uncount(peer);
            }
        }
    }
}

/// The reply to a wait over `ids` if it is over (all settled, or `timed_out`), else `None`.
/// An id the queue does not have is an error reply.
fn answer(store: &Store, ids: &[String], want: Want, timed_out: bool) -> Result<Option<Value>> {
    let found = load_all(store, ids)?;
    if let Some(i) = found.iter().position(Option::is_none) {
        return Ok(Some(super::line::error(ErrorCode::NotFound, &not_found(&ids[i]))));
    }
    let messages: Vec<Message> = found.into_iter().flatten().collect();
    if !settled(&messages, want) && !timed_out {
        return Ok(None);
    }
    Ok(Some(reply(&messages, want)))
}

/// `{"ok":true,"outcome","for","messages":[...]}`.
pub fn reply(messages: &[Message], want: Want) -> Value {
    let now = now_ms();
    serde_json::to_value(WaitReply::of(messages.iter().map(|m| record(m, now)).collect(), want)).unwrap_or_default()
}

pub fn not_found(id: &str) -> String {
    format!("no message {id} (never queued here, or pruned after retention_days)")
}

/// The client closed its end (or the socket failed): nobody is waiting any more.
fn hung_up(stream: &UnixStream) -> bool {
    let mut pfd = nix::libc::pollfd { fd: stream.as_raw_fd(), events: nix::libc::POLLIN | nix::libc::POLLRDHUP, revents: 0 };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { nix::libc::poll(&mut pfd, 1, 0) };
    n > 0 && pfd.revents & (nix::libc::POLLRDHUP | nix::libc::POLLHUP | nix::libc::POLLERR | nix::libc::POLLNVAL) != 0
}

/// What a client-side wait learned.
pub struct Waited {
    pub outcome: Outcome,
    pub messages: Vec<Message>,
    /// The messages' records, as `--json` prints them.
    pub records: Vec<Value>,
    /// Answered by a running broker (else by the local fallback poll).
    pub by_broker: bool,
}

/// A message record as the socket returns it, back into a [`Message`] (fields the record does
/// not carry stay empty).
fn message_of(r: Record) -> Message {
    Message {
        id: r.id,
        thread: r.thread,
        kind: r.kind,
        state: r.state,
        body: String::new(),
        from: r.from,
        key: r.key,
        created_at: r.created_at,
        updated_at: r.updated_at,
        expires_at: r.expires_at,
        event: r.event.as_deref().and_then(Channel::parse),
        turn_id: r.turn_id,
        lease: None,
        handed_at: r.handed_at,
        confirmed_at: r.confirmed_at,
        reason: r.reason,
        attempts: r.attempts,
        rollout_path: None,
        scan_offset: None,
        shown_by: None,
        alarms: r.alarms,
        sender_check: None,
        mode: r.mode,
    }
}

/// One look at the queue without a broker: settle hand-offs of these messages' threads from
/// their rollouts and retire messages past their `--ttl` (what the broker would have done), then
/// read their states.
fn look_locally(state_dir: &Path, ids: &[String]) -> Result<Vec<Message>> {
    let mut store = Store::open(state_dir)?;
    let found = load_all(&store, ids)?;
    if let Some(i) = found.iter().position(Option::is_none) {
        anyhow::bail!("{}", not_found(&ids[i]));
    }
    let mut threads: Vec<ThreadId> = found.iter().flatten().filter(|m| m.state == State::Handed).map(|m| m.thread.clone()).collect();
    threads.dedup();
    for t in threads {
        let _ = crate::delivery::reconcile(&mut store, Some(&t));
    }
    if found.iter().flatten().any(|m| m.state == State::Pending && m.expires_at.is_some_and(|e| e <= now_ms())) {
        let _ = store.expire_due();
    }
    Ok(load_all(&store, ids)?.into_iter().flatten().collect())
}

/// Waits until every message of `ids` reached `want` or ended, or until `timeout`: through the
/// broker when one answers, else by polling the queue every [`FALLBACK_POLL`] (and trying the
/// broker again each time).
pub fn wait_for(runtime_dir: &Path, state_dir: &Path, ids: &[String], want: Want, timeout: Option<Duration>) -> Result<Waited> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let socket: PathBuf = courier_shared::paths::socket_path(runtime_dir);
    loop {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let req = Request::Wait { ids: ids.to_vec(), want, timeout_ms: left.map(|l| l.as_millis() as u64) };
        // No broker, it went away mid-wait, or its waits are full (busy): look ourselves (below).
        if let Ok(Some(reply)) = super::line::call(&socket, &req, None) {
            match super::line::ErrorReply::of(&reply) {
                Some(e) if e.error == ErrorCode::Busy => {}
                Some(e) => anyhow::bail!("{}", if e.message.is_empty() { "the broker refused the wait".into() } else { e.message }),
                None => {
                    // The records as the broker wrote them, for `--json` (a newer broker's fields kept).
                    let records: Vec<Value> = reply.get("messages").and_then(Value::as_array).cloned().unwrap_or_default();
                    let typed: WaitReply = serde_json::from_value(reply).context("the broker's wait reply does not parse")?;
                    let outcome = typed.outcome;
                    let messages: Vec<Message> = typed.messages.into_iter().map(message_of).collect();
                    if messages.len() != ids.len() || records.len() != ids.len() {
                        anyhow::bail!("the broker's wait reply does not list every message");
                    }
                    return Ok(Waited { outcome, messages, records, by_broker: true });
                }
            }
        }
        let messages = look_locally(state_dir, ids)?;
        let timed_out = deadline.is_some_and(|d| Instant::now() >= d);
        if settled(&messages, want) || timed_out {
            let now = now_ms();
            let records = messages.iter().map(|m| record_json(m, now)).collect();
            return Ok(Waited { outcome: outcome(&messages, want), messages, records, by_broker: false });
        }
        let nap = deadline.map_or(FALLBACK_POLL, |d| d.saturating_duration_since(Instant::now()).min(FALLBACK_POLL));
        std::thread::sleep(nap);
    }
}

/// The lines `broker wait` prints per message: `ID STATE`, the reason when it ended without
/// reaching `want`, or what it is still waiting on after a timeout.
pub fn describe(m: &Message, want: Want) -> String {
    let esc = |s: &str| crate::terminal::escape(s).into_owned();
    match super::progress(m, want) {
        super::Progress::Reached => format!("{} {}", m.id, m.state),
        super::Progress::Ended => {
            format!(
                "{} {} without reaching {} ({})",
                m.id,
                m.state,
                want.as_str(),
                esc(m.reason.as_deref().unwrap_or("no reason recorded"))
            )
        }
        super::Progress::Held => {
            format!("{} held by its thread's inbound policy (timed out; a person releases it with `broker release {}`)", m.id, m.id)
        }
        super::Progress::InFlight => match &m.reason {
            Some(r) => format!("{} still {} (timed out; {})", m.id, m.state, esc(r)),
            None => format!("{} still {} (timed out)", m.id, m.state),
        },
    }
}
