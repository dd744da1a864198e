//! The broker killed at every failpoint of a hook delivery, on the real Codex: the message
//! reaches the model at most once. Where the crash left a lease (it lapses and returns) it ends
//! `confirmed` and a producer waiting with `--wait confirmed` is told so (exit 0). Where it left
//! a hand-off Codex withdrew (`after_ack_commit`: the client was never told, exited 1) the turn
//! completes without it, which only the rollout says, a file others can rewrite: `uncertain`
//! (`turn_closed_unseen`), never offered again, and the waiting producer is told it is not
//! confirmed (exit non-zero).
//! The wake path's failpoints are `crash.rs`'s `real_codex_wake_crash_never_doubles`.
//! Needs `cargo build --workspace` and the pinned Codex.

use courier_tests::appserver::ListeningAppServer;
use courier_tests::broker::{broker_bin, hook_command, messages_by_id};
use courier_tests::model::exec_held_then_done;
use courier_tests::util::{marker, poll_until, wait_until};
use courier_tests::{Broker, CodexEnv, Hold, ScriptedModel, Serve};
use std::process::Stdio;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

/// The hook path's failpoints a hook call passes (`after_release_commit` needs a client that
/// dies before its ack: `crash.rs`'s `hook_client_killed_before_or_after_ack`).
const HOOK_FAILPOINTS: [&str; 8] = [
    "after_lease_commit",
    "after_reply_before_ack",
    "after_ack_read",
    "after_note_codex",
    "before_ack_commit",
    "after_ack_commit",
    "reconcile_before_settle",
    "reconcile_after_settle",
];

/// One round: a turn of a live app-server thread is held at the model; a message is sent with
/// `--wait confirmed`; the turn's first hook takes it and the broker dies at `fp`; the turn runs
/// to its end with the broker down, then the broker starts again. The message is delivered again
/// if and only if the broker's own record proves Codex never got it (here through the wake
/// channel: the thread is idle).
fn crash_round(fp: &str) {
    let hold = Hold::new();
    let model = ScriptedModel::start_with(exec_held_then_done("echo hi", &hold));
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let cli = Broker::cli_only(&env);
    cli.trust_codex(&env.codex);
    let mut serve = Serve::start(&env, &[("COURIER_FAILPOINTS", fp)]);
    let server = ListeningAppServer::start(env.codex_command(), env.root.join("as.sock"), &[], env.root.join("app-server.log"));
    let mut client = server.client(T);
    client.initialize(false, T);
    let thread = client.start_thread(&env.work, T);
    let turn = client.start_turn(&thread, "run a command", T);
    hold.wait_held(1, T);
    let text = marker("HOOK_CRASH");
    let mut waiter = env
        .command(broker_bin())
        .args(["send", "--thread", &thread, "--from", "e2e", "--wait", "confirmed", "--timeout", "120s", &text])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("broker send --wait");
    let id = wait_until(T, "the message queued", || {
        messages_by_id(&Broker::cli_only(&env).inspect_json()).into_iter().find(|(_, m)| m["thread"] == thread.as_str()).map(|(id, _)| id)
    });
    hold.release();
    let died = poll_until(T, || serve.child.try_wait().ok().flatten());
    assert!(died.is_some(), "{fp}: the broker died at the failpoint: {}", std::fs::read_to_string(&serve.log).unwrap_or_default());
    client.wait_turn_completed(&turn, T);
    let at_crash = cli.message(&id).unwrap_or_default();
    let _serve = Serve::start(&env, &[]);
    let m = wait_until(T, &format!("{fp}: {id} final"), || {
        cli.message(&id).filter(|m| matches!(m["state"].as_str(), Some("confirmed" | "uncertain")))
    });
    eprintln!("{fp}: at the crash {}/{}, then {m}", at_crash["state"], at_crash["reason"]);
    let withdrawn = fp == "after_ack_commit";
    let (want, shown_times) = if withdrawn { ("uncertain", 0) } else { ("confirmed", 1) };
    assert_eq!(m["state"], want, "{fp}: {m}\n{}", model.dump());
    if withdrawn {
        assert_eq!((m["reason"].as_str(), m["attempts"].as_i64()), (Some("turn_closed_unseen"), Some(1)), "{fp}: never offered again");
        assert_eq!(model.requests_mentioning(&text), 0, "{fp}: Codex dropped the failed hook's output");
    } else {
        model.assert_received_once(&text, T);
    }
    // A later turn brings nothing again.
    client.run_turn(&thread, "next task", T);
    assert_eq!(cli.message(&id).unwrap_or_default()["state"], want, "{fp}: stays {want}");
    let ro = env.rollout(&thread);
    let shown: usize = ["developer", "user"].iter().map(|r| ro.messages(r).iter().filter(|t| t.contains(&text)).count()).sum();
    assert_eq!(shown, shown_times, "{fp}: in the rollout");
    assert_eq!(model.requests_mentioning(&text) > 0, !withdrawn, "{fp}: {}", model.dump());
    let status = wait_until(T, "broker send --wait to end", || waiter.try_wait().ok().flatten());
    let out = waiter.wait_with_output().unwrap();
    assert_eq!(status.success(), !withdrawn, "{fp}: --wait confirmed ({status}): {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn real_codex_hook_crash_at_every_failpoint_reaches_the_model_once() {
    let only = std::env::var("COURIER_CRASH_FAILPOINT").ok();
    for fp in HOOK_FAILPOINTS.into_iter().filter(|fp| only.as_deref().is_none_or(|o| o == *fp)) {
        crash_round(fp);
    }
}
