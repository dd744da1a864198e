//! Approvals on the real Codex: what the app-server and the PermissionRequest hook do (the facts
//! Courier builds on), then Courier's pending approvals (`broker approvals`), answered once
//! through the owning app-server (`broker approve|deny`), and only by a person.

use std::path::Path;
use std::time::{Duration, Instant};

use courier_tests::appserver::{ListeningAppServer, WsAppServer};
use courier_tests::hooks::Hook;
use courier_tests::util::{marker, str_field, wait_until};
use courier_tests::{hook_command, Broker, CodexEnv, Reply, ScriptedModel};
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(20);
const REQUEST_APPROVAL: &str = "item/commandExecution/requestApproval";

/// The model asks once to run `cmd` outside the sandbox (`require_escalated`, with `reason` as
/// its justification), then answers `done`.
fn escalated_then_done(cmd: &str, reason: &str) -> impl FnMut(&courier_tests::Request) -> Reply + Send + 'static {
    let (cmd, reason) = (cmd.to_string(), reason.to_string());
    move |r| {
        if r.function_calls().is_empty() {
            let args = json!({"cmd": cmd, "yield_time_ms": 2000, "sandbox_permissions": "require_escalated", "justification": reason});
            Reply::call(None, "exec_command", args)
        } else {
            Reply::message("done")
        }
    }
}

/// A `codex app-server --listen unix://` and a client with a thread that asks for approvals
/// (on-request, read-only sandbox).
fn approving_thread(env: &CodexEnv) -> (ListeningAppServer, WsAppServer, String) {
    let server = ListeningAppServer::start(env.codex_command(), env.root.join("as.sock"), &[], env.root.join("app-server.log"));
    let mut client = server.client(T);
    client.initialize(true, T);
    let r = client.request(
        "thread/start",
        json!({"cwd": env.work.display().to_string(), "approvalPolicy": "on-request", "sandbox": "read-only"}),
        T,
    );
    let thread = r.pointer("/thread/id").and_then(Value::as_str).expect("thread id").to_string();
    (server, client, thread)
}

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

/// `broker approvals --json`'s list.
fn approvals(broker: &Broker, all: bool) -> Vec<Value> {
    let mut args = vec!["approvals", "--json"];
    if all {
        args.push("--all");
    }
    let out: Value = serde_json::from_str(&broker.run_ok(&args)).expect("approvals --json");
    out["approvals"].as_array().cloned().unwrap_or_default()
}

/// Waits (bounded) until `broker approvals` lists one for `thread`; returns it and how long it took.
fn wait_listed(broker: &Broker, thread: &str, since: Instant) -> (Value, Duration) {
    let a = wait_until(T, "the approval listed", || approvals(broker, false).into_iter().find(|a| a["thread"] == thread));
    (a, since.elapsed())
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
