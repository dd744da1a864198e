//! `broker send --mode interrupt`: the running turn of a Codex thread is stopped through the
//! app-server that owns the thread, and the message is then delivered by the wake (a new turn
//! carrying it), exactly once.
//!
//! An `interrupt` message is `pending` like any other and never goes into a running turn
//! (`Channel::inside_turn`); what is its own is that a wake pass which finds its thread busy stops
//! the turn first. The steps, and what a crash (kill -9) at each instant leaves:
//!
//! 1. the thread's proven owner has an open turn T, and a pending `interrupt` message has stopped
//!    no turn yet, or stopped T ([`Store::interrupt_due`]); the thread is within its wake bound
//!    (an interrupt is always followed by a wake, so it is counted by the same bound).
//! 2. a session on the owner's app-server (`appserver::open_session`); none: nothing was sent,
//!    the message waits (`wake_unreachable`).
//! 3. T recorded on the messages, fsynced, BEFORE anything is sent ([`Store::record_interrupt`]).
//!    A crash from here on: the restarted broker asks again only while T is still open (the
//!    request may not have left; a second `turn/interrupt` of one turn changes nothing), and
//!    never stops a later turn for these messages. They stay `pending` throughout.
//! 4. `turn/interrupt {threadId, turnId: T}` written; Codex answers once the turn is aborted.
//! 5. the rollout shows T closed (`turn_aborted`, or `task_complete` if it ended first) within
//!    [`TURN_END`]: the wake delivers at once, on the owner as it stands now (the hand-off's
//!    rollout offset is after T's end). Another turn opened meanwhile: the message waits for it
//!    (its hooks never take an `interrupt` message; the wake does when it ends). T still open: the
//!    message keeps `turn_not_interrupted`, and the next pass asks again.
//!
//! Delivery is the wake's, with its exactly-once rules: one lease, a hand-off record before
//! `turn/start`, `confirmed` from the rollout.

use super::{appserver, Endpoint, Outcome, Owner, WakeReason};
use crate::exe::CodexTrust;
use crate::gate::Gate;
use crate::store::Store;
use courier_shared::ids::ThreadId;
use serde_json::json;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long the rollout has to show the interrupted turn closed before the pass gives up for now.
pub const TURN_END: Duration = Duration::from_secs(10);
/// The exchange: connect, initialize, `turn/interrupt` and its answer.
const EXCHANGE: Duration = Duration::from_secs(10);
/// How often the owner's rollout is read while waiting for the turn to close.
const POLL: Duration = Duration::from_millis(50);

/// Why a send with `--mode interrupt` is refused for a Codex thread that is live: what the wake
/// pass needs to interrupt it, checked when the message is sent (`producer/send.rs`), so nothing
/// is queued that could never interrupt.
pub fn check(gate: &Gate, trust: &dyn CodexTrust, thread: &ThreadId) -> Result<(), String> {
    let owner = gate.thread_owner(thread, trust).map_err(|why| {
        let code = super::wake_reason(&why);
        format!("the process that runs thread {thread} could not be proven to be a trusted Codex ({code})")
    })?;
    if owner.subagent {
        return Err(format!("thread {thread} is a sub-agent: its turns are its parent's to stop"));
    }
    if appserver::endpoint::discover(gate.codex_home(), owner.pid, owner.starttime).is_empty() {
        return Err(format!(
            "the Codex process that runs thread {thread} serves no app-server (a `codex exec`, or a TUI without its app-server), \
             and only an app-server takes an interrupt"
        ));
    }
    Ok(())
}

/// Whether `thread`, busy in `turn`, has a pending `interrupt` message for that turn.
pub fn due(store: &Mutex<Store>, thread: &ThreadId, turn: &str) -> bool {
    crate::store::lock(store).interrupt_due(thread, turn).unwrap_or_else(|e| {
        crate::log_error!("interrupt: looking for interrupt messages of {thread}: {e:#}");
        false
    })
}

/// Stops `turn` of `thread` (steps 2 to 5 of the module docs): the owner, idle now, for the wake
/// to deliver on; else what the pass did.
pub fn stop(
    store: &Mutex<Store>,
    gate: &Gate,
    trust: &dyn CodexTrust,
    thread: &ThreadId,
    owner: &Owner,
    turn: &str,
    endpoints: &[Endpoint],
) -> Result<Owner, Outcome> {
    let mut ws = appserver::open_session(endpoints, owner.pid, owner.starttime, Instant::now() + EXCHANGE).map_err(|why| {
        crate::log_warn!("interrupt {thread}: no app-server session: {why}");
        super::note(store, thread, WakeReason::Unreachable);
        Outcome::NotWoken(WakeReason::Unreachable)
    })?;
    // The durable record before anything leaves: this turn and no other is stopped for them.
    match crate::store::lock(store).record_interrupt(thread, turn) {
        Ok(0) => return Err(Outcome::Nothing),
        Ok(_) => {}
        Err(e) => {
            crate::log_error!("interrupt {thread}: recording the interrupt of turn {turn}: {e:#}");
            return Err(Outcome::Nothing);
        }
    }
    crate::failpoint::hit("interrupt_before_send");
    let started = Instant::now();
    match ws.call("turn/interrupt", json!({"threadId": thread, "turnId": turn})) {
        Ok(r) if r.get("result").is_some() => crate::log_info!("interrupt {thread}: turn {turn} interrupted"),
        // Refused (the turn ended meanwhile, or another is running): the rollout says which.
        Ok(r) => crate::log_warn!("interrupt {thread}: turn/interrupt of {turn} refused: {}", r.get("error").unwrap_or(&r)),
        Err(e) => crate::log_warn!("interrupt {thread}: turn/interrupt of {turn}: {e}; the rollout decides"),
    }
    crate::failpoint::hit("interrupt_after_answer");
    let closed = turn_closed(gate, trust, thread, turn, started + TURN_END);
    crate::log_debug!("interrupt {thread}: turn {turn}: {:?} after {:?}", closed.as_ref().map(|o| &o.open_turn), started.elapsed());
    match closed {
        Ok(now) if now.open_turn.is_none() => Ok(now),
        // The person (or a client) started another turn at once: it is not stopped too.
        Ok(_) => Err(Outcome::Busy),
        Err(why) => {
            super::note(store, thread, why);
            Err(Outcome::NotWoken(why))
        }
    }
}

/// The owner once the rollout shows `turn` closed, by `deadline`; else `turn_not_interrupted`
/// (still open then), or why the owner could no longer be proven (it exited, say).
fn turn_closed(gate: &Gate, trust: &dyn CodexTrust, thread: &ThreadId, turn: &str, deadline: Instant) -> Result<Owner, WakeReason> {
    loop {
        let now = gate.thread_owner(thread, trust).map_err(|why| super::wake_reason(&why))?;
        if now.open_turn.as_deref() != Some(turn) {
            return Ok(now);
        }
        if Instant::now() >= deadline {
            return Err(WakeReason::TurnNotInterrupted);
        }
        std::thread::sleep(POLL);
    }
}
