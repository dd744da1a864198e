//! Approvals that do not end in a clean answer, on the real Codex: the broker killed -9 while
//! answering (after taking the answer, and after Codex acknowledged it but before it was
//! recorded), an acknowledgement that never comes in time, and approvals that go away without
//! Courier (the person answers at the app-server or TUI, Esc, Codex exits). Never answered twice,
//! never stuck `answering`, never listed once it is over.

use std::time::{Duration, Instant};

use courier_tests::approval_rig::*;
use courier_tests::util::{poll_until, str_field, wait_until};
use courier_tests::{Broker, Hold, Reply, Serve};
use serde_json::{json, Value};

/// Approval `id` from `broker approvals --all --json`.
fn approval(broker: &Broker, id: &str) -> Value {
    approvals(broker, true).into_iter().find(|a| a["id"] == id).unwrap_or_else(|| panic!("no approval {id}"))
}

/// What the model was told its escalated command did (the tool output in its next request).
fn tool_output(model: &courier_tests::ScriptedModel) -> String {
    let results = model.requests().last().map(|r| r.exec_results()).unwrap_or_default();
    results.first().and_then(|(_, o)| o.clone()).unwrap_or_default()
}

/// The broker dies (kill -9 at failpoint `fp`) inside `broker approve`; restarted, the approval
/// is `unknown` with why, never `answering`, never listed as pending, and a second approve is
/// refused: the answer is never sent twice. Returns what is needed to check the command's fate.
fn killed_while_answering(fp: &str) -> (courier_tests::ScriptedModel, courier_tests::CodexEnv, std::path::PathBuf) {
    let (model, env, _, ran, _) = escalating(&format!("CRASH_{fp}").to_uppercase(), "to crash");
    {
        let cli = Broker::cli_only(&env);
        cli.trust_codex(&env.codex);
        let mut serve = Serve::start(&env, &[("COURIER_FAILPOINTS", fp)]);
        let (_server, mut client, thread) = approving_thread(&env);
        let turn = client.start_turn(&thread, "run it", T);
        let request = client.wait_server_request(REQUEST_APPROVAL, T, |p| p["threadId"] == thread.as_str());
        let (a, _) = wait_listed(&cli, &thread, Instant::now());
        let id = str_field(&a, "id").to_string();
        let (ok, said) = answer(&cli, &["approve", &id]);
        assert!(!ok, "the broker died mid-answer, approve cannot have succeeded: {said}");
        let died = poll_until(Duration::from_secs(5), || serve.child.try_wait().ok().flatten());
        assert!(died.is_some(), "the broker died at {fp}: {}", serve.log_text());
        assert!(serve.log_text().contains(&format!("failpoint {fp}:")), "{}", serve.log_text());
        // As the dead broker left it: taken, outcome not recorded.
        assert_eq!(approval(&cli, &id)["state"], "answering", "the instant is the one under test");

        let broker = Broker::start(&env);
        let a = approval(&broker, &id);
        eprintln!("{fp}: after restart: {a}");
        assert_eq!((a["state"].as_str(), a["answer"]["outcome"].as_str()), (Some("unknown"), Some("unknown")), "{a}");
        assert!(str_field(&a, "detail").contains("broker stopped"), "says why: {a}");
        assert!(approvals(&broker, false).iter().all(|p| p["id"] != id.as_str()), "no longer listed as pending");
        let (ok, said) = answer(&broker, &["approve", &id]);
        assert!(!ok && said.contains("not_pending") && said.contains("unknown"), "never sent twice: {said}");
        let (ok, said) = answer(&broker, &["deny", &id]);
        assert!(!ok && said.contains("not_pending"), "nor the other way: {said}");

        if fp == "approval_after_claim" {
            // Nothing reached Codex: the request still waits for the person, whose decline wins.
            client.respond(&request["id"], json!({"decision": "decline"}));
        }
        client.wait_turn_completed(&turn, T);
    }
    (model, env, ran)
}

/// Killed after taking the answer, before anything was sent: `unknown` after restart (Courier
/// cannot tell it sent nothing), not sent again; the person's own answer still decides.
#[test]
fn killed_after_claiming_an_answer_it_is_unknown_and_never_sent() {
    let (model, _env, ran) = killed_while_answering("approval_after_claim");
    assert!(!ran.exists(), "Courier's approve never reached Codex; the person declined");
    assert!(tool_output(&model).contains("rejected"), "the person's decline: {}", tool_output(&model));
}

/// Killed after Codex acknowledged the answer, before its outcome was recorded: `unknown` after
/// restart, not sent again, and the command ran exactly once.
#[test]
fn killed_after_the_answer_it_is_unknown_and_ran_once() {
    let (_model, _env, ran) = killed_while_answering("approval_after_answer");
    let runs = wait_until(T, "the command ran", || std::fs::read_to_string(&ran).ok());
    assert_eq!(runs.lines().count(), 1, "the command ran once");
}

/// Codex's acknowledgement never reaches the broker (failpoint `approval_ack_lost` drops it):
/// the outcome is `unknown`, said so, and never retried: a second approve is refused, and the
/// command (Codex did apply the answer) ran once.
#[test]
fn an_ack_timeout_is_unknown_and_never_retried() {
    let (_model, env, _, ran, _) = escalating("ACK_TIMEOUT", "to time out");
    std::fs::write(&env.courier_config, "[approvals]\nack_timeout_ms = 300\n").unwrap();
    let cli = Broker::cli_only(&env);
    cli.trust_codex(&env.codex);
    let serve = Serve::start(&env, &[("COURIER_FAILPOINTS", "approval_ack_lost")]);
    let mut w = waiting_with(cli, &env);
    let t0 = Instant::now();
    let (ok, said) = answer(&w.broker, &["approve", w.id()]);
    assert!(!ok && said.contains("unknown"), "approve: {said}");
    assert!(t0.elapsed() >= Duration::from_millis(300), "it waited ack_timeout_ms for the ack: {:?}", t0.elapsed());
    let a = approval(&w.broker, w.id());
    assert_eq!((a["state"].as_str(), a["answer"]["outcome"].as_str()), (Some("unknown"), Some("unknown")), "{a}");
    let (ok, said) = answer(&w.broker, &["approve", w.id()]);
    assert!(!ok && said.contains("not_pending"), "never retried: {said}");
    w.client.wait_turn_completed(&w.turn, T);
    assert_eq!(std::fs::read_to_string(&ran).unwrap().lines().count(), 1, "the (late-acknowledged) answer ran it once");
    assert!(serve.log_text().contains("-> unknown"), "{}", serve.log_text());
}

/// How long a pending approval Codex no longer waits on may stay listed (the broker looks every
/// second, past a grace for the request to reach the app-server).
const GONE_WITHIN: Duration = Duration::from_secs(8);

/// A thread waiting on an approval whose model, once the approval is over, holds its next reply
/// (so no Stop hook comes to resolve it): after `end_it` the approval must leave the list on its
/// own, with why, and `broker approve` must then say so and send nothing.
fn goes_away(name: &str, end_it: impl FnOnce(&mut Waiting), why: &str) {
    let (model, env, cmd, ran, _) = escalating(name, "to go away");
    let hold = Hold::new();
    let (mut ask, h) = (escalated_then_done(&cmd, "to go away"), hold.clone());
    model.set_script(move |r| if r.function_calls().is_empty() { ask(r) } else { Reply::message("done").held(&h) });
    let mut w = waiting_on(&env);
    let id = w.id().to_string();
    let t0 = Instant::now();
    end_it(&mut w);
    let gone = wait_until(GONE_WITHIN, "the approval no longer listed", || {
        approvals(&w.broker, false).iter().all(|a| a["id"] != id.as_str()).then(|| t0.elapsed())
    });
    let a = approval(&w.broker, &id);
    eprintln!("{name}: left the list {gone:?} after it ended: {a}");
    assert_eq!(a["state"], "resolved", "{a}");
    assert!(str_field(&a, "detail").contains(why), "says why ({why}): {a}");
    assert!(a["answer"].is_null(), "no answer recorded: {a}");
    let (ok, said) = answer(&w.broker, &["approve", &id]);
    assert!(!ok && said.contains("not_pending") && said.contains(why), "approve says it is over: {said}");
    hold.release();
    assert!(!ran.exists(), "nothing Courier did ran the command");
}

/// The person declines at the app-server (no hook follows: the model's next reply is held).
#[test]
fn answered_at_the_app_server_it_leaves_the_list() {
    goes_away("PERSON_DECLINED", |w| w.client.respond(&w.request["id"].clone(), json!({"decision": "decline"})), "no longer waits");
}

/// The turn is interrupted while the approval waits (the app-server's Esc).
#[test]
fn an_interrupted_turn_leaves_the_list() {
    goes_away(
        "INTERRUPTED",
        |w| {
            w.client.request("turn/interrupt", json!({"threadId": w.thread, "turnId": w.turn}), T);
        },
        "no longer waits",
    );
}

/// The Codex process serving the thread exits while the approval waits.
#[test]
fn codex_exiting_leaves_the_list() {
    goes_away("CODEX_EXITED", |w| w.kill_codex(), "exited");
}

/// The person at the TUI (under tmux) presses Esc at the approval popup: no hook follows, and
/// the approval leaves the list on its own; `broker approve` then says so and sends nothing.
#[test]
fn esc_at_the_tui_leaves_the_list() {
    let (_model, env, _, ran, _) = escalating("TUI_ESC", "to press Esc");
    let broker = Broker::start_trusted(&env);
    let tui = tui_asking(&env);
    let a = wait_until(T, "the TUI's approval shown and listed", || {
        let screen = tui.screen();
        if screen.contains("Use existing model") {
            tui.send_keys(&["Down", "Enter"]);
        }
        screen.contains("Yes, proceed").then(|| approvals(&broker, false).into_iter().next()).flatten()
    });
    let id = str_field(&a, "id").to_string();
    let t0 = Instant::now();
    tui.send_keys(&["Escape"]);
    let gone = wait_until(GONE_WITHIN, "the approval no longer listed", || {
        approvals(&broker, false).iter().all(|p| p["id"] != id.as_str()).then(|| t0.elapsed())
    });
    let a = approval(&broker, &id);
    eprintln!("TUI Esc: left the list {gone:?} after Esc: {a}\n--- screen\n{}", tui.screen());
    assert_eq!(a["state"], "resolved", "{a}");
    let (ok, said) = answer(&broker, &["approve", &id]);
    assert!(!ok && said.contains("not_pending") && said.contains("resolved"), "approve says it is over: {said}");
    assert!(!ran.exists(), "the command never ran");
}
