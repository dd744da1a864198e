//! The receiving side decides, on the real Codex (docs/producers.md, "Names, inbound policy and
//! modes"): a named thread receives `send --to NAME --wait confirmed` once and an unknown name is
//! `misaddressed` with nothing queued; a thread whose policy holds a message keeps it from the
//! model until the person releases it, then it arrives once, `confirmed`; a confined process
//! cannot release, drop or change a policy, even with the passphrase; a `next-turn` message never
//! lands inside the running turn. Each test has its own scripted model, Codex home and broker.

use courier_tests::util::{marker, wait_until};
use courier_tests::{Broker, CodexEnv};
use serde_json::Value;
use std::process::{Output, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// `broker ARGS` in the background (a wait that the test ends by what it does next).
fn bg(env: &CodexEnv, args: &[&str]) -> std::thread::JoinHandle<Output> {
    let mut cmd = env.command(courier_tests::broker_bin());
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().expect("spawn broker");
    std::thread::spawn(move || child.wait_with_output().expect("wait for broker"))
}

fn messages(broker: &Broker) -> Vec<Value> {
    broker.inspect_json()["messages"].as_array().cloned().unwrap_or_default()
}

/// The id of the one message of `thread` queued so far.
fn queued_id(broker: &Broker, thread: &str) -> String {
    wait_until(T, "the message to be queued", || {
        messages(broker).iter().find(|m| m["thread"] == thread).map(|m| m["id"].as_str().unwrap().to_string())
    })
}

/// A named thread receives `send --to NAME --wait confirmed` exactly once (exit 0), `threads`
/// shows the name; a name no thread has exits 5 `misaddressed` and queues nothing, on the CLI and
/// on the socket.
#[test]
fn a_named_thread_receives_once_and_an_unknown_name_is_misaddressed() {
    let (model, env, hold) = CodexEnv::with_held_turn();
    let broker = Broker::start_trusted(&env);
    let child = env.spawn_exec("please run a command");
    hold.wait_held(1, T);
    let thread = child.wait_thread_id(T);

    let named = broker.run_ok(&["name", &thread, "reviewer"]);
    assert!(named.contains("reviewer"), "{named}");
    let listed: Value = serde_json::from_str(&broker.run_ok(&["threads", "--json"])).unwrap();
    let me = listed["threads"].as_array().unwrap().iter().find(|t| t["id"] == thread.as_str()).cloned().unwrap();
    assert_eq!(me["name"], "reviewer", "{me}");
    assert!(broker.run_ok(&["threads"]).lines().any(|l| l.starts_with(&thread) && l.contains(" reviewer ")));

    let out = broker.run(&["send", "--to", "reviwer", "--wait", "confirmed", "--json", "lost"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(5), "misaddressed: {stdout} {stderr}");
    assert!(stderr.contains("no thread is named \"reviwer\"") && stderr.contains("nothing was queued"), "{stderr}");
    assert_eq!(serde_json::from_str::<Value>(stdout.trim()).unwrap()["outcome"], "misaddressed");
    let reply = courier_tests::broker::line_request(&env.runtime_dir.join("broker.sock"), r#"{"op":"send","to":"nobody","text":"x"}"#);
    assert_eq!(reply["error"], "misaddressed", "{reply}");
    assert!(messages(&broker).is_empty(), "nothing was queued");

    let body = marker("NAMED");
    let send = bg(&env, &["send", "--to", "REVIEWER", "--from", "relay", "--wait", "confirmed", "--timeout", "60s", &body]);
    let id = queued_id(&broker, &thread);
    hold.release();
    child.wait(T).assert_success();
    let out = send.join().unwrap();
    assert_eq!(out.status.code(), Some(0), "send --to --wait confirmed: {:?}", text(&out));
    assert_eq!(text(&out).0.trim(), id);
    assert_eq!(model.count_messages_containing("developer", &body), 1, "once: {}", model.dump());

    // The name outlives the process: the ended thread keeps it, and `--clear` frees it.
    let ended = broker.run(&["send", "--to", "reviewer", "waits for a resume"]);
    assert_eq!(ended.status.code(), Some(0), "{:?}", text(&ended));
    assert!(text(&ended).1.contains("waits until the thread is resumed"), "{:?}", text(&ended));
    broker.run_ok(&["name", "--clear", "reviewer"]);
    assert_eq!(broker.run(&["send", "--to", "reviewer", "x"]).status.code(), Some(5));
}

/// A thread whose policy holds the person's sends: the message is `held` (a wait with a timeout
/// exits 6 `held`), no hook of the running turn hands it and the model never sees it; `broker
/// held` lists it escaped; `broker release` (the person, with the passphrase) makes it pending,
/// and the resumed thread gets it once, `confirmed`, which a `--wait confirmed` started before
/// the release sees (exit 0).
#[test]
fn a_held_message_stays_unseen_until_the_person_releases_it_then_arrives_once() {
    let (model, env, hold) = CodexEnv::with_held_turn();
    let broker = Broker::start_trusted(&env);
    broker.person_passphrase();
    let child = env.spawn_exec("please run a command");
    hold.wait_held(1, T);
    let thread = child.wait_thread_id(T);
    let set = broker.answer_as_person(&["inbound", &thread, "hold"]);
    assert!(set.status.success(), "{:?}", text(&set));
    let shown = broker.run_ok(&["inbound", &thread]);
    assert!(shown.lines().filter(|l| l.contains(" hold ")).count() == 4, "every class holds: {shown}");

    let body = marker("HELD");
    let out = broker.run(&["send", "--thread", &thread, "--wait", "confirmed", "--timeout", "2s", &format!("{body}\u{1b}]52;c;aGk=\u{7}")]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(6), "a wait that runs out on a held message: {stdout} {stderr}");
    let id = stdout.trim().to_string();
    assert!(stderr.contains("held by its thread's inbound policy"), "{stderr}");
    let waiter = bg(&env, &["wait", &id, "--timeout", "90s", "--json"]);
    let status: Value = serde_json::from_str(&broker.run_ok(&["status", &id, "--json"])).unwrap();
    assert_eq!((status["state"].as_str(), status["reason"].as_str()), (Some("held"), Some("held_by_policy")), "{status}");
    let listed = broker.run_ok(&["held"]);
    assert!(listed.contains(&id) && listed.contains(&body) && !listed.contains('\u{1b}') && !listed.contains('\u{7}'), "{listed}");

    // The turn goes on: its hooks (PostToolUse, Stop) run, and none of them hands the message.
    hold.release();
    child.wait(T).assert_success();
    assert_eq!(model.count_messages_containing("developer", &body), 0, "held: unseen {}", model.dump());
    assert_eq!(broker.message_state(&id), "held");

    // A held message whose sender's ttl runs out meanwhile: released, it is not shown late.
    let stale_body = marker("STALE");
    let stale = broker.run_ok(&["send", "--thread", &thread, "--ttl", "1s", &stale_body]).trim().to_string();
    assert_eq!(broker.message_state(&stale), "held");
    std::thread::sleep(Duration::from_millis(1100)); // the ttl itself is what is under test
    assert_eq!(broker.message_state(&stale), "held", "nothing expires while held");
    let released = broker.answer_as_person(&["release", &stale]);
    assert!(released.status.success() && text(&released).0.contains("its --ttl ran out while it was held"), "{:?}", text(&released));

    let released = broker.answer_as_person(&["release", &id]);
    assert!(released.status.success(), "{:?}", text(&released));
    assert!(!text(&released).0.contains("note:"), "{:?}", text(&released));
    assert_eq!(broker.message_state(&id), "pending");
    let again = broker.answer_as_person(&["release", &id]);
    assert!(!again.status.success() && text(&again).1.contains("not held"), "released once: {:?}", text(&again));
    env.exec_args(&["resume", &thread], "carry on", T).assert_success();
    let out = waiter.join().unwrap();
    assert_eq!(out.status.code(), Some(0), "the wait saw it confirmed after the release: {:?}", text(&out));
    let rec: Value = serde_json::from_str(text(&out).0.trim()).unwrap();
    assert_eq!(rec["state"], "confirmed");
    assert_eq!(model.count_messages_containing("developer", &body), 1, "once: {}", model.dump());
    assert_eq!(model.count_messages_containing("developer", &stale_body), 0, "stale: never shown {}", model.dump());
    let stale: Value = serde_json::from_str(&broker.run_ok(&["status", &stale, "--json"])).unwrap();
    assert_eq!((stale["state"].as_str(), stale["reason"].as_str()), (Some("expired"), Some("ttl_elapsed")), "{stale}");
}

/// A confined process (NoNewPrivs, as every agent sandbox runs a model's commands) cannot
/// release, drop or change a policy, even holding the passphrase file; nor can any process with
/// a made-up proof on the raw socket. The message stays held and the policy unchanged; the
/// person's own command then drops it.
#[test]
fn a_confined_command_cannot_release_drop_or_change_the_policy() {
    let (_model, env, hold) = CodexEnv::with_held_turn();
    hold.release();
    let broker = Broker::start_trusted(&env);
    let passphrase = broker.person_passphrase().display().to_string();
    let done = env.exec("finish at once");
    done.assert_success();
    let thread = done.thread_id().expect("session id");
    assert!(broker.answer_as_person(&["inbound", &thread, "hold", "--from", "person"]).status.success());
    let id = broker.run_ok(&["send", "--thread", &thread, "from a relay"]).trim().to_string();
    assert_eq!(broker.message_state(&id), "held");

    let confined = |args: &[&str]| {
        let mut cmd = env.command("setpriv");
        cmd.arg("--no-new-privs").arg(courier_tests::broker_bin()).args(args).args(["--passphrase-file", &passphrase]);
        let out = cmd.output().unwrap();
        (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    };
    for args in [vec!["release", id.as_str()], vec!["drop", id.as_str()], vec!["inbound", thread.as_str(), "accept"]] {
        let (ok, said) = confined(&args);
        assert!(!ok && said.contains("not_a_person") && said.contains("confined"), "{args:?}: {said}");
    }
    let (ok, said) = {
        let mut cmd = env.command("setpriv");
        cmd.arg("--no-new-privs").arg(courier_tests::broker_bin()).args(["name", &thread, "stolen"]);
        let out = cmd.output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    assert!(!ok && said.contains("not_a_person"), "naming is the owner's: {said}");
    let sock = env.runtime_dir.join("broker.sock");
    let shown = courier_tests::broker::line_request(&sock, &format!(r#"{{"op":"answerable","id":"{id}"}}"#))["held"][0]["shown"].clone();
    let forged = format!(r#"{{"op":"release","id":"{id}","shown":{shown},"proof":"{}"}}"#, "ab".repeat(64));
    assert_eq!(courier_tests::broker::line_request(&sock, &forged)["error"], "not_a_person");
    let forged = format!(r#"{{"op":"inbound","thread":"{thread}","action":"accept","rev":1,"proof":"{}"}}"#, "ab".repeat(64));
    assert_eq!(courier_tests::broker::line_request(&sock, &forged)["error"], "not_a_person");
    assert_eq!(broker.message_state(&id), "held", "nothing changed");
    assert!(broker.run_ok(&["inbound", &thread]).lines().any(|l| l.trim_start().starts_with("person") && l.contains(" hold ")));

    let dropped = broker.answer_as_person(&["drop", &id]);
    assert!(dropped.status.success(), "{:?}", text(&dropped));
    let status: Value = serde_json::from_str(&broker.run_ok(&["status", &id, "--json"])).unwrap();
    assert_eq!((status["state"].as_str(), status["reason"].as_str()), (Some("cancelled"), Some("dropped_by_person")));
    let refused_policy = broker.answer_as_person(&["inbound", &thread, "refuse", "--from", "person"]);
    assert!(refused_policy.status.success(), "{:?}", text(&refused_policy));
    let out = broker.run(&["send", "--thread", &thread, "no"]);
    assert_eq!(out.status.code(), Some(2), "{:?}", text(&out));
    assert!(text(&out).1.contains("refuses messages from person senders"), "{:?}", text(&out));
}

/// `--mode next-turn` is never handed inside the running turn: its PostToolUse and Stop hooks
/// leave it (a steer message sent beside it goes in that turn), and the next prompt's first
/// hook (the resume) hands it, once, `confirmed`.
#[test]
fn a_next_turn_message_never_lands_inside_the_running_turn() {
    let (model, env, hold) = CodexEnv::with_held_turn();
    let broker = Broker::start_trusted(&env);
    let child = env.spawn_exec("please run a command");
    hold.wait_held(1, T);
    let thread = child.wait_thread_id(T);
    let (next, steer) = (marker("NEXT_TURN"), marker("STEER"));
    let next_id = broker.run_ok(&["send", "--thread", &thread, "--mode", "next-turn", "--wake", "never", &next]).trim().to_string();
    let steer_id = broker.run_ok(&["send", "--thread", &thread, &steer]).trim().to_string();
    hold.release();
    child.wait(T).assert_success();
    wait_until(T, "the steer message confirmed", || (broker.message_state(&steer_id) == "confirmed").then_some(()));
    assert_eq!(model.count_messages_containing("developer", &steer), 1, "{}", model.dump());
    assert_eq!(model.count_messages_containing("developer", &next), 0, "not inside the running turn: {}", model.dump());
    assert_eq!(broker.message_state(&next_id), "pending");
    let status: Value = serde_json::from_str(&broker.run_ok(&["status", &next_id, "--json"])).unwrap();
    assert_eq!(status["mode"], "next-turn");

    let waiter = bg(&env, &["wait", &next_id, "--timeout", "60s"]);
    env.exec_args(&["resume", &thread], "carry on", T).assert_success();
    let out = waiter.join().unwrap();
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    assert_eq!(model.count_messages_containing("developer", &next), 1, "once, in the next turn: {}", model.dump());
    let status: Value = serde_json::from_str(&broker.run_ok(&["status", &next_id, "--json"])).unwrap();
    assert!(matches!(status["event"].as_str(), Some("UserPromptSubmit" | "SessionStart")), "{status}");
}
