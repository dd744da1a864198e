//! `broker send --mode interrupt` on the real Codex (docs/producers.md, "Modes"): a thread of a
//! live app-server busy in a long tool call has that turn interrupted, and a new turn carries the
//! message once, `confirmed`, within a few seconds; an idle thread is simply woken; a thread no
//! app-server serves (`codex exec`) is refused with `no_interrupt` and nothing is queued. Needs
//! `cargo build --workspace` and the pinned Codex.

use courier_tests::broker::hook_command;
use courier_tests::util::{marker, poll_until, str_field, wait_until};
use courier_tests::{Broker, CodexEnv, Reply, ScriptedModel, Serve};
use serde_json::Value;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(60);
/// What the long tool call sleeps: far longer than an interrupt may take.
const LONG_SECS: u64 = 30;

/// A scripted model whose turn asked for `LONG_TASK` runs `sleep 30` in the thread's cwd (between
/// touching `long-started` and `long-finished`), unless the request already carries one of
/// `texts` (the woken turn); everything else is answered `done`.
fn long_task_model(texts: &[&str]) -> ScriptedModel {
    let texts: Vec<String> = texts.iter().map(|t| t.to_string()).collect();
    ScriptedModel::start_with(move |r| {
        let long_task = !r.user_messages_containing("LONG_TASK").is_empty();
        if long_task && r.function_calls().is_empty() && texts.iter().all(|t| r.items_containing(t) == 0) {
            // Yields after 60 s at most: the call holds the turn for the whole sleep.
            return Reply::exec_with_yield(&format!("touch long-started; sleep {LONG_SECS}; touch long-finished"), 60_000);
        }
        Reply::message("done")
    })
}

/// `broker send --mode interrupt --wait confirmed` on a thread of `codex app-server --listen`
/// busy in a `sleep 30` tool call returns 0 within a few seconds; the turn ends `interrupted`
/// (the command never finished), and the next model request carries the message exactly once, as
/// the woken turn's user message. Then, the thread idle, another `interrupt` is a plain wake.
#[test]
fn interrupt_stops_a_long_tool_call_and_a_new_turn_carries_the_message_once() {
    let text = marker("INTERRUPTING");
    let idle_text = marker("INTERRUPT_IDLE");
    let model = long_task_model(&[&text, &idle_text]);
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let broker = Broker::start_trusted(&env);
    let (_server, mut client, thread) = courier_tests::appserver::idle_thread(&env, T);
    let (started, finished) = (env.work.join("long-started"), env.work.join("long-finished"));

    let long_turn = client.start_turn(&thread, "LONG_TASK: run the long command", T);
    wait_until(T, "the long tool call to start", || started.exists().then_some(()));
    let sleeping_since = Instant::now();

    let t0 = Instant::now();
    let out = broker.run(&[
        "send",
        "--thread",
        &thread,
        "--mode",
        "interrupt",
        "--from",
        "boss",
        "--wait",
        "confirmed",
        "--timeout",
        "20s",
        &text,
    ]);
    let took = t0.elapsed();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "stdout {stdout}\nstderr {stderr}\n{}", broker.log_text());
    eprintln!("broker send --mode interrupt --wait confirmed on a busy thread: {took:?}");
    assert!(took < Duration::from_secs(5), "the interrupt and the new turn took {took:?}");

    let completed = client.wait_notification("turn/completed", T, |p| p.pointer("/turn/id").and_then(Value::as_str) == Some(&long_turn));
    assert_eq!(completed.pointer("/turn/status").and_then(Value::as_str), Some("interrupted"), "{completed}");
    let id = stdout.trim().to_string();
    let m = broker.wait_state(&id, "confirmed", Duration::from_secs(5));
    assert_eq!(str_field(&m, "event"), "wake", "a new turn carried it: {m}");
    assert_ne!(str_field(&m, "turn_id"), long_turn, "not the interrupted turn: {m}");
    let status: Value = serde_json::from_str(&broker.run_ok(&["status", &id, "--json"])).unwrap();
    assert_eq!(status["mode"], "interrupt", "{status}");
    model.assert_received_once(&text, T);
    let carrying: Vec<_> = model.requests().into_iter().filter(|r| r.items_containing(&text) > 0).collect();
    assert_eq!(carrying[0].user_messages_containing(&text).len(), 1, "the woken turn's user message: {}", model.dump());
    assert!(sleeping_since.elapsed() < Duration::from_secs(LONG_SECS - 5), "checked well before the sleep could end");
    assert!(!finished.exists(), "the long command never finished: the turn was interrupted");

    // Idle now: an interrupt has no turn to stop and is delivered by a wake, once.
    client.wait_turn_completed(str_field(&m, "turn_id"), T);
    let idle_id = broker
        .run_ok(&[
            "send",
            "--thread",
            &thread,
            "--mode",
            "interrupt",
            "--from",
            "boss",
            "--wait",
            "confirmed",
            "--timeout",
            "20s",
            &idle_text,
        ])
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    let m = broker.wait_state(&idle_id, "confirmed", Duration::from_secs(5));
    assert_eq!(str_field(&m, "event"), "wake", "{m}");
    model.assert_received_once(&idle_text, T);
    assert!(!finished.exists(), "the interrupted command never ran on");
}

/// A busy `codex exec` thread serves no app-server, so nothing can interrupt it: `--mode
/// interrupt` exits 2 with `no_interrupt`, says why and what to use instead, and queues nothing;
/// the turn runs on undisturbed.
#[test]
fn interrupt_is_refused_for_a_thread_no_app_server_serves() {
    let (model, env, hold) = CodexEnv::with_held_turn();
    let broker = Broker::start_trusted(&env);
    let child = env.spawn_exec("please run a command");
    hold.wait_held(1, T);
    let thread = child.wait_thread_id(T);
    let text = marker("NO_INTERRUPT");
    let out = broker.run(&["send", "--thread", &thread, "--mode", "interrupt", "--json", &text]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(2), "stdout {stdout}\nstderr {stderr}");
    assert!(stderr.contains("serves no app-server") && stderr.contains("--mode steer"), "says why and what instead: {stderr}");
    let messages = broker.inspect_json()["messages"].as_array().cloned().unwrap_or_default();
    assert!(messages.is_empty(), "nothing was queued: {messages:#?}");

    // Through the socket, as MCP and the bridge send: the same stable code.
    let req = serde_json::json!({"op": "send", "thread": thread, "text": text, "mode": "interrupt"});
    let reply = courier_tests::broker::line_request(&broker.socket_path(), &req.to_string());
    assert_eq!(reply["error"], "no_interrupt", "{reply}");
    hold.release();
    child.wait(T).assert_success();
    assert_eq!(model.requests_mentioning(&text), 0, "{}", model.dump());
}

/// The broker killed (-9) after it recorded the turn it interrupts but before `turn/interrupt`
/// left, and after Codex answered it but before the wake: the message is `pending` at the crash,
/// and the restarted broker stops that same turn if it still runs and wakes the thread with the
/// message: confirmed, handed once (attempts 1), in the model's requests once.
#[test]
fn a_broker_killed_mid_interrupt_neither_loses_nor_doubles_the_message() {
    for fp in ["interrupt_before_send", "interrupt_after_answer"] {
        let text = marker("INTERRUPT_CRASH");
        let model = long_task_model(&[&text]);
        let env = CodexEnv::with_hook_command(&model, &hook_command());
        let cli = Broker::cli_only(&env);
        cli.trust_codex(&env.codex);
        let mut serve = Serve::start(&env, &[("COURIER_FAILPOINTS", fp)]);
        let (_server, mut client, thread) = courier_tests::appserver::idle_thread(&env, T);
        let long_turn = client.start_turn(&thread, "LONG_TASK: run the long command", T);
        wait_until(T, "the long tool call to start", || env.work.join("long-started").exists().then_some(()));
        let id = cli.run_ok(&["send", "--thread", &thread, "--mode", "interrupt", "--from", "boss", &text]).trim().to_string();
        let died = poll_until(Duration::from_secs(20), || serve.child.try_wait().ok().flatten());
        assert!(died.is_some(), "{fp}: the broker died at the failpoint: {}", std::fs::read_to_string(&serve.log).unwrap_or_default());
        let at_crash = cli.message(&id).unwrap_or_default();
        assert_eq!(str_field(&at_crash, "state"), "pending", "{fp}: nothing was handed before the crash: {at_crash}");

        let restarted = Instant::now();
        let _serve = Serve::start(&env, &[]);
        let m = wait_until(Duration::from_secs(30), &format!("{fp}: {id} confirmed"), || {
            cli.message(&id).filter(|m| m["state"] == "confirmed")
        });
        eprintln!("{fp}: confirmed {:?} after the restart: {m}", restarted.elapsed());
        assert_eq!((str_field(&m, "event"), &m["attempts"]), ("wake", &Value::from(1)), "{fp}: woken once: {m}");
        let completed =
            client.wait_notification("turn/completed", T, |p| p.pointer("/turn/id").and_then(Value::as_str) == Some(&long_turn));
        assert_eq!(completed.pointer("/turn/status").and_then(Value::as_str), Some("interrupted"), "{fp}: {completed}");
        model.assert_received_once(&text, T);
        assert!(!env.work.join("long-finished").exists(), "{fp}: the long command never finished");
    }
}
