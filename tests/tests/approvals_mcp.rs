//! MCP tool calls waiting on a person, on the real Codex: under `on-request` Codex asks before
//! calling an MCP tool that does not declare itself harmless (Courier's `send_message`), runs
//! its PermissionRequest hook first, and Courier lists the wait and answers it once.

use std::path::Path;

use courier_tests::approval_rig::*;
use courier_tests::hooks::Hook;
use courier_tests::util::str_field;
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

/// What Courier builds on, on the real app-server (on-request, read-only): an MCP tool call runs
/// PreToolUse, then PermissionRequest (`tool_name` the namespaced tool, `tool_input` its
/// arguments: no command), then the app-server asks its client.
#[test]
fn app_server_mcp_tool_approval_facts() {
    let model = ScriptedModel::start_with(sends_over_mcp("MCP_FACTS"));
    let env = CodexEnv::new(&model);
    let log = env.root.join("hooks.log");
    env.install_hooks(&[logging_hook("PreToolUse", &log), logging_hook("PermissionRequest", &log), logging_hook("PostToolUse", &log)]);
    register_mcp(&env, "");
    let _broker = Broker::start_trusted(&env);
    let (server, mut owner, thread) = approving_thread(&env);
    let turn = owner.start_turn(&thread, "tell yourself", T);
    let req = owner.wait_server_request_where("a server request", T, |m| m["params"]["threadId"] == thread.as_str());
    eprintln!("server request: {req}");
    let hooks = logged(&log);
    for h in &hooks {
        eprintln!("hook: {h}");
    }
    let mut other = server.client(T);
    other.initialize(true, T);
    let resumed = other.request("thread/resume", json!({"threadId": thread}), T);
    eprintln!("resumed: {resumed}");
    let replayed = other.wait_server_request_where("the replay", T, |m| m["params"]["threadId"] == thread.as_str());
    eprintln!("replayed: {replayed}");
    assert_eq!(replayed["id"], req["id"]);
    let _ = (turn, str_field(&req, "method"));
    panic!("facts printed");
}
