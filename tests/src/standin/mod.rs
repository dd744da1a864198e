//! The stand-in Codex of the end-to-end tests that need a Codex process without the real CLI
//! (crash, hostile, follow, rollouts): the broker's (`broker::codex::standin`: a copy of the system
//! python3 with unique bytes appended, so its SHA-256 is this run's own; `broker trust-codex`
//! trusts it and nothing else), running the one stand-in script (`broker::codex::standin::SCRIPT`).
//!
//! Like Codex it writes a rollout under `$CODEX_HOME/sessions/` (opened O_APPEND), holds the
//! thread's writer flock, opens and closes turns, and runs the real `target/debug/hook-client` as
//! a hook (own session, payload on stdin). When hook-client exits 0 with output it appends what
//! Codex would: a developer message with `content_item_kinds: ["hooks.additional_context"]`, or
//! for a Stop block a `<hook_prompt>` user message with the reason XML-escaped. So the rollout is
//! the ground truth of what "the model" saw, exactly as with Codex.
//!
//! [`Standin`] runs the script's `turns` mode (whole turns until told to stop), [`Stepped`] its
//! `stepped` mode (the records a test asks for, in order; [`records`] makes them).

pub mod records;
mod stepped;

pub use stepped::Stepped;

use crate::broker::hook_client_bin;
use crate::CodexEnv;
use serde_json::Value;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// The stand-in Codex executable: the broker's (`broker::codex::standin`), a python3 copy unique to this
/// test process.
pub fn standin_codex() -> &'static PathBuf {
    &broker_lib::codex::standin::bins().codex
}

/// A private world (HOME, CODEX_HOME, COURIER_* dirs) with no model: the stand-in needs none. Its
/// `codex` is the stand-in, so nothing here needs the real Codex (the fast tier has none).
pub fn world() -> CodexEnv {
    CodexEnv::with_codex("http://127.0.0.1:9/v1", standin_codex().clone())
}

/// One record the stand-in printed per hook call.
#[derive(Debug, Clone)]
pub struct HookCall {
    pub event: String,
    pub rc: i64,
    pub ms: f64,
    /// Wall-clock start of the call (seconds since the epoch).
    pub t: f64,
    /// What reached "the model" (the rollout), if anything.
    pub shown: Option<String>,
    pub out: String,
    pub err: String,
}

impl HookCall {
    /// From the record the script returns for a hook call.
    fn from_record(v: &Value) -> HookCall {
        HookCall {
            event: v["event"].as_str().unwrap_or("").into(),
            rc: v["rc"].as_i64().unwrap_or(-1000),
            ms: v["ms"].as_f64().unwrap_or(0.0),
            t: v["t"].as_f64().unwrap_or(0.0),
            shown: v["shown"].as_str().map(Into::into),
            out: v["out"].as_str().unwrap_or("").into(),
            err: v["err"].as_str().unwrap_or("").into(),
        }
    }
}

/// The stand-in running one of the script's thread modes.
struct Running {
    child: Child,
    /// Lines it printed, read by a thread so it never blocks on a full pipe.
    lines: Receiver<String>,
    rollout: PathBuf,
}

/// Starts the script in `mode` (`turns` or `stepped`) for `thread` in `env`, hook-client's
/// environment with `extra_env` added and the mode's `own_args` last; returns once it said it is
/// ready.
fn spawn(env: &CodexEnv, mode: &str, thread: &str, extra_env: &[(&str, &str)], own_args: &[&OsStr]) -> Running {
    let extra: serde_json::Map<String, Value> = extra_env.iter().map(|(k, v)| (k.to_string(), Value::String(v.to_string()))).collect();
    let mut cmd = env.command(standin_codex());
    cmd.args(["-c", broker_lib::codex::standin::SCRIPT, mode])
        .arg(&env.codex_home)
        .arg(thread)
        .arg(hook_client_bin())
        .arg(Value::Object(extra).to_string())
        .args(own_args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = cmd.spawn().expect("spawn stand-in codex");
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let line = lines.recv_timeout(Duration::from_secs(30)).expect("stand-in did not start");
    let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("stand-in said {line:?}: {e}"));
    let rollout = PathBuf::from(v["rollout"].as_str().unwrap());
    Running { child, lines, rollout }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The autonomous stand-in: turn after turn of tool calls and their hooks (every one recorded)
/// until [`Standin::finish`].
pub struct Standin {
    run: Running,
    pub pid: u32,
    pub thread: String,
    pub rollout: PathBuf,
    stop_file: PathBuf,
}

impl Standin {
    /// Start a stand-in codex for `thread` in `env`, running hook-client with `extra_env` added.
    pub fn start(env: &CodexEnv, thread: &str, tools_per_turn: usize, extra_env: &[(&str, &str)]) -> Standin {
        let stop_file = env.root.join(format!("stop-{thread}"));
        let tools = tools_per_turn.to_string();
        let run = spawn(env, "turns", thread, extra_env, &[stop_file.as_os_str(), tools.as_ref()]);
        Standin { pid: run.child.id(), rollout: run.rollout.clone(), run, thread: thread.to_string(), stop_file }
    }

    /// Ask it to finish its current turn and exit; returns every hook call it made.
    pub fn finish(mut self, timeout: Duration) -> Vec<HookCall> {
        std::fs::write(&self.stop_file, "").unwrap();
        let deadline = Instant::now() + timeout;
        let mut calls = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.run.lines.recv_timeout(left) {
                Ok(line) => line,
                Err(RecvTimeoutError::Disconnected) => break,
                Err(_) => panic!("stand-in {} did not stop within {timeout:?}", self.pid),
            };
            let v: Value = serde_json::from_str(&line).unwrap();
            if v.get("stopped").is_some() {
                break;
            }
            calls.push(HookCall::from_record(&v));
        }
        let _ = self.run.child.wait();
        calls
    }

    /// SIGKILL the stand-in (a Codex crash).
    pub fn kill(&mut self) {
        let _ = self.run.child.kill();
        let _ = self.run.child.wait();
    }
}
