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

/// Hold off (the default) and no app-server (`codex exec --approve-for-me`, its automatic review
/// kept waiting at the model): `broker approve` sends nothing and says what would make such an
/// approval answerable from here: `[approvals] hold = "exec"` in Courier's config.
#[test]
fn without_a_hold_approve_says_how_to_make_it_answerable() {
    let (model, env, cmd, ran, _) = escalating("NOT_ANSWERABLE", "not held");
    let review = courier_tests::Hold::new();
    let mut first = Some(escalated_then_done(&cmd, "not held"));
    let held = review.clone();
    model.set_script(move |r| match first.take() {
        Some(mut f) => f(r),
        None => courier_tests::Reply::message("done").held(&held),
    });
    let broker = Broker::start_trusted(&env);
    let child = spawn_exec(&env);
    let thread = child.wait_thread_id(T);
    let (a, _) = wait_listed(&broker, &thread, Instant::now());
    review.wait_held(1, T);
    let (ok, said) = answer(&broker, &["approve", str_field(&a, "id")]);
    eprintln!("approve without an app-server or a hold: {said}");
    assert!(!ok && said.contains("serves no app-server") && said.contains("nothing was sent"), "{said}");
    assert!(said.contains("[approvals] hold = \"exec\"") && said.contains(&env.courier_config.display().to_string()), "{said}");
    let listed = approvals(&broker, false).into_iter().find(|x| x["id"] == a["id"]).expect("still pending");
    assert!(listed["answer"].is_null(), "nothing answered: {listed}");
    review.release();
    let _ = child.wait(T);
    assert!(!ran.exists(), "the command never ran");
}

/// One request to the broker's socket, as any process of the user can send it.
fn raw(broker: &Broker, request: &serde_json::Value) -> serde_json::Value {
    broker_lib::producer::line::call(&broker.socket_path(), request, Some(T)).unwrap().expect("a broker answers")
}

/// The broker killed -9 while a held approval waits, then started again: the approval it recorded
/// cannot be answered through Courier any more. What the person was shown lived in the dead
/// broker's memory (the database row alone could have been rewritten since): neither `broker
/// approve` nor a raw request carrying the person's valid signature of the record as it was shown
/// answers it. The hook fell back at once when the broker died (the session did not wait out the
/// 60 s hold), Codex went on by its own rules, and nothing was answered twice: no answer is
/// recorded, and the command ran at most once.
#[test]
fn killed_while_an_approval_is_held_a_restarted_broker_answers_nothing() {
    use broker_lib::approval::Decision;
    use broker_lib::person::{self, Act, PersonKey};
    let (_model, env, ran) = held_exec("HELD_KILLED", "hold = \"exec\"\nhold_secs = 60\n");
    let mut broker = Broker::start_trusted(&env);
    broker.person_passphrase();
    let child = spawn_exec(&env);
    let thread = child.wait_thread_id(T);
    let (a, _) = wait_listed(&broker, &thread, Instant::now());
    let id = str_field(&a, "id").to_string();
    // What the person is shown before the crash, and their valid signature of approving it.
    let listed = raw(&broker, &serde_json::json!({"op": "answerable", "id": id}));
    let shown = listed["approvals"][0]["shown"].as_str().unwrap_or_else(|| panic!("answerable: {listed}")).to_string();
    let key: PersonKey = serde_json::from_value(listed["person"].clone()).unwrap();
    let act = Act::Answer { approval: &id, decision: Decision::Approve, shown: &shown, message: None };
    let proof = person::sign(&key.unlock(courier_tests::broker::PERSON_PASSPHRASE).unwrap(), &act);
    key.verify(&act, &proof).expect("the signature is the person's");

    let killed = Instant::now();
    broker.stop(); // SIGKILL
    let out = child.wait(T);
    let ended = killed.elapsed();
    eprintln!("broker killed -> exec ended {ended:?}: {:?}", out.status);
    assert!(ended < Duration::from_secs(30), "the held hook fell back when the broker died, not after the 60 s hold: {ended:?}");

    let broker = Broker::start(&env);
    let (ok, said) = answer(&broker, &["approve", &id]);
    assert!(!ok && !said.contains("won"), "broker approve after the restart: {said}");
    let reply = raw(&broker, &serde_json::json!({"op": "approve", "id": id, "shown": shown, "proof": proof}));
    eprintln!("the signed answer of the record shown before the crash: {reply}");
    assert!(
        reply["ok"] != true && reply["message"].as_str().unwrap_or_default().contains("recorded before this broker started"),
        "{reply}"
    );
    let after = approvals(&broker, true).into_iter().find(|x| x["id"] == id.as_str()).expect("the record is kept");
    assert!(after["answer"].is_null() || after["answer"]["outcome"] != "won", "nothing answered through Courier: {after}");
    let runs = std::fs::read_to_string(&ran).unwrap_or_default().lines().count();
    assert!(runs <= 1, "the command ran {runs} times");
}
