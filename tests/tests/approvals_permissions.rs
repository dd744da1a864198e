//! Permission approvals on the real Codex: the model's `request_permissions` tool (feature flag
//! `request_permissions_tool`) asks a person for more sandbox permissions. What Codex does (no
//! PermissionRequest hook runs; PreToolUse names the call; the app-server sends
//! `item/permissions/requestApproval` with the permissions it resolved, and takes the permissions
//! granted as the answer), then Courier's side: the request listed with what it asks, answered
//! once with exactly those permissions or none, and an answer never crossing kinds.

use std::path::PathBuf;
use std::time::Instant;

use courier_tests::approval_rig::*;
use courier_tests::hooks::Hook;
use courier_tests::util::{marker, str_field, wait_until};
use courier_tests::{hook_command, Broker, CodexEnv, Reply, Request, ScriptedModel};
use serde_json::{json, Value};

const PERMISSIONS_APPROVAL: &str = "item/permissions/requestApproval";
const FEATURE: &str = "[features]\nrequest_permissions_tool = true\n";
const REASON: &str = "to write the report";

/// The model's `request_permissions` call asking to write `dir`.
fn ask_call(call_id: &str, dir: &str) -> Value {
    let args = json!({"permissions": {"file_system": {"write": [dir]}}, "reason": REASON});
    json!({"type": "function_call", "call_id": call_id, "name": "request_permissions", "arguments": args.to_string()})
}

/// The model sends `items` in one reply, then (once every call has its output) runs `then`
/// (unescalated: it writes outside the workspace only with the permissions granted), then says
/// `done`.
fn ask_then(items: Vec<Value>, then: Option<String>) -> impl FnMut(&Request) -> Reply + Send + 'static {
    move |r| {
        let asked = items.iter().filter(|i| i.get("call_id").is_some()).count();
        match (r.tool_outputs().len(), &then) {
            (0, _) => Reply::raw_items(items.clone()),
            (n, Some(cmd)) if n == asked => Reply::call(None, "exec_command", json!({"cmd": cmd, "yield_time_ms": 2000})),
            _ => Reply::message("done"),
        }
    }
}

/// A Courier-hooked environment with the feature on, whose model asks to write `dir` (outside
/// the workspace) and then writes `file` there with the line `line`.
struct Asking {
    model: ScriptedModel,
    env: CodexEnv,
    dir: PathBuf,
    file: PathBuf,
    line: String,
}

fn asking(name: &str) -> Asking {
    let model = ScriptedModel::start_with(|_r: &Request| Reply::message("done"));
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    env.set_extra_config(FEATURE);
    let dir = env.root.join("outside");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{name}.txt"));
    let line = marker(name);
    let write = format!("echo {line} > {}", file.display());
    model.set_script(ask_then(vec![ask_call("call_ask", &dir.display().to_string())], Some(write)));
    Asking { model, env, dir, file, line }
}

/// What Courier relies on. The tool is offered only with the feature on. Asked, Codex runs
/// PreToolUse (`tool_name` `request_permissions`, `tool_input` the call's arguments, `tool_use_id`
/// the call id) and no PermissionRequest hook; the request carries the call id as `itemId`, the
/// reason and the permissions as Codex resolved them; a client that resumes the thread gets it
/// replayed (the thread shows no item for it); the answer is the permissions granted, and with
/// those granted the model's next command writes where it asked to.
#[test]
fn app_server_permissions_facts() {
    let off = ScriptedModel::start_with(|_r: &Request| Reply::message("done"));
    let off_env = CodexEnv::with_hook_command(&off, &hook_command());
    let (_off_server, mut c, t) = approving_thread(&off_env);
    c.run_turn(&t, "hi", T);
    assert!(!off.requests()[0].tool_names().iter().any(|n| n == "request_permissions"), "not offered without the feature");

    let a = asking("FACTS");
    let log = a.env.root.join("hooks.log");
    let logging = |event: &str| Hook::new(event, &format!("cat >> '{0}'; echo >> '{0}'", log.display())).timeout(Some(10));
    a.env.install_hooks(&[logging("PreToolUse"), logging("PermissionRequest"), logging("PostToolUse")]);
    let (server, mut owner, thread) = approving_thread(&a.env);
    let turn = owner.start_turn(&thread, "ask", T);
    let req = owner.wait_server_request(PERMISSIONS_APPROVAL, T, |r| r["threadId"] == thread.as_str());
    eprintln!("requestApproval: {req}");
    assert!(a.model.requests()[0].tool_names().iter().any(|n| n == "request_permissions"), "offered with the feature");
    let dir = a.dir.display().to_string();
    let p = &req["params"];
    assert_eq!((p["itemId"].as_str(), p["turnId"].as_str(), p["reason"].as_str()), (Some("call_ask"), Some(turn.as_str()), Some(REASON)));
    assert_eq!(p["permissions"]["fileSystem"]["write"], json!([dir]), "{p}");
    assert_eq!(p["permissions"]["fileSystem"]["entries"], json!([{"path": {"type": "path", "path": dir}, "access": "write"}]), "{p}");

    let hooks: Vec<Value> = std::fs::read_to_string(&log).unwrap().lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let events: Vec<&str> = hooks.iter().map(|h| str_field(h, "hook_event_name")).collect();
    assert_eq!(events, ["PreToolUse"], "no PermissionRequest hook for a permission request: {hooks:?}");
    assert_eq!(hooks[0]["tool_name"], "request_permissions");
    assert_eq!(hooks[0]["tool_use_id"], "call_ask");
    assert_eq!(hooks[0]["tool_input"], json!({"permissions": {"file_system": {"write": [dir]}}, "reason": REASON}));

    let mut other = server.client(T);
    other.initialize(true, T);
    let resumed = other.request("thread/resume", json!({"threadId": thread}), T);
    assert_eq!(resumed.pointer("/thread/status/activeFlags"), Some(&json!(["waitingOnApproval"])), "{resumed}");
    assert!(!resumed.to_string().contains("call_ask"), "no item for the request: {resumed}");
    let replayed = other.wait_server_request(PERMISSIONS_APPROVAL, T, |r| r["threadId"] == thread.as_str());
    assert_eq!(replayed["id"], req["id"]);
    other.respond(&replayed["id"], json!({"permissions": replayed["params"]["permissions"], "scope": "turn"}));
    owner.wait_turn_completed(&turn, T);
    let granted: Value = serde_json::from_str(&tool_output(&a.model, "call_ask")).unwrap();
    assert_eq!(granted, json!({"permissions": {"network": null, "file_system": {"write": [dir]}}, "scope": "turn"}));
    assert_eq!(std::fs::read_to_string(&a.file).unwrap(), format!("{}\n", a.line), "granted: the next command wrote there");
    let after: Vec<String> = std::fs::read_to_string(&log).unwrap().lines().map(str::to_string).collect();
    assert!(after.iter().any(|l| l.contains("\"PostToolUse\"") && l.contains("call_ask")), "PostToolUse of the call follows the answer");
}

/// The request listed with what it asks (kind, tool, call, the paths, the reason); `broker
/// approve` grants exactly that, once: `won`, the model's next command writes there; a second
/// answer is refused and sends nothing.
#[test]
fn approve_grants_exactly_what_was_asked_once() {
    let a = asking("GRANTED");
    let broker = Broker::start_trusted(&a.env);
    let (_server, mut client, thread) = approving_thread(&a.env);
    let turn = client.start_turn(&thread, "ask", T);
    client.wait_server_request(PERMISSIONS_APPROVAL, T, |r| r["threadId"] == thread.as_str());
    let (listed, seen) = wait_listed(&broker, &thread, Instant::now());
    eprintln!("listed {seen:?} after the request reached the client: {listed}");
    let dir = a.dir.display().to_string();
    assert_eq!(listed["kind"], "permissions", "{listed}");
    assert_eq!(listed["tool"], "request_permissions");
    assert_eq!(listed["call_id"], "call_ask");
    assert_eq!(listed["command"], format!("write: {dir}"));
    assert_eq!(listed["reason"], REASON);
    let table = broker.run_ok(&["approvals"]);
    assert!(table.contains(&format!("permissions: write: {dir}  ({REASON})")), "{table}");

    let id = str_field(&listed, "id");
    let t0 = Instant::now();
    let (ok, out) = answer(&broker, &["approve", id]);
    let answered = t0.elapsed();
    assert!(ok && out.contains("won"), "{out}");
    wait_until(T, "the granted command writes", || a.file.exists().then_some(()));
    eprintln!("approve: {answered:?}; the write ran {:?} after approve began", t0.elapsed());
    client.wait_turn_completed(&turn, T);
    assert_eq!(std::fs::read_to_string(&a.file).unwrap(), format!("{}\n", a.line));
    assert!(tool_output(&a.model, "call_ask").contains(&dir), "the model was told what it got");
    let (again, out) = answer(&broker, &["deny", id]);
    assert!(!again && out.contains("not_pending"), "{out}");
    assert_eq!(approvals(&broker, true)[0]["answer"]["outcome"], "won");
}

/// `broker deny --message` grants nothing (the model's write fails) and the model reads the
/// message, naming what it asked for.
#[test]
fn deny_grants_nothing_and_the_message_reaches_the_model() {
    let a = asking("REFUSED");
    let broker = Broker::start_trusted(&a.env);
    let (_server, mut client, thread) = approving_thread(&a.env);
    let turn = client.start_turn(&thread, "ask", T);
    client.wait_server_request(PERMISSIONS_APPROVAL, T, |r| r["threadId"] == thread.as_str());
    let (listed, _) = wait_listed(&broker, &thread, Instant::now());
    let why = marker("WRITE_IN_THE_WORKSPACE");
    let (ok, out) = answer(&broker, &["deny", str_field(&listed, "id"), "--message", &why]);
    assert!(ok && out.contains("won"), "{out}");
    let got: Value = serde_json::from_str(&tool_output(&a.model, "call_ask")).unwrap();
    assert_eq!(got["permissions"], json!({"network": null, "file_system": null}), "nothing granted");
    a.model.wait_for(T, "the deny message reaches the model", |r| r.body_contains(&why));
    client.wait_turn_completed(&turn, T);
    assert!(!a.file.exists(), "denied: the write failed");
    let r = a.model.requests().into_iter().find(|r| r.body_contains(&why)).unwrap();
    assert!(r.body_contains(&format!("Your request for permissions (write: {}) was denied", a.dir.display())));
}

/// An answer never crosses kinds. The model asks for a command (escalated) and for permissions
/// in one reply; the person answers the first request at the app-server, so its approval may
/// still be listed while the second, of the other kind, waits. Answering the first sends nothing
/// and leaves the second waiting; the second is then answered as itself. Both orders.
#[test]
fn an_answer_never_crosses_kinds() {
    for permissions_first in [false, true] {
        let a = asking(if permissions_first { "PERMISSIONS_FIRST" } else { "COMMAND_FIRST" });
        let ran = a.env.root.join("ran");
        let exec = json!({"type": "function_call", "call_id": "call_cmd", "name": "exec_command", "arguments": json!({
            "cmd": format!("touch {}", ran.display()), "yield_time_ms": 2000,
            "sandbox_permissions": "require_escalated", "justification": "to cross"}).to_string()});
        let ask = ask_call("call_ask", &a.dir.display().to_string());
        let items = if permissions_first { vec![ask, exec] } else { vec![exec, ask] };
        a.model.set_script(ask_then(items, None));
        let broker = Broker::start_trusted(&a.env);
        let (_server, mut client, thread) = approving_thread(&a.env);
        let turn = client.start_turn(&thread, "do both", T);
        let is_approval = |m: &Value| m["method"] == REQUEST_APPROVAL || m["method"] == PERMISSIONS_APPROVAL;
        let first = client.wait_server_request_where("an approval request", T, is_approval);
        let stale = wait_until(T, "the first approval listed", || {
            let kind = if first["method"] == PERMISSIONS_APPROVAL { "permissions" } else { "command" };
            approvals(&broker, false).into_iter().find(|x| x["thread"] == thread.as_str() && x["kind"] == kind)
        });
        // The person answers the first at the app-server: nothing granted, nothing run.
        let person = if first["method"] == PERMISSIONS_APPROVAL { json!({"permissions": {}}) } else { json!({"decision": "decline"}) };
        client.respond(&first["id"], person);
        let (_second, fresh) = stale_answer_sends_nothing(&broker, &mut client, &thread, &first, &stale, is_approval);
        assert!(!ran.exists(), "no command ran");
        let (ok, out) = answer(&broker, &["approve", str_field(&fresh, "id")]);
        assert!(ok && out.contains("won"), "the waiting request is answered as itself: {out}");
        client.wait_turn_completed(&turn, T);
        let granted = tool_output(&a.model, "call_ask").contains(&a.dir.display().to_string());
        let approved = if fresh["kind"] == "permissions" { granted && !ran.exists() } else { ran.exists() && !granted };
        assert!(approved, "exactly the second one was approved (permissions first: {permissions_first})");
    }
}

/// The person answers first, at the app-server: the approval leaves the list (resolved by the
/// turn's Stop hook; the call's PostToolUse is refused at the gate, its rollout showing no output
/// for the call yet) and a later `approve` is refused, sending nothing.
#[test]
fn the_person_answering_first_leaves_nothing_to_answer() {
    let a = asking("PERSON_FIRST");
    let broker = Broker::start_trusted(&a.env);
    let (_server, mut client, thread) = approving_thread(&a.env);
    let turn = client.start_turn(&thread, "ask", T);
    let req = client.wait_server_request(PERMISSIONS_APPROVAL, T, |r| r["threadId"] == thread.as_str());
    let (listed, _) = wait_listed(&broker, &thread, Instant::now());
    client.respond(&req["id"], json!({"permissions": {}, "scope": "turn"}));
    client.wait_turn_completed(&turn, T);
    let settled = wait_until(T, "the approval resolved", || {
        approvals(&broker, true).into_iter().find(|x| x["id"] == listed["id"] && x["state"] == "resolved")
    });
    eprintln!("resolved: {}", settled["detail"]);
    assert!(approvals(&broker, false).is_empty(), "no longer listed");
    let (ok, out) = answer(&broker, &["approve", str_field(&listed, "id")]);
    assert!(!ok && out.contains("not_pending"), "{out}");
    assert!(!a.file.exists(), "nothing granted: the write failed");
}

/// A message sent while a permission request waits goes with the turn's next hook, not the
/// request's own PostToolUse. Codex writes no `item_completed` for `request_permissions`: its
/// PostToolUse runs with the rollout as it stood while the person had not answered, the state in
/// which any process running beside the call could present the same hook, so the gate refuses it
/// (`no_ticket`, `codex::proof::ticket`) and the message goes at the next command's PreToolUse.
#[test]
fn a_message_sent_while_a_permission_request_waits_goes_with_the_next_hook() {
    let a = asking("MIDASK");
    let broker = Broker::start_trusted(&a.env);
    let (_server, mut client, thread) = approving_thread(&a.env);
    let turn = client.start_turn(&thread, "ask", T);
    let req = client.wait_server_request(PERMISSIONS_APPROVAL, T, |r| r["threadId"] == thread.as_str());
    let text = marker("WHILE_ASKING");
    let id = broker.send_opts(&thread, &text, None, Some("e2e"));
    client.respond(&req["id"], json!({"permissions": req["params"]["permissions"], "scope": "turn"}));
    client.wait_turn_completed(&turn, T);
    let m = broker.wait_state(&id, "confirmed", T);
    assert_eq!(str_field(&m, "event"), "PreToolUse", "taken by the next command's PreToolUse: {m}");
    let refused: Vec<Value> =
        courier_tests::broker::refusals(&broker.inspect_json()).into_iter().filter(|r| r["thread"] == thread.as_str()).collect();
    assert_eq!(refused.len(), 1, "only the request's PostToolUse refused: {refused:?}");
    assert_eq!((refused[0]["event"].as_str(), refused[0]["reason"].as_str()), (Some("PostToolUse"), Some("no_ticket")), "{refused:?}");
    assert!(refused[0].to_string().contains("call_ask"), "{refused:?}");
    // The model read it once, in the request after the command's output.
    let reqs = a.model.requests();
    let first = reqs.iter().position(|r| r.body_contains(&text)).expect("the message reached the model");
    assert_eq!(reqs[first].tool_outputs().len(), 2, "with the request's and the next command's outputs");
    assert_eq!(reqs[first].items_containing(&text), 1);
    assert!(a.file.exists(), "the granted write ran");
}
