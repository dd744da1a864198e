//! Attacks on which Codex runs a hook, its ancestry (docs/security.md; `broker/src/gate/`):
//! hook-client with no Codex ancestor or under a fake `codex`, a Codex the broker has not trusted
//! yet (then trusted live), and the TUI's managed app-server daemon (a copy of the binary) that
//! must still verify. This file's name holds no "codex": the gate would take the test binary,
//! named after it, for a codex-named ancestor.
//!
//! Each test tries one attack and checks that the attacker gets nothing, that the queue is
//! untouched (message still `pending`, `attempts` 0) and that `broker inspect --json` records the
//! refusal with its reason code; where it is cheap, the same message is then delivered by an
//! honest hook of the same turn, so the refusal is shown to be the only thing that kept it back.
//! The real Codex CLI, broker and hook-client; the other attack surfaces are the other
//! `attacks_*.rs` (docs/security.md maps each gate check to its test). Needs
//! `cargo build --workspace` and the pinned Codex (`install/fetch-codex.sh`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use courier_tests::attack::{assert_untouched, attack_codes, exec_then_done_held, payload_file, post_tool_use, SETTLE};
use courier_tests::broker::{hook_command, refusal_codes, run_bounded};
use courier_tests::model::Request;
use courier_tests::util::{marker, poll_until, shell_quote, str_field};
use courier_tests::{hook_client_bin, Broker, CodexEnv, Hold, Reply, ScriptedModel};
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(60);

/// Run `program args` (from the test process, no Codex ancestor) with the env and `stdin_file`.
fn run_with_stdin(env: &CodexEnv, program: &Path, args: &[&str], stdin_file: &Path) -> std::process::Output {
    let mut cmd = env.command(program);
    cmd.args(args).stdin(std::fs::File::open(stdin_file).unwrap()).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.output().unwrap()
}

/// With a live thread and a payload that names it correctly (thread, rollout, open turn),
/// hook-client run from the test process (no Codex ancestor) gets nothing (`no_codex_ancestor`),
/// and run from a copy of bash named `codex` gets nothing (`untrusted_codex`).
#[test]
fn hook_client_outside_codex_gets_nothing() {
    let hold = Hold::new();
    let h = hold.clone();
    let model = ScriptedModel::start_with(move |_r: &Request| Reply::message("done").held(&h));
    let env = CodexEnv::new(&model); // no hooks: nothing else takes the message
    let broker = Broker::start_trusted(&env);
    let proc = env.spawn_exec("hello");
    let first = model.wait_for_requests(1, T).remove(0);
    hold.wait_held(1, T);
    let thread = first.thread_id().unwrap();
    let turn = first.turn_id().unwrap();
    let rollout = env.wait_rollout(&thread, T);
    assert_eq!(env.rollout(&thread).open_turn().as_deref(), Some(turn.as_str()), "payload names the open turn");
    let text = marker("OUTSIDE");
    let id = broker.send_opts(&thread, &text, None, Some("e2e"));
    let payload = payload_file(&env, "valid.json", &post_tool_use(&env, &thread, &turn, &rollout));

    let out = run_with_stdin(&env, &hook_client_bin(), &[], &payload);
    assert!(out.status.success() && out.stdout.is_empty(), "plain shell: {out:?}");
    broker.wait_refusals(1, SETTLE, "no_codex_ancestor", |r| str_field(r, "reason") == "no_codex_ancestor");

    let fake_dir = env.root.join("fake");
    std::fs::create_dir_all(&fake_dir).unwrap();
    let fake = fake_dir.join("codex");
    std::fs::copy("/bin/bash", &fake).unwrap();
    // `; exit $?` keeps the fake codex as hook-client's parent (bash would exec a lone command).
    let script = format!("{} < {}; exit $?", hook_command(), shell_quote(&payload.display().to_string()));
    let out = run_with_stdin(&env, &fake, &["-c", &script], Path::new("/dev/null"));
    assert!(out.status.success() && out.stdout.is_empty(), "fake codex: {out:?}");
    let r = broker.wait_refusals(1, SETTLE, "untrusted_codex", |r| str_field(r, "reason") == "untrusted_codex");
    assert!(str_field(&r[0], "detail").contains("codex"), "{r:?}");

    assert_untouched(&broker, &id);
    assert_eq!(attack_codes(&broker.inspect_json(), None), ["untrusted_codex", "no_codex_ancestor"]);
    hold.release();
    proc.wait(T).assert_success();
    assert_eq!(model.requests_mentioning(&text), 0);
}

/// A broker that has not trusted this Codex gives its hooks nothing (`untrusted_codex`); after
/// `broker trust-codex PATH` — same broker process, no restart — the next session (a resume of the
/// same thread) delivers the very message that stayed pending.
#[test]
fn untrusted_codex_gets_nothing_until_trusted_live() {
    let (first, last) = (Hold::new(), Hold::new());
    let model = ScriptedModel::start_with(exec_then_done_held(&first, &last));
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    last.release();
    let broker = Broker::start(&env); // no trust-codex
    let pid = broker.pid();
    let proc = env.spawn_exec("please run a command");
    let thread = proc.wait_thread_id(T);
    first.wait_held(1, T);
    let text = marker("UNTRUSTED");
    let id = broker.send_opts(&thread, &text, None, Some("e2e"));
    first.release();
    proc.wait(T).assert_success();
    assert_eq!(model.requests_mentioning(&text), 0);
    // A hook-client that gave up at its deadline (the first call hashes Codex) leaves Codex free
    // to go on before its refusal is recorded: every call the broker took is answered first.
    let inspect = poll_until(SETTLE, || {
        let i = broker.inspect_json();
        let calls = i["broker"]["hook_calls"].as_u64().unwrap_or(u64::MAX);
        (refusal_codes(&i, None).len() as u64 >= calls).then_some(i)
    })
    .unwrap_or_else(|| panic!("a hook call left unanswered: {}", broker.inspect_json()));
    let codes = attack_codes(&inspect, None);
    assert!(codes.len() >= 4 && codes.iter().all(|c| c == "untrusted_codex"), "every hook call refused: {codes:?}");
    assert_untouched(&broker, &id);

    broker.trust_codex(&env.codex);
    assert_eq!(broker.pid(), pid);
    let n0 = model.request_count();
    let out = env.exec_args(&["resume", &thread], "again", T);
    out.assert_success();
    let m = broker.wait_state(&id, "confirmed", SETTLE);
    assert_eq!(str_field(&m, "thread"), thread);
    let reqs = model.requests();
    let counts: Vec<usize> = reqs[n0..].iter().map(|r| r.items_containing(&text)).collect();
    assert!(counts.iter().all(|c| *c <= 1) && counts.last() == Some(&1), "delivered once after trust: {counts:?}");
    let after = broker.inspect_json();
    assert_eq!(attack_codes(&after, None).len(), codes.len(), "nothing refused after trust: {}", after["refusals"]);
    assert!(broker.inspect_json().pointer("/broker/running") == Some(&Value::Bool(true)));
    let _ = std::io::stderr().flush();
}

/// Stops the managed daemon of `env` when dropped: `codex app-server daemon stop`, then SIGKILL to
/// any process still running an executable under this env's CODEX_HOME (the daemon's
/// `pid-update-loop` helper survives `daemon stop`).
struct DaemonGuard<'a>(&'a CodexEnv);

impl Drop for DaemonGuard<'_> {
    fn drop(&mut self) {
        let out = run_bounded(self.0.codex_command().args(["app-server", "daemon", "stop"]), Duration::from_secs(30));
        if !out.status.success() {
            eprintln!("daemon stop: {out:?}");
        }
        courier_tests::codex::kill_processes_running_from(&self.0.codex_home);
    }
}

/// The pid holding `$CODEX_HOME/thread-writer-locks/<thread>.lock` (from /proc/locks).
fn lock_holder(env: &CodexEnv, thread: &str) -> Option<i32> {
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(env.codex_home.join(format!("thread-writer-locks/{thread}.lock"))).ok()?.ino();
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (pid, id) = (f.get(4)?, f.get(5)?);
        (f.get(1) == Some(&"FLOCK") && id.rsplit(':').next()? == ino.to_string()).then(|| pid.parse().ok()).flatten()
    })
}

/// The default interactive TUI runs hooks from a managed daemon, a copy of the codex binary under
/// `$CODEX_HOME/packages/app-server-daemon/releases/<ver>/bin/codex`. Started the way the TUI
/// starts it (`codex app-server daemon start`) and driven over its control socket
/// (`codex app-server proxy`), its hooks verify (the copy has the trusted SHA-256) and deliver.
#[test]
fn managed_daemon_hooks_verify_and_deliver() {
    let (first, last) = (Hold::new(), Hold::new());
    last.release();
    let model = ScriptedModel::start_with(exec_then_done_held(&first, &last));
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let broker = Broker::start_trusted(&env);
    let _guard = DaemonGuard(&env);
    let out = run_bounded(env.codex_command().args(["app-server", "daemon", "start"]), T);
    assert!(out.status.success(), "daemon start: {out:?}");
    let started: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("daemon start JSON ({e}): {out:?}"));
    let sock = PathBuf::from(str_field(&started, "socketPath"));
    let mut app = courier_tests::appserver::WsAppServer::connect(&sock, T);
    app.initialize(false, T);
    let r = app.request("thread/start", json!({"cwd": env.work}), T);
    let thread = r.pointer("/thread/id").and_then(Value::as_str).unwrap().to_string();
    app.request("turn/start", json!({"threadId": thread, "input": [{"type": "text", "text": "please run a command"}]}), T);
    first.wait_held(1, T);
    let holder = lock_holder(&env, &thread).expect("a process holds the thread's writer lock");
    let exe = std::fs::read_link(format!("/proc/{holder}/exe")).unwrap();
    // The thread runs in the daemon's copy of codex: another file with the same content.
    assert!(exe.starts_with(env.codex_home.join("packages/app-server-daemon/releases")), "{}", exe.display());
    let (a, b) = (std::fs::metadata(&exe).unwrap(), std::fs::metadata(&env.codex).unwrap());
    use std::os::unix::fs::MetadataExt;
    assert_ne!((a.dev(), a.ino()), (b.dev(), b.ino()), "a copy, not the trusted path itself");
    assert_eq!(a.len(), b.len());
    let text = marker("DAEMON");
    let id = broker.send_opts(&thread, &text, None, Some("e2e"));
    first.release();
    let m = broker.wait_state(&id, "confirmed", T);
    assert!(matches!(str_field(&m, "event"), "PreToolUse" | "PostToolUse"), "{m}");
    model.wait_for(T, "the request after the tool call", |r| !r.function_calls().is_empty());
    let reqs = model.requests_for_thread(&thread);
    let counts: Vec<usize> = reqs.iter().map(|r| r.items_containing(&text)).collect();
    assert!(counts.iter().all(|c| *c <= 1) && counts.last() == Some(&1), "delivered once: {counts:?}");
    assert_eq!(reqs.last().unwrap().developer_messages_containing(&text).len(), 1);
    // The copy is new to the broker: its first hook may come before the follower's hash ahead
    // of it ends (seconds on a loaded machine), and then fails open as `digest_pending`, by
    // design. Nothing else is refused: every later hook verifies.
    let inspect = broker.inspect_json();
    let refused: Vec<(&str, &str)> = inspect["refusals"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| (r["reason"].as_str().unwrap_or("?"), r["event"].as_str().unwrap_or("?")))
        .filter(|(reason, _)| *reason != "peer_gone")
        .collect();
    assert!(refused.iter().all(|r| *r == ("digest_pending", "SessionStart")), "daemon hooks verify: {refused:?} {inspect:#}");
    assert!(attack_codes(&inspect, None).iter().all(|c| c == "digest_pending"), "{inspect:#}");
}
