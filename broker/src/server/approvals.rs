//! Approvals in `broker serve`: a verified PermissionRequest hook records a pending approval and
//! is answered at once with no decision (the person's prompt appears as usual); later hooks of
//! the thread resolve it; and the `approve`/`deny` request line answers it once, from a person's
//! process only, through the app-server that owns the thread.
//!
//! Request (JSON line on the broker socket, like the producers'):
//! `{"op":"approve"|"deny","id":ID,"message"?:TEXT}` ->
//! `{"ok":true,"id","outcome":"won"|"lost"|"unknown","detail"}`; errors as the producers'
//! (`not_a_person`, `not_pending`, `not_found`, `failed`, `bad_request`).

use super::trust::TrustView;
use super::Broker;
use crate::approval::{AnswerOutcome, AnswerRecord, AnswerVia, Approval, Decision, NewApproval, Refused};
use crate::codex::approval::{self as codex_approval, Answered};
use crate::codex::appserver::endpoint;
use crate::gate::{self, Verified};
use crate::producer::line::{error, write_line, ErrorCode};
use crate::reason::DeliveryReason;
use crate::store::{now_ms, Enqueued, NewMessage, Store, Ticket};
use codex_format::hook::HookEvent;
use courier_shared::ids::ThreadId;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The whole app-server exchange of one answer (connect, resume, answer, its ack).
const EXCHANGE: Duration = Duration::from_secs(10);
/// Who the deny message is from, as the model reads it.
const DENY_FROM: &str = "approval";

/// What the broker keeps of approvals between requests.
pub(super) struct Approvals {
    codex_home: PathBuf,
    /// Threads with an approval still pending: only their hooks look at the table.
    waiting: Mutex<HashSet<ThreadId>>,
}

impl Approvals {
    pub(super) fn open(store: &Store, codex_home: PathBuf) -> anyhow::Result<Approvals> {
        let waiting = store.threads_waiting_on_approval()?.into_iter().collect();
        Ok(Approvals { codex_home, waiting: Mutex::new(waiting) })
    }
}

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum AnswerOp {
    Approve {
        id: String,
    },
    Deny {
        id: String,
        #[serde(default)]
        message: Option<String>,
    },
}

/// Whether a request line is an answer (`approve`/`deny`) rather than a producer's request.
pub(super) fn is_answer(line: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Op<'a> {
        #[serde(borrow)]
        op: &'a str,
    }
    serde_json::from_slice::<Op>(line).is_ok_and(|o| matches!(o.op, "approve" | "deny"))
}

impl Broker {
    /// A verified PermissionRequest: recorded as pending; the hook gets no decision.
    pub(super) fn record_approval(&self, v: &Verified, ticket: &Ticket) {
        let (Some(command), Some(turn)) = (codex_approval::hook_command(&v.payload), v.turn_id.clone()) else { return };
        let mut waiting = v.actions.calls.iter().filter(|(_, done)| !done).map(|(id, _)| id.clone());
        let call_id = match (waiting.next(), waiting.next()) {
            (Some(only), None) => Some(only),
            _ => None,
        };
        let new = NewApproval {
            thread: v.thread_id.clone(),
            turn,
            call_id,
            tool: v.payload.tool_name.clone().unwrap_or_default(),
            command,
            reason: codex_approval::hook_reason(&v.payload),
            cwd: v.payload.cwd.clone(),
            ticket: ticket.key.clone(),
        };
        let mut store = crate::store::lock(&self.store);
        let recorded = store.record_approval(&new);
        // No hook runs until it is answered: the thread's messages say why they wait.
        if let Err(e) = store.note_deferral(&new.thread, DeliveryReason::WaitingOnApproval) {
            crate::log_error!("noting waiting_on_approval on thread {}: {e:#}", new.thread);
        }
        drop(store);
        match recorded {
            Ok(id) => {
                self.approvals.waiting.lock().unwrap_or_else(|e| e.into_inner()).insert(new.thread.clone());
                crate::log_info!("approval {id}: thread {} waits on a person for {:?}", new.thread, new.command);
            }
            Err(e) => crate::log_error!("recording the approval of thread {}: {e:#}", new.thread),
        }
    }

    /// A later hook of a thread with pending approvals: PostToolUse(C) shows C's command ran;
    /// the turn's end or a new turn shows none of them waits any more.
    pub(super) fn resolve_approvals(&self, v: &Verified) {
        if !self.approvals.waiting.lock().unwrap_or_else(|e| e.into_inner()).contains(&v.thread_id) {
            return;
        }
        let call = match v.event {
            HookEvent::PostToolUse => v.payload.tool_use_id.as_deref(),
            HookEvent::Stop | HookEvent::UserPromptSubmit | HookEvent::SessionStart => None,
            _ => return,
        };
        let mut store = crate::store::lock(&self.store);
        if let Err(e) = store.resolve_approvals(&v.thread_id, call) {
            crate::log_error!("resolving the approvals of thread {}: {e:#}", v.thread_id);
        }
        if store.threads_waiting_on_approval().is_ok_and(|t| !t.contains(&v.thread_id)) {
            self.approvals.waiting.lock().unwrap_or_else(|e| e.into_inner()).remove(&v.thread_id);
        }
    }

    /// Serves one `approve`/`deny` line.
    pub(super) fn answer_approval(&self, mut stream: UnixStream, line: &[u8]) {
        let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
        let reply = match serde_json::from_slice::<AnswerOp>(line) {
            Err(e) => error(ErrorCode::BadRequest, &format!("not an answer: {e}")),
            Ok(op) => self.answer(&stream, op).unwrap_or_else(|(code, why)| error(code, &why)),
        };
        let _ = write_line(&mut stream, &reply);
    }

    fn answer(&self, stream: &UnixStream, op: AnswerOp) -> Result<Value, (ErrorCode, String)> {
        let (id, decision, message) = match op {
            AnswerOp::Approve { id } => (id, Decision::Approve, None),
            AnswerOp::Deny { id, message } => (id, Decision::Deny, message.filter(|m| !m.trim().is_empty())),
        };
        // Only a person answers: never a process a model's command may be.
        let peer = gate::peer::identify(stream).map_err(|r| (ErrorCode::NotAPerson, format!("{}: {}", r.code, r.detail)))?;
        let by = self.gate.verify_person(&peer, &TrustView(self)).map_err(|why| (ErrorCode::NotAPerson, why))?;
        let listed = crate::store::lock(&self.store).approval(&id).map_err(failed)?;
        let listed = listed.ok_or_else(|| (ErrorCode::NotFound, format!("no approval {id}")))?;
        let owner = self
            .gate
            .thread_owner(&listed.thread, &TrustView(self))
            .map_err(|why| (ErrorCode::Failed, format!("thread {}: no live Codex process proven to hold it ({why:?})", listed.thread)))?;
        let endpoints = endpoint::discover(&self.approvals.codex_home, owner.pid, owner.starttime);
        if endpoints.is_empty() {
            return Err((ErrorCode::Failed, format!("the Codex process {} of thread {} serves no app-server", owner.pid, listed.thread)));
        }
        let record = AnswerRecord { decision, message: message.clone(), by, via: AnswerVia::Cli, at: now_ms(), outcome: None };
        let taken = crate::store::lock(&self.store).claim_approval(&id, &record).map_err(failed)?;
        let approval = taken.map_err(|r| match r {
            Refused::NotFound => (ErrorCode::NotFound, format!("no approval {id}")),
            r @ Refused::NotPending(_) => (ErrorCode::NotPending, r.to_string()),
        })?;
        let steering = message.as_deref().map(|m| self.queue_deny_message(&approval, m)).transpose()?;
        let answered = codex_approval::answer(&endpoints, owner.pid, owner.starttime, &approval, decision, Instant::now() + EXCHANGE);
        let (outcome, detail) = match answered {
            Answered::Sent(o) => (o, String::new()),
            Answered::NotSent(why) => (AnswerOutcome::Lost, why),
            Answered::Failed(why) => {
                // Nothing was written: the approval waits again, and so does no steering.
                self.undo_claim(&approval, steering.as_deref());
                return Err((ErrorCode::Failed, why));
            }
        };
        if outcome == AnswerOutcome::Lost {
            self.cancel_steering(steering.as_deref());
        }
        let mut store = crate::store::lock(&self.store);
        store.settle_approval(&id, outcome).map_err(failed)?;
        crate::log_info!("approval {id}: {} -> {}{}", decision.as_str(), outcome.as_str(), if detail.is_empty() { "" } else { ": " });
        Ok(json!({"ok": true, "id": id, "outcome": outcome, "detail": detail}))
    }

    /// The deny message, queued for the thread before the answer leaves so the next hook of the
    /// turn carries it to the model.
    fn queue_deny_message(&self, a: &Approval, message: &str) -> Result<String, (ErrorCode, String)> {
        let text = format!("Your request to run `{}` was denied: {message}", a.command);
        let key = format!("approval:{}", a.id);
        let new = NewMessage {
            thread: &a.thread,
            body: &text,
            sender: Some(DENY_FROM),
            verified: false,
            key: Some(&key),
            ttl_ms: None,
            wake: true,
        };
        let mut store = crate::store::lock(&self.store);
        match store.enqueue_message(&new) {
            Ok(Enqueued::New(id) | Enqueued::Existing(id)) => Ok(id),
            Err(e) => Err((ErrorCode::Failed, format!("queueing the deny message: {e:#}"))),
        }
    }

    fn cancel_steering(&self, message: Option<&str>) {
        if let Some(m) = message {
            if let Err(e) = crate::store::lock(&self.store).cancel(m) {
                crate::log_warn!("cancelling deny message {m}: {e:#}");
            }
        }
    }

    fn undo_claim(&self, a: &Approval, steering: Option<&str>) {
        self.cancel_steering(steering);
        if let Err(e) = crate::store::lock(&self.store).unclaim_approval(&a.id) {
            crate::log_error!("returning approval {} to pending: {e:#}", a.id);
        }
    }
}

fn failed(e: anyhow::Error) -> (ErrorCode, String) {
    (ErrorCode::Failed, format!("{e:#}"))
}
