//! The opt-in hold (`[approvals] hold`): a PermissionRequest hook (Codex's, or Copilot CLI's
//! permissionRequest) that waits, bounded, for a person's `broker approve|deny` and returns it as
//! the hook's decision, in the host's own form. Off by default: the hook
//! returns at once and the person's prompt appears as usual.
//!
//! The broker tells hook-client at once that it holds, and for how long (`hold_ms`), so a broker
//! that says nothing still fails open at hook-client's usual deadline. A held approval is taken
//! by one answer (the table's `pending -> answering`, then the hold's entry removed under its
//! lock); a hold that ends first (timeout) returns no decision and Codex does what it does without
//! one. Codex's own hook timeout must exceed the hold (docs/approvals.md).

use super::Broker;
use crate::approval::{ApprovalHost, ApprovalKind, Decision, NewApproval};
use crate::codex::approval as codex_approval;
use crate::codex::appserver::endpoint;
use crate::codex::patch::patch_files;
use crate::config::Hold;
use crate::gate::Verified;
use courier_shared::wire::{self, HookReply, PROTOCOL_VERSION};
use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Holds at once at most: each keeps a broker worker.
pub(super) const MAX_HOLDS: usize = 4;
/// A hold that ran out just as an answer took it waits this long more for that answer.
const TAKEN_GRACE: Duration = Duration::from_secs(2);
/// How long after its hold ended an approval is still left alone by the sweep.
const JUST_ENDED: Duration = Duration::from_secs(5);
/// How long an answer waits for the held hook to say whether the decision was written.
const WRITTEN_WITHIN: Duration = Duration::from_secs(5);

/// A person's answer for a held hook; `written` says whether it reached hook-client.
pub(super) struct HeldAnswer {
    pub decision: Decision,
    pub message: Option<String>,
    pub written: Sender<bool>,
}

/// A hook held now, or one whose hold ended a moment ago.
enum Held {
    Waiting(Sender<HeldAnswer>),
    /// Its request reaches the app-server only now: the sweep leaves it alone a while.
    Ended(Instant),
}

/// The hooks held, by approval id.
#[derive(Default)]
pub(super) struct Holds(Mutex<HashMap<String, Held>>);

impl Holds {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether approval `id`'s hook is held, or was a moment ago (Codex may not have shown it
    /// to anyone yet).
    pub(super) fn is_held(&self, id: &str) -> bool {
        match self.lock().get(id) {
            Some(Held::Waiting(_)) => true,
            Some(Held::Ended(at)) => at.elapsed() < JUST_ENDED,
            None => false,
        }
    }

    /// Records an approval (`record`) and holds it, under the holds' lock: an answer that sees
    /// the approval sees its hold. `None`: not recorded, or too many held (it returns at once).
    pub(super) fn register(&self, record: impl FnOnce() -> Option<String>) -> Option<(String, Receiver<HeldAnswer>)> {
        let mut held = self.lock();
        let id = record()?;
        held.retain(|_, h| !matches!(h, Held::Ended(at) if at.elapsed() >= JUST_ENDED));
        if held.values().filter(|h| matches!(h, Held::Waiting(_))).count() >= MAX_HOLDS {
            crate::log_warn!("approval {id}: {MAX_HOLDS} hooks held already; this one returns at once");
            return None;
        }
        let (tx, rx) = channel();
        held.insert(id.clone(), Held::Waiting(tx));
        Some((id, rx))
    }

    /// Takes the hold of `id` for one answer (`None`: not held, or its hold ended).
    pub(super) fn take(&self, id: &str) -> Option<Sender<HeldAnswer>> {
        let mut held = self.lock();
        match held.insert(id.to_string(), Held::Ended(Instant::now())) {
            Some(Held::Waiting(tx)) => Some(tx),
            _ => None,
        }
    }
}

/// What giving a held hook its decision came to.
pub(super) enum Given {
    /// hook-client has the decision (it prints it for Codex).
    Written,
    /// The hook had gone (Codex's own timeout killed it, or Codex exited): nothing reached Codex.
    HookGone,
}

/// Gives the held hook `answer`'s decision; waits (bounded) to learn whether it was written.
pub(super) fn give(hold: Sender<HeldAnswer>, decision: Decision, message: Option<String>) -> Given {
    let (written, was_written) = channel();
    if hold.send(HeldAnswer { decision, message, written }).is_err() {
        return Given::HookGone;
    }
    match was_written.recv_timeout(WRITTEN_WITHIN) {
        Ok(true) => Given::Written,
        _ => Given::HookGone,
    }
}

impl Broker {
    /// Whether `v`'s PermissionRequest is held, as configured.
    pub(super) fn holds(&self, v: &Verified) -> bool {
        // A patch whose files Courier cannot list is never answered through Courier: holding
        // its hook would only keep Codex from asking the person (or its own review).
        let patch = codex_approval::hook_kind(&v.payload) == ApprovalKind::FileChange;
        if patch && codex_approval::hook_command(&v.payload).is_none_or(|p| patch_files(&p, v.payload.cwd.as_deref()).is_empty()) {
            return false;
        }
        match self.approvals.config.hold {
            Hold::Off => false,
            Hold::All => true,
            Hold::Exec => endpoint::discover(&self.approvals.codex_home, v.codex_pid, v.codex_starttime).is_empty(),
        }
    }

    /// Holds a host's hook that asks a person `asked` (Copilot CLI's permissionRequest): recorded
    /// and held; not recorded, or too many held, it is answered at once with no decision.
    pub(super) fn hold_for_person(&self, mut stream: UnixStream, asked: &NewApproval) {
        match self.approvals.holds.register(|| self.record_new_approval(asked)) {
            Some((id, answers)) => self.hold(stream, &id, asked.host, answers),
            None => {
                let _ = wire::write_json(&mut stream, &HookReply { v: PROTOCOL_VERSION, ..Default::default() });
            }
        }
    }

    /// Holds the hook of `host`'s approval `id` (registered, answers come on `rx`) until an answer
    /// or the hold's end, then replies: the decision, or none. Always replies something on `stream`.
    pub(super) fn hold(&self, mut stream: UnixStream, id: &str, host: ApprovalHost, rx: Receiver<HeldAnswer>) {
        let holds = &self.approvals.holds;
        let hold = self.approvals.config.hold_for();
        let said = HookReply { v: PROTOCOL_VERSION, hold_ms: Some(hold.as_millis() as u64), ..Default::default() };
        if wire::write_json(&mut stream, &said).is_err() {
            holds.take(id);
            return;
        }
        crate::log_info!("approval {id}: hook held up to {}s for a person's answer", hold.as_secs());
        let answer = match rx.recv_timeout(hold) {
            Ok(answer) => Some(answer),
            // Not taken: the hold ends. Taken just now: its answer is on its way.
            Err(RecvTimeoutError::Timeout) if holds.take(id).is_some() => None,
            Err(_) => rx.recv_timeout(TAKEN_GRACE).ok(),
        };
        let output = answer.as_ref().map(|x| hook_decision(host, x.decision, x.message.as_deref())).unwrap_or_default();
        let written = wire::write_json(&mut stream, &HookReply { v: PROTOCOL_VERSION, output, ..Default::default() }).is_ok();
        match (answer, host) {
            (Some(x), _) => {
                let _ = x.written.send(written);
            }
            (None, ApprovalHost::Codex) => {
                crate::log_info!("approval {id}: the hold ended with no answer; Codex decides as without Courier")
            }
            // Nothing else carries an answer to Copilot CLI: the approval is over.
            (None, ApprovalHost::Copilot) => self.resolve_unheld(id, crate::copilot::approval::HOLD_ENDED),
        }
    }

    /// Resolves approval `id`, which nothing can answer any more, with `why`.
    pub(super) fn resolve_unheld(&self, id: &str, why: &str) {
        let mut store = crate::store::lock(&self.store);
        match store.resolve_approval(id, why) {
            Ok(true) => crate::log_info!("approval {id}: resolved: {why}"),
            Ok(false) => {}
            Err(e) => crate::log_error!("resolving approval {id}: {e:#}"),
        }
        if let Ok(Some(a)) = store.approval(id) {
            self.approvals.forget_if_settled(&store, &a.thread);
        }
    }
}

/// The held hook's output for a person's decision, as `host` reads it.
fn hook_decision(host: ApprovalHost, decision: Decision, message: Option<&str>) -> String {
    match host {
        ApprovalHost::Codex => codex_approval::hook_decision(decision, message),
        ApprovalHost::Copilot => crate::copilot::approval::decision(decision, message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hold is taken by one answer; a hold that ended is not taken, and is still left alone
    /// by the sweep a moment; no more than MAX_HOLDS wait at once.
    #[test]
    fn a_hold_is_taken_once() {
        let holds = Holds::default();
        let (id, _rx) = holds.register(|| Some("apr-1".into())).unwrap();
        assert!(holds.is_held(&id));
        assert!(holds.take(&id).is_some());
        assert!(holds.take(&id).is_none(), "taken once");
        assert!(holds.is_held(&id), "just ended: not yet shown to anyone");
        assert!(holds.register(|| None).is_none(), "nothing recorded, nothing held");
        let _waiting: Vec<_> = (0..MAX_HOLDS).map(|i| holds.register(|| Some(format!("apr-w{i}"))).unwrap()).collect();
        assert!(holds.register(|| Some("apr-over".into())).is_none(), "at most {MAX_HOLDS} held");
    }
}
