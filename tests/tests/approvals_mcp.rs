//! MCP tool calls waiting on a person, on the real Codex: under `on-request` Codex asks before
//! calling an MCP tool that does not declare itself harmless (Courier's `send_message`), runs
//! its PermissionRequest hook first, and Courier lists the wait and answers it once.

use std::path::Path;
use std::time::Instant;

use courier_tests::approval_rig::*;
use courier_tests::hooks::Hook;
use courier_tests::util::{marker, str_field};
use courier_tests::{Broker, CodexEnv, Reply, Request, ScriptedModel};
use serde_json::{json, Value};

/// A hook that appends its stdin (one JSON payload) as a line to `log`.
fn logging_hook(event: &str, log: &Path) -> Hook {
    Hook::new(event, &format!("cat >> '{}'; echo >> '{}'", log.display(), log.display())).timeout(Some(10))
}

fn logged(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// Registers `broker mcp` as Codex's MCP server `courier` in `env` (Codex passes an MCP server
/// only a few variables of its own environment, so Courier's directories are given); `extra`:
/// more lines of its table.
fn register_mcp(env: &CodexEnv, extra: &str) {
    env.set_extra_config(&format!(
        "[mcp_servers.courier]\ncommand = {:?}\nargs = [\"mcp\"]\nenv = {{ COURIER_RUNTIME_DIR = {:?}, COURIER_STATE_DIR = {:?} }}\n{extra}",
        courier_tests::broker_bin().display().to_string(),
        env.runtime_dir.display().to_string(),
        env.state_dir.display().to_string()
    ));
}

/// The model finds Courier's tools (Codex defers MCP tools behind `tool_search`), calls
/// `send_message` to its own thread with `text`, then answers `done`.
fn sends_over_mcp(text: &str) -> impl FnMut(&Request) -> Reply + Send + 'static {
    let text = text.to_string();
    move |r| {
        let last = r.input().last().cloned().unwrap_or_default();
        match last["type"].as_str() {
            Some("message") => Reply::raw_items(vec![json!({
                "type": "tool_search_call", "call_id": "ts_courier", "execution": "client",
                "arguments": {"query": "courier send message to another thread"}})]),
            Some("tool_search_output") => {
                let to = r.thread_id().unwrap_or_default();
                Reply::call(Some("mcp__courier"), "send_message", json!({"thread": to, "text": text}))
            }
            _ => Reply::message("done"),
        }
    }
}

const ELICITATION: &str = "mcpServer/elicitation/request";

/// What Courier builds on, on the real app-server (on-request, read-only): an MCP tool call runs
/// PreToolUse, then PermissionRequest (`tool_name` the namespaced tool, `tool_input` its
/// arguments; no command, no call id), then the app-server asks its client with an MCP
/// elicitation whose `_meta` names the kind, the tool and its arguments (no item id); a client
/// that resumes the thread gets it replayed with the same id.
#[test]
fn app_server_mcp_tool_approval_facts() {
    let text = marker("MCP_FACTS");
    let model = ScriptedModel::start_with(sends_over_mcp(&text));
    let env = CodexEnv::new(&model);
    let log = env.root.join("hooks.log");
    env.install_hooks(&[logging_hook("PreToolUse", &log), logging_hook("PermissionRequest", &log)]);
    register_mcp(&env, "");
    let _broker = Broker::start_trusted(&env);
    let (server, mut owner, thread) = approving_thread(&env);
    owner.start_turn(&thread, "tell yourself", T);
    let req = owner.wait_server_request(ELICITATION, T, |p| p["threadId"] == thread.as_str());
    eprintln!("elicitation: {req}");
    let hooks = logged(&log);
    let events: Vec<&str> = hooks.iter().map(|h| str_field(h, "hook_event_name")).collect();
    assert_eq!(events, ["PreToolUse", "PermissionRequest"], "{hooks:?}");
    let perm = &hooks[1];
    assert_eq!(perm["tool_name"], "mcp__courier__send_message", "{perm}");
    assert_eq!(perm["tool_input"], json!({"thread": thread, "text": text}), "{perm}");
    assert!(perm.get("tool_use_id").is_none() && perm["tool_input"].get("command").is_none(), "{perm}");
    let meta = &req["params"]["_meta"];
    assert_eq!((meta["codex_approval_kind"].as_str(), meta["tool_name"].as_str()), (Some("mcp_tool_call"), Some("send_message")));
    assert_eq!(meta["tool_params"], perm["tool_input"]);
    assert_eq!(req["params"]["serverName"], "courier");
    assert!(req["params"].get("itemId").is_none(), "{req}");
    let mut other = server.client(T);
    other.initialize(true, T);
    other.request("thread/resume", json!({"threadId": thread}), T);
    let replayed = other.wait_server_request(ELICITATION, T, |p| p["threadId"] == thread.as_str());
    assert_eq!(replayed["id"], req["id"], "one JSON-RPC id for every client");
}

/// Courier's hooks on the same thread: the PermissionRequest hook of the MCP call gets its
/// ticket (no refusal, so `broker doctor` warns of nothing), the wait is listed as an `mcp_tool`
/// approval with the tool and its arguments, `broker threads` says the thread waits on a person,
/// and `broker approve` (the person's passphrase) answers the elicitation once: `won`, the tool
/// runs (its message is queued) and the turn ends.
#[test]
fn an_mcp_tool_call_waiting_on_a_person_is_listed_and_approved_once() {
    let text = marker("MCP_APPROVED");
    let model = ScriptedModel::start_with(sends_over_mcp(&text));
    let env = CodexEnv::with_hook_command(&model, &courier_tests::hook_command());
    register_mcp(&env, "");
    let broker = Broker::start_trusted(&env);
    broker.person_passphrase();
    let (_server, mut client, thread) = approving_thread(&env);
    let t0 = Instant::now();
    let turn = client.start_turn(&thread, "tell yourself", T);
    let req = client.wait_server_request(ELICITATION, T, |p| p["threadId"] == thread.as_str());
    let at_request = t0.elapsed();
    let (a, listed) = wait_listed(&broker, &thread, t0);
    eprintln!("turn/start -> elicitation {at_request:?}; -> listed {listed:?}");
    assert_eq!((a["kind"].as_str(), a["tool"].as_str()), (Some("mcp_tool"), Some("mcp__courier__send_message")), "{a}");
    let args: Value = serde_json::from_str(str_field(&a, "command")).unwrap();
    assert_eq!(args, json!({"thread": thread, "text": text}), "{a}");
    let table = broker.run_ok(&["approvals"]);
    assert!(table.contains("tool call: mcp__courier__send_message"), "{table}");
    let listing = broker.run_ok(&["threads"]);
    assert!(listing.contains(&format!("waits on a person (approval {}", str_field(&a, "id"))), "{listing}");
    let refused = courier_tests::broker::refusals(&broker.inspect_json());
    assert!(refused.is_empty(), "Codex's own hook was refused: {refused:#?}");
    let doctor = broker.run(&["doctor"]);
    let said = String::from_utf8_lossy(&doctor.stdout);
    assert!(said.contains("no refused hook calls"), "{said}");

    let t1 = Instant::now();
    let (ok, said) = answer(&broker, &["approve", str_field(&a, "id")]);
    assert!(ok && said.contains("won"), "approve: {said}");
    eprintln!("broker approve -> won {:?}", t1.elapsed());
    let resolved = client.wait_notification("serverRequest/resolved", T, |p| p["threadId"] == thread.as_str());
    assert_eq!(resolved["requestId"], req["id"]);
    client.wait_turn_completed(&turn, T);
    let msgs = courier_tests::broker::messages(&broker.inspect_json());
    let sent: Vec<&Value> = msgs.iter().filter(|m| m["thread"] == thread.as_str()).collect();
    assert_eq!(sent.len(), 1, "the tool ran once: {msgs:#?}");
    let (ok, said) = answer(&broker, &["deny", str_field(&a, "id")]);
    assert!(!ok && said.contains("not_pending"), "{said}");
    let all = approvals(&broker, true);
    let done = all.iter().find(|x| x["id"] == a["id"]).unwrap();
    assert_eq!((done["state"].as_str(), done["answer"]["outcome"].as_str()), (Some("answered"), Some("won")), "{done}");
}

/// What `broker install --allow-courier-tools` writes (`default_tools_approval_mode = "approve"`
/// in Courier's entry) is what the real Codex reads: the same on-request thread calls
/// `send_message` with no elicitation and no approval listed, and the message is queued.
#[test]
fn courier_tools_allowed_run_without_asking() {
    let text = marker("MCP_ALLOWED");
    let model = ScriptedModel::start_with(sends_over_mcp(&text));
    let env = CodexEnv::with_hook_command(&model, &courier_tests::hook_command());
    register_mcp(&env, "default_tools_approval_mode = \"approve\"\n");
    let broker = Broker::start_trusted(&env);
    let (_server, mut client, thread) = approving_thread(&env);
    let turn = client.start_turn(&thread, "tell yourself", T);
    client.wait_turn_completed(&turn, T);
    let msgs = courier_tests::broker::messages(&broker.inspect_json());
    assert_eq!(msgs.iter().filter(|m| m["thread"] == thread.as_str()).count(), 1, "the tool ran: {msgs:#?}");
    assert!(approvals(&broker, true).is_empty(), "nothing waited on a person");
    assert!(client.server_requests.is_empty(), "the client was asked: {:?}", client.server_requests);
}
