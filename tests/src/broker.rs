//! Driving Courier's own binaries (`broker`, `hook-client`) from `target/debug`, through the
//! commands and environment README.md and docs/ document.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::codex::CodexEnv;
use crate::util::poll_until;

/// Directory holding the workspace's debug binaries: `$COURIER_BIN_DIR`, else
/// `$CARGO_TARGET_DIR/debug`, else `<workspace>/target/debug`.
pub fn target_bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("COURIER_BIN_DIR").filter(|v| !v.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR").filter(|v| !v.is_empty()) {
        let d = PathBuf::from(d);
        let d = if d.is_relative() { PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(d) } else { d };
        return d.join("debug");
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug")
}

fn workspace_bin(name: &str) -> PathBuf {
    let p = target_bin_dir().join(name);
    match p.canonicalize() {
        Ok(c) if c.is_file() => c,
        _ => panic!(
            "{} not found. Build it first: `cargo build --workspace` (tests use the debug binaries \
             of this checkout; set COURIER_BIN_DIR to use others).",
            p.display()
        ),
    }
}

/// Absolute path of `target/debug/broker`.
pub fn broker_bin() -> PathBuf {
    workspace_bin("broker")
}

/// Absolute path of `target/debug/hook-client`.
pub fn hook_client_bin() -> PathBuf {
    workspace_bin("hook-client")
}

/// The hook command string registered for tests: the absolute hook-client path alone (a simple
/// command, so bash execs it and its parent is the codex process).
pub fn hook_command() -> String {
    broker_lib::install::hook_command(&hook_client_bin())
}

/// A `broker serve` running for one [`CodexEnv`]; killed on drop.
/// The person's passphrase in every test env ([`Broker::person_passphrase`]).
pub const PERSON_PASSPHRASE: &str = "the kit person's passphrase";

pub struct Broker<'a> {
    env: &'a CodexEnv,
    child: Option<Child>,
    pub bin: PathBuf,
    pub log: PathBuf,
}

impl<'a> Broker<'a> {
    /// Start `broker serve` with the env's directories and wait (bounded) until
    /// `$COURIER_RUNTIME_DIR/broker.sock` accepts a connection.
    pub fn start(env: &'a CodexEnv) -> Broker<'a> {
        let bin = broker_bin();
        let log = env.root.join(format!("broker-{}.log", crate::util::unique_token()));
        let logf = std::fs::File::create(&log).unwrap();
        let mut cmd = env.command(&bin);
        cmd.arg("serve").stdout(logf.try_clone().unwrap()).stderr(logf);
        if let Ok(v) = std::env::var("RUST_LOG") {
            cmd.env("RUST_LOG", v);
        }
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {} serve: {e}", bin.display()));
        let mut b = Broker { env, child: Some(child), bin, log };
        b.wait_ready(Duration::from_secs(15));
        b
    }

    /// A handle for CLI commands only (no `serve` started), e.g. to test `trust-codex` offline.
    pub fn cli_only(env: &'a CodexEnv) -> Broker<'a> {
        Broker { env, child: None, bin: broker_bin(), log: env.root.join("broker-none.log") }
    }

    pub fn socket_path(&self) -> PathBuf {
        self.env.runtime_dir.join("broker.sock")
    }

    /// Bounded poll until the socket accepts a connection *and* answers a status request: the
    /// probe is `broker inspect --json` reporting `broker.running`, so the kit never opens a bare
    /// connection that the broker would have to log as a malformed request.
    fn wait_ready(&mut self, timeout: Duration) {
        let sock = self.socket_path();
        let deadline = Instant::now() + timeout;
        let ok = poll_until(timeout, || {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    panic!("broker serve exited early ({st}); log:\n{}", self.log_text());
                }
            }
            if !sock.exists() {
                return None;
            }
            let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1));
            let out = run_bounded(self.env.command(&self.bin).args(["inspect", "--json"]), left);
            let v: Value = serde_json::from_slice(&out.stdout).ok()?;
            (v.pointer("/broker/running") == Some(&Value::Bool(true))).then_some(())
        });
        if ok.is_none() {
            panic!("broker socket {} did not answer within {timeout:?}; log:\n{}", sock.display(), self.log_text());
        }
    }

    /// The broker's stdout+stderr so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Run `broker <args>` (the CLI) with the env; bounded by 30 s.
    pub fn run(&self, args: &[&str]) -> Output {
        run_bounded(self.env.command(&self.bin).args(args), Duration::from_secs(30))
    }

    /// Run `broker <args>` and return stdout; panics with stderr unless it exits 0.
    pub fn run_ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        if !out.status.success() {
            panic!(
                "broker {args:?} failed ({}):\n--- stdout\n{}\n--- stderr\n{}\n--- broker log\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                self.log_text()
            );
        }
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The person's passphrase file for this env, the person key set with it on first use (with
    /// the fewest PBKDF2 rounds allowed: tests sign many answers).
    pub fn person_passphrase(&self) -> PathBuf {
        let file = self.env.root.join("person-passphrase");
        if !file.exists() {
            let tmp = self.env.root.join(format!("person-passphrase.{}", crate::util::unique_token()));
            std::fs::write(&tmp, format!("{PERSON_PASSPHRASE}\n")).unwrap();
            std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
            let iterations = broker_lib::person::MIN_ITERATIONS.to_string();
            self.run_ok(&["person", "set", "--passphrase-file", &tmp.display().to_string(), "--kdf-iterations", &iterations]);
            std::fs::rename(&tmp, &file).unwrap();
        }
        file
    }

    /// `broker approve|deny ARGS` as the person: with the env's passphrase file.
    pub fn answer_as_person(&self, args: &[&str]) -> Output {
        let file = self.person_passphrase().display().to_string();
        let mut all = args.to_vec();
        all.extend(["--passphrase-file", &file]);
        self.run(&all)
    }

    /// `broker person sign DECISION` of a published approval (the bridge's message), as the
    /// person's other device does: the answer to send over NATS.
    pub fn sign_published(&self, published: &Value, decision: &str) -> Value {
        use std::io::Write;
        let file = self.person_passphrase().display().to_string();
        let mut cmd = self.env.command(&self.bin);
        cmd.args(["person", "sign", decision, "--passphrase-file", &file])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        child.stdin.take().unwrap().write_all(published.to_string().as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "person sign: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Trust the env's pinned Codex, then [`Broker::start`] (what most end-to-end tests want).
    pub fn start_trusted(env: &'a CodexEnv) -> Broker<'a> {
        // Trusted before it starts: the broker's Codex follower reads the trusted binaries (and the
        // sizes a managed-daemon copy of one has) at its first pass, so the first hook of a daemon
        // started at once waits for its hash instead of racing the follower's next pass.
        Broker::cli_only(env).trust_codex(&env.codex);
        Broker::start(env)
    }

    /// `broker trust-codex PATH`, signed with the env's passphrase once the person has a key.
    pub fn trust_codex(&self, path: &std::path::Path) {
        self.trust("trust-codex", path);
    }

    /// `broker trust-claude PATH`, signed with the env's passphrase once the person has a key.
    pub fn trust_claude(&self, path: &std::path::Path) {
        self.trust("trust-claude", path);
    }

    fn trust(&self, command: &str, path: &std::path::Path) {
        let file = self.env.root.join("person-passphrase");
        let mut args = vec![command.to_string(), path.display().to_string()];
        if file.exists() {
            args.extend(["--passphrase-file".to_string(), file.display().to_string()]);
        }
        self.run_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    }

    /// `broker threads --json [--all]`: the threads listed.
    pub fn threads_json(&self, all: bool) -> Vec<Value> {
        let mut args = vec!["threads", "--json"];
        if all {
            args.push("--all");
        }
        let out = self.run_ok(&args);
        let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("threads --json is not JSON ({e}): {out}"));
        v["threads"].as_array().cloned().unwrap_or_else(|| panic!("no threads[]: {v}"))
    }

    /// `broker send --thread T [--key K] TEXT` -> the message id (printed alone on a line).
    pub fn send(&self, thread: &str, text: &str, key: Option<&str>) -> String {
        self.send_opts(thread, text, key, None)
    }

    /// `broker send --thread T [--key K] [--from F] TEXT` -> the message id.
    pub fn send_opts(&self, thread: &str, text: &str, key: Option<&str>, from: Option<&str>) -> String {
        self.send_args(&["--thread", thread], text, key, from)
    }

    /// `broker send --future-thread --thread T [--key K] [--from F] TEXT`, for a thread id no rollout
    /// has (yet), such as a [`crate::util::fake_uuid_v7`] -> the message id.
    pub fn send_future(&self, thread: &str, text: &str, key: Option<&str>, from: Option<&str>) -> String {
        self.send_args(&["--thread", thread, "--future-thread"], text, key, from)
    }

    fn send_args(&self, target: &[&str], text: &str, key: Option<&str>, from: Option<&str>) -> String {
        let mut args = vec!["send"];
        args.extend_from_slice(target);
        if let Some(k) = key {
            args.extend(["--key", k]);
        }
        if let Some(f) = from {
            args.extend(["--from", f]);
        }
        args.push(text);
        let out = self.run_ok(&args);
        let lines: Vec<&str> = out.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        match lines.as_slice() {
            [id] => id.to_string(),
            _ => panic!("broker send should print the message id alone on one line, got {out:?}"),
        }
    }

    /// `broker inspect --json`, parsed.
    pub fn inspect_json(&self) -> Value {
        let out = self.run_ok(&["inspect", "--json"]);
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("inspect --json is not one JSON object ({e}): {out}"))
    }

    /// `broker inspect` (the human table).
    pub fn inspect_text(&self) -> String {
        self.run_ok(&["inspect"])
    }

    /// The `messages[]` entry with this id, if any.
    pub fn message(&self, id: &str) -> Option<Value> {
        messages(&self.inspect_json()).into_iter().find(|m| m.get("id").and_then(Value::as_str) == Some(id))
    }

    /// The `state` of message `id` (panics when inspect does not list it).
    pub fn message_state(&self, id: &str) -> String {
        let m = self.message(id).unwrap_or_else(|| panic!("inspect does not list message {id}: {}", self.inspect_json()));
        m.get("state").and_then(Value::as_str).unwrap_or("").to_string()
    }

    /// Poll `inspect --json` (bounded) until message `id` is in `state`; returns the entry.
    pub fn wait_state(&self, id: &str, state: &str, timeout: Duration) -> Value {
        let mut last = Value::Null;
        let got = poll_until(timeout, || {
            last = self.inspect_json();
            messages(&last)
                .into_iter()
                .find(|m| m.get("id").and_then(Value::as_str) == Some(id) && m.get("state").and_then(Value::as_str) == Some(state))
        });
        got.unwrap_or_else(|| panic!("message {id} not {state} within {timeout:?}; inspect: {last:#}\nbroker log:\n{}", self.log_text()))
    }

    /// Poll `inspect --json` (bounded) until at least `n` refusals satisfy `pred`; returns them.
    pub fn wait_refusals(&self, n: usize, timeout: Duration, what: &str, pred: impl Fn(&Value) -> bool) -> Vec<Value> {
        let mut last = Value::Null;
        let got = poll_until(timeout, || {
            last = self.inspect_json();
            let hits: Vec<Value> = refusals(&last).into_iter().filter(|r| pred(r)).collect();
            (hits.len() >= n).then_some(hits)
        });
        got.unwrap_or_else(|| {
            panic!("fewer than {n} refusals ({what}) within {timeout:?}; inspect: {last:#}\nbroker log:\n{}", self.log_text())
        })
    }

    /// Stop the broker (SIGKILL) now.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Broker<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() && self.child.is_some() {
            eprintln!("--- broker log ({})\n{}", self.log.display(), self.log_text());
        }
        self.stop();
    }
}

/// Panics unless every line of a broker log reads `broker: <level>: ...`.
pub fn assert_log_levelled(log: &str) {
    for line in log.lines() {
        let rest = line.strip_prefix("broker: ").unwrap_or_else(|| panic!("log line without `broker: `: {line:?}\n{log}"));
        assert!(
            ["error: ", "warn: ", "info: ", "debug: ", "trace: "].iter().any(|l| rest.starts_with(l)),
            "log line without a level: {line:?}\n{log}"
        );
    }
}

/// `messages[]` of an inspect document.
pub fn messages(inspect: &Value) -> Vec<Value> {
    inspect.get("messages").and_then(Value::as_array).cloned().unwrap_or_default()
}

/// Every message of an inspect document by id.
pub fn messages_by_id(inspect: &Value) -> std::collections::HashMap<String, Value> {
    messages(inspect).into_iter().map(|m| (m["id"].as_str().unwrap_or("").to_string(), m)).collect()
}

/// `refusals[]` of an inspect document.
pub fn refusals(inspect: &Value) -> Vec<Value> {
    inspect.get("refusals").and_then(Value::as_array).cloned().unwrap_or_default()
}

/// Reason codes of the `refusals[]` of an inspect document, newest first; only those naming
/// `thread` when given.
pub fn refusal_codes(inspect: &Value, thread: Option<&str>) -> Vec<String> {
    refusals(inspect)
        .iter()
        .filter(|r| thread.is_none() || r.get("thread").and_then(Value::as_str) == thread)
        .map(|r| r.get("reason").and_then(Value::as_str).unwrap_or("").to_string())
        .collect()
}

/// Run hook-client by hand with `payload` on stdin (no trailing newline, then EOF, as Codex does)
/// and `extra` environment; its output and how long it took.
pub fn run_hook_client(env: &CodexEnv, payload: &str, extra: &[(&str, &str)]) -> (Output, Duration) {
    use std::io::Write;
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

/// One request line on the broker socket (the producer protocol), its one reply line parsed.
pub fn line_request(sock: &std::path::Path, req: &str) -> Value {
    use std::io::{BufRead, Write};
    let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("{req}\n").as_bytes()).unwrap();
    let mut line = String::new();
    std::io::BufReader::new(s).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
}

/// Run a command with piped output, killing it after `timeout`.
pub fn run_bounded(cmd: &mut Command, timeout: Duration) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {:?}: {e}", cmd.get_program()));
    let start = Instant::now();
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let to = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut so, &mut v);
        v
    });
    let te = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut se, &mut v);
        v
    });
    let status = match poll_until(timeout, || child.try_wait().ok().flatten()) {
        Some(s) => s,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{:?} did not finish within {timeout:?}", cmd.get_program());
        }
    };
    let _ = start;
    Output { status, stdout: to.join().unwrap_or_default(), stderr: te.join().unwrap_or_default() }
}
