//! Approvals on the real Codex: what the app-server and the PermissionRequest hook do (the facts
//! Courier builds on), then Courier's pending approvals (`broker approvals`), answered once
//! through the owning app-server (`broker approve|deny`), and only by a person.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use courier_tests::approval_rig::*;
use courier_tests::hooks::Hook;
use courier_tests::rollout::find_rollout;
use courier_tests::util::{marker, str_field, wait_until};
use courier_tests::{hook_command, Broker, CodexEnv, Reply, Request, ScriptedModel};
use serde_json::{json, Value};

/// A hook that appends its stdin (one JSON payload) as a line to `log`.
fn logging_hook(event: &str, log: &Path) -> Hook {
    Hook::new(event, &format!("cat >> '{}'; echo >> '{}'", log.display(), log.display())).timeout(Some(10))
}

fn logged(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// What Courier relies on, on the real app-server: PreToolUse, then PermissionRequest (its
/// `tool_input` holds the command and the model's reason, no call id), then one
/// `requestApproval` to every subscribed client with the same JSON-RPC id and the call id as
/// `itemId`; a client that resumes the thread gets it replayed; the first answer wins, everyone
/// gets `serverRequest/resolved`, the command runs once and a later answer changes nothing.
#[test]
fn app_server_approval_facts() {
    let cmd = format!("echo {}", marker("APPROVED_RAN"));
    let model = ScriptedModel::start_with(escalated_then_done(&cmd, "to see the facts"));
    let env = CodexEnv::new(&model);
    let log = env.root.join("hooks.log");
    env.install_hooks(&[logging_hook("PreToolUse", &log), logging_hook("PermissionRequest", &log)]);
    let (server, mut owner, thread) = approving_thread(&env);
    let turn = owner.start_turn(&thread, "run it", T);

    let req = owner.wait_server_request(REQUEST_APPROVAL, T, |p| p["threadId"] == thread.as_str());
    let hooks = logged(&log);
    let events: Vec<&str> = hooks.iter().map(|h| str_field(h, "hook_event_name")).collect();
    assert_eq!(events, ["PreToolUse", "PermissionRequest"], "{hooks:?}");
    let perm = &hooks[1];
    eprintln!("PermissionRequest payload: {perm}\nrequestApproval: {req}");
    assert_eq!(perm["tool_input"]["command"], cmd.as_str(), "{perm}");
    assert_eq!(perm["tool_input"]["description"], "to see the facts", "{perm}");
    assert_eq!(perm["turn_id"], turn.as_str());
    assert!(perm.get("tool_use_id").is_none(), "no call id in PermissionRequest: {perm}");
    assert_eq!(req["params"]["itemId"], hooks[0]["tool_use_id"], "itemId is the call id");
    // The request's command is the shell's whole command line; the hook saw the model's.
    assert_eq!(req["params"]["command"], format!("/bin/bash -lc '{cmd}'").as_str());

    // A client that resumes, gets the replay and goes away unanswered changes nothing.
    {
        let mut gone = server.client(T);
        gone.initialize(true, T);
        gone.request("thread/resume", json!({"threadId": thread}), T);
        gone.wait_server_request(REQUEST_APPROVAL, T, |p| p["threadId"] == thread.as_str());
    }
    // A second client that resumes the thread gets the same request replayed.
    let mut other = server.client(T);
    other.initialize(true, T);
    let resumed = other.request("thread/resume", json!({"threadId": thread}), T);
    eprintln!("thread/resume while waiting: status {}", resumed.pointer("/thread/status").unwrap_or(&Value::Null));
    let replayed = other.wait_server_request(REQUEST_APPROVAL, T, |p| p["threadId"] == thread.as_str());
    assert_eq!(replayed["id"], req["id"], "one JSON-RPC id for every client");

    other.respond(&replayed["id"], json!({"decision": "accept"}));
    let resolved = owner.wait_notification("serverRequest/resolved", T, |p| p["threadId"] == thread.as_str());
    assert_eq!(resolved["requestId"], req["id"]);
    owner.respond(&req["id"], json!({"decision": "decline"}));
    owner.wait_turn_completed(&turn, T);
    let ran: Vec<_> = model.requests().iter().flat_map(|r| r.exec_results()).filter(|(_, out)| out.is_some()).collect();
    eprintln!("exec results: {ran:?}");
    let last = model.requests().last().unwrap().exec_results();
    assert!(last[0].1.as_deref().unwrap_or("").contains("APPROVED_RAN"), "the first answer (accept) won: {last:?}");
}

/// A Courier-hooked app-server thread whose model asks to run `cmd` escalated: the approval is
/// listed (with its command, the model's reason, the call id) before the request reaches the
/// client, `broker threads` shows the thread waiting on it; the person's own answer through the
/// app-server resolves it.
#[test]
fn a_pending_approval_is_listed_with_its_command() {
    let cmd = format!("echo {}", marker("LISTED"));
    let model = ScriptedModel::start_with(escalated_then_done(&cmd, "to list it"));
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let broker = Broker::start_trusted(&env);
    let (_server, mut client, thread) = approving_thread(&env);
    let t0 = Instant::now();
    let turn = client.start_turn(&thread, "run it", T);
    let req = client.wait_server_request(REQUEST_APPROVAL, T, |p| p["threadId"] == thread.as_str());
    let at_request = t0.elapsed();
    let (a, listed) = wait_listed(&broker, &thread, t0);
    eprintln!("turn/start -> requestApproval {at_request:?}; turn/start -> listed {listed:?}");
    assert!(listed <= at_request + Duration::from_secs(1), "listed within a second of the request: {listed:?} vs {at_request:?}");
    assert_eq!(a["command"], cmd.as_str(), "{a}");
    assert_eq!(a["reason"], "to list it");
    assert_eq!(a["call_id"], req["params"]["itemId"], "{a}");
    assert_eq!(a["turn"], turn.as_str());
    assert_eq!(a["state"], "pending");
    let threads: Value = serde_json::from_str(&broker.run_ok(&["threads", "--json"])).unwrap();
    let t = threads["threads"].as_array().unwrap().iter().find(|t| t["id"] == thread.as_str()).cloned().unwrap();
    assert_eq!(t["waiting_on_approval"][0]["id"], a["id"], "{t}");
    assert!(broker.run_ok(&["threads"]).contains(&format!("approval {}", str_field(&a, "id"))));

    // The person answers at the app-server: the command runs, the approval is resolved.
    client.respond(&req["id"], json!({"decision": "accept"}));
    client.wait_turn_completed(&turn, T);
    wait_until(T, "the approval resolved", || approvals(&broker, false).is_empty().then_some(()));
    let all = approvals(&broker, true);
    assert_eq!(all.len(), 1, "one approval for one request: {all:?}");
    assert_eq!(all[0]["state"], "resolved");
}

/// `broker approvals --wait --thread T` blocks while T has no pending approval (exit 3 once its
/// timeout runs out, as `broker wait`), and returns (exit 0, listing it) once T's model asks for
/// approval; another thread's wait is not woken by it.
#[test]
fn approvals_wait_returns_once_one_is_pending() {
    let cmd = format!("echo {}", marker("WAITED"));
    let model = ScriptedModel::start_with(escalated_then_done(&cmd, "to wait for it"));
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let broker = Broker::start_trusted(&env);
    let (_server, mut client, thread) = approving_thread(&env);
    let timed_out = broker.run(&["approvals", "--wait", "--thread", &thread, "--timeout", "1s", "--json"]);
    assert_eq!(timed_out.status.code(), Some(3), "{timed_out:?}");
    let spawn = |thread: &str| {
        env.command(courier_tests::broker_bin())
            .args(["approvals", "--wait", "--thread", thread, "--timeout", "60s", "--json"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut waiter = spawn(&thread);
    let mut other = spawn("01a234e3-6132-7900-91d8-43a5034bdb61");
    assert!(waiter.try_wait().unwrap().is_none(), "returned with nothing pending");
    let turn = client.start_turn(&thread, "run it", T);
    let req = client.wait_server_request(REQUEST_APPROVAL, T, |p| p["threadId"] == thread.as_str());
    let t0 = Instant::now();
    let status = wait_until(T, "approvals --wait returned", || waiter.try_wait().unwrap());
    eprintln!("requestApproval -> approvals --wait returned: {:?}", t0.elapsed());
    assert_eq!(status.code(), Some(0));
    let mut out = String::new();
    std::io::Read::read_to_string(waiter.stdout.as_mut().unwrap(), &mut out).unwrap();
    let listed: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    let a = &listed["approvals"][0];
    assert_eq!(
        (a["thread"].as_str(), a["command"].as_str(), a["state"].as_str()),
        (Some(thread.as_str()), Some(cmd.as_str()), Some("pending")),
        "{listed}"
    );
    assert!(other.try_wait().unwrap().is_none(), "another thread's wait returned");
    let _ = other.kill();
    let _ = other.wait();
    client.respond(&req["id"], json!({"decision": "accept"}));
    client.wait_turn_completed(&turn, T);
}

/// `broker approve` answers the request once through the owning app-server: `won`, the command
/// runs once, every client sees the request resolved; a second approve (or a deny) is refused.
/// A message queued while the thread waits shows why and is delivered after the answer.
#[test]
fn approve_runs_the_command_once() {
    let (model, env, _, ran, mark) = escalating("APPROVED", "to run it");
    let mut w = waiting_on(&env);
    // A message for the waiting thread waits with that reason; the next hook after the answer
    // delivers it.
    let queued = w.broker.send_opts(&w.thread, &marker("WHILE_WAITING"), None, Some("coordinator"));
    wait_until(T, "the message noted waiting_on_approval", || {
        w.broker.message(&queued).filter(|m| m["reason"] == "waiting_on_approval").map(|_| ())
    });
    assert_eq!(w.broker.message_state(&queued), "pending");
    let t0 = Instant::now();
    let (ok, said) = answer(&w.broker, &["approve", w.id()]);
    let answered = t0.elapsed();
    assert!(ok && said.contains("won"), "approve: {said}");
    wait_until(T, "the command ran", || ran.exists().then_some(()));
    eprintln!("broker approve -> answered {answered:?}; -> command ran {:?}", t0.elapsed());
    let resolved = w.client.wait_notification("serverRequest/resolved", T, |p| p["threadId"] == w.thread.as_str());
    assert_eq!(resolved["requestId"], w.request["id"]);
    w.client.wait_turn_completed(&w.turn, T);
    assert_eq!(std::fs::read_to_string(&ran).unwrap().lines().count(), 1, "the command ran once");
    let outputs = model.requests().last().unwrap().exec_results();
    assert!(outputs[0].1.as_deref().unwrap_or("").contains(&mark), "{outputs:?}");

    w.broker.wait_state(&queued, "confirmed", T);
    let (ok, said) = answer(&w.broker, &["approve", w.id()]);
    assert!(!ok && said.contains("not_pending"), "{said}");
    assert!(!w.broker.answer_as_person(&["deny", w.id()]).status.success());
    let a = approvals(&w.broker, true).into_iter().find(|a| a["id"] == w.id()).unwrap();
    assert_eq!((a["state"].as_str(), a["answer"]["outcome"].as_str()), (Some("answered"), Some("won")), "{a}");
    assert_eq!(a["answer"]["decision"], "approve");
    assert!(str_field(&a["answer"], "by").starts_with("the person (key "), "{a}");
}

/// `broker deny --message`: the command does not run, the model reads the refusal and, through
/// the next hook, the message.
#[test]
fn deny_message_reaches_the_model() {
    let (model, env, _, ran, _) = escalating("DENIED", "to run it");
    let mut w = waiting_on(&env);
    let why = marker("USE_STAGING_INSTEAD");
    let (ok, said) = answer(&w.broker, &["deny", w.id(), "--message", &why]);
    assert!(ok && said.contains("won"), "deny: {said}");
    let seen = model.wait_for(T, "the deny message", |r| r.items_containing(&why) > 0);
    w.client.wait_turn_completed(&w.turn, T);
    assert!(!ran.exists(), "a denied command never runs");
    let outputs = seen.exec_results();
    eprintln!("the model's tool output after deny: {outputs:?}");
    model.assert_received_once(&why, T);
    let a = approvals(&w.broker, true).into_iter().find(|a| a["id"] == w.id()).unwrap();
    assert_eq!((a["state"].as_str(), a["answer"]["decision"].as_str()), (Some("answered"), Some("deny")), "{a}");
}

/// The person at the app-server answers first: Courier's later approve reports `lost`, sends
/// nothing, and the command ran once (the person's answer).
#[test]
fn the_person_answering_first_wins() {
    let (_model, env, _, ran, _) = escalating("PERSON", "to run it");
    let mut w = waiting_on(&env);
    w.client.respond(&w.request["id"], json!({"decision": "accept"}));
    w.client.wait_notification("serverRequest/resolved", T, |p| p["threadId"] == w.thread.as_str());
    let (ok, said) = answer(&w.broker, &["approve", w.id()]);
    assert!(!ok && said.contains("lost"), "{said}");
    w.client.wait_turn_completed(&w.turn, T);
    assert_eq!(std::fs::read_to_string(&ran).unwrap().lines().count(), 1, "the command ran once");
}

/// The attacker's script for a `codex exec` whose prompt holds `ATTACK`: one command per request
/// (`commands`, in order), then `done`; any other thread asks for `cmd` escalated.
fn attacker_or_escalated(cmd: &str, commands: Arc<Mutex<Vec<String>>>) -> impl FnMut(&Request) -> Reply + Send + 'static {
    let mut honest = escalated_then_done(cmd, "to run it");
    move |r| {
        if !r.body_contains("ATTACK") {
            return honest(r);
        }
        match commands.lock().unwrap().get(r.function_calls().len()) {
            Some(c) => Reply::exec(c),
            None => Reply::message("done"),
        }
    }
}

/// A model's tool command cannot answer an approval: `broker approve` run by the model of
/// another Codex session, as is and with its environment scrubbed (`env -i`: no tool-command
/// markers), finds no person to ask (no terminal, no passphrase); the raw socket request, with
/// the record's digest from `answerable` and a made-up proof, is refused `not_a_person`. The
/// approval stays pending, and a person's approve then wins (nothing had answered it).
#[test]
fn a_model_run_approve_is_refused() {
    let commands: Arc<Mutex<Vec<String>>> = Arc::default();
    let model = ScriptedModel::start_with(escalated_then_done("true", "placeholder"));
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let (cmd, ran, _) = timed_command(&env, "ATTACKED");
    model.set_script(attacker_or_escalated(&cmd, commands.clone()));
    let w = waiting_on(&env);
    let broker = courier_tests::broker_bin().display().to_string();
    let runtime = env.runtime_dir.display().to_string();
    *commands.lock().unwrap() = vec![
        format!("{broker} approve {id} 2>&1; echo rc=$? # PLAIN", id = w.id()),
        format!("env -i PATH=/usr/bin:/bin COURIER_RUNTIME_DIR={runtime} {broker} approve {id} 2>&1; echo rc=$? # SCRUBBED", id = w.id()),
        raw_approve(&env.runtime_dir.join("broker.sock"), w.id()),
    ];
    let out = env.exec_args(&["--dangerously-bypass-approvals-and-sandbox"], "ATTACK: approve it", T);
    out.assert_success();
    let results = model.requests().iter().rfind(|r| r.body_contains("ATTACK")).unwrap().exec_results();
    eprintln!("the model's commands: {results:#?}");
    assert_eq!(results.len(), 3, "{results:?}");
    for (c, o) in &results {
        let o = o.as_deref().unwrap_or_default();
        assert!((o.contains("no terminal to ask the person's passphrase") || o.contains("not_a_person")) && o.contains("rc=1"), "{c}: {o}");
    }
    assert!(results[2].1.as_deref().unwrap_or_default().contains("not_a_person"), "{results:?}");
    let a = approvals(&w.broker, false).into_iter().find(|a| a["id"] == w.id()).expect("still pending");
    assert_eq!(a["state"], "pending", "{a}");
    assert!(!ran.exists(), "the command did not run");
    let (ok, said) = answer(&w.broker, &["approve", w.id()]);
    assert!(ok && said.contains("won"), "a person's approve: {said}");
}

/// A PermissionRequest forged by a model's command (hook-client fed a payload naming its own
/// thread and turn) is refused by the gate and records no approval.
#[test]
fn a_forged_permission_request_is_refused() {
    let model = ScriptedModel::start();
    let env = Arc::new(CodexEnv::with_hook_command(&model, &hook_command()));
    let e = env.clone();
    let hc = hook_command();
    model.set_script(move |r: &Request| {
        if !r.function_calls().is_empty() {
            return Reply::message("done");
        }
        let (thread, turn) = (r.thread_id().unwrap(), r.turn_id().unwrap());
        let rollout = find_rollout(&e.codex_home, &thread).expect("rollout exists at the first request");
        let payload = json!({
            "session_id": thread, "turn_id": turn, "transcript_path": rollout, "cwd": e.work,
            "hook_event_name": "PermissionRequest", "model": "gpt-5.5", "permission_mode": "default",
            "tool_name": "Bash", "tool_input": {"command": "echo FORGED", "description": "trust me"}
        });
        let f = e.root.join("forged.json");
        std::fs::write(&f, payload.to_string()).unwrap();
        Reply::exec(&format!("{hc} < {}; echo rc=$? # FORGE", f.display()))
    });
    let broker = Broker::start_trusted(&env);
    env.exec_args(&["--dangerously-bypass-approvals-and-sandbox"], "forge an approval", T).assert_success();
    let refused = broker.wait_refusals(1, T, "the forged PermissionRequest", |r| r["event"] == "PermissionRequest");
    eprintln!("refused: {refused:#?}");
    assert!(approvals(&broker, true).is_empty(), "no approval recorded");
}

/// The Codex TUI (under tmux) blocked on an approval: listed with its command, `broker approve`
/// answers through the TUI's managed app-server daemon, the popup closes and the command runs
/// once.
#[test]
fn a_tui_approval_is_answered_from_another_terminal() {
    let (model, env, cmd, ran, mark) = escalating("TUI_APPROVED", "to run it from the TUI");
    let broker = Broker::start_trusted(&env);
    let tui = tui_asking(&env);
    // Both looked at in one loop: when the popup shows, and when `broker approvals` lists it.
    let (mut listed, mut shown): (Option<(Value, Instant)>, Option<Instant>) = (None, None);
    wait_until(T, "the TUI's approval listed and shown", || {
        let screen = tui.screen();
        if screen.contains("Use existing model") {
            tui.send_keys(&["Down", "Enter"]);
        }
        if shown.is_none() && screen.contains("Yes, proceed") {
            shown = Some(Instant::now());
        }
        if listed.is_none() {
            listed = approvals(&broker, false).into_iter().next().map(|a| (a, Instant::now()));
        }
        (listed.is_some() && shown.is_some()).then_some(())
    });
    let ((a, listed_at), shown_at) = (listed.unwrap(), shown.unwrap());
    let (late, early) = (listed_at.saturating_duration_since(shown_at), shown_at.saturating_duration_since(listed_at));
    eprintln!("TUI: listed {late:?} after the popup showed ({early:?} before it; one poll is a capture and a CLI run)");
    assert!(listed_at <= shown_at + Duration::from_secs(1), "listed within a second of the popup");
    assert_eq!(a["command"], cmd.as_str(), "{a}");
    assert_eq!(a["reason"], "to run it from the TUI");
    let t1 = Instant::now();
    let (ok, said) = answer(&broker, &["approve", str_field(&a, "id")]);
    assert!(ok && said.contains("won"), "{said}");
    wait_until(T, "the command ran", || ran.exists().then_some(()));
    eprintln!("TUI: broker approve -> command ran {:?}", t1.elapsed());
    model.wait_for(T, "the command's output", |r| r.exec_results().iter().any(|(_, o)| o.as_deref().is_some_and(|o| o.contains(&mark))));
    let after = tui.wait_for("done", T);
    eprintln!("--- TUI after\n{after}");
    assert!(!after.contains("Yes, proceed"), "the popup closed:\n{after}");
    assert_eq!(std::fs::read_to_string(&ran).unwrap().lines().count(), 1, "the command ran once");
}

/// `command` written over approval `id`'s record in the queue database, as a process that can
/// write the state directory would (and `command_digest` with it).
fn rewrite_record(env: &CodexEnv, id: &str, command: &str) {
    let py = "import sqlite3, sys, hashlib\n\
              c = sqlite3.connect(sys.argv[1], timeout=10)\n\
              d = 'sha256:' + hashlib.sha256(sys.argv[3].encode()).hexdigest()\n\
              c.execute('update approvals set command = ?, command_digest = ? where id = ?', (sys.argv[3], d, sys.argv[2]))\n\
              c.commit()";
    let db = env.state_dir.join("queue.sqlite");
    let st = std::process::Command::new("python3").args(["-c", py, &db.display().to_string(), id, command]).status().unwrap();
    assert!(st.success(), "rewriting the record");
}

/// What was shown is what is answered: a record rewritten in the queue database after the hook
/// recorded it (a person would be shown `ls -la` while Codex waits to run another command) is
/// not offered to answer (`answerable` leaves it out, so the bridge never publishes it), and
/// `broker approve` refuses it with nothing sent. Restored, the person's approve wins.
#[test]
fn a_rewritten_approval_record_is_neither_offered_nor_answered() {
    let (_model, env, cmd, ran, _) = escalating("REWRITTEN", "to rewrite its record");
    let w = waiting_on(&env);
    rewrite_record(&env, w.id(), "ls -la");
    let shown = approvals(&w.broker, false).into_iter().find(|a| a["id"] == w.id()).unwrap();
    assert_eq!(shown["command"], "ls -la", "the rewrite took: {shown}");
    let offered = courier_tests::broker::line_request(&w.broker.socket_path(), r#"{"op":"answerable"}"#);
    assert_eq!(offered["approvals"].as_array().map(Vec::len), Some(0), "a rewritten record is not offered: {offered}");
    let (ok, said) = answer(&w.broker, &["approve", w.id()]);
    assert!(!ok && said.contains("changed after the hook recorded it"), "{said}");
    assert!(!ran.exists(), "nothing was answered");
    rewrite_record(&env, w.id(), &cmd);
    let (ok, said) = answer(&w.broker, &["approve", w.id()]);
    assert!(ok && said.contains("won"), "the restored record: {said}");
    wait_until(T, "the command ran", || ran.exists().then_some(()));
}
