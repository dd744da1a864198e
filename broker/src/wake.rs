//! The wake channel: delivery to a thread that is waiting (no open turn), through the app-server
//! that owns it, exactly once.
//!
//! Hooks fire only while a turn runs. A message pending for an idle thread is delivered by
//! starting a turn with it: `turn/start {threadId, clientUserMessageId: <first message id>,
//! input: [the wrapped messages]}` on the app-server served by the trusted Codex process that
//! holds the thread's writer lock (`gate::owner`; the endpoint is proven to be that process with
//! `SO_PEERCRED`, `appserver::endpoint`). The TUI's managed daemon and any `codex app-server
//! --listen unix://` are such servers; `codex exec` serves none.
//!
//! One lease for both paths: the wake leases the messages like a hook call does (`event` =
//! `wake`), so a message leased to a wake is never offered to a hook, and the reverse. The
//! app-server's answer is the acknowledgement: accepted -> `handed` (with the turn id); refused ->
//! back to `pending`; no answer (timeout, connection lost, daemon killed) -> `handed` with no turn,
//! never re-sent: the rollout decides, `confirmed` when the user message carrying the message's
//! client id and whole text is there (`delivery::settle_line`), else `uncertain` when a turn closes
//! or the codex exits without it.
//!
//! A thread that cannot be woken gets the reason on its waiting messages (`inspect`):
//! `thread_not_loaded` (ended, or `codex exec` finished: the next `codex exec resume` delivers),
//! `no_app_server` (its codex serves none: `codex exec`), `subagent_thread` (a sub-agent takes its
//! input from its parent), `owner_untrusted`, `owner_not_proven`,
//! `wake_refused` (the app-server answered with an error; retried later). Busy threads are left
//! to their hooks.
//!
//! The pass runs in its own thread, at once when the broker makes a message pending (queued
//! through it: `broker send`, the MCP server and the bridge all queue through the running broker),
//! and at least every [`RECHECK`] (a thread that went idle after its last hook; a message written
//! to the database by another process while no broker ran).

use crate::appserver::{self, endpoint};
use crate::delivery::{self, MAX_OUTPUT_BYTES};
use crate::gate::owner::NoOwner;
use crate::gate::{CodexTrust, Gate};
use crate::store::{PendingSignal, Store};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A pass at least this often.
pub const RECHECK: Duration = Duration::from_secs(1);
/// How long a wake's lease lasts: longer than the whole exchange, so the lease cannot lapse (and
/// the messages be offered to a hook) while `turn/start` may still reach Codex.
pub const WAKE_LEASE_MS: i64 = 30_000;
/// The whole app-server exchange (connect, initialize, turn/start and its answer).
const EXCHANGE: Duration = Duration::from_secs(10);
/// After a thread could not be woken, wait this long before looking at it again.
const BACKOFF: Duration = Duration::from_secs(2);

/// What one pass did for one thread (for the log and tests).
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A turn was started (or may have been: `turn` is `None` when the answer was lost).
    Woken {
        count: usize,
        turn: Option<String>,
    },
    Busy,
    NotWoken(&'static str),
    Nothing,
}

/// The wake channel's memory between passes.
#[derive(Default)]
pub struct Waker {
    not_before: Mutex<HashMap<String, Instant>>,
}

impl Waker {
    /// One pass over every thread with messages that may be woken.
    pub fn pass(&self, store: &Mutex<Store>, gate: &Gate, trust: &dyn CodexTrust, codex_home: &Path) -> Vec<(String, Outcome)> {
        let threads = {
            let s = store.lock().unwrap_or_else(|e| e.into_inner());
            match s.wake_candidates() {
                Ok(t) => t,
                Err(e) => {
                    crate::log_error!("wake: listing threads: {e:#}");
                    return Vec::new();
                }
            }
        };
        let now = Instant::now();
        let mut out = Vec::new();
        for thread in threads {
            {
                let mut nb = self.not_before.lock().unwrap_or_else(|e| e.into_inner());
                if nb.get(&thread).is_some_and(|t| *t > now) {
                    continue;
                }
                nb.remove(&thread);
            }
            let outcome = wake_thread(store, gate, trust, codex_home, &thread);
            if !matches!(outcome, Outcome::Woken { .. } | Outcome::Nothing) {
                self.not_before.lock().unwrap_or_else(|e| e.into_inner()).insert(thread.clone(), Instant::now() + BACKOFF);
            }
            out.push((thread, outcome));
        }
        out
    }

    /// The wake thread: a pass as soon as this broker makes messages pending (queued through it,
    /// or returned from a lease: [`PendingSignal`]), and every [`RECHECK`] (a thread that went
    /// idle after its last hook; a message another process wrote to the database while no broker
    /// ran). No file watcher and no polling: every commit of every hook call would wake one, when
    /// only a new or returned message can start a turn.
    pub fn run(&self, signal: &PendingSignal, pass: impl Fn()) {
        loop {
            let seen = signal.count();
            pass();
            signal.wait_past(seen, RECHECK);
        }
    }
}

fn note(store: &Mutex<Store>, thread: &str, reason: &str) {
    let mut s = store.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(e) = s.note_deferral(thread, reason) {
        crate::log_error!("wake: noting {reason} on {thread}: {e:#}");
    }
}

fn wake_thread(store: &Mutex<Store>, gate: &Gate, trust: &dyn CodexTrust, codex_home: &Path, thread: &str) -> Outcome {
    let owner = match gate.thread_owner(thread, trust) {
        Ok(o) => o,
        Err(why) => {
            if let NoOwner::Untrusted(d) | NoOwner::NotProven(d) = &why {
                crate::log_debug!("wake {thread}: {}: {d}", why.code());
            }
            note(store, thread, why.code());
            return Outcome::NotWoken(why.code());
        }
    };
    if owner.open_turn.is_some() {
        return Outcome::Busy;
    }
    if owner.subagent {
        // Sub-agents take their input from their parent, not from a client's turn/start.
        note(store, thread, "subagent_thread");
        return Outcome::NotWoken("subagent_thread");
    }
    let endpoints = endpoint::discover(codex_home, owner.pid, owner.starttime);
    if endpoints.is_empty() {
        note(store, thread, "no_app_server");
        return Outcome::NotWoken("no_app_server");
    }
    let lease = {
        let mut s = store.lock().unwrap_or_else(|e| e.into_inner());
        match s.lease_for_wake(thread, WAKE_LEASE_MS, MAX_OUTPUT_BYTES) {
            Ok(Some(l)) => {
                if let Err(e) = s.note_codex(l.token, owner.pid, owner.starttime) {
                    crate::log_error!("wake: recording the owner of lease {}: {e:#}", l.token);
                }
                l
            }
            Ok(None) => return Outcome::Nothing,
            Err(e) => {
                crate::log_error!("wake: leasing for {thread}: {e:#}");
                return Outcome::Nothing;
            }
        }
    };
    crate::failpoint::hit("wake_after_lease");
    let text = lease.messages.iter().map(delivery::wrap).collect::<Vec<_>>().join("\n");
    let client_id = lease.messages[0].id.clone();
    let count = lease.messages.len();
    let deadline = Instant::now() + EXCHANGE;
    let release = |reason: &str| {
        let mut s = store.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = s.release(lease.token, reason) {
            crate::log_error!("wake: releasing lease {}: {e:#}", lease.token);
        }
    };
    let handed = |turn: Option<&str>| {
        let mut s = store.lock().unwrap_or_else(|e| e.into_inner());
        let path = owner.rollout.to_string_lossy();
        match s.ack(lease.token, &path, owner.rollout_len, None) {
            Ok(true) => {}
            Ok(false) => crate::log_error!("wake: lease {} lapsed before turn/start was answered", lease.token),
            Err(e) => crate::log_error!("wake: recording hand-off of lease {}: {e:#}", lease.token),
        }
        if let Some(t) = turn {
            let _ = s.set_lease_turn(lease.token, t);
        }
    };
    let mut ws = match appserver::open_session(&endpoints, owner.pid, owner.starttime, deadline) {
        Ok(ws) => ws,
        Err(why) => {
            crate::log_warn!("wake {thread}: no app-server session: {why}");
            release("wake_unreachable");
            return Outcome::NotWoken("wake_unreachable");
        }
    };
    let params = json!({
        "threadId": thread,
        "clientUserMessageId": client_id,
        "input": [{"type": "text", "text": text, "text_elements": []}],
    });
    crate::failpoint::hit("wake_before_turn_start");
    let id = match ws.send_request("turn/start", params) {
        Ok(id) => id,
        Err(e) if !e.timed_out => {
            // Nothing was written: the request never left.
            crate::log_warn!("wake {thread}: sending turn/start: {e}");
            release("wake_unreachable");
            return Outcome::NotWoken("wake_unreachable");
        }
        Err(e) => {
            crate::log_warn!("wake {thread}: turn/start may have been sent ({e}); the rollout decides");
            handed(None);
            return Outcome::Woken { count, turn: None };
        }
    };
    // From here on Codex may have the input: never re-sent.
    crate::failpoint::hit("wake_after_turn_start");
    match ws.wait_response(id) {
        Ok(r) => match r.pointer("/result/turn/id").and_then(Value::as_str) {
            Some(turn) => {
                crate::failpoint::hit("wake_after_answer");
                handed(Some(turn));
                crate::log_info!("woke thread {thread}: turn {turn} started with {count} message(s) ({client_id}...)");
                Outcome::Woken { count, turn: Some(turn.to_string()) }
            }
            None => {
                let err = r.get("error").cloned().unwrap_or(r);
                crate::log_warn!("wake {thread}: turn/start refused: {err}");
                release("wake_refused");
                Outcome::NotWoken("wake_refused")
            }
        },
        Err(e) => {
            crate::log_warn!("wake {thread}: no answer to turn/start ({e}); the rollout decides");
            handed(None);
            Outcome::Woken { count, turn: None }
        }
    }
}
