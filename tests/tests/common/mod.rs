//! Shared rig for crash.rs and hostile.rs: a stand-in Codex that the real broker's gate accepts,
//! and a restartable `broker serve`.
//!
//! The stand-in is the broker's (`broker::codex::standin`: a copy of the system python3 with unique bytes
//! appended, so its SHA-256 is this run's own; `broker trust-codex` trusts it and nothing else),
//! running this file's own script, a loop of whole turns. Like Codex it writes a
//! rollout under `$CODEX_HOME/sessions/` (opened O_APPEND), holds the thread's writer flock, opens
//! and closes turns, and runs the real `target/debug/hook-client` as a hook (own session, payload
//! on stdin). When hook-client exits 0 with output it appends what Codex would: a developer
//! message with `content_item_kinds: ["hooks.additional_context"]`, or for a Stop block a
//! `<hook_prompt>` user message with the reason XML-escaped. So the rollout is the ground truth
//! of what "the model" saw, exactly as with Codex.
#![allow(dead_code)]

use courier_tests::broker::{broker_bin, hook_client_bin};
use courier_tests::util::poll_until;
use courier_tests::CodexEnv;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// What both stand-in scripts start with. argv: `CODEX_HOME THREAD HOOK_CLIENT EXTRA_ENV_JSON
/// [script's own]`. It writes the rollout under `$CODEX_HOME/sessions/` (O_APPEND, compact JSON
/// with ordinals, as Codex does), holds the thread's writer flock, prints `{ready, pid, rollout}`,
/// and defines `hook(event, turn, extra)`: run hook-client as Codex does (own session, payload on
/// stdin, the tool-command markers removed from the environment and EXTRA_ENV added), append what
/// Codex would for its output, and return the call's record.
macro_rules! standin_prelude {
    () => {
        r#"
import sys, os, json, fcntl, subprocess, time, uuid
home, thread, hc = sys.argv[1:4]
extra_env = json.loads(sys.argv[4])
args = sys.argv[5:]
d = os.path.join(home, "sessions/2026/11/29")
os.makedirs(d, exist_ok=True)
os.makedirs(os.path.join(home, "thread-writer-locks"), exist_ok=True)
path = os.path.join(d, "rollout-2026-11-29T08-08-52-%s.jsonl" % thread)
lock = os.open(os.path.join(home, "thread-writer-locks", thread + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
ro = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
ordinal = [0]
def rec(kind, payload):
    ordinal[0] += 1
    os.write(ro, (json.dumps({"timestamp": "2026-11-29T08:08:52.339Z", "ordinal": ordinal[0], "type": kind, "payload": payload},
                             separators=(",", ":")) + "\n").encode())
rec("session_meta", {"id": thread, "session_id": thread, "cwd": "/", "originator": "standin", "cli_version": "0.171.0"})
env = dict(os.environ)
for k in ["CODEX_TOOL_CALL_ID", "CODEX_THREAD_ID", "CODEX_SESSION_ID", "CODEX_CI"]:
    env.pop(k, None)
env.update(extra_env)
HOOK = [{"provenance": {"type": "harness", "hook": True}}]  # what Codex puts on hook output
def xml_escape(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;").replace("'", "&apos;")
def say(o):
    sys.stdout.write(json.dumps(o) + "\n"); sys.stdout.flush()
def hook(event, turn, extra):
    p = {"session_id": thread, "transcript_path": path, "cwd": "/", "hook_event_name": event,
         "model": "m", "permission_mode": "bypassPermissions"}
    if turn is not None:
        p["turn_id"] = turn
    p.update(extra)
    t0 = time.monotonic(); wall = time.time()
    c = subprocess.Popen([hc], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env, start_new_session=True)
    try:
        out, err = c.communicate(json.dumps(p).encode(), timeout=30)
    except subprocess.TimeoutExpired:
        c.kill(); out, err = c.communicate()
    ms = (time.monotonic() - t0) * 1000.0
    text = None
    if c.returncode == 0 and out.strip():
        o = json.loads(out)
        if event == "Stop":
            if o.get("decision") == "block":
                text = o["reason"]
                rec("response_item", {"type": "message", "role": "user", "content": [{"type": "input_text",
                    "text": '<hook_prompt hook_run_id="stop:1">' + xml_escape(text) + "</hook_prompt>"}],
                    "internal_chat_message_metadata_passthrough": {"turn_id": turn, "content_item_metadata": HOOK}})
        else:
            text = o["hookSpecificOutput"]["additionalContext"]
            rec("response_item", {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": text}],
                "internal_chat_message_metadata_passthrough": {"turn_id": turn, "content_item_kinds": ["hooks.additional_context"],
                                                                "content_item_metadata": HOOK}})
    return {"event": event, "turn": turn, "rc": c.returncode, "ms": ms, "t": wall, "shown": text,
            "out": out.decode(errors="replace"), "err": err.decode(errors="replace")[-300:]}
say({"ready": True, "pid": os.getpid(), "rollout": path})
"#
    };
}

/// The autonomous stand-in: turn after turn of tool calls and their hooks (every one printed)
/// until the stop file (own argv: `STOP_FILE TOOLS_PER_TURN`) exists.
pub const STANDIN_SCRIPT: &str = concat!(
    standin_prelude!(),
    r#"
stop_file, tools_per_turn = args[0], int(args[1])
def run_hook(event, turn, extra):
    r = hook(event, turn, extra)
    say(r)
    return r["shown"]
# The records Codex writes around each hook (docs/security.md, "One ticket per Codex action"), so each hook follows its own
# Codex action (gate/ticket.rs): the tool call before PreToolUse, its item_completed before
# PostToolUse and its output after, the answer before Stop.
def in_turn(turn):
    return {"turn_id": turn}
def usage(turn):
    rec("token_usage_record", {"thread_id": thread, "turn_id": turn, "usage": {}})
def answer(turn):
    rec("response_item", {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}],
        "internal_chat_message_metadata_passthrough": in_turn(turn)})
    usage(turn)
n = 0
while not os.path.exists(stop_file):
    turn = str(uuid.uuid4())
    rec("event_msg", {"type": "task_started", "turn_id": turn})
    rec("turn_context", {"turn_id": turn})
    for i in range(tools_per_turn):
        call = "call_%d" % n
        rec("response_item", {"type": "function_call", "name": "exec_command", "arguments": "{}", "call_id": call,
            "internal_chat_message_metadata_passthrough": in_turn(turn)})
        usage(turn)
        extra = {"tool_name": "Bash", "tool_input": {"command": "true"}, "tool_use_id": call}
        if i % 2 == 0:
            run_hook("PreToolUse", turn, extra)
        rec("event_msg", {"type": "item_completed", "thread_id": thread, "turn_id": turn, "item": {"type": "CommandExecution", "id": call}})
        if i % 2 == 1:
            run_hook("PostToolUse", turn, extra)
        rec("response_item", {"type": "function_call_output", "call_id": call, "output": "ok"})
        n += 1
    active = False
    for _ in range(5):
        answer(turn)
        if run_hook("Stop", turn, {"stop_hook_active": active, "last_assistant_message": "done"}) is None:
            break
        active = True
    rec("event_msg", {"type": "task_complete", "turn_id": turn, "last_agent_message": "done"})
say({"stopped": True, "hooks": n})
"#
);

/// Starts `script` (one of the two above) on the stand-in executable for `thread` in `env`, its
/// `own_args` after the prelude's; returns the child, its stdout lines (read by a thread, so it
/// never blocks on a full pipe) and its rollout, once it said it is ready.
fn spawn_standin(
    env: &CodexEnv,
    script: &str,
    thread: &str,
    extra_env: &[(&str, &str)],
    own_args: &[&std::ffi::OsStr],
) -> (Child, std::sync::mpsc::Receiver<String>, PathBuf) {
    let extra: serde_json::Map<String, Value> = extra_env.iter().map(|(k, v)| (k.to_string(), Value::String(v.to_string()))).collect();
    let mut cmd = env.command(standin_codex());
    cmd.arg("-c")
        .arg(script)
        .arg(&env.codex_home)
        .arg(thread)
        .arg(hook_client_bin())
        .arg(Value::Object(extra).to_string())
        .args(own_args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = cmd.spawn().expect("spawn stand-in codex");
    let stdout: BufReader<ChildStdout> = BufReader::new(child.stdout.take().unwrap());
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
    (child, lines, rollout)
}

/// The stand-in Codex executable: the broker's (`broker::codex::standin`), a python3 copy unique to this
/// test process, here running [`STANDIN_SCRIPT`].
pub fn standin_codex() -> &'static PathBuf {
    &broker_lib::codex::standin::bins().codex
}

/// A private world (HOME, CODEX_HOME, COURIER_* dirs) with no model: the stand-in needs none.
pub fn world() -> CodexEnv {
    CodexEnv::with_base_url("http://127.0.0.1:9/v1")
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
    /// From the record the prelude's `hook` returns.
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

pub struct Standin {
    child: Child,
    /// Lines the stand-in printed, read by a thread so it never blocks on a full pipe.
    lines: std::sync::mpsc::Receiver<String>,
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
        let (child, lines, rollout) = spawn_standin(env, STANDIN_SCRIPT, thread, extra_env, &[stop_file.as_os_str(), tools.as_ref()]);
        Standin { pid: child.id(), child, lines, thread: thread.to_string(), rollout, stop_file }
    }

    /// Ask it to finish its current turn and exit; returns every hook call it made.
    pub fn finish(mut self, timeout: Duration) -> Vec<HookCall> {
        std::fs::write(&self.stop_file, "").unwrap();
        let deadline = Instant::now() + timeout;
        let mut calls = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.lines.recv_timeout(left) {
                Ok(line) => line,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                Err(_) => panic!("stand-in {} did not stop within {timeout:?}", self.pid),
            };
            let v: Value = serde_json::from_str(&line).unwrap();
            if v.get("stopped").is_some() {
                break;
            }
            calls.push(HookCall::from_record(&v));
        }
        let _ = self.child.wait();
        calls
    }

    /// SIGKILL the stand-in (a Codex crash).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Standin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Raw frame I/O against the broker socket (tests speak the wire protocol by hand).
pub fn frame(body: &[u8]) -> Vec<u8> {
    let mut v = (body.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

pub fn read_frame(s: &mut UnixStream) -> std::io::Result<Value> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body)?;
    serde_json::from_slice(&body).map_err(std::io::Error::other)
}

/// `{"op":"status"}` over the socket; the broker's status document.
pub fn status(sock: &Path) -> Option<Value> {
    let mut s = UnixStream::connect(sock).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(&frame(br#"{"op":"status","v":1}"#)).ok()?;
    read_frame(&mut s).ok()
}

/// A `broker serve` process that tests kill and restart at will.
pub struct Serve {
    pub child: Child,
    pub log: PathBuf,
}

impl Serve {
    /// Start `broker serve` with `extra` environment; wait (bounded) until it answers status.
    pub fn start(env: &CodexEnv, extra: &[(&str, &str)]) -> Serve {
        let s = Serve::spawn(env, extra);
        let sock = env.runtime_dir.join("broker.sock");
        let mut s = s;
        let ok = poll_until(Duration::from_secs(15), || {
            if let Ok(Some(st)) = s.child.try_wait() {
                panic!("broker serve exited at start ({st}): {}", std::fs::read_to_string(&s.log).unwrap_or_default());
            }
            status(&sock)
        });
        assert!(ok.is_some(), "broker did not answer status: {}", std::fs::read_to_string(&s.log).unwrap_or_default());
        s
    }

    /// Spawn without waiting.
    pub fn spawn(env: &CodexEnv, extra: &[(&str, &str)]) -> Serve {
        let log = env.root.join("broker.log");
        let logf = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        let mut cmd = env.command(broker_bin());
        cmd.arg("serve").stdout(logf.try_clone().unwrap()).stderr(logf);
        for (k, v) in extra {
            cmd.env(k, v);
        }
        Serve { child: cmd.spawn().expect("spawn broker serve"), log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// `broker <args>` with the world's environment.
pub fn broker_cli(env: &CodexEnv, args: &[&str]) -> std::process::Output {
    courier_tests::broker::run_bounded(env.command(broker_bin()).args(args), Duration::from_secs(30))
}

pub fn broker_ok(env: &CodexEnv, args: &[&str]) -> String {
    let out = broker_cli(env, args);
    assert!(out.status.success(), "broker {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn inspect(env: &CodexEnv) -> Value {
    serde_json::from_str(&broker_ok(env, &["inspect", "--json"])).unwrap()
}

/// Marker ids in every hook-injected line of a rollout, as Codex recorded them (Stop prompts
/// unescaped once).
pub fn rollout_marker_ids(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut ids = Vec::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else { continue };
        let p = &v["payload"];
        if p["type"] != "message" {
            continue;
        }
        let t: String = p["content"].as_array().into_iter().flatten().filter_map(|c| c["text"].as_str()).collect();
        let hooky = (p["role"] == "developer"
            && p["internal_chat_message_metadata_passthrough"]["content_item_kinds"]
                .as_array()
                .is_some_and(|k| k.iter().any(|x| x == "hooks.additional_context")))
            || (p["role"] == "user" && t.starts_with("<hook_prompt"));
        if !hooky {
            continue;
        }
        let t = t.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&apos;", "'").replace("&amp;", "&");
        for (at, _) in t.match_indices("<courier-message id=\"") {
            let rest = &t[at + 21..];
            if let Some(end) = rest.find('"') {
                ids.push(rest[..end].to_string());
            }
        }
    }
    ids
}

/// A tiny deterministic PRNG (xorshift64*), seeded from `COURIER_CRASH_SEED` or the clock.
pub struct Rng(pub u64);

impl Rng {
    pub fn from_env() -> Rng {
        let seed = std::env::var("COURIER_CRASH_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1);
        eprintln!("random seed {seed} (COURIER_CRASH_SEED={seed} repeats it)");
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Every message of the inspect document by id.
pub fn messages_by_id(inspect: &Value) -> std::collections::HashMap<String, Value> {
    courier_tests::broker::messages(inspect).into_iter().map(|m| (m["id"].as_str().unwrap_or("").to_string(), m)).collect()
}

/// Run `Command` and return when it exits or `timeout` passes (killing it).
pub fn spawn_hook_client(env: &CodexEnv, payload: &str, extra: &[(&str, &str)]) -> (std::process::Output, Duration) {
    let mut cmd = env.command(hook_client_bin());
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let start = Instant::now();
    let mut child = cmd.spawn().expect("spawn hook-client");
    child.stdin.take().unwrap().write_all(payload.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (out, start.elapsed())
}

pub fn cmd_output(cmd: &mut Command) -> std::process::Output {
    courier_tests::broker::run_bounded(cmd, Duration::from_secs(30))
}

/// A stand-in Codex driven step by step (one JSON command per stdin line, one JSON answer per
/// line): it writes exactly the rollout records a test asks for, in order, and runs the real
/// hook-client as a hook when asked, appending what Codex would for its output (as
/// [`STANDIN_SCRIPT`] does). For tests that need a rollout of a particular shape, e.g. a turn opened
/// far back, or the records Codex writes around each hook.
pub const STEPPED_SCRIPT: &str = concat!(
    standin_prelude!(),
    r#"
for line in sys.stdin:
    c = json.loads(line)
    op = c["op"]
    if op == "rec":
        rec(c["kind"], c["payload"])
        say({"ok": True, "size": os.fstat(ro).st_size})
    elif op == "filler":
        # `count` records of `bytes` each, as a long tool output: function_call_output lines.
        for i in range(c["count"]):
            rec("response_item", {"type": "function_call_output", "call_id": "filler_%d" % i, "output": "y" * c["bytes"]})
        say({"ok": True, "size": os.fstat(ro).st_size})
    elif op == "hook":
        say(hook(c["event"], c.get("turn"), c.get("extra", {})))
    else:
        say({"error": "unknown op " + op})
"#
);

/// The stand-in of [`STEPPED_SCRIPT`].
pub struct Stepped {
    child: Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
    pub pid: u32,
    pub thread: String,
    pub rollout: PathBuf,
}

impl Stepped {
    pub fn start(env: &CodexEnv, thread: &str) -> Stepped {
        let (mut child, lines, rollout) = spawn_standin(env, STEPPED_SCRIPT, thread, &[], &[]);
        let stdin = child.stdin.take().unwrap();
        Stepped { pid: child.id(), child, stdin, lines, thread: thread.to_string(), rollout }
    }

    fn cmd(&mut self, c: Value) -> Value {
        writeln!(self.stdin, "{c}").unwrap();
        self.stdin.flush().unwrap();
        let line = self.lines.recv_timeout(Duration::from_secs(120)).expect("stand-in did not answer");
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("stand-in said {line:?}: {e}"));
        assert!(v.get("error").is_none(), "stand-in: {v}");
        v
    }

    /// Append one record; returns the rollout size after it.
    pub fn rec(&mut self, kind: &str, payload: Value) -> u64 {
        self.cmd(serde_json::json!({"op": "rec", "kind": kind, "payload": payload}))["size"].as_u64().unwrap()
    }

    /// Append `count` function_call_output records of `bytes` bytes of output each.
    pub fn filler(&mut self, count: usize, bytes: usize) -> u64 {
        self.cmd(serde_json::json!({"op": "filler", "count": count, "bytes": bytes}))["size"].as_u64().unwrap()
    }

    /// Run hook-client for `event` (payload `turn_id` = `turn`, plus `extra` fields).
    pub fn hook(&mut self, event: &str, turn: Option<&str>, extra: Value) -> HookCall {
        let v = self.cmd(serde_json::json!({"op": "hook", "event": event, "turn": turn, "extra": extra}));
        HookCall::from_record(&v)
    }
}

impl Drop for Stepped {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Rollout records as codex-cli 0.171.0 writes them (fields in its order; see
/// shared/testdata/rollout-0.171.0-*.jsonl), for [`Stepped::rec`].
pub mod records {
    use serde_json::{json, Value};

    pub fn task_started(turn: &str) -> (&'static str, Value) {
        ("event_msg", json!({"type": "task_started", "turn_id": turn, "started_at": 1796112975, "model_context_window": 258400}))
    }
    pub fn task_complete(turn: &str) -> (&'static str, Value) {
        ("event_msg", json!({"type": "task_complete", "turn_id": turn, "last_agent_message": "done"}))
    }
    pub fn turn_context(turn: &str) -> (&'static str, Value) {
        ("turn_context", json!({"turn_id": turn, "root_turn_id": turn, "cwd": "/", "model": "gpt-5.5"}))
    }
    pub fn user_message(turn: &str, text: &str) -> (&'static str, Value) {
        (
            "response_item",
            json!({"type": "message", "id": "msg_u", "role": "user",
            "content": [{"type": "input_text", "text": text}],
            "internal_chat_message_metadata_passthrough": {"turn_id": turn}}),
        )
    }
    pub fn function_call(call: &str, turn: &str, cmd: &str) -> (&'static str, Value) {
        let args = json!({"cmd": cmd, "yield_time_ms": 2000}).to_string();
        (
            "response_item",
            json!({"type": "function_call", "id": format!("fc_{call}"), "name": "exec_command",
            "arguments": args, "call_id": call, "internal_chat_message_metadata_passthrough": {"turn_id": turn}}),
        )
    }
    pub fn token_usage(thread: &str, turn: &str) -> (&'static str, Value) {
        (
            "token_usage_record",
            json!({"thread_id": thread, "turn_id": turn, "session_id": thread, "root_turn_id": turn,
            "response_id": "resp_1", "usage": {"input_tokens": 10, "output_tokens": 5}}),
        )
    }
    pub fn exec_completed(thread: &str, turn: &str, call: &str) -> (&'static str, Value) {
        (
            "event_msg",
            json!({"type": "item_completed", "thread_id": thread, "turn_id": turn,
            "item": {"type": "CommandExecution", "id": call, "process_id": "7010", "command": ["/bin/bash", "-lc", "true"],
                     "aggregated_output": "", "exit_code": 0}}),
        )
    }
    pub fn function_call_output(call: &str) -> (&'static str, Value) {
        (
            "response_item",
            json!({"type": "function_call_output", "id": format!("fco_{call}"), "call_id": call,
            "output": "Process exited with code 0"}),
        )
    }
    pub fn assistant_message(turn: &str, text: &str) -> (&'static str, Value) {
        (
            "response_item",
            json!({"type": "message", "id": "msg_a", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
            "internal_chat_message_metadata_passthrough": {"turn_id": turn}}),
        )
    }
}

impl Stepped {
    /// Append a record made by [`records`].
    pub fn write(&mut self, r: (&str, Value)) -> u64 {
        self.rec(r.0, r.1)
    }
}
