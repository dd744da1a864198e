//! Approvals on the real Codex: what the app-server and the PermissionRequest hook do (the facts
//! Courier builds on), then Courier's pending approvals (`broker approvals`), answered once
//! through the owning app-server (`broker approve|deny`), and only by a person.

use std::path::Path;
use std::time::Duration;

use courier_tests::appserver::{ListeningAppServer, WsAppServer};
use courier_tests::hooks::Hook;
use courier_tests::util::{marker, str_field};
use courier_tests::{CodexEnv, Reply, ScriptedModel};
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
