//! The answers Courier does not offer, and why (facts on the real Codex): `acceptForSession`
//! (a command's, and a permission grant's `scope: session`) approves later requests that Courier
//! never sees or lists; `cancel` declines and interrupts the whole turn.

use courier_tests::approval_rig::*;
use courier_tests::hooks::Hook;
use courier_tests::{CodexEnv, Reply, Request, ScriptedModel};
use serde_json::{json, Value};

fn escalated(call_id: &str, cmd: &str) -> Value {
    json!({"type": "function_call", "call_id": call_id, "name": "exec_command", "arguments": json!({
        "cmd": cmd, "yield_time_ms": 2000, "sandbox_permissions": "require_escalated", "justification": "to see"}).to_string()})
}

/// The model makes `calls` one per reply (each after the previous one's output), then `done`.
fn one_by_one(calls: Vec<Value>) -> impl FnMut(&Request) -> Reply + Send + 'static {
    move |r| match calls.get(r.tool_outputs().len()) {
        Some(c) => Reply::raw_items(vec![c.clone()]),
        None => Reply::message("done"),
    }
}

fn logged(log: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(log).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// `acceptForSession` on a command's request: the request does not offer it (`availableDecisions`
/// is `accept`, `acceptWithExecpolicyAmendment`, `cancel`), Codex takes it anyway, and the same
/// command asked again later in the session runs with no request (its PermissionRequest hook
/// still runs); another command still asks.
#[test]
fn accept_for_session_approves_later_runs_courier_never_sees() {
    let model = ScriptedModel::start_with(|_r: &Request| Reply::message("done"));
    let env = CodexEnv::new(&model);
    let (ran, other) = (env.root.join("ran"), env.root.join("other"));
    let again = format!("echo x >> {}", ran.display());
    model.set_script(one_by_one(vec![
        escalated("call_1", &again),
        escalated("call_2", &again),
        escalated("call_3", &format!("echo y >> {}", other.display())),
    ]));
    let log = env.root.join("hooks.log");
    env.install_hooks(&[Hook::new("PermissionRequest", &format!("cat >> '{0}'; echo >> '{0}'", log.display())).timeout(Some(10))]);
    let (_server, mut client, thread) = approving_thread(&env);
    let turn = client.start_turn(&thread, "run them", T);
    let first = client.wait_server_request(REQUEST_APPROVAL, T, |p| p["threadId"] == thread.as_str());
    let offered: Vec<String> = first["params"]["availableDecisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().map(str::to_string).unwrap_or_else(|| d.as_object().unwrap().keys().next().unwrap().clone()))
        .collect();
    assert_eq!(offered, ["accept", "acceptWithExecpolicyAmendment", "cancel"], "{first}");
    client.respond(&first["id"], json!({"decision": "acceptForSession"}));
    let next =
        client.wait_server_request_where("the next approval request", T, |m| m["method"] == REQUEST_APPROVAL && m["id"] != first["id"]);
    assert_eq!(next["params"]["itemId"], "call_3", "call_2 (the same command) asked nothing: {next}");
    assert_eq!(std::fs::read_to_string(&ran).unwrap().lines().count(), 2, "the command ran twice on one answer");
    let asked: Vec<String> = logged(&log).iter().map(|h| h["tool_input"]["command"].as_str().unwrap_or_default().to_string()).collect();
    // The PermissionRequest hook still runs for the second run (Courier lists it until its
    // PostToolUse), but no request is sent: nobody answers it.
    assert_eq!(asked.iter().filter(|c| **c == again).count(), 2, "{asked:?}");
    client.respond(&next["id"], json!({"decision": "decline"}));
    client.wait_turn_completed(&turn, T);
}

/// `cancel`: the command does not run and the turn is interrupted at once (the model is not
/// asked again in that turn).
#[test]
fn cancel_interrupts_the_turn() {
    let model = ScriptedModel::start_with(|_r: &Request| Reply::message("done"));
    let env = CodexEnv::new(&model);
    let ran = env.root.join("ran");
    model.set_script(one_by_one(vec![escalated("call_1", &format!("touch {}", ran.display()))]));
    let (_server, mut client, thread) = approving_thread(&env);
    let turn = client.start_turn(&thread, "run it", T);
    let req = client.wait_server_request(REQUEST_APPROVAL, T, |p| p["threadId"] == thread.as_str());
    let before = model.requests().len();
    client.respond(&req["id"], json!({"decision": "cancel"}));
    let done = client.wait_notification("turn/completed", T, |p| p["turn"]["id"] == turn.as_str());
    eprintln!("turn/completed after cancel: {done}");
    assert_eq!(done["turn"]["status"], "interrupted", "{done}");
    assert!(!ran.exists());
    assert_eq!(model.requests().len(), before, "the model is not asked again in the turn");
}

/// A permission grant at `scope: session` outlives the turn: in the next turn the model writes
/// there with no request at all.
#[test]
fn a_session_grant_outlives_the_turn() {
    let model = ScriptedModel::start_with(|_r: &Request| Reply::message("done"));
    let env = CodexEnv::new(&model);
    env.set_extra_config("[features]\nrequest_permissions_tool = true\n");
    let dir = env.root.join("outside");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("later.txt");
    let ask = json!({"type": "function_call", "call_id": "call_ask", "name": "request_permissions", "arguments":
        json!({"permissions": {"file_system": {"write": [dir.display().to_string()]}}}).to_string()});
    model.set_script(one_by_one(vec![ask]));
    let (_server, mut client, thread) = approving_thread(&env);
    let turn = client.start_turn(&thread, "ask", T);
    let req = client.wait_server_request("item/permissions/requestApproval", T, |p| p["threadId"] == thread.as_str());
    client.respond(&req["id"], json!({"permissions": req["params"]["permissions"], "scope": "session"}));
    client.wait_turn_completed(&turn, T);
    let write = json!({"type": "function_call", "call_id": "call_w", "name": "exec_command", "arguments":
        json!({"cmd": format!("echo later > {}", file.display()), "yield_time_ms": 2000}).to_string()});
    model.set_script(move |r: &Request| {
        if r.user_messages().iter().any(|m| m.contains("write it")) && !r.body.to_string().contains("call_w") {
            Reply::raw_items(vec![write.clone()])
        } else {
            Reply::message("done")
        }
    });
    let turn2 = client.start_turn(&thread, "write it", T);
    client.wait_turn_completed(&turn2, T);
    assert!(!client.server_requests.iter().any(|m| m["id"] != req["id"]), "no request in the next turn");
    assert_eq!(std::fs::read_to_string(&file).unwrap_or_default(), "later\n", "the session grant wrote in the next turn");
}
