//! The hook handler: one complete request frame, from the peer's identity through the gate and
//! delivery to the hand-off of leased output; the ack's commit; refusals recorded.

use super::{
    poller::error_frame,
    trust::{HookTrust, TrustView},
    workers::{AwaitAck, Served},
    Broker, QUEUED_REFUSALS_MAX, REQUEST_TIMEOUT,
};
use crate::codex::effort;
use crate::copilot::serve::Answer;
use crate::delivery::{self, Offer};
use crate::failpoint;
use crate::gate::session_sender::SessionHost;
use crate::gate::{self, HookRequest, Peer, Verified};
use crate::os::ProcessKey;
use crate::reason::DeliveryReason;
use crate::refusal::RefusalCode;
use crate::store::{HandOff, ThreadWork};
use codex_format::hook::HookEvent;
use courier_shared::wire::{self, AckReply, HookReply, Request, PROTOCOL_VERSION};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

impl Broker {
    pub(super) fn refuse(&self, code: RefusalCode, detail: &str, thread: Option<&str>, event: Option<&str>, pid: Option<i32>) {
        self.counters.refusals.fetch_add(1, Ordering::Relaxed);
        crate::log_debug!("refused {code} (pid {pid:?}, thread {thread:?}, event {event:?}): {detail}");
        let mut store = crate::store::lock(&self.store);
        if let Err(e) = store.record_refusal(code, detail, thread, event, pid.map(i64::from)) {
            crate::log_error!("recording refusal {code}: {e:#}");
        }
    }

    /// A refusal seen by the poll thread, which must not wait for the database: recorded by the
    /// next maintenance pass, or only counted when too many are waiting.
    pub(super) fn refuse_later(&self, code: RefusalCode, detail: String, pid: i32) {
        self.counters.refusals.fetch_add(1, Ordering::Relaxed);
        let mut q = self.queued_refusals.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() < QUEUED_REFUSALS_MAX {
            q.push((code, detail, pid));
            if q.len() == 1 {
                // An idle maintenance pass sleeps until something is queued for it; once per
                // pass's worth (a flood must not wake the idle passes once a refusal).
                crate::store::QUEUED.bump(1);
            }
        } else {
            self.counters.refusals_unrecorded.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Serves one request. A hook call that hands messages over returns the hand-off, whose ack
    /// the poll thread waits for.
    /// `cred`: the connection's `SO_PEERCRED`, as the poll thread read it. Only replies are
    /// written from here (the frame is read; an ack is read by the poll thread), so only writes
    /// get a timeout.
    pub(super) fn handle(&self, mut stream: UnixStream, frame: &[u8], cred: &gate::peer::Credentials) -> Served {
        let _ = stream.set_write_timeout(Some(REQUEST_TIMEOUT));
        let peer = match gate::peer::identify_as(&stream, cred) {
            Ok(peer) => peer,
            Err(r) => {
                self.refuse(r.code, &r.detail, None, None, None);
                return Served::Closed;
            }
        };
        let request: Request = match serde_json::from_slice(frame) {
            Ok(req) => req,
            Err(e) => {
                let detail = format!("not a request: {e}");
                self.counters.bad_frames.fetch_add(1, Ordering::Relaxed);
                self.refuse(RefusalCode::BadRequest, &detail, None, None, Some(peer.pid));
                let _ = stream.write_all(&error_frame(RefusalCode::BadRequest.as_str(), &detail));
                return Served::Closed;
            }
        };
        match request {
            Request::Status { .. } => {
                if peer.uid == courier_shared::paths::uid() {
                    let _ = wire::write_json(&mut stream, &self.status());
                }
            }
            Request::Hook { v, pid, ts_ms, payload, mac, context_limit, host_event } => {
                self.counters.hook_calls.fetch_add(1, Ordering::Relaxed);
                if v != PROTOCOL_VERSION {
                    self.refuse(RefusalCode::ProtocolVersion, &format!("client speaks v{v}"), None, None, Some(peer.pid));
                    let _ = wire::write_json(&mut stream, &HookReply { v: PROTOCOL_VERSION, ..Default::default() });
                    return Served::Closed;
                }
                let request = HookRequest { pid, ts_ms, payload: &payload, mac: &mac };
                if let Some(host_event) = host_event {
                    return self.host_hook(stream, &peer, &request, &host_event);
                }
                let answered = self.hook(stream, &peer, &request, context_limit);
                // The client gives up at its deadline (500 ms from its start): how close this came.
                crate::log_debug!("hook of pid {pid} answered {} ms after its client sent it", crate::store::now_ms() - ts_ms as i64);
                return answered;
            }
            Request::Ack { .. } => {
                self.refuse(RefusalCode::UnexpectedAck, "ack without a lease", None, None, Some(peer.pid));
                let _ = stream.write_all(&error_frame(RefusalCode::UnexpectedAck.as_str(), "ack without a lease"));
            }
        }
        Served::Closed
    }

    /// A hook of a host whose command names its event (`hook-client --host H --event E`): the
    /// host's wing proves it and hands what waits, recorded before the answer is written.
    fn host_hook(&self, mut stream: UnixStream, peer: &Peer, request: &HookRequest, he: &wire::HostEvent) -> Served {
        let served = match he.host.as_str() {
            crate::copilot::HOST => {
                crate::copilot::serve::hook(&self.gate, &self.store, peer, request, &he.event, self.approvals.config.hold)
            }
            other => Err(gate::Refusal::new(RefusalCode::UnsupportedEvent, format!("host {other:?} is not one Courier serves"))),
        };
        let output = match served {
            Ok(Answer::Ask(asked)) => {
                self.hold_for_person(stream, &asked);
                return Served::Closed;
            }
            Ok(Answer::Handed(handed)) => handed.map(|h| {
                self.counters.handed.fetch_add(h.count as u64, Ordering::Relaxed);
                self.producer.changed();
                h.output
            }),
            Err(r) => {
                self.refuse(r.code, &r.detail, r.thread.as_deref(), r.event.as_deref(), Some(peer.pid));
                None
            }
        };
        let _ = wire::write_json(&mut stream, &HookReply { v: PROTOCOL_VERSION, output: output.unwrap_or_default(), ..Default::default() });
        Served::Closed
    }

    /// `context_limit`: the handler's `additionalContextLimit`, as hook-client was told it.
    pub(super) fn hook(&self, mut stream: UnixStream, peer: &Peer, request: &HookRequest, context_limit: Option<u64>) -> Served {
        let trust = HookTrust::new(self);
        // Recorded before the answer: once the agent goes on, `inspect` already shows the refusal.
        let refused = |mut stream: UnixStream, r: gate::Refusal| {
            self.refuse(r.code, &r.detail, r.thread.as_deref(), r.event.as_deref(), Some(peer.pid));
            let _ = wire::write_json(&mut stream, &HookReply { v: PROTOCOL_VERSION, ..Default::default() });
            Served::Closed
        };
        let verified = match self.gate.verify(peer, request, &trust) {
            Ok(v) => v,
            Err(r) => return refused(stream, r),
        };
        // One read says what the call has to do (an idle call does nothing more with the queue)
        // and whether the codex the walk stopped at is trusted now: the walk took a digest
        // trusted before at its word (trust.rs).
        let work = match self.confirmed_work(&verified, trust.to_confirm()) {
            Ok(work) => work,
            Err(r) => return refused(stream, r),
        };
        // One ticket per Codex action (codex/proof/ticket.rs, tickets.rs): before anything is claimed.
        let ticket = match crate::tickets::take(&self.store, &self.tickets, &verified, peer.pid) {
            Ok(t) => t,
            Err(r) => return refused(stream, r),
        };
        if verified.event == HookEvent::PermissionRequest {
            // Recorded; no decision, or a held one (approvals.rs, approval_hold.rs).
            self.permission_request(stream, &verified, ticket.as_ref().map(|t| &t.ticket));
            return Served::Closed;
        }
        if verified.event == HookEvent::PreToolUse {
            if let Some(t) = &ticket {
                // A permission request runs no PermissionRequest hook: this is where it shows.
                self.record_permission_request(&verified, &t.ticket);
            }
        }
        self.resolve_approvals(&verified);
        if let Some(turn) = &verified.turn_id {
            // A turn the wake channel did not start ends a run of wakes (wake/bound.rs).
            self.wake_bound.saw_turn(&verified.thread_id, turn);
        }
        // Effort changes go through the app-server on their own thread; waited for below, bounded.
        let effort = self.effort.on_hook(&verified, request.payload, work.effort);
        let (offer, settled) = if !work.handed && !work.pending {
            (Ok(Offer::Nothing), 0)
        } else {
            // Settle earlier hand-offs first, so inspect and the Stop guard see current states
            // (their rollouts read without the store lock).
            let settled = if work.handed { delivery::reconcile_shared(&self.store, Some(&verified.thread_id)).unwrap_or(0) } else { 0 };
            let mut store = crate::store::lock(&self.store);
            let offer = delivery::offer(&mut store, &verified, context_limit, self.receipts);
            if let (Some(t), Ok(Offer::Lease { token, .. })) = (&ticket, &offer) {
                if let Err(e) = crate::tickets::attach(&mut store, t, *token) {
                    crate::log_error!("recording the hand-off of ticket {}: {e:#}", t.ticket.key);
                }
            }
            (offer, settled)
        };
        if settled > 0 {
            self.producer.changed(); // a `send --wait confirmed` parked on one of them returns now
        }
        let leased_at = Instant::now();
        effort.wait(effort::HOOK_WAIT);
        match offer {
            Ok(Offer::Lease { token, output, count }) => {
                let deadline = leased_at + Duration::from_millis(delivery::LEASE_MS as u64);
                self.hand_over(stream, verified, token, output, count, deadline).map_or(Served::Closed, Served::AwaitAck)
            }
            Ok(Offer::Deferred | Offer::Nothing) => {
                let _ = wire::write_json(&mut stream, &HookReply { v: PROTOCOL_VERSION, ..Default::default() });
                Served::Answered(stream)
            }
            Err(e) => {
                crate::log_error!("offer failed for thread {}: {e:#}", verified.thread_id);
                let _ = wire::write_json(&mut stream, &HookReply { v: PROTOCOL_VERSION, ..Default::default() });
                Served::Closed
            }
        }
    }

    /// The thread's work, once the store confirms `codex_sha256` (the digest the gate's walk
    /// stopped at) is a trusted Codex binary now. Not trusted, or not answerable: refused
    /// `untrusted_codex` (fail closed).
    fn confirmed_work(&self, verified: &Verified, codex_sha256: Option<String>) -> Result<ThreadWork, gate::Refusal> {
        let untrusted = |detail: String| {
            let mut r = gate::Refusal::new(RefusalCode::UntrustedCodex, detail);
            r.thread = Some(verified.thread_id.to_string());
            r.event = Some(verified.event.as_str().to_string());
            r
        };
        let sha = codex_sha256.ok_or_else(|| untrusted("the walk to codex named no trusted digest".into()))?;
        match crate::store::lock(&self.store).hook_work(&verified.thread_id, &sha) {
            Ok(Some(work)) => Ok(work),
            Ok(None) => {
                self.trusted_before.forget(&sha);
                Err(untrusted(format!("codex {} (sha256 {sha}) is no longer trusted", verified.codex_pid)))
            }
            Err(e) => Err(untrusted(format!("the trust of codex sha256 {sha} could not be read: {e:#}"))),
        }
    }

    /// Sends the leased output; the ack is awaited by the poll thread (the returned hand-off),
    /// not by this worker. A reply that cannot be written releases the lease at once.
    pub(super) fn hand_over(
        &self,
        mut stream: UnixStream,
        verified: Verified,
        token: crate::store::LeaseToken,
        output: String,
        count: usize,
        deadline: Instant,
    ) -> Option<AwaitAck> {
        self.counters.leases.fetch_add(1, Ordering::Relaxed);
        let reply = HookReply { v: PROTOCOL_VERSION, output, lease: Some(token.to_wire()), hold_ms: None };
        let written = wire::write_json(&mut stream, &reply).is_ok();
        let pending = AwaitAck { stream, token, count, verified: Box::new(verified), deadline };
        if !written {
            self.finish_hand_over(pending, None);
            return None;
        }
        failpoint::hit("after_reply_before_ack");
        Some(pending)
    }

    /// Commits a hand-off whose client acked lease `token` (`frame` is its ack), or releases it.
    pub(super) fn finish_hand_over(&self, pending: AwaitAck, frame: Option<&[u8]>) {
        let AwaitAck { mut stream, token, count, verified, .. } = pending;
        let v = &*verified;
        let acked = frame
            .and_then(|f| serde_json::from_slice::<Request>(f).ok())
            .is_some_and(|r| matches!(r, Request::Ack { lease, .. } if token.acked_by(lease)));
        if acked {
            failpoint::hit("after_ack_read");
        }
        let mut store = crate::store::lock(&self.store);
        if !acked {
            self.counters.unacked.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = store.release(token, DeliveryReason::NotAcked) {
                crate::log_error!("releasing lease {token}: {e:#}");
            }
            return;
        }
        let stop_turn = match (v.event, &v.turn_id) {
            (e, Some(turn)) if e.continues_turn() => Some((v.thread_id.as_str(), turn.as_str())),
            _ => None,
        };
        let path = v.rollout_path.to_string_lossy();
        let record =
            HandOff { stop_turn, ..HandOff::at(&path, v.rollout_offset, ProcessKey { pid: v.codex_pid, starttime: v.codex_starttime }) };
        let accepted = store.hand_off(token, &record).unwrap_or_else(|e| {
            crate::log_error!("ack of lease {token}: {e:#}");
            false
        });
        drop(store);
        if accepted {
            self.counters.handed.fetch_add(count as u64, Ordering::Relaxed);
        }
        let _ = stream.set_write_timeout(Some(REQUEST_TIMEOUT));
        let _ = wire::write_json(&mut stream, &AckReply { v: PROTOCOL_VERSION, accepted });
        self.producer.changed();
    }
}

impl Broker {
    /// Whether the peer of `stream` is a process of the user that runs unconfined (the
    /// inbound policy's `person` class).
    pub(super) fn is_unconfined_user(&self, stream: &UnixStream) -> bool {
        gate::peer::identify(stream).is_ok_and(|peer| self.gate.verify_unconfined_user(&peer).is_ok())
    }

    /// Whether the wake pass can interrupt `thread`'s running turn (`--mode interrupt`).
    pub(super) fn interruptible(&self, thread: &courier_shared::ids::ThreadId) -> Result<(), String> {
        crate::wake::interrupt::check(&self.gate, &super::trust::TrustView(self), thread)
    }

    /// The Codex thread, Claude Code or Copilot CLI session whose model's command is on the
    /// other end of `stream` (a `broker send` the model ran), proven as `gate/sender.rs` and
    /// `gate/session_sender.rs` say, or why not. A command claiming a session in a host's
    /// variable is checked as that first; else, or when that fails, as a Codex tool command.
    pub(super) fn verify_sender(&self, stream: &UnixStream, claims: Option<(&str, &str)>) -> Result<gate::sender::ToolSender, String> {
        let peer = gate::peer::identify(stream).map_err(|r| format!("{}: {}", r.code, r.detail))?;
        let by_session = match claims {
            Some(_) => Ok(None),
            None => {
                let claude_trust =
                    gate::session_sender::Hosted(&crate::claude::gate_trust::StoreTrust(&self.store, &self.claude_followed), "Claude Code");
                let copilot_trust = crate::copilot::trust::StoreTrust(&self.store);
                let claude_owns = |s: &courier_shared::ids::ThreadId, p: ProcessKey| crate::claude::session::owns(&self.store, s, p);
                let copilot_owns = |s: &courier_shared::ids::ThreadId, p: ProcessKey| crate::copilot::sender::owns(&self.store, s, p);
                let rows = [
                    SessionHost {
                        name: "Claude Code",
                        session_var: crate::claude::session::SESSION_VAR,
                        trust: &claude_trust,
                        owns: &claude_owns,
                    },
                    SessionHost {
                        name: "Copilot CLI",
                        session_var: crate::copilot::sender::SESSION_VAR,
                        trust: &copilot_trust,
                        owns: &copilot_owns,
                    },
                ];
                self.gate.verify_session_sender(&peer, &TrustView(self), &rows, "Codex, Claude Code or Copilot CLI")
            }
        };
        match by_session {
            Ok(Some(sender)) => Ok(sender),
            Ok(None) => self.gate.verify_tool_sender(&peer, &TrustView(self), claims),
            Err(not_session) => self
                .gate
                .verify_tool_sender(&peer, &TrustView(self), claims)
                .map_err(|not_codex| format!("as a session's command: {not_session}; as a Codex tool command: {not_codex}")),
        }
    }
}
