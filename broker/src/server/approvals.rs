//! Approvals in `broker serve`: a verified PermissionRequest hook records a pending approval and
//! is answered at once with no decision (the person's prompt appears as usual); later hooks of
//! the thread resolve it; and the `approve`/`deny` request line answers it once, from a person's
//! process only, through the app-server that owns the thread.
//!
//! Requests (JSON lines on the broker socket, like the producers'):
//! - `{"op":"answerable","id"?:ID}` -> `{"ok":true,"approvals":[APPROVAL + "shown"],"person":KEY|null}`:
//!   the pending approvals whose record is still the one the hook saw, each with the digest of
//!   what a person is shown (`shown`), and the public person key to sign with (`person/`);
//! - `{"op":"approve"|"deny","id":ID,"shown":DIGEST,"proof":SIG,"message"?:TEXT}` ->
//!   `{"ok":true,"id","outcome":"won"|"lost"|"unknown","detail"}`; errors as the producers'
//!   (`not_a_person`, `not_pending`, `not_found`, `failed`, `bad_request`).
//!
//! An answer is taken only with the person's signature of exactly that act on exactly the
//! record shown (`gate/person.rs`), and only while the record is the one this broker recorded:
//! the digest of each approval it records is kept in its memory (`Approvals::shown`), where no
//! other process writes, so a row rewritten in the database (to show a person `ls` while Codex
//! runs something else) is never offered, and an answer signed for a rewritten row is refused.

use super::approval_hold::{self, Given, Holds, MAX_HOLDS as MAX_HELD};
use super::trust::TrustView;
use super::Broker;
use crate::approval::{
    AnswerOutcome, AnswerRecord, AnswerVia, Approval, ApprovalHost, ApprovalKind, ApprovalState, Decision, NewApproval, Refused,
};
use crate::codex::approval::{self as codex_approval, Answered};
use crate::codex::appserver::endpoint;
use crate::config::Hold;
use crate::gate::{self, Verified};
use crate::producer::line::{error, write_line, ErrorCode};
use crate::reason::DeliveryReason;
use crate::store::{now_ms, Enqueued, NewMessage, Store, Ticket};
use codex_format::hook::HookEvent;
use courier_shared::ids::ThreadId;
use courier_shared::wire::{HookReply, PROTOCOL_VERSION};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The whole app-server exchange of one answer (connect, resume, answer, its ack).
const EXCHANGE: Duration = Duration::from_secs(10);
/// Who the deny message is from, as the model reads it.
const DENY_FROM: &str = crate::envelope::label::APPROVAL_LABEL;

/// What the broker keeps of approvals between requests.
pub(super) struct Approvals {
    pub(super) codex_home: PathBuf,
    pub(super) config: crate::config::ApprovalsConfig,
    /// Hooks held for a remote answer (approval_hold.rs).
    pub(super) holds: Holds,
    /// Threads with an approval still pending: only their hooks look at the table.
    waiting: Mutex<HashSet<ThreadId>>,
    /// Signalled when `waiting` gains a thread: the sweep sleeps until then (an idle broker's
    /// `approvals` thread woke every second for nothing).
    gained: Condvar,
    /// What each approval this broker recorded showed, by id (`Approval::shown`): the record a
    /// person may answer. Memory only: an approval recorded before a restart is answered at the
    /// agent's own prompt.
    shown: Mutex<HashMap<String, String>>,
}

impl Approvals {
    pub(super) fn open(store: &Store, codex_home: PathBuf, config: crate::config::ApprovalsConfig) -> anyhow::Result<Approvals> {
        let waiting = store.threads_waiting_on_approval()?.into_iter().collect();
        Ok(Approvals {
            codex_home,
            config,
            holds: Holds::default(),
            waiting: Mutex::new(waiting),
            gained: Condvar::new(),
            shown: Mutex::new(HashMap::new()),
        })
    }

    /// `thread` has an approval pending from now on.
    fn note_waiting(&self, thread: &ThreadId) {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).insert(thread.clone());
        self.gained.notify_all();
    }

    /// Returns once some thread has an approval pending (at once if one has).
    pub(super) fn wait_for_any(&self) {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        while waiting.is_empty() {
            waiting = self.gained.wait(waiting).unwrap_or_else(|e| e.into_inner());
        }
    }

    pub(super) fn any_waiting(&self) -> bool {
        !self.waiting.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    /// Whether a hook holds approval `id` for a remote answer (Codex has not seen it yet).
    pub(super) fn is_held(&self, id: &str) -> bool {
        self.holds.is_held(id)
    }

    /// Stops looking at `thread`'s hooks once none of its approvals is still waiting.
    pub(super) fn forget_if_settled(&self, store: &Store, thread: &ThreadId) {
        if store.threads_waiting_on_approval().is_ok_and(|t| !t.iter().any(|w| w == thread)) {
            self.waiting.lock().unwrap_or_else(|e| e.into_inner()).remove(thread);
        }
    }
}

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum AnswerOp {
    /// The approvals a person may answer now, with what each shows.
    Answerable {
        #[serde(default)]
        id: Option<String>,
    },
    Approve {
        id: String,
        /// The digest of the record the person was shown and signed.
        shown: String,
        /// The person's signature of this act (`person::Act::Answer`).
        proof: String,
        /// Set by the NATS bridge: the approver it answers for (recorded as the bridge's word;
        /// the proof is the signature).
        #[serde(default)]
        nats_user: Option<String>,
    },
    Deny {
        id: String,
        shown: String,
        proof: String,
        #[serde(default)]
        message: Option<String>,
        #[serde(default)]
        nats_user: Option<String>,
    },
}

/// Whether a request line is for the approvals service (`answerable`, `approve`, `deny`) rather
/// than a producer's request.
pub(super) fn is_answer(line: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Op<'a> {
        #[serde(borrow)]
        op: &'a str,
    }
    serde_json::from_slice::<Op>(line).is_ok_and(|o| matches!(o.op, "approve" | "deny" | "answerable"))
}

impl Broker {
    /// Records a verified PermissionRequest, or a `request_permissions` call's PreToolUse, as
    /// pending; its id.
    pub(super) fn record_approval(&self, v: &Verified, ticket: &Ticket) -> Option<String> {
        self.record_new_approval(&new_approval(v, ticket)?)
    }

    /// Records `new` as pending (whatever its host); its id.
    pub(super) fn record_new_approval(&self, new: &NewApproval) -> Option<String> {
        let mut store = crate::store::lock(&self.store);
        let recorded = store.record_approval(new);
        // No hook runs until it is answered: the thread's messages say why they wait.
        if let Err(e) = store.note_deferral(&new.thread, DeliveryReason::WaitingOnApproval) {
            crate::log_error!("noting waiting_on_approval on thread {}: {e:#}", new.thread);
        }
        drop(store);
        match recorded {
            Ok(id) => {
                self.approvals.shown.lock().unwrap_or_else(|e| e.into_inner()).insert(id.clone(), new.shown(&id));
                self.approvals.note_waiting(&new.thread);
                crate::log_info!("approval {id}: thread {} waits on a person for {} {:?}", new.thread, new.kind.as_str(), new.command);
                Some(id)
            }
            Err(e) => {
                crate::log_error!("recording the approval of thread {}: {e:#}", new.thread);
                None
            }
        }
    }

    /// A verified PreToolUse: a `request_permissions` call's is recorded as pending (Codex asks
    /// the person next, running no PermissionRequest hook); any other tool's is not an approval.
    pub(super) fn record_permission_request(&self, v: &Verified, ticket: &Ticket) {
        if codex_approval::permission_ask(&v.payload).is_some() {
            self.record_approval(v, ticket);
        }
    }

    /// A verified PermissionRequest: recorded, then answered with no decision (the person's
    /// prompt appears as usual), or held for a remote answer where configured.
    pub(super) fn permission_request(&self, mut stream: UnixStream, v: &Verified, ticket: Option<&Ticket>) {
        let Some(ticket) = ticket else {
            let _ = courier_shared::wire::write_json(&mut stream, &HookReply { v: PROTOCOL_VERSION, ..Default::default() });
            return;
        };
        if !self.holds(v) {
            self.record_approval(v, ticket);
        } else if let Some((id, answers)) = self.approvals.holds.register(|| self.record_approval(v, ticket)) {
            return self.hold(stream, &id, ApprovalHost::Codex, answers);
        }
        let _ = courier_shared::wire::write_json(&mut stream, &HookReply { v: PROTOCOL_VERSION, ..Default::default() });
    }

    /// A later hook of a thread with pending approvals: PostToolUse(C) shows C's command ran;
    /// the turn's end or a new turn shows none of them waits any more.
    pub(super) fn resolve_approvals(&self, v: &Verified) {
        if !self.approvals.waiting.lock().unwrap_or_else(|e| e.into_inner()).contains(&v.thread_id) {
            return;
        }
        let (call, why) = match v.event {
            HookEvent::PostToolUse => (v.payload.tool_use_id.as_deref(), "its call completed (its PostToolUse hook)"),
            HookEvent::Stop => (None, "the turn ended (its Stop hook)"),
            HookEvent::UserPromptSubmit | HookEvent::SessionStart => (None, "a new turn began"),
            _ => return,
        };
        let mut store = crate::store::lock(&self.store);
        if let Err(e) = store.resolve_approvals(&v.thread_id, call, why) {
            crate::log_error!("resolving the approvals of thread {}: {e:#}", v.thread_id);
        }
        self.approvals.forget_if_settled(&store, &v.thread_id);
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
        let (id, decision, message, shown, proof, nats_user) = match op {
            // A held message is answered through the same flow (server/inbound.rs).
            AnswerOp::Answerable { id: Some(id) } if crate::producer::is_message_id(&id) => return self.held_answerable(&id),
            AnswerOp::Answerable { id } => return self.answerable(id.as_deref()),
            AnswerOp::Approve { id, shown, proof, nats_user } => (id, Decision::Approve, None, shown, proof, nats_user),
            AnswerOp::Deny { id, shown, proof, message, nats_user } => {
                (id, Decision::Deny, message.filter(|m| !m.trim().is_empty()), shown, proof, nats_user)
            }
        };
        let listed = self.sealed(&id)?;
        if listed.shown() != shown {
            return Err((ErrorCode::NotAPerson, format!("approval {id} is not what was signed: its record differs from the one shown")));
        }
        // Only a person answers: the person key's signature of exactly this act.
        let peer = gate::peer::identify(stream).map_err(|r| (ErrorCode::NotAPerson, format!("{}: {}", r.code, r.detail)))?;
        let key = crate::person::PersonKey::load(&crate::person::key_path()).map_err(failed)?;
        let act = crate::person::Act::Answer { approval: &id, decision, shown: &shown, message: message.as_deref() };
        let by = self.gate.verify_person(&peer, key.as_ref(), &act, &proof).map_err(|why| (ErrorCode::NotAPerson, why))?.by;
        let (by, via) = match nats_user {
            Some(user) => (format!("NATS user {user} (as the bridge names it), {by}"), AnswerVia::Nats),
            None => (by, AnswerVia::Cli),
        };
        unanswerable(&listed).map_err(|why| (ErrorCode::Failed, why))?;
        let record = AnswerRecord { decision, message, by, via, at: now_ms(), outcome: None };
        if self.approvals.holds.is_held(&id) {
            return self.answer_held(&id, &record);
        }
        self.answer_through_app_server(&listed, &record)
    }

    /// Approval `id`, pending, and still the record this broker recorded (its digest in memory
    /// equals the row's now); else why it cannot be answered.
    fn sealed(&self, id: &str) -> Result<Approval, (ErrorCode, String)> {
        let listed = crate::store::lock(&self.store).approval(id).map_err(failed)?;
        let listed = listed.ok_or_else(|| (ErrorCode::NotFound, format!("no approval {id}")))?;
        // Over already (answered, or gone from Codex): say so before anything else.
        if listed.state != ApprovalState::Pending {
            return Err((ErrorCode::NotPending, Refused::NotPending(listed.state, listed.detail).to_string()));
        }
        match self.approvals.shown.lock().unwrap_or_else(|e| e.into_inner()).get(id) {
            None => Err((
                ErrorCode::Failed,
                format!("approval {id} was recorded before this broker started: its record cannot be shown to be the one the hook saw; answer it at the agent's own prompt"),
            )),
            Some(sealed) if *sealed != listed.shown() => {
                crate::log_error!("approval {id}: its record in the database changed after it was recorded; not offered for an answer");
                Err((ErrorCode::Failed, format!("approval {id}: its record was changed after the hook recorded it; answer it at the agent's own prompt")))
            }
            Some(_) => Ok(listed),
        }
    }

    /// The `answerable` op: pending approvals (all, or `id`) each with what it shows, and the
    /// public person key.
    fn answerable(&self, id: Option<&str>) -> Result<Value, (ErrorCode, String)> {
        let ids: Vec<String> = match id {
            Some(id) => vec![id.to_string()],
            None => crate::store::lock(&self.store).approvals(false).map_err(failed)?.into_iter().map(|a| a.id).collect(),
        };
        let (asked_for_one, mut list) = (id.is_some(), Vec::new());
        for id in &ids {
            match self.sealed(id) {
                Ok(a) => {
                    let shown = a.shown();
                    let mut v = serde_json::to_value(&a).map_err(|e| failed(e.into()))?;
                    v["shown"] = json!(shown);
                    list.push(v);
                }
                // Asked for this one: why not. Listing: a record that cannot be answered is left out.
                Err(e) if asked_for_one => return Err(e),
                Err(_) => {}
            }
        }
        let key = crate::person::PersonKey::load(&crate::person::key_path()).map_err(failed)?;
        Ok(json!({"ok": true, "approvals": list, "person": key}))
    }

    /// Answers through the app-server that owns the thread: the person's prompt there closes.
    fn answer_through_app_server(&self, listed: &Approval, record: &AnswerRecord) -> Result<Value, (ErrorCode, String)> {
        let (id, decision, message) = (&listed.id, record.decision, record.message.clone());
        if listed.host == ApprovalHost::Copilot {
            // Only its held hook carries an answer to Copilot CLI.
            return Err((ErrorCode::Failed, format!("approval {id}: {}; nothing was sent", crate::copilot::approval::HOLD_ENDED)));
        }
        let owner = self
            .gate
            .thread_owner(&listed.thread, &TrustView(self))
            .map_err(|why| (ErrorCode::Failed, format!("thread {}: no live Codex process proven to hold it ({why:?})", listed.thread)))?;
        let endpoints = endpoint::discover(&self.approvals.codex_home, owner.pid, owner.starttime);
        if endpoints.is_empty() {
            let why = match listed.kind {
                ApprovalKind::Permissions => no_app_server_for_permissions(owner.pid, &listed.thread),
                ApprovalKind::Command | ApprovalKind::FileChange | ApprovalKind::McpTool => {
                    no_app_server(owner.pid, &listed.thread, self.approvals.config.hold)
                }
            };
            return Err((ErrorCode::Failed, why));
        }
        let approval = self.claim(id, record)?;
        let steering = message.as_deref().map(|m| self.queue_deny_message(&approval, m)).transpose()?;
        let within = codex_approval::Within { exchange: Instant::now() + EXCHANGE, ack: self.approvals.config.ack_timeout() };
        let answered = codex_approval::answer(&endpoints, owner.pid, owner.starttime, &approval, decision, within);
        crate::failpoint::hit("approval_after_answer");
        let (outcome, detail) = match answered {
            Answered::Sent(AnswerOutcome::Unknown) => (AnswerOutcome::Unknown, no_ack(self.approvals.config.ack_timeout())),
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
        store.settle_approval(id, outcome, Some(&detail).filter(|d| !d.is_empty()).map(String::as_str)).map_err(failed)?;
        crate::log_info!("approval {id}: {} -> {} {detail}", decision.as_str(), outcome.as_str());
        Ok(json!({"ok": true, "id": id, "outcome": outcome, "detail": detail}))
    }

    /// Takes approval `id` for `record`'s answer (`pending -> answering`), or why not.
    fn claim(&self, id: &str, record: &AnswerRecord) -> Result<Approval, (ErrorCode, String)> {
        let taken = crate::store::lock(&self.store).claim_approval(id, record).map_err(failed)?;
        let approval = taken.map_err(|r| match r {
            Refused::NotFound => (ErrorCode::NotFound, format!("no approval {id}")),
            r @ Refused::NotPending(..) => (ErrorCode::NotPending, r.to_string()),
        })?;
        crate::failpoint::hit("approval_after_claim");
        Ok(approval)
    }

    /// Answers a held hook: the decision is the hook's output (a deny's message with it).
    fn answer_held(&self, id: &str, record: &AnswerRecord) -> Result<Value, (ErrorCode, String)> {
        let approval = self.claim(id, record)?;
        let Some(hold) = self.approvals.holds.take(id) else {
            self.undo_claim(&approval, None);
            return Err((ErrorCode::Failed, "the hook's hold ended before this answer; nothing was sent".into()));
        };
        let (outcome, detail) = match approval_hold::give(hold, record.decision, record.message.clone()) {
            Given::Written => (AnswerOutcome::Won, "given as the PermissionRequest hook's decision"),
            Given::HookGone => {
                (AnswerOutcome::Lost, "the held hook had gone (Codex's hook timeout, or Codex exited): nothing reached Codex")
            }
        };
        crate::failpoint::hit("approval_after_answer");
        crate::store::lock(&self.store).settle_approval(id, outcome, Some(detail)).map_err(failed)?;
        crate::log_info!("approval {id}: {} -> {} ({detail})", record.decision.as_str(), outcome.as_str());
        Ok(json!({"ok": true, "id": id, "outcome": outcome, "detail": detail}))
    }

    /// The deny message, queued for the thread before the answer leaves so the next hook of the
    /// turn carries it to the model.
    fn queue_deny_message(&self, a: &Approval, message: &str) -> Result<String, (ErrorCode, String)> {
        let text = match a.kind {
            ApprovalKind::Command => format!("Your request to run `{}` was denied: {message}", a.command),
            ApprovalKind::FileChange => format!("Your change to {} was denied: {message}", a.files.join(", ")),
            ApprovalKind::Permissions => format!("Your request for permissions ({}) was denied: {message}", a.command),
            ApprovalKind::McpTool => format!("Your call of the tool `{}` was denied: {message}", a.tool),
        };
        let key = format!("approval:{}", a.id);
        let new = NewMessage {
            thread: &a.thread,
            body: &text,
            sender: Some(DENY_FROM),
            verified: false,
            key: Some(&key),
            ttl_ms: None,
            wake: true,
            mode: Default::default(),
            held: false,
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

/// The approval a verified hook shows: a PermissionRequest (a command, or a patch), or the
/// PreToolUse of a `request_permissions` call (no PermissionRequest hook runs for those, and
/// PreToolUse names the call).
fn new_approval(v: &Verified, ticket: &Ticket) -> Option<NewApproval> {
    let turn = v.turn_id.clone()?;
    let tool = v.payload.tool_name.clone().unwrap_or_default();
    if v.event == HookEvent::PreToolUse {
        let asked = codex_approval::permission_ask(&v.payload)?;
        return Some(NewApproval {
            host: ApprovalHost::Codex,
            thread: v.thread_id.clone(),
            turn,
            call_id: v.payload.tool_use_id.clone(),
            tool,
            kind: ApprovalKind::Permissions,
            command: asked,
            files: Vec::new(),
            reason: codex_approval::permission_reason(&v.payload),
            cwd: v.payload.cwd.clone(),
            ticket: ticket.key.clone(),
        });
    }
    let kind = codex_approval::hook_kind(&v.payload);
    let command = match kind {
        ApprovalKind::McpTool => codex_approval::mcp_tool_call(&v.payload)?.1,
        ApprovalKind::Command | ApprovalKind::FileChange | ApprovalKind::Permissions => codex_approval::hook_command(&v.payload)?,
    };
    let mut waiting = v.actions.calls.iter().filter(|c| !c.completed).map(|c| c.id.clone());
    let call_id = match (waiting.next(), waiting.next()) {
        (Some(only), None) => Some(only),
        _ => None,
    };
    let files = match kind {
        ApprovalKind::FileChange => crate::codex::patch::patch_files(&command, v.payload.cwd.as_deref()),
        ApprovalKind::Command | ApprovalKind::Permissions | ApprovalKind::McpTool => Vec::new(),
    };
    Some(NewApproval {
        host: ApprovalHost::Codex,
        thread: v.thread_id.clone(),
        turn,
        call_id,
        tool,
        kind,
        command,
        files,
        reason: codex_approval::hook_reason(&v.payload),
        cwd: v.payload.cwd.clone(),
        ticket: ticket.key.clone(),
    })
}

/// Why an approval of a thread no app-server serves (`codex exec`) and whose hook is not held
/// cannot be answered, and what would make the next one answerable.
fn no_app_server(pid: i32, thread: &ThreadId, hold: Hold) -> String {
    let base = format!(
        "the Codex process {pid} of thread {thread} serves no app-server (a `codex exec` run) and its PermissionRequest \
         hook is not held, so Courier has nothing to answer through; nothing was sent"
    );
    match hold {
        Hold::Off => format!(
            "{base}. To answer such approvals with `broker approve|deny`, set `[approvals] hold = \"exec\"` in {} and restart \
             the broker: the next one's hook then waits up to hold_secs for the answer (docs/approvals.md)",
            courier_shared::paths::config_path().display()
        ),
        Hold::Exec | Hold::All => format!(
            "{base}: its hold ended (`[approvals] hold_secs`), {MAX_HELD} hooks were held already, or it was recorded \
             before the broker read the hold setting"
        ),
    }
}

/// Why a listed approval can never be answered by Courier, whatever Codex does next: nothing is
/// claimed or sent, and the person learns where to answer it.
fn unanswerable(a: &Approval) -> Result<(), String> {
    match a.kind {
        ApprovalKind::FileChange if a.files.is_empty() => Err(format!(
            "approval {} is a patch that names no file Courier can list for certain (Codex's parser refuses it, or a line \
             looks like a hunk header that Codex's parser does not read as one), so Courier cannot bind an answer to the \
             change Codex would make; nothing was sent. Answer it where Codex shows it (the TUI's prompt, or the app-server \
             client of thread {})",
            a.id, a.thread
        )),
        ApprovalKind::Permissions if a.command.starts_with(codex_approval::UNREADABLE) => Err(format!(
            "approval {} asks for permissions Courier cannot read ({}), so it cannot bind an answer to them; nothing was \
             sent. Answer it where Codex shows it (the TUI's prompt, or the app-server client of thread {})",
            a.id, a.command, a.thread
        )),
        ApprovalKind::Command | ApprovalKind::FileChange | ApprovalKind::Permissions | ApprovalKind::McpTool => Ok(()),
    }
}

/// Why a permission request of a thread no app-server serves cannot be answered: Codex runs no
/// PermissionRequest hook for it, so no hold can carry an answer either.
fn no_app_server_for_permissions(pid: i32, thread: &ThreadId) -> String {
    format!(
        "the Codex process {pid} of thread {thread} serves no app-server (a `codex exec` run), and Codex runs no \
         PermissionRequest hook for a `request_permissions` call, so Courier has nothing to answer through; nothing was sent"
    )
}

/// Why an answer sent without an acknowledgement is `unknown`.
fn no_ack(waited: Duration) -> String {
    format!(
        "sent, and Codex did not acknowledge it within {} ms: it may or may not have been applied, and it is never sent again",
        waited.as_millis()
    )
}

fn failed(e: anyhow::Error) -> (ErrorCode, String) {
    (ErrorCode::Failed, format!("{e:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sweep's wait returns at once while an approval is pending, and, with none, only once
    /// one is noted (so an idle broker's `approvals` thread sleeps).
    #[test]
    fn the_sweep_waits_for_a_pending_approval() {
        let approvals = std::sync::Arc::new(Approvals {
            codex_home: PathBuf::new(),
            config: crate::config::ApprovalsConfig::default(),
            holds: Holds::default(),
            waiting: Mutex::new(HashSet::new()),
            gained: Condvar::new(),
            shown: Mutex::new(HashMap::new()),
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::sync::Arc::clone(&approvals);
        std::thread::spawn(move || {
            waiter.wait_for_any();
            tx.send(()).unwrap();
        });
        approvals.note_waiting(crate::store::sample::T1);
        rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the wait ended when an approval was noted");
        approvals.wait_for_any(); // pending: at once
    }

    /// Refused for want of an app-server, the person learns what would make the next one
    /// answerable (the hold), or why a configured hold did not apply.
    #[test]
    fn no_app_server_says_what_would_make_it_answerable() {
        let t = &crate::store::sample::T1;
        let off = no_app_server(42, t, Hold::Off);
        assert!(off.contains("serves no app-server") && off.contains("nothing was sent"), "{off}");
        assert!(off.contains("[approvals] hold = \"exec\"") && off.contains("restart the broker"), "{off}");
        let on = no_app_server(42, t, Hold::Exec);
        assert!(on.contains("its hold ended") && !on.contains("set `[approvals]"), "{on}");
    }
}
