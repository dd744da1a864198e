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

pub mod config;
pub mod db;
pub mod endpoint;
pub mod policy;
pub mod ws;

use crate::gate::Verified;
use crate::store::Store;
use anyhow::Result;
use config::{ConfigCache, EffortConfig};
use courier_shared::hook::HookEvent;
use endpoint::Endpoint;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Seek, SeekFrom};
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
    thread: String,
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
        let n = db::sweep_orphans(store.conn_ref(), None, "broker_stopped_during_apply")?;
        if n > 0 {
            eprintln!("broker: {n} effort change(s) were mid-exchange when the broker stopped: marked uncertain");
        }
        Ok(Arc::new(Service { store: Mutex::new(store), codex_home: codex_home.to_path_buf(), config: ConfigCache::new(config_path) }))
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Called for every verified hook. Cheap when the thread has no effort work.
    pub fn on_hook(self: &Arc<Self>, v: &Verified, raw_payload: &str) -> Pending {
        let cfg = self.config.get();
        let tool = match (v.event, &v.payload.tool_name) {
            (HookEvent::PostToolUse, Some(t)) if cfg.policy.enabled && cfg.policy.rules.iter().any(|r| &r.tool == t) => {
                Some((t.clone(), raw_payload.to_string()))
            }
            _ => None,
        };
        let pending = db::has_pending(self.store().conn_ref(), &v.thread_id).unwrap_or(false);
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
                eprintln!("broker: effort for thread {}: {e:#}", job.thread);
                None
            });
            let _ = tx.send(());
            if let Some((id, level, offset)) = confirm {
                me.confirm_thread_scope(&id, &job.rollout, offset, &level);
            }
        });
        match spawned {
            Ok(_) => Pending(Some(rx)),
            Err(_) => Pending(None),
        }
    }

    /// Returns a thread-scope change to look for in the rollout: (id, level, offset).
    fn run(&self, job: &Job, cfg: &EffortConfig) -> Result<Option<(String, String, u64)>> {
        if let Some((tool, raw)) = &job.tool {
            if let Some(code) = policy::exit_code(raw, &job.rollout, job.rollout_len) {
                let mut store = self.store();
                if let Some(level) = policy::evaluate(cfg, store.conn_ref(), &job.thread, tool, code == 0)? {
                    let (id, _) = db::enqueue(store.conn(), &job.thread, &level, cfg.policy_scope(), "policy")?;
                    eprintln!("broker: effort policy: {tool} exit {code} in {} -> {level} ({id})", job.thread);
                }
            }
        }
        if !db::has_pending(self.store().conn_ref(), &job.thread)? {
            return Ok(None);
        }
        let endpoints = endpoint::discover(&self.codex_home, job.codex_pid, job.codex_start);
        if endpoints.is_empty() {
            db::mark_waiting(self.store().conn_ref(), &job.thread, "no_settings_channel")?;
            return Ok(None);
        }
        let detail = endpoints.iter().map(|e| format!("{} {}", e.via, e.path.display())).collect::<Vec<_>>().join("; ");
        let claim = {
            let mut store = self.store();
            let rollout = job.rollout.to_string_lossy();
            db::claim(store.conn(), &job.thread, job.event.as_str(), job.turn_id.as_deref(), (&rollout, job.rollout_len), &detail)?
        };
        let Some(claim) = claim else { return Ok(None) };
        if !cfg.allow.contains(&claim.level) {
            db::settle(self.store().conn_ref(), &claim, "cancelled", Some("not_allowed"))?;
            return Ok(None);
        }
        let started = Instant::now();
        let deadline = started + Duration::from_millis(cfg.deadline_ms);
        let outcome = apply(&endpoints, job, &claim, deadline);
        eprintln!(
            "broker: effort {} {} (scope {}) for thread {} at {}: {outcome:?} in {} ms",
            claim.id,
            claim.level,
            claim.scope,
            job.thread,
            job.event.as_str(),
            started.elapsed().as_millis()
        );
        let store = self.store();
        let conn = store.conn_ref();
        let settled = match &outcome {
            Outcome::Applied => db::settle(conn, &claim, "applied", None)?,
            Outcome::Failed(r) => db::settle(conn, &claim, "failed", Some(r))?,
            Outcome::Uncertain(r) => db::settle(conn, &claim, "uncertain", Some(r))?,
            Outcome::NotSent(r) => db::unclaim(conn, &claim, r)?,
        };
        if !settled {
            eprintln!("broker: effort {} was settled by someone else (outcome {outcome:?})", claim.id);
        }
        Ok((settled && outcome == Outcome::Applied && claim.scope == "thread").then(|| (claim.id, claim.level, job.rollout_len)))
    }

    /// Watches the rollout (bounded) for `thread_settings_applied` carrying `level`.
    fn confirm_thread_scope(&self, id: &str, rollout: &Path, offset: u64, level: &str) {
        let end = Instant::now() + CONFIRM_WAIT;
        let mut pos = offset;
        loop {
            match scan_for_effort(rollout, pos, level) {
                (true, _) => {
                    let _ = db::confirm(self.store().conn_ref(), id);
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
        if let Err(e) = db::sweep_orphans(self.store().conn_ref(), Some(limit), "no_answer_before_deadline") {
            eprintln!("broker: effort sweep: {e:#}");
        }
    }
}

/// Looks from `from` for a complete line recording `level` as the thread's effort; returns
/// whether found and the offset scanned to.
fn scan_for_effort(path: &Path, from: u64, level: &str) -> (bool, u64) {
    let Ok(mut f) = std::fs::File::open(path) else { return (false, from) };
    if f.seek(SeekFrom::Start(from)).is_err() {
        return (false, from);
    }
    let mut reader = BufReader::new(f);
    let mut pos = from;
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return (false, pos),
            Ok(_) if line.last() != Some(&b'\n') => return (false, pos),
            Ok(n) => pos += n as u64,
        }
        if effort_record(&line).as_deref() == Some(level) {
            return (true, pos);
        }
    }
}

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

/// One exchange: connect to the first endpoint that proves to be the Codex process, initialize,
/// send the update once, read its answer before `deadline`.
fn apply(endpoints: &[Endpoint], job: &Job, claim: &db::Claim, deadline: Instant) -> Outcome {
    let mut refused = Vec::new();
    let stream = endpoints.iter().find_map(|ep| match endpoint::connect_verified(ep, job.codex_pid, job.codex_start) {
        Ok(s) => Some(s),
        Err(e) => {
            refused.push(e);
            None
        }
    });
    let Some(stream) = stream else {
        return Outcome::NotSent(format!("endpoint_unreachable: {}", refused.join("; ")));
    };
    let mut ws = match ws::WsClient::handshake(stream, deadline) {
        Ok(ws) => ws,
        Err(e) => return Outcome::NotSent(format!("endpoint_handshake: {e}")),
    };
    let init = ws.call(
        "initialize",
        json!({"clientInfo": {"name": "courier", "title": "Courier broker", "version": env!("CARGO_PKG_VERSION")},
               "capabilities": {"experimentalApi": true}}),
    );
    match init {
        Ok(r) if r.get("result").is_some() => {}
        Ok(r) => return Outcome::NotSent(format!("initialize_refused: {}", r.get("error").unwrap_or(&r))),
        Err(e) => return Outcome::NotSent(format!("initialize: {e}")),
    }
    if let Err(e) = ws.notify("initialized") {
        return Outcome::NotSent(format!("initialized: {e}"));
    }
    if deadline.saturating_duration_since(Instant::now()) < MIN_SEND_BUDGET {
        return Outcome::NotSent("deadline_before_send".into());
    }
    let (method, params) = if claim.scope == "thread" {
        ("thread/settings/update", json!({"threadId": job.thread, "effort": claim.level}))
    } else {
        ("turn/settings/update", json!({"threadId": job.thread, "turnId": job.turn_id, "effort": claim.level}))
    };
    // From here on the request may have reached Codex: never NotSent.
    let answer = ws.send_request(method, params).and_then(|id| ws.wait_response(id));
    match answer {
        Err(e) if e.timed_out => Outcome::Uncertain("no_answer_before_deadline".into()),
        Err(e) => Outcome::Uncertain(format!("connection_lost_after_send: {e}")),
        Ok(r) => judge(&claim.scope, &r),
    }
}

/// Reads an update's response.
pub fn judge(scope: &str, response: &Value) -> Outcome {
    if let Some(e) = response.get("error") {
        let code = e.get("code").and_then(Value::as_i64).unwrap_or(0);
        let msg = e.get("message").and_then(Value::as_str).unwrap_or("");
        return Outcome::Failed(format!("rpc_error {code}: {msg}"));
    }
    let Some(result) = response.get("result") else {
        return Outcome::Uncertain("malformed_response".into());
    };
    if scope == "thread" {
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
pub fn enqueue(store: &mut Store, cfg: &EffortConfig, thread: &str, level: &str, scope: &str, from: &str) -> Result<(String, Vec<String>)> {
    cfg.check_level(level)?;
    if !config::SCOPES.contains(&scope) {
        anyhow::bail!("--scope {scope:?} is not turn or thread");
    }
    db::enqueue(store.conn(), thread, level, scope, from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_are_judged_by_scope() {
        let applied = json!({"id": 3, "result": {"status": "applied"}});
        assert_eq!(judge("turn", &applied), Outcome::Applied);
        let gone = json!({"id": 3, "result": {"status": "targetUnavailable"}});
        assert_eq!(judge("turn", &gone), Outcome::Failed("target_unavailable".into()));
        let err = json!({"id": 3, "error": {"code": -32600, "message": "no"}});
        assert!(matches!(judge("turn", &err), Outcome::Failed(r) if r.contains("-32600")));
        assert_eq!(judge("thread", &json!({"id": 3, "result": {}})), Outcome::Applied);
        assert!(matches!(judge("turn", &json!({"id": 3, "result": {}})), Outcome::Uncertain(_)));
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
