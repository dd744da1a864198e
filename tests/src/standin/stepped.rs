//! The stand-in driven step by step (the script's `stepped` mode: one JSON command per stdin
//! line, one JSON answer per line): it writes exactly the rollout records a test asks for, in
//! order, and runs the real hook-client as a hook when asked, appending what Codex would for its
//! output. For tests that need a rollout of a particular shape (a turn opened far back, the
//! records Codex writes around each hook) or one codex holding many threads.

use super::{spawn, HookCall, Running};
use crate::CodexEnv;
use serde_json::{json, Value};
use std::io::Write;
use std::path::PathBuf;
use std::process::ChildStdin;
use std::time::Duration;

/// A hook call started with [`Stepped::hook_start`], not yet waited for.
#[derive(Debug, Clone, Copy)]
pub struct Started(u64);

pub struct Stepped {
    run: Running,
    stdin: ChildStdin,
    codex_home: PathBuf,
    pub pid: u32,
    /// The thread it started with: what a command without a thread means.
    pub thread: String,
    pub rollout: PathBuf,
}

impl Stepped {
    pub fn start(env: &CodexEnv, thread: &str) -> Stepped {
        let mut run = spawn(env, "stepped", thread, &[], &[]);
        let stdin = run.child.stdin.take().unwrap();
        Stepped {
            pid: run.child.id(),
            rollout: run.rollout.clone(),
            run,
            stdin,
            codex_home: env.codex_home.clone(),
            thread: thread.to_string(),
        }
    }

    fn cmd(&mut self, c: Value) -> Value {
        writeln!(self.stdin, "{c}").unwrap();
        self.stdin.flush().unwrap();
        let line = self.run.lines.recv_timeout(Duration::from_secs(120)).expect("stand-in did not answer");
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("stand-in said {line:?}: {e}"));
        assert!(v.get("error").is_none(), "stand-in: {v}");
        v
    }

    /// Start another thread in the same process (its lock taken, `session_meta` written); its
    /// rollout.
    pub fn add_thread(&mut self, thread: &str) -> PathBuf {
        let home = self.codex_home.clone();
        PathBuf::from(self.cmd(json!({"op": "new_thread", "home": home, "thread": thread}))["rollout"].as_str().unwrap())
    }

    /// Append one record; returns the rollout size after it.
    pub fn rec(&mut self, kind: &str, payload: Value) -> u64 {
        self.cmd(json!({"op": "rec", "kind": kind, "payload": payload}))["size"].as_u64().unwrap()
    }

    /// Append a record made by [`super::records`] to the rollout of `thread`.
    pub fn write_to(&mut self, thread: &str, r: (&str, Value)) -> u64 {
        self.cmd(json!({"op": "rec", "thread": thread, "kind": r.0, "payload": r.1}))["size"].as_u64().unwrap()
    }

    /// Append a record made by [`super::records`].
    pub fn write(&mut self, r: (&str, Value)) -> u64 {
        self.rec(r.0, r.1)
    }

    /// Append `count` function_call_output records of `bytes` bytes of output each.
    pub fn filler(&mut self, count: usize, bytes: usize) -> u64 {
        self.cmd(json!({"op": "filler", "count": count, "bytes": bytes}))["size"].as_u64().unwrap()
    }

    /// Run hook-client for `event` (payload `turn_id` = `turn`, plus `extra` fields).
    pub fn hook(&mut self, event: &str, turn: Option<&str>, extra: Value) -> HookCall {
        let v = self.cmd(json!({"op": "hook", "event": event, "turn": turn, "extra": extra}));
        HookCall::from_record(&v)
    }

    /// Start hook-client for `event` of `thread` without waiting for it, its environment with
    /// `env` added and its stderr to `stderr` (else kept for [`HookCall::err`]).
    pub fn hook_start(
        &mut self,
        thread: &str,
        event: &str,
        turn: &str,
        extra: Value,
        env: &[(&str, &str)],
        stderr: Option<&std::path::Path>,
    ) -> Started {
        let env: serde_json::Map<String, Value> = env.iter().map(|(k, v)| (k.to_string(), Value::String(v.to_string()))).collect();
        let c = json!({"op": "hook_start", "thread": thread, "event": event, "turn": turn, "extra": extra, "env": env, "stderr": stderr});
        Started(self.cmd(c)["spawned"].as_u64().unwrap())
    }

    /// Wait for a hook call [`Stepped::hook_start`] started (30 s at most, then it is killed).
    pub fn hook_wait(&mut self, started: Started) -> HookCall {
        HookCall::from_record(&self.cmd(json!({"op": "hook_wait", "id": started.0})))
    }

    /// Kill every hook call started and not waited for.
    pub fn hook_kill(&mut self) {
        self.cmd(json!({"op": "hook_kill"}));
    }
}
