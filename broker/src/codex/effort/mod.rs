//! Reasoning-effort changes, applied exactly once through the app-server that owns the thread.
//!
//! `broker effort` queues a level (`messages` row, `kind = 'effort'`). On a verified hook of that
//! thread, [`Service::on_hook`] looks for an app-server endpoint served by the SAME verified Codex
//! process ([`endpoint`]); with none (e.g. `codex exec`) the request stays pending with reason
//! `no_settings_channel`. Otherwise the row is claimed under a fencing token (`applying`) and one
//! `turn/settings/update` (scope turn) or `thread/settings/update` (scope thread) is sent on a
//! worker thread with its own deadline ([`ws`]). The hook waits for it at most [`HOOK_WAIT`], so
//! the change normally lands before Codex builds its next request, and never holds the hook up
//! past the client's deadline. Outcomes: `applied`; `failed` (target unavailable, JSON-RPC error);
//! `uncertain` (no answer in time, or the broker stopped mid-exchange): never sent again.

pub mod policy;

use crate::codex::appserver::{self, endpoint, Endpoint};
use crate::codex::Verified;
use crate::config::ConfigCache;
use crate::config::{EffortConfig, EffortLevel, EffortScope};
use crate::lines::WholeLines;
use crate::store::{State, Store};
use anyhow::Result;
use codex_format::hook::HookEvent;
use courier_shared::ids::ThreadId;
use serde_json::{json, Value};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Longest a hook call waits for its effort exchange (the client's own deadline is 500 ms).
pub const HOOK_WAIT: Duration = Duration::from_millis(250);
/// How long a thread-scope change is looked for in the rollout after Codex accepted it.
const CONFIRM_WAIT: Duration = Duration::from_secs(3);
/// Time left that is needed before the update request is worth sending at all.
const MIN_SEND_BUDGET: Duration = Duration::from_millis(50);

pub struct Service {
    store: Mutex<Store>,
    codex_home: PathBuf,
    config: ConfigCache,
}

/// A hook call's handle on its effort work: wait for it, bounded.
pub struct Pending(Option<Receiver<()>>);

impl Pending {
    pub fn wait(self, budget: Duration) {
        if let Some(rx) = self.0 {
            let _ = rx.recv_timeout(budget);
        }
    }
}

/// What one exchange with the app-server came to.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    Applied,
    Failed(String),
    /// The update may have reached Codex; its effect is unknown.
    Uncertain(String),
    /// Nothing was sent: the request may go on a later hook.
    NotSent(String),
}

struct Job {
    thread: ThreadId,
    turn_id: Option<String>,
    event: HookEvent,
    codex_pid: i32,
    codex_start: u64,
    rollout: PathBuf,
    rollout_len: u64,
    /// PostToolUse: (tool name, raw payload) for the policy.
    tool: Option<(String, String)>,
}

impl Service {
    /// Opens its own connection to the queue and settles claims a previous broker left behind.
    pub fn open(state_dir: &Path, codex_home: &Path, config_path: PathBuf) -> Result<Arc<Service>> {
        let store = Store::open(state_dir)?;
        let n = store.effort_sweep_orphans(None, "broker_stopped_during_apply")?;
        if n > 0 {
            crate::log_warn!("{n} effort change(s) were mid-exchange when the broker stopped: marked uncertain");
        }
        Ok(Arc::new(Service { store: Mutex::new(store), codex_home: codex_home.to_path_buf(), config: ConfigCache::new(config_path) }))
    }

    fn store(&self) -> crate::store::Locked<'_> {
        crate::store::lock(&self.store)
    }

    /// Called for every verified hook; `pending`: whether the thread has effort changes queued
    /// (the hook's one read of the queue, `Store::hook_work`). Cheap when it has no effort work.
    pub fn on_hook(self: &Arc<Self>, v: &Verified, raw_payload: &str, pending: bool) -> Pending {
        let cfg = self.config.get();
        let tool = match (v.event, &v.payload.tool_name) {
            (HookEvent::PostToolUse, Some(t)) if cfg.policy.enabled && cfg.policy.rules.iter().any(|r| &r.tool == t) => {
                Some((t.clone(), raw_payload.to_string()))
            }
            _ => None,
        };
        if tool.is_none() && !pending {
            return Pending(None);
        }
        let job = Job {
            thread: v.thread_id.clone(),
            turn_id: v.turn_id.clone(),
            event: v.event,
            codex_pid: v.codex_pid,
            codex_start: v.codex_starttime,
            rollout: v.rollout_path.clone(),
            rollout_len: v.rollout_offset,
            tool,
        };
        let (tx, rx) = sync_channel(1);
        let me = Arc::clone(self);
        let spawned = std::thread::Builder::new().name("effort".into()).spawn(move || {
            let confirm = me.run(&job, &cfg).unwrap_or_else(|e| {
                crate::log_error!("effort for thread {}: {e:#}", job.thread);
                None
            });
            let _ = tx.send(());
            if let Some((id, level, offset)) = confirm {
                me.confirm_thread_scope(&id, &job.rollout, offset, level);
            }
        });
        match spawned {
            Ok(_) => Pending(Some(rx)),
            Err(_) => Pending(None),
        }
    }

    /// Returns a thread-scope change to look for in the rollout: (id, level, offset).
    fn run(&self, job: &Job, cfg: &EffortConfig) -> Result<Option<(String, EffortLevel, u64)>> {
        if let Some((tool, raw)) = &job.tool {
            if let Some(code) = policy::exit_code(raw, &job.rollout, job.rollout_len) {
                let mut store = self.store();
                if let Some(level) = policy::evaluate(cfg, &store, &job.thread, tool, code == 0)? {
                    let (id, _) = store.effort_enqueue(&job.thread, level, cfg.policy_scope(), "policy")?;
                    crate::log_info!("effort policy: {tool} exit {code} in {} -> {level} ({id})", job.thread);
                }
            }
        }
        if !self.store().effort_has_pending(&job.thread)? {
            return Ok(None);
        }
        let endpoints = endpoint::discover(&self.codex_home, job.codex_pid, job.codex_start);
        if endpoints.is_empty() {
            self.store().effort_mark_waiting(&job.thread, "no_settings_channel")?;
            return Ok(None);
        }
        let detail = endpoints.iter().map(|e| format!("{} {}", e.via, e.path.display())).collect::<Vec<_>>().join("; ");
        let claim = {
            let mut store = self.store();
            let rollout = job.rollout.to_string_lossy();
            store.effort_claim(&job.thread, job.event.as_str(), job.turn_id.as_deref(), (&rollout, job.rollout_len), &detail)?
        };
        let Some(claim) = claim else { return Ok(None) };
        if !cfg.allow.contains(&claim.level) {
            self.store().effort_settle(&claim, State::Cancelled, Some("not_allowed"))?;
            return Ok(None);
        }
        let started = Instant::now();
        let deadline = started + Duration::from_millis(cfg.deadline_ms);
        let outcome = apply(&endpoints, job, &claim, deadline);
        crate::log_info!(
            "effort {} {} (scope {}) for thread {} at {}: {outcome:?} in {} ms",
            claim.id,
            claim.level,
            claim.scope.as_str(),
            job.thread,
            job.event.as_str(),
            started.elapsed().as_millis()
        );
        let store = self.store();
        let settled = match &outcome {
            Outcome::Applied => store.effort_settle(&claim, State::Applied, None)?,
            Outcome::Failed(r) => store.effort_settle(&claim, State::Failed, Some(r))?,
            Outcome::Uncertain(r) => store.effort_settle(&claim, State::Uncertain, Some(r))?,
            Outcome::NotSent(r) => store.effort_unclaim(&claim, r)?,
        };
        if !settled {
            crate::log_warn!("effort {} was settled by someone else (outcome {outcome:?})", claim.id);
        }
        Ok((settled && outcome == Outcome::Applied && claim.scope == EffortScope::Thread).then_some((
            claim.id,
            claim.level,
            job.rollout_len,
        )))
    }

    /// Watches the rollout (bounded) for `thread_settings_applied` carrying `level`.
    fn confirm_thread_scope(&self, id: &str, rollout: &Path, offset: u64, level: EffortLevel) {
        let end = Instant::now() + CONFIRM_WAIT;
        let mut pos = offset;
        loop {
            match scan_for_effort(rollout, pos, level) {
                (true, _) => {
                    let _ = self.store().effort_confirm(id);
                    return;
                }
                (false, next) => pos = next,
            }
            if Instant::now() >= end {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Periodic: a claim older than any exchange can take was orphaned (its worker died).
    pub fn maintain(&self) {
        let limit = self.config.get().deadline_ms as i64 + CONFIRM_WAIT.as_millis() as i64 + 10_000;
        if let Err(e) = self.store().effort_sweep_orphans(Some(limit), "no_answer_before_deadline") {
            crate::log_error!("effort sweep: {e:#}");
        }
    }
}

/// Looks from `from` for a complete line recording `level` as the thread's effort; returns
/// whether found and the offset scanned to.
fn scan_for_effort(path: &Path, from: u64, level: EffortLevel) -> (bool, u64) {
    let Ok(f) = std::fs::File::open(path) else { return (false, from) };
    let mut lines = WholeLines::at(from, MAX_EFFORT_LINE);
    let mut found = false;
    let _ = lines.read(&f, u64::MAX, |line, _, _| {
        found = line.and_then(effort_record).as_deref() == Some(level.as_str());
        if found {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    (found, lines.cursor.line_start)
}

/// Longest rollout line looked at for an effort record (a `turn_context` carries the turn's
/// instructions; far shorter than this in practice).
const MAX_EFFORT_LINE: usize = 16 << 20;

/// The effort a rollout line records as in effect: `thread_settings_applied` or `turn_context`.
pub fn effort_record(line: &[u8]) -> Option<String> {
    let head = &line[..line.len().min(200)];
    let is = |n: &[u8]| head.windows(n.len()).any(|w| w == n);
    if !is(b"\"thread_settings_applied\"") && !is(b"\"turn_context\"") {
        return None;
    }
    let v: Value = serde_json::from_slice(line).ok()?;
    let p = v.get("payload")?;
    let found = match (v.get("type")?.as_str()?, p.get("type").and_then(Value::as_str)) {
        ("event_msg", Some("thread_settings_applied")) => p.pointer("/thread_settings/reasoning_effort"),
        ("turn_context", _) => p.get("effort"),
        _ => None,
    };
    found?.as_str().map(str::to_string)
}

/// One exchange: open a session, send the update once, read its answer before `deadline`.
fn apply(endpoints: &[Endpoint], job: &Job, claim: &crate::store::Claim, deadline: Instant) -> Outcome {
    let mut ws = match appserver::open_session(endpoints, job.codex_pid, job.codex_start, deadline) {
        Ok(ws) => ws,
        Err(why) => return Outcome::NotSent(format!("endpoint_unreachable: {why}")),
    };
    if deadline.saturating_duration_since(Instant::now()) < MIN_SEND_BUDGET {
        return Outcome::NotSent("deadline_before_send".into());
    }
    let (method, params) = if claim.scope == EffortScope::Thread {
        ("thread/settings/update", json!({"threadId": job.thread, "effort": claim.level.as_str()}))
    } else {
        ("turn/settings/update", json!({"threadId": job.thread, "turnId": job.turn_id, "effort": claim.level.as_str()}))
    };
    // From here on the request may have reached Codex: never NotSent.
    let answer = ws.send_request(method, params).and_then(|id| ws.wait_response(id));
    match answer {
        Err(e) if e.timed_out => Outcome::Uncertain("no_answer_before_deadline".into()),
        Err(e) => Outcome::Uncertain(format!("connection_lost_after_send: {e}")),
        Ok(r) => judge(claim.scope, &r),
    }
}

/// Reads an update's response.
pub fn judge(scope: EffortScope, response: &Value) -> Outcome {
    if let Some(e) = response.get("error") {
        let code = e.get("code").and_then(Value::as_i64).unwrap_or(0);
        let msg = e.get("message").and_then(Value::as_str).unwrap_or("");
        return Outcome::Failed(format!("rpc_error {code}: {msg}"));
    }
    let Some(result) = response.get("result") else {
        return Outcome::Uncertain("malformed_response".into());
    };
    if scope == EffortScope::Thread {
        return if result.is_object() { Outcome::Applied } else { Outcome::Uncertain("malformed_response".into()) };
    }
    match result.get("status").and_then(Value::as_str) {
        Some("applied") => Outcome::Applied,
        Some("targetUnavailable") => Outcome::Failed("target_unavailable".into()),
        Some(other) => Outcome::Failed(format!("status_{other}")),
        None => Outcome::Uncertain("malformed_response".into()),
    }
}

/// `broker effort`: checks the level against the allowlist and queues it.
pub fn enqueue(
    store: &mut Store,
    cfg: &EffortConfig,
    thread: &ThreadId,
    level: &str,
    scope: EffortScope,
    from: &str,
) -> Result<(String, Vec<String>)> {
    let level = cfg.check_level(level)?;
    store.effort_enqueue(thread, level, scope, from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_are_judged_by_scope() {
        let applied = json!({"id": 3, "result": {"status": "applied"}});
        assert_eq!(judge(EffortScope::Turn, &applied), Outcome::Applied);
        let gone = json!({"id": 3, "result": {"status": "targetUnavailable"}});
        assert_eq!(judge(EffortScope::Turn, &gone), Outcome::Failed("target_unavailable".into()));
        let err = json!({"id": 3, "error": {"code": -32600, "message": "no"}});
        assert!(matches!(judge(EffortScope::Turn, &err), Outcome::Failed(r) if r.contains("-32600")));
        assert_eq!(judge(EffortScope::Thread, &json!({"id": 3, "result": {}})), Outcome::Applied);
        assert!(matches!(judge(EffortScope::Turn, &json!({"id": 3, "result": {}})), Outcome::Uncertain(_)));
    }

    #[test]
    fn effort_records_in_rollout_lines() {
        let tsa = br#"{"timestamp":"t","ordinal":9,"type":"event_msg","payload":{"type":"thread_settings_applied","thread_id":"x","thread_settings":{"model":"gpt-5.5","reasoning_effort":"low"}}}"#;
        assert_eq!(effort_record(tsa).as_deref(), Some("low"));
        let tc = br#"{"timestamp":"t","ordinal":5,"type":"turn_context","payload":{"turn_id":"T","model":"gpt-5.5","effort":"high"}}"#;
        assert_eq!(effort_record(tc).as_deref(), Some("high"));
        let other = br#"{"timestamp":"t","type":"event_msg","payload":{"type":"token_count"}}"#;
        assert_eq!(effort_record(other), None);
    }
}

/// The whole apply path (discovery, claim, one exchange, settlement) against a stand-in
/// app-server on a real socket held by this test process, so discovery finds it as the "codex".
#[cfg(test)]
mod exchange_tests {
    use super::*;
    use sha1::{Digest, Sha1};
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;

    const THREAD: &ThreadId = &ThreadId::from_static("01a22652-96c4-7652-bf64-6f7bc9883ce2");

    #[derive(Clone, Copy)]
    enum Mode {
        Answer(&'static str),
        Silent,
        CloseAfterUpdate,
    }

    fn read_frame(s: &mut std::os::unix::net::UnixStream) -> Option<Value> {
        let mut h = [0u8; 2];
        s.read_exact(&mut h).ok()?;
        let mut len = (h[1] & 0x7f) as usize;
        if len == 126 {
            let mut b = [0u8; 2];
            s.read_exact(&mut b).ok()?;
            len = u16::from_be_bytes(b) as usize;
        }
        assert!(h[1] & 0x80 != 0, "client frames must be masked");
        let mut mask = [0u8; 4];
        s.read_exact(&mut mask).ok()?;
        let mut p = vec![0u8; len];
        s.read_exact(&mut p).ok()?;
        p.iter_mut().enumerate().for_each(|(i, b)| *b ^= mask[i % 4]);
        serde_json::from_slice(&p).ok()
    }

    fn write_frame(s: &mut std::os::unix::net::UnixStream, v: &Value) {
        let d = v.to_string().into_bytes();
        let mut f = vec![0x81u8];
        if d.len() < 126 {
            f.push(d.len() as u8);
        } else {
            f.push(126);
            f.extend_from_slice(&(d.len() as u16).to_be_bytes());
        }
        f.extend_from_slice(&d);
        s.write_all(&f).unwrap();
    }

    /// Serves one connection; returns the methods it received.
    fn stand_in(listener: UnixListener, mode: Mode) -> std::thread::JoinHandle<Vec<String>> {
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                s.read_exact(&mut b).unwrap();
                head.push(b[0]);
            }
            let head = String::from_utf8(head).unwrap();
            let key = head.lines().find_map(|l| l.strip_prefix("Sec-WebSocket-Key: ")).unwrap().trim().to_string();
            let accept =
                crate::codex::appserver::ws::base64(&Sha1::digest(format!("{key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11").as_bytes()));
            write!(
                s,
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
            )
            .unwrap();
            let mut methods = Vec::new();
            while let Some(msg) = read_frame(&mut s) {
                let method = msg["method"].as_str().unwrap_or("").to_string();
                methods.push(method.clone());
                match method.as_str() {
                    "initialize" => write_frame(&mut s, &json!({"id": msg["id"], "result": {}})),
                    "initialized" => write_frame(&mut s, &json!({"method": "thread/status", "params": {}})),
                    _ => match mode {
                        Mode::Answer(r) => {
                            let mut v: Value = serde_json::from_str(r).unwrap();
                            v["id"] = msg["id"].clone();
                            write_frame(&mut s, &v);
                        }
                        Mode::Silent => {}
                        Mode::CloseAfterUpdate => return methods,
                    },
                }
            }
            methods
        })
    }

    fn run_once(name: &str, scope: EffortScope, mode: Mode, deadline_ms: u64) -> (Value, Vec<String>, Arc<Service>, PathBuf) {
        let _one = crate::codex::appserver::LISTENER_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let dir = std::env::temp_dir().join(format!("courier-exchange-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let listener = UnixListener::bind(dir.join("as.sock")).unwrap();
        let server = stand_in(listener, mode);
        let svc = Service::open(&dir, &dir, dir.join("none.toml")).unwrap();
        let cfg = EffortConfig { deadline_ms, ..EffortConfig::default() };
        let id = enqueue(&mut svc.store(), &cfg, THREAD, "high", scope, "test").unwrap().0;
        let me = std::process::id() as i32;
        let job = Job {
            thread: THREAD.clone(),
            turn_id: Some("turn-1".into()),
            event: HookEvent::PostToolUse,
            codex_pid: me,
            codex_start: endpoint::starttime(me).unwrap(),
            rollout: dir.join("rollout.jsonl"),
            rollout_len: 0,
            tool: None,
        };
        svc.run(&job, &cfg).unwrap();
        // A second hook finds nothing left to send.
        svc.run(&job, &cfg).unwrap();
        let row = svc.store().messages(Some(THREAD)).unwrap().into_iter().find(|m| m.id == id).unwrap();
        let methods = server.join().unwrap();
        (json!({"state": row.state, "reason": row.reason, "attempts": row.attempts}), methods, svc, dir)
    }

    fn updates(methods: &[String]) -> usize {
        methods.iter().filter(|m| m.ends_with("/settings/update")).count()
    }

    #[test]
    fn applied_answer_is_recorded() {
        let (row, methods, _s, dir) = run_once("applied", EffortScope::Turn, Mode::Answer(r#"{"result":{"status":"applied"}}"#), 2000);
        assert_eq!(row["state"], "applied");
        assert_eq!(methods, ["initialize", "initialized", "turn/settings/update"]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn target_unavailable_and_rpc_errors_fail_once() {
        let (row, methods, _s, dir) =
            run_once("gone", EffortScope::Turn, Mode::Answer(r#"{"result":{"status":"targetUnavailable"}}"#), 2000);
        assert_eq!((row["state"].as_str(), row["reason"].as_str()), (Some("failed"), Some("target_unavailable")));
        assert_eq!(updates(&methods), 1);
        std::fs::remove_dir_all(dir).unwrap();
        let (row, methods, _s, dir) =
            run_once("rpcerr", EffortScope::Thread, Mode::Answer(r#"{"error":{"code":-32600,"message":"nope"}}"#), 2000);
        assert_eq!(row["state"], "failed");
        assert!(row["reason"].as_str().unwrap().contains("-32600"), "{row}");
        assert_eq!(methods.last().map(String::as_str), Some("thread/settings/update"));
        assert_eq!(updates(&methods), 1);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn no_answer_is_uncertain_within_the_deadline_and_never_resent() {
        let started = Instant::now();
        let (row, methods, _s, dir) = run_once("silent", EffortScope::Turn, Mode::Silent, 300);
        assert_eq!((row["state"].as_str(), row["reason"].as_str()), (Some("uncertain"), Some("no_answer_before_deadline")));
        assert!(started.elapsed() < Duration::from_secs(2), "bounded by the deadline: {:?}", started.elapsed());
        assert_eq!(updates(&methods), 1);
        assert_eq!(row["attempts"], 1);
        std::fs::remove_dir_all(dir).unwrap();
        let (row, methods, _s, dir) = run_once("closed", EffortScope::Turn, Mode::CloseAfterUpdate, 2000);
        assert_eq!(row["state"], "uncertain");
        assert_eq!(updates(&methods), 1);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn claim_is_exactly_once_and_a_crash_after_claim_is_uncertain() {
        let dir = std::env::temp_dir().join(format!("courier-claim-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut store = Store::open(&dir).unwrap();
        let (id, _) = store.effort_enqueue(THREAD, EffortLevel::High, EffortScope::Turn, "t").unwrap();
        let c = store.effort_claim(THREAD, "PreToolUse", Some("t1"), ("/r", 0), "x").unwrap().unwrap();
        assert!(store.effort_claim(THREAD, "PostToolUse", Some("t1"), ("/r", 0), "x").unwrap().is_none());
        let stale = crate::store::Claim { token: c.token.plus(-1), ..c.clone() };
        assert!(!store.effort_settle(&stale, State::Applied, None).unwrap(), "a stale token settles nothing");
        drop(store);
        // The broker stops here. The next one must not send it again.
        let svc = Service::open(&dir, &dir, dir.join("none.toml")).unwrap();
        let s = svc.store();
        let row = s.messages(Some(THREAD)).unwrap().into_iter().find(|m| m.id == id).unwrap();
        assert_eq!((row.state.as_str(), row.reason.as_deref()), ("uncertain", Some("broker_stopped_during_apply")));
        assert!(!s.effort_has_pending(THREAD).unwrap());
        assert!(!s.effort_unclaim(&c, "x").unwrap(), "an uncertain claim never returns to pending");
        drop(s);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn turn_scope_waits_for_a_hook_with_a_turn() {
        let dir = std::env::temp_dir().join(format!("courier-noturn-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut store = Store::open(&dir).unwrap();
        store.effort_enqueue(THREAD, EffortLevel::High, EffortScope::Turn, "t").unwrap();
        assert!(store.effort_claim(THREAD, "SessionStart", None, ("/r", 0), "x").unwrap().is_none());
        assert_eq!(store.messages(None).unwrap()[0].reason.as_deref(), Some("waiting_for_turn"));
        store.effort_enqueue(THREAD, EffortLevel::Low, EffortScope::Thread, "t").unwrap();
        assert!(store.effort_claim(THREAD, "SessionStart", None, ("/r", 0), "x").unwrap().is_some());
        drop(store);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
