//! The wake channel: delivery to a thread that is waiting (no open turn), through the app-server
//! that owns it, exactly once.
//!
//! Hooks fire only while a turn runs. A message pending for an idle thread is delivered by
//! starting a turn with it: `turn/start {threadId, clientUserMessageId: <first message id>,
//! input: [the wrapped messages]}` on the app-server served by the trusted Codex process that
//! holds the thread's writer lock (`codex::owner`; the endpoint is proven to be that process with
//! `SO_PEERCRED`, `appserver::endpoint`). The TUI's managed daemon and any `codex app-server
//! --listen unix://` are such servers; `codex exec` serves none.
//!
//! One lease and one hand-off record for every channel (`Store::lease`, `Store::hand_off`): a
//! message leased to a wake is never offered to a hook, and the reverse. The steps, and what a
//! crash (kill -9) at each instant leaves:
//!
//! 1. lease (`Channel::Wake`): nothing has left. A crash: the restarted broker returns its wake
//!    leases to `pending` at once (`wake_interrupted`), and wakes the thread again.
//! 2. the app-server session (connect, initialize): nothing has left; no session -> `pending`.
//! 3. the hand-off record, fsynced, BEFORE `turn/start` is written: `handed`, with the rollout
//!    offset, the codex process and a deadline (`shown_by`, [`WAKE_LEASE_MS`]). From here on the
//!    message is never offered again: the rollout decides. `confirmed` when the user message
//!    carrying the lease's first message id as Codex's client id and the whole text is there
//!    (`delivery::settle_line`); else `uncertain`: its known turn completed without it
//!    (`turn_closed_unseen`, `delivery/unseen.rs`: the rollout is a file others can rewrite, so
//!    it proves nothing unseen), `codex_exited`, or `wake_unanswered` once the deadline passed. A crash between the record and the frame leaves
//!    a message Codex never got `uncertain` (nothing can prove the frame did not leave).
//! 4. `turn/start` written; its answer: a turn id (recorded on the messages), or an error ->
//!    Codex started nothing: the hand-off is withdrawn to `pending` (`wake_refused`). Not written
//!    at all -> withdrawn (`wake_unreachable`). No answer (timeout, connection lost, a crash) ->
//!    the rollout decides, as above.
//!
//! A thread that cannot be woken gets the reason on its waiting messages (`inspect`): a
//! [`WakeReason`] (`reason.rs` lists them). Busy threads are left to their hooks, unless a
//! `broker send --mode interrupt` message is to stop the running turn first (`interrupt.rs`).
//! Wakes per thread are bounded (`bound.rs`, `[wake]` in the config file).
//!
//! The pass runs in its own thread, at once when this process queues a message or makes one
//! pending again, or another process says it queued one (`broker send` without a broker-verified
//! sender writes the queue itself, then sends a `nudge`: [`crate::store::QUEUED`]). While some
//! thread has messages to wake it for, at least every [`RECHECK`] (a thread that went idle after
//! its last hook, a back-off or bound that ran out). While none has, a pass finds nothing until a
//! message is queued or made pending, so the thread sleeps until the signal, with
//! [`IDLE_RECHECK`] as the fallback for a writer that did not say (a message written by an older
//! `broker send`, or one whose nudge did not arrive). A pass that found no thread to wake is not
//! repeated until something commits (`store/watch.rs`): only a commit makes one.

mod bound;
pub mod interrupt;

pub use crate::reason::WakeReason;
pub use bound::Bound;

use crate::codex::appserver::{self, endpoint, Endpoint};
use crate::codex::owner::{NoOwner, Owner};
use crate::envelope::MAX_OUTPUT_BYTES;
use crate::exe::CodexTrust;
use crate::gate::Gate;
use crate::os::ProcessKey;
use crate::reason::DeliveryReason;
use crate::store::{Channel, CommitSignal, HandOff, Lease, Store, Watch};
use courier_shared::ids::ThreadId;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A pass at least this often while some thread has messages that may be woken.
pub const RECHECK: Duration = Duration::from_secs(1);
/// While none has: a pass at least this often, for a message another process queued without
/// saying so (every in-process queueing, and `broker send`'s nudge, wake the pass at once).
pub const IDLE_RECHECK: Duration = Duration::from_secs(5);
/// Passes start at most this often, however many commits or nudges signal them.
const MIN_SPACING: Duration = Duration::from_millis(100);
/// How long a wake's lease lasts: longer than the whole exchange, so the lease cannot lapse (and
/// the messages be offered to a hook) while it runs. Also how long after its hand-off record the
/// rollout has to show the woken user message before the message is `uncertain`.
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
    NotWoken(WakeReason),
    /// Over the thread's bound ([`Bound`]): looked at again at `until`.
    Bounded(WakeReason, Instant),
    Nothing,
}

/// The wake channel's memory between passes.
pub struct Waker {
    not_before: Mutex<HashMap<ThreadId, Instant>>,
    bound: Arc<Bound>,
    /// Whether the queue changed since a pass found no thread (`None`: every pass looks).
    watch: Mutex<Option<Watch>>,
    /// The last pass listed no thread with messages that may be woken (none in back-off either).
    found_none: std::sync::atomic::AtomicBool,
}

impl Waker {
    pub fn new(bound: Arc<Bound>, watch: Option<Watch>) -> Waker {
        Waker { not_before: Mutex::default(), bound, watch: Mutex::new(watch), found_none: Default::default() }
    }

    /// One pass over every thread with messages that may be woken; `None` when it was skipped:
    /// nothing was committed since a pass found none.
    pub fn pass(&self, store: &Mutex<Store>, gate: &Gate, trust: &dyn CodexTrust, codex_home: &Path) -> Option<Vec<(ThreadId, Outcome)>> {
        let mut watch = self.watch.lock().unwrap_or_else(|e| e.into_inner());
        match watch.as_mut().map(Watch::unchanged_since_idle) {
            Some(Ok(true)) => {
                self.found_none.store(true, Ordering::Relaxed);
                return None;
            }
            Some(Err(e)) => crate::log_error!("wake: watching the queue: {e:#}"),
            Some(Ok(false)) | None => {}
        }
        let listed = crate::store::lock(store).wake_candidates();
        let threads = match listed {
            Ok(t) => t,
            Err(e) => {
                crate::log_error!("wake: listing threads: {e:#}");
                self.found_none.store(false, Ordering::Relaxed);
                return Some(Vec::new());
            }
        };
        self.found_none.store(threads.is_empty(), Ordering::Relaxed);
        if let Some(w) = watch.as_mut() {
            w.found(threads.is_empty());
        }
        drop(watch);
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
            let outcome = self.wake_thread(store, gate, trust, codex_home, &thread);
            let retry = match &outcome {
                Outcome::Woken { .. } | Outcome::Nothing => None,
                Outcome::Bounded(_, until) => Some(*until),
                Outcome::Busy | Outcome::NotWoken(_) => Some(Instant::now() + BACKOFF),
            };
            if let Some(t) = retry {
                self.not_before.lock().unwrap_or_else(|e| e.into_inner()).insert(thread.clone(), t);
            }
            out.push((thread, outcome));
        }
        Some(out)
    }

    /// Whether the last [`Waker::pass`] listed no thread with messages that may be woken (or was
    /// skipped: nothing committed since one listed none).
    pub fn found_none(&self) -> bool {
        self.found_none.load(Ordering::Relaxed)
    }

    /// The wake thread: a pass as soon as messages are queued or made pending ([`Store::pending_signal`]),
    /// and every [`RECHECK`] while the last pass found threads to wake (a thread that went idle
    /// after its last hook), every [`IDLE_RECHECK`] while it found none. No file watcher: every
    /// commit of every hook call would wake one, when only a new or returned message can start a
    /// turn. `pass` says whether it found no thread to wake ([`Waker::found_none`]).
    ///
    /// The count is read before the pass looks: a message queued during the pass moves it, and
    /// the wait returns at once (`store/signal.rs`).
    pub fn run(&self, signal: &CommitSignal, pass: impl Fn() -> bool) {
        loop {
            let seen = signal.count();
            let started = Instant::now();
            let idle = pass();
            signal.wait_past(seen, if idle { IDLE_RECHECK } else { RECHECK });
            // Any process of the uid may nudge: however many signals come, passes stay spaced.
            std::thread::sleep(MIN_SPACING.saturating_sub(started.elapsed()));
        }
    }

    /// One thread: its proven owner, idle (or busy in a turn an `interrupt` message stops
    /// first: `interrupt.rs`) and its app-server; the bound; the lease; the exchange.
    fn wake_thread(&self, store: &Mutex<Store>, gate: &Gate, trust: &dyn CodexTrust, codex_home: &Path, thread: &ThreadId) -> Outcome {
        let owner = match gate.thread_owner(thread, trust) {
            Ok(owner) => owner,
            // Not a Codex thread: a Claude Code session, which its own wing wakes.
            Err(NoOwner::NotLoaded) => {
                let why = match claude_session(store, thread) {
                    Some(Claude::Busy) => return Outcome::Busy,
                    Some(Claude::WakeHeld) => return Outcome::Nothing,
                    Some(Claude::NoWake) => WakeReason::ClaudeNoWake,
                    None => WakeReason::ThreadNotLoaded,
                };
                note(store, thread, why);
                return Outcome::NotWoken(why);
            }
            Err(why) => {
                if let NoOwner::Untrusted(d) | NoOwner::NotProven(d) = &why {
                    crate::log_debug!("wake {thread}: {}: {d}", wake_reason(&why));
                }
                note(store, thread, wake_reason(&why));
                return Outcome::NotWoken(wake_reason(&why));
            }
        };
        // A busy thread is left to its hooks, unless an `interrupt` message is to stop its turn.
        let interrupting = owner.open_turn.clone().filter(|turn| interrupt::due(store, thread, turn));
        if owner.open_turn.is_some() && interrupting.is_none() {
            note_waiting_on_approval(store, thread);
            return Outcome::Busy;
        }
        let endpoints = match app_server(&owner, codex_home) {
            Ok(e) => e,
            Err(why) => {
                note(store, thread, why);
                return Outcome::NotWoken(why);
            }
        };
        if let Err((why, until)) = self.bound.check(thread, Instant::now()) {
            note(store, thread, why);
            return Outcome::Bounded(why, until);
        }
        let owner = match interrupting {
            Some(turn) => match interrupt::stop(store, gate, trust, thread, &owner, &turn, &endpoints) {
                Ok(idle) => idle,
                Err(outcome) => return outcome,
            },
            None => owner,
        };
        let lease = {
            let mut s = crate::store::lock(store);
            match s.lease(thread, Channel::Wake, None, WAKE_LEASE_MS, MAX_OUTPUT_BYTES) {
                Ok(Some(l)) => l,
                Ok(None) => return Outcome::Nothing,
                Err(e) => {
                    crate::log_error!("wake: leasing for {thread}: {e:#}");
                    return Outcome::Nothing;
                }
            }
        };
        crate::failpoint::hit("wake_after_lease");
        Exchange { store, bound: &self.bound, thread, owner: &owner, lease: &lease }.run(&endpoints)
    }
}

/// The app-server the proven owner of a thread serves, which may start a turn in it.
fn app_server(owner: &Owner, codex_home: &Path) -> Result<Vec<Endpoint>, WakeReason> {
    if owner.subagent {
        // Sub-agents take their input from their parent, not from a client's turn/start.
        return Err(WakeReason::SubagentThread);
    }
    let endpoints = endpoint::discover(codex_home, owner.pid, owner.starttime);
    if endpoints.is_empty() {
        return Err(WakeReason::NoAppServer);
    }
    Ok(endpoints)
}

/// Why a thread whose owner could not be proven is not woken.
fn wake_reason(why: &NoOwner) -> WakeReason {
    match why {
        NoOwner::NotLoaded => WakeReason::ThreadNotLoaded,
        NoOwner::Untrusted(_) => WakeReason::OwnerUntrusted,
        NoOwner::NotProven(_) => WakeReason::OwnerNotProven,
    }
}

/// A Claude Code session with a live claude, as the wake pass sees it.
enum Claude {
    /// A turn is open (or no hook said yet): its hooks deliver.
    Busy,
    /// Idle, and a wake hook of it is held: the Claude wing hands the message.
    WakeHeld,
    /// Idle, and no wake hook of it is held: its next prompt delivers.
    NoWake,
}

/// `thread` as a Claude Code session with a live claude, or `None`: not one.
fn claude_session(store: &Mutex<Store>, thread: &ThreadId) -> Option<Claude> {
    let pin = crate::store::lock(store).claude_session_pin(thread).ok().flatten()?;
    if !pin.owner.is_alive() {
        return None;
    }
    Some(match (pin.activity, pin.wake_held(crate::store::now_ms())) {
        (Some(crate::store::SessionActivity::Idle), true) => Claude::WakeHeld,
        (Some(crate::store::SessionActivity::Idle), false) => Claude::NoWake,
        _ => Claude::Busy,
    })
}

fn note(store: &Mutex<Store>, thread: &ThreadId, reason: WakeReason) {
    let mut s = crate::store::lock(store);
    if let Err(e) = s.note_deferral(thread, reason) {
        crate::log_error!("wake: noting {reason} on {thread}: {e:#}");
    }
}

/// A busy thread is left to its hooks; while it waits on a person's approval none will run:
/// its messages say so (`broker approvals`).
fn note_waiting_on_approval(store: &Mutex<Store>, thread: &ThreadId) {
    let mut s = crate::store::lock(store);
    if s.thread_waits_on_approval(thread).unwrap_or(false) {
        if let Err(e) = s.note_deferral(thread, DeliveryReason::WaitingOnApproval) {
            crate::log_error!("wake: noting waiting_on_approval on {thread}: {e:#}");
        }
    }
}

/// One wake's exchange with the app-server, from its lease on.
struct Exchange<'a> {
    store: &'a Mutex<Store>,
    bound: &'a Bound,
    thread: &'a ThreadId,
    owner: &'a Owner,
    lease: &'a Lease,
}

impl Exchange<'_> {
    fn run(&self, endpoints: &[Endpoint]) -> Outcome {
        let thread = self.thread;
        let count = self.lease.messages.len();
        let deadline = Instant::now() + EXCHANGE;
        let mut ws = match appserver::open_session(endpoints, self.owner.pid, self.owner.starttime, deadline) {
            Ok(ws) => ws,
            Err(why) => {
                crate::log_warn!("wake {thread}: no app-server session: {why}");
                return self.give_back(Step::Leased, WakeReason::Unreachable);
            }
        };
        // The durable record before anything leaves: from here on only the rollout settles it.
        if !self.record_hand_off() {
            return self.give_back(Step::Leased, WakeReason::Unreachable);
        }
        crate::failpoint::hit("wake_before_turn_start");
        let text = self.lease.messages.iter().map(crate::store::Message::wrapped).collect::<Vec<_>>().join("\n");
        let client_id = &self.lease.messages[0].id;
        let params = json!({
            "threadId": thread,
            "clientUserMessageId": client_id,
            "input": [{"type": "text", "text": text, "text_elements": []}],
        });
        let id = match ws.send_request("turn/start", params) {
            Ok(id) => id,
            Err(e) if !e.timed_out => {
                // Nothing was written: the request never left.
                crate::log_warn!("wake {thread}: sending turn/start: {e}");
                return self.give_back(Step::Handed, WakeReason::Unreachable);
            }
            Err(e) => {
                crate::log_warn!("wake {thread}: turn/start may have been sent ({e}); the rollout decides");
                self.bound.woke(thread, Instant::now());
                return Outcome::Woken { count, turn: None };
            }
        };
        self.bound.woke(thread, Instant::now());
        crate::failpoint::hit("wake_after_turn_start");
        match ws.wait_response(id) {
            Ok(r) => match r.pointer("/result/turn/id").and_then(Value::as_str) {
                Some(turn) => {
                    crate::failpoint::hit("wake_after_answer");
                    self.record_turn(turn);
                    crate::log_info!("woke thread {thread}: turn {turn} started with {count} message(s) ({client_id}...)");
                    Outcome::Woken { count, turn: Some(turn.to_string()) }
                }
                None => {
                    let err = r.get("error").cloned().unwrap_or(r);
                    crate::log_warn!("wake {thread}: turn/start refused: {err}");
                    self.give_back(Step::Handed, WakeReason::Refused)
                }
            },
            Err(e) => {
                crate::log_warn!("wake {thread}: no answer to turn/start ({e}); the rollout decides");
                Outcome::Woken { count, turn: None }
            }
        }
    }

    /// `handed`, with the rollout offset, the codex and the deadline, fsynced. False: not recorded
    /// (the lease lapsed, or the store failed), so nothing may be sent.
    fn record_hand_off(&self) -> bool {
        let path = self.owner.rollout.to_string_lossy();
        let codex = ProcessKey { pid: self.owner.pid, starttime: self.owner.starttime };
        let record =
            HandOff { shown_by: Some(crate::store::now_ms() + WAKE_LEASE_MS), ..HandOff::at(&path, self.owner.rollout_len, codex) };
        let mut s = crate::store::lock(self.store);
        match s.hand_off(self.lease.token, &record) {
            Ok(true) => true,
            Ok(false) => {
                crate::log_error!("wake: lease {} lapsed before turn/start was sent", self.lease.token);
                false
            }
            Err(e) => {
                crate::log_error!("wake: recording the hand-off of lease {}: {e:#}", self.lease.token);
                false
            }
        }
    }

    fn record_turn(&self, turn: &str) {
        self.bound.started(self.thread, turn);
        let mut s = crate::store::lock(self.store);
        if let Err(e) = s.set_lease_turn(self.lease.token, turn) {
            crate::log_error!("wake: recording turn {turn} of lease {}: {e:#}", self.lease.token);
        }
    }

    /// Codex provably got nothing: the messages go back to `pending` with `why`.
    fn give_back(&self, step: Step, why: WakeReason) -> Outcome {
        let mut s = crate::store::lock(self.store);
        let done = match step {
            Step::Leased => s.release(self.lease.token, why),
            Step::Handed => s.withdraw(self.lease.token, why),
        };
        if let Err(e) = done {
            crate::log_error!("wake: giving back lease {}: {e:#}", self.lease.token);
        }
        Outcome::NotWoken(why)
    }
}

/// How far a wake got before it gave up: what taking it back undoes.
enum Step {
    Leased,
    Handed,
}
