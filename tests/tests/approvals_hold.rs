//! The opt-in hold (`[approvals] hold`) on the real Codex: `codex exec --approve-for-me` (only a
//! PermissionRequest hook's decision counts there) whose hook the broker holds for a person's
//! `broker approve|deny`, and returns as the hook's decision.

use std::time::{Duration, Instant};

use courier_tests::approval_rig::*;
use courier_tests::util::{marker, str_field, wait_until};
use courier_tests::{Broker, CodexEnv, ExecChild};

/// `codex exec --approve-for-me` whose model asks once to run the env's timed command escalated,
/// with the broker holding its PermissionRequest hook per `config` (`[approvals]` keys).
fn held_exec(name: &str, config: &str) -> (courier_tests::ScriptedModel, CodexEnv, std::path::PathBuf) {
    let (model, env, _, ran, _) = escalating(name, "to be held");
    std::fs::write(&env.courier_config, format!("[approvals]\n{config}")).unwrap();
    (model, env, ran)
}

fn spawn_exec(env: &CodexEnv) -> ExecChild {
    env.spawn_exec_args(&["--approve-for-me"], "run it")
}

/// Hold on: the approval is listed while the hook waits; `broker approve`, 6 s later (longer than
/// Courier's other hooks may run), is given as the hook's decision (`won`), the command runs once
/// and the session ends normally.
#[test]
fn a_held_hook_returns_the_approval() {
    let (_model, env, ran) = held_exec("HELD_APPROVED", "hold = \"exec\"\nhold_secs = 60\n");
    let broker = Broker::start_trusted(&env);
    let t0 = Instant::now();
    let child = spawn_exec(&env);
    let thread = child.wait_thread_id(T);
    let (a, listed) = wait_listed(&broker, &thread, t0);
    eprintln!("exec start -> listed {listed:?}");
    // Past the 5 s Courier's other hooks have: Codex's timeout of this one covers the hold.
    std::thread::sleep(Duration::from_secs(6));
    let t1 = Instant::now();
    let (ok, said) = answer(&broker, &["approve", str_field(&a, "id")]);
    assert!(ok && said.contains("won"), "approve: {said}");
    wait_until(T, "the command ran", || ran.exists().then_some(()));
    eprintln!("held: broker approve -> command ran {:?}", t1.elapsed());
    let out = child.wait(T);
    out.assert_success();
    assert_eq!(std::fs::read_to_string(&ran).unwrap().lines().count(), 1, "the command ran once");
    let a = approvals(&broker, true).into_iter().find(|x| x["id"] == a["id"]).unwrap();
    assert_eq!((a["state"].as_str(), a["answer"]["outcome"].as_str()), (Some("answered"), Some("won")), "{a}");
    assert!(broker.log_text().contains("hook held up to 60s"), "{}", broker.log_text());
}

/// Hold on: `broker deny --message X` is the hook's deny, and the model reads X in its tool
/// failure; the command never runs.
#[test]
fn a_held_hook_returns_the_deny_message() {
    let (model, env, ran) = held_exec("HELD_DENIED", "hold = \"exec\"\nhold_secs = 60\n");
    let broker = Broker::start_trusted(&env);
    let child = spawn_exec(&env);
    let thread = child.wait_thread_id(T);
    let (a, _) = wait_listed(&broker, &thread, Instant::now());
    let why = marker("USE_STAGING_INSTEAD");
    let (ok, said) = answer(&broker, &["deny", str_field(&a, "id"), "--message", &why]);
    assert!(ok && said.contains("won"), "deny: {said}");
    let seen = model.wait_for(T, "the deny message", |r| r.items_containing(&why) > 0);
    eprintln!("the model's tool output after a held deny: {:?}", seen.exec_results());
    child.wait(T).assert_success();
    assert!(!ran.exists(), "a denied command never runs");
}

/// Hold on, nobody answers: the hook returns no decision when the hold ends (bounded), and
/// Codex goes on as without Courier; a later `broker approve` sends nothing.
#[test]
fn a_hold_that_runs_out_returns_no_decision() {
    let (_model, env, _ran) = held_exec("HELD_TIMEOUT", "hold = \"exec\"\nhold_secs = 2\n");
    let broker = Broker::start_trusted(&env);
    let t0 = Instant::now();
    let child = spawn_exec(&env);
    let thread = child.wait_thread_id(T);
    let (a, _) = wait_listed(&broker, &thread, t0);
    wait_until(T, "the hold ended", || broker.log_text().contains("the hold ended with no answer").then_some(()));
    let held_for = t0.elapsed();
    eprintln!("exec start -> hold ended {held_for:?}");
    assert!(held_for >= Duration::from_secs(2), "held for hold_secs");
    let out = child.wait(T);
    eprintln!("exec after the hold ran out: {:?}\n{}", out.status, out.stdout);
    let (ok, said) = answer(&broker, &["approve", str_field(&a, "id")]);
    assert!(!ok, "nothing to answer once the hold ended and the session is over: {said}");
}

/// Hold off (the default): the hook returns at once, nothing waits on Courier.
#[test]
fn no_hold_by_default() {
    let (_model, env, _, _ran, _) = escalating("NOT_HELD", "not held");
    let broker = Broker::start_trusted(&env);
    let child = spawn_exec(&env);
    let thread = child.wait_thread_id(T);
    wait_listed(&broker, &thread, Instant::now());
    let _ = child.wait(T);
    assert!(!broker.log_text().contains("hook held"), "{}", broker.log_text());
}
