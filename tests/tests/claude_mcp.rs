//! Courier's MCP server for Claude Code agents, and Claude Code sessions' busy/idle, on the real
//! pinned binaries (`COURIER_CLAUDE_BIN`, `COURIER_CODEX_BIN`): `broker install` registers
//! `broker mcp` in Claude Code's user config (`~/.claude.json`, or `$CLAUDE_CONFIG_DIR/.claude.json`)
//! where the real `claude mcp list` finds it, doctor names a removed registration, uninstall takes
//! out only Courier's entry; a real `claude -p` whose model calls Courier's MCP tools sees its own
//! session busy in `list_threads` and sends as that session, verified; a process under no claude
//! claiming the session is not. docs/claude-code.md, "MCP".
//!
//! Skips (and says so) only when COURIER_CLAUDE_BIN is unset; `install/test.sh` sets it.

use std::io::{BufRead, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier_tests::claude::gate::{message_by_key, of_host, serve_hooks};
use courier_tests::claude::{claude_bin, env_or_skip, say_skipped, ClaudeEnv};
use courier_tests::install_rig::{text, Rig};
use courier_tests::messages::{content_text, ScriptedMessages, Turn};
use courier_tests::{broker_bin, Broker, CodexEnv};
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(30);

/// Registers `broker mcp` in `cenv`'s `~/.claude.json` as install writes it (the runtime
/// directory in its env) and allows its tools without a prompt.
fn register_courier_mcp(cenv: &ClaudeEnv, env: &CodexEnv) {
    let state = cenv.home.join(".claude.json");
    let mut doc: Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    doc["mcpServers"] = json!({"courier": {"type": "stdio", "command": broker_bin(), "args": ["mcp"],
        "env": {"COURIER_RUNTIME_DIR": env.runtime_dir}}});
    std::fs::write(&state, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    let settings = cenv.home.join(".claude/settings.json");
    let mut doc: Value = serde_json::from_slice(&std::fs::read(&settings).unwrap()).unwrap();
    doc["permissions"]["allow"] = json!(["Bash", "mcp__courier"]);
    std::fs::write(&settings, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
}

/// One `tools/call` of `broker mcp` on stdio from this process (no host above it), with `extra`
/// environment: the tool's text, parsed.
fn mcp_call(env: &CodexEnv, extra: &[(&str, &str)], tool: &str, args: Value) -> Value {
    let mut child =
        env.command(broker_bin()).arg("mcp").envs(extra.iter().copied()).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Value>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for v in std::io::BufReader::new(stdout).lines().map_while(Result::ok).filter_map(|l| serde_json::from_str(&l).ok()) {
            let _ = tx.send(v);
        }
    });
    let answer = |id: u64| loop {
        let v: Value = rx.recv_timeout(T).unwrap_or_else(|e| panic!("broker mcp answered no request {id}: {e}"));
        if v["id"] == id {
            break v;
        }
    };
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-03-26",
        "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}});
    writeln!(stdin, "{init}").unwrap();
    answer(1);
    writeln!(stdin, r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#).unwrap();
    writeln!(stdin, "{}", json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": tool, "arguments": args}})).unwrap();
    let reply = answer(2);
    let _ = child.kill();
    let _ = child.wait();
    let text = reply.pointer("/result/content/0/text").and_then(Value::as_str).unwrap_or_else(|| panic!("{reply}"));
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The text of the `n`th tool result Claude Code sent the model, parsed as Courier's JSON.
fn tool_result(api: &ScriptedMessages, n: usize) -> Value {
    let requests = api.requests();
    let last = requests.last().unwrap_or_else(|| panic!("no requests"));
    let results = last.tool_results();
    let text = content_text(results.get(n).unwrap_or_else(|| panic!("no tool result {n}: {}", api.dump())));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("tool result {n} is not JSON ({e}): {text}"))
}

/// A real `claude -p` whose model calls Courier's MCP tools (registered in `~/.claude.json` as
/// install writes them): `list_threads` shows the session itself `busy` (its turn is open, told
/// by its proven hooks) beside the busy Codex thread; `send_message` to that Codex thread is
/// queued from `thread:<session>`, verified: the `broker mcp` claude started runs under the very
/// claude the session is pinned to. The same call from a process under no claude, claiming the
/// session in `CLAUDE_CODE_SESSION_ID`, is sent as `mcp` with the reason.
#[test]
fn a_claude_code_agent_lists_threads_and_sends_over_courier_mcp_as_its_verified_session() {
    let (_model, env, hold) = CodexEnv::with_held_turn();
    let port = serve_hooks(&env);
    let target: Arc<Mutex<String>> = Arc::default();
    let to = Arc::clone(&target);
    let api = ScriptedMessages::start_with(move |r| match r.tool_results().len() {
        0 => Turn::tool_use("mcp__courier__list_threads", json!({})),
        1 => Turn::tool_use("mcp__courier__send_message", json!({"thread": *to.lock().unwrap(), "text": "HELLO codex", "key": "over-mcp"})),
        _ => Turn::text("done"),
    });
    let Some(cenv) = env_or_skip(&api) else {
        hold.release();
        return;
    };
    cenv.set_courier_hooks(port);
    register_courier_mcp(&cenv, &env);
    let broker = Broker::start_trusted(&env);
    broker.trust_claude(&cenv.claude);
    let codex = env.spawn_exec("CODEX keep busy");
    hold.wait_held(1, T);
    let thread = codex.wait_thread_id(T);
    *target.lock().unwrap() = thread.clone();

    let out = cenv.print("use courier");
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());
    let all = broker.threads_json(true);
    let sid = of_host(&all, "claude-code").first().map(|t| t["id"].as_str().unwrap().to_string()).expect("the session is listed");

    let listed = tool_result(&api, 0);
    let threads = listed["threads"].as_array().cloned().unwrap_or_default();
    let by_id = |id: &str| threads.iter().find(|t| t["id"] == id).cloned().unwrap_or_else(|| panic!("{id} not listed: {listed:#}"));
    let (me, codex_thread) = (by_id(&sid), by_id(&thread));
    assert_eq!((me["host"].as_str(), me["state"].as_str()), (Some("claude-code"), Some("busy")), "{me}");
    assert_eq!((codex_thread["host"].as_str(), codex_thread["state"].as_str()), (Some("codex"), Some("busy")), "{codex_thread}");

    let sent = tool_result(&api, 1);
    assert!(sent["id"].as_str().is_some_and(|id| id.starts_with("m_")) && sent.get("sender_note").is_none(), "{sent}");
    let msg = message_by_key(&broker, "over-mcp");
    assert_eq!((msg["thread"].as_str(), msg["from"].as_str()), (Some(thread.as_str()), Some(format!("thread:{sid}").as_str())), "{msg}");

    // A process under no claude claiming the session is not it.
    let forged =
        mcp_call(&env, &[("CLAUDE_CODE_SESSION_ID", &sid)], "send_message", json!({"thread": thread, "text": "x", "key": "forged"}));
    let note = forged["sender_note"].as_str().unwrap_or_else(|| panic!("no sender_note: {forged}"));
    assert!(note.contains("no trusted Codex, Claude Code or Copilot CLI executable"), "{note}");
    assert_eq!(message_by_key(&broker, "forged")["from"], "mcp");
    hold.release();
    assert!(codex.wait(T).status.success());
}

/// `claude args` with `home` as HOME and `extra` environment: its stdout.
fn claude_in(claude: &Path, home: &Path, extra: &[(&str, &Path)], args: &[&str]) -> String {
    let mut c = Command::new(claude);
    c.args(args).env_clear().env("HOME", home).env("PATH", "/usr/bin:/bin").current_dir(home);
    for v in ["DISABLE_TELEMETRY", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_AUTOUPDATER", "DISABLE_ERROR_REPORTING"] {
        c.env(v, "1");
    }
    c.envs(extra.iter().copied());
    let out = courier_tests::broker::run_bounded(&mut c, T);
    format!("{}{}", text(&out.stdout), text(&out.stderr))
}

/// `broker install` registers `broker mcp` in `~/.claude.json` beside the user's keys (their
/// order and indent kept) where the real `claude mcp list` finds and starts it; a second install
/// changes no byte; doctor names the registration once it is removed, with its fix; uninstall of
/// a file changed since takes out only Courier's entry, and so does `--no-mcp`. With CLAUDE_CONFIG_DIR set, install
/// writes `$CLAUDE_CONFIG_DIR/.claude.json`, where claude reads it then.
#[test]
fn install_registers_courier_mcp_where_claude_code_reads_it() {
    let Some(claude) = claude_bin() else { return say_skipped() };
    let rig = Rig::new(CodexEnv::with_base_url("http://127.0.0.1:9/v1"));
    let home = rig.env.home.clone();
    let user_json = home.join(".claude.json");
    std::fs::write(&user_json, "{\n    \"numStartups\": 4,\n    \"mcpServers\": {\n        \"mine\": {\n            \"command\": \"/bin/true\"\n        }\n    }\n}\n").unwrap();
    let out = rig.install(&["--claude", "--start", "none"]);
    assert!(out.contains("as Claude Code's MCP server \"courier\""), "{out}");
    let written = std::fs::read_to_string(&user_json).unwrap();
    assert!(written.starts_with("{\n    \"numStartups\": 4,\n    \"mcpServers\": {\n        \"mine\""), "{written}");
    let doc: Value = serde_json::from_str(&written).unwrap();
    let broker = rig.installed_broker();
    assert_eq!(doc["mcpServers"]["courier"]["command"], broker.display().to_string(), "{doc:#}");
    assert_eq!(doc["mcpServers"]["courier"]["args"], json!(["mcp"]));
    rig.install(&["--claude", "--start", "none"]);
    assert_eq!(std::fs::read_to_string(&user_json).unwrap(), written, "a second install changes nothing");
    let listed = claude_in(&claude, &home, &[], &["mcp", "list"]);
    assert!(listed.contains(&format!("courier: {} mcp", broker.display())) && listed.contains("Connected"), "{listed}");

    // Removed (by the user, or by a claude that wrote its own copy back): doctor says so.
    let mut doc: Value = serde_json::from_str(&std::fs::read_to_string(&user_json).unwrap()).unwrap();
    doc["mcpServers"].as_object_mut().unwrap().remove("courier");
    doc["numStartups"] = json!(5);
    std::fs::write(&user_json, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    let doctor = rig.command(&broker_bin(), &["doctor"]).output().unwrap();
    let said = format!("{}{}", text(&doctor.stdout), text(&doctor.stderr));
    assert!(said.contains(&format!("Courier's MCP server is not registered in {}", user_json.display())), "{said}");
    assert!(said.contains("broker install --claude"), "{said}");
    rig.install(&["--claude", "--start", "none"]);
    let doctor = rig.command(&broker_bin(), &["doctor"]).output().unwrap();
    let said = format!("{}{}", text(&doctor.stdout), text(&doctor.stderr));
    assert!(said.contains("Courier's MCP server is registered with Claude Code"), "{said}");
    // `--no-mcp` takes the registration out again, and only it.
    rig.install(&["--claude", "--no-mcp", "--start", "none"]);
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&user_json).unwrap()).unwrap();
    assert_eq!(doc["mcpServers"], json!({"mine": {"command": "/bin/true"}}), "{doc:#}");

    // CLAUDE_CONFIG_DIR: claude reads `.claude.json` there, and install moves
    // Courier's one registration there.
    let config_dir = rig.env.root.join("claude-config");
    std::fs::create_dir_all(&config_dir).unwrap();
    let mut c = rig.command(&broker_bin(), &["install", "--prefix", &rig.prefix.display().to_string(), "--codex-home"]);
    c.arg(&rig.env.codex_home).args(["--claude", "--start", "none"]).env("CLAUDE_CONFIG_DIR", &config_dir);
    let out = courier_tests::broker::run_bounded(&mut c, Duration::from_secs(180));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = claude_in(&claude, &home, &[("CLAUDE_CONFIG_DIR", &config_dir)], &["mcp", "list"]);
    assert!(listed.contains(&format!("courier: {} mcp", broker.display())), "{listed}");
    let other: Value = serde_json::from_str(&std::fs::read_to_string(config_dir.join(".claude.json")).unwrap()).unwrap();
    assert_eq!(other["mcpServers"]["courier"]["command"], broker.display().to_string());

    // The registration moved out of ~/.claude.json (changed since: only Courier's entry went), and
    // uninstall takes it out of the file install created (claude has written its own keys there).
    rig.run_ok(&broker_bin(), &["uninstall"]);
    let after: Value = serde_json::from_str(&std::fs::read_to_string(&user_json).unwrap()).unwrap();
    assert_eq!((&after["numStartups"], &after["mcpServers"]), (&json!(5), &json!({"mine": {"command": "/bin/true"}})), "{after:#}");
    assert!(after.get("firstStartTime").is_some(), "the keys claude wrote stay: {after:#}");
    let other: Value = serde_json::from_str(&std::fs::read_to_string(config_dir.join(".claude.json")).unwrap()).unwrap();
    assert!(other.get("mcpServers").is_none(), "claude wrote its own keys there since; install's mcpServers went: {other:#}");
}

/// A Claude Code session is `busy` while its turn runs and `idle` once its Stop hook was proven,
/// in `broker threads` (table and `--json`): a real `claude -p --input-format stream-json` stays
/// alive between turns, so its idle session is seen; its prompt is the busy session's turn.
#[test]
fn a_claude_code_session_is_busy_in_its_turn_and_idle_after_stop() {
    use courier_tests::claude::gate::wait_claude_session;
    use courier_tests::util::poll_until;
    let api = ScriptedMessages::start_with(|r| match r.tool_results().is_empty() {
        true => Turn::bash("sleep 4"),
        false => Turn::text("done"),
    });
    let Some(cenv) = env_or_skip(&api) else { return };
    let env = CodexEnv::with_base_url("http://127.0.0.1:9/v1");
    cenv.set_courier_hooks(serve_hooks(&env));
    let broker = Broker::start(&env);
    broker.trust_claude(&cenv.claude);
    let mut c = cenv.command();
    c.args(["-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose"]);
    let mut claude = c.stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let mut stdin = claude.stdin.take().unwrap();
    writeln!(stdin, "{}", json!({"type": "user", "message": {"role": "user", "content": "work a while"}})).unwrap();

    let busy = wait_claude_session(&broker);
    assert_eq!(busy["state"], "busy", "in its turn: {busy}");
    assert!(busy["turn_id"].as_str().is_some_and(|t| !t.is_empty()), "the open prompt is its turn: {busy}");
    let sid = busy["id"].as_str().unwrap().to_string();
    let idle = poll_until(T, || {
        of_host(&broker.threads_json(false), "claude-code").first().filter(|t| t["state"] == "idle").map(|t| (*t).clone())
    })
    .unwrap_or_else(|| panic!("the session never went idle: {:#?}\n{}", broker.threads_json(false), broker.log_text()));
    assert_eq!((idle["id"].as_str(), &idle["turn_id"]), (Some(sid.as_str()), &Value::Null), "{idle}");
    let table = broker.run_ok(&["threads"]);
    let row = table.lines().find(|l| l.contains(&sid)).unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains("idle") && row.contains("claude-code"), "{table}");
    drop(stdin);
    let status = poll_until(T, || claude.try_wait().unwrap()).unwrap_or_else(|| {
        let _ = claude.kill();
        panic!("claude did not exit once its input ended")
    });
    assert!(status.success(), "{status:?}");
}
