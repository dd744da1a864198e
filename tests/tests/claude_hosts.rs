//! One queue and one producer interface for both hosts, on the real pinned binaries
//! (`COURIER_CLAUDE_BIN`, `COURIER_CODEX_BIN`): `broker threads` lists proven Claude Code
//! sessions beside Codex threads, a `broker send` run by a Claude Code model's Bash command is
//! sent as that session (verified as a Codex tool command's sender is), and a Codex agent and a
//! Claude Code agent message each other with receipts. docs/claude-code.md.
//!
//! Skips (and says so) only when COURIER_CLAUDE_BIN is unset; `install/test.sh` sets it.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier_tests::claude::gate::{broker_in_claude, message_by_key, of_host, serve_hooks, wait_claude_session, ClaudeBroker};
use courier_tests::claude::{env_or_skip, ClaudeEnv, PRINT_TIMEOUT};
use courier_tests::messages::{ScriptedMessages, Turn};
use courier_tests::model::{Hold, Reply};
use courier_tests::util::{marker, poll_until};
use courier_tests::{broker_bin, hook_command, Broker, CodexEnv, ScriptedModel};
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

/// A Claude Code home on `api` with Courier's hooks on `port`, or `None` (the test skipped).
fn claude_env(api: &ScriptedMessages, port: u16) -> Option<ClaudeEnv> {
    let env = env_or_skip(api)?;
    env.set_courier_hooks(port);
    Some(env)
}

/// MCP `list_threads` of `broker mcp` on stdio, as a Codex would call it: the threads listed.
fn mcp_list_threads(env: &CodexEnv) -> Vec<Value> {
    use std::io::{BufRead, Write};
    let mut child = env
        .command(broker_bin())
        .arg("mcp")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("broker mcp");
    let mut stdin = child.stdin.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Value>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str(&line) {
                let _ = tx.send(v);
            }
        }
    });
    let answer = |id: u64| loop {
        let v = rx.recv_timeout(T).unwrap_or_else(|e| panic!("broker mcp answered no request {id}: {e}"));
        if v["id"] == id {
            break v;
        }
    };
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-03-26",
        "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}});
    writeln!(stdin, "{init}").unwrap();
    answer(1);
    writeln!(stdin, r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#).unwrap();
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "list_threads", "arguments": {}}});
    writeln!(stdin, "{call}").unwrap();
    let reply = answer(2);
    let _ = child.kill();
    let _ = child.wait();
    let text = reply.pointer("/result/content/0/text").and_then(Value::as_str).unwrap_or_else(|| panic!("{reply}"));
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    v["threads"].as_array().cloned().unwrap_or_default()
}

/// `broker threads --json` lists a live `claude -p` session (kept in a Bash call) as
/// `host: claude-code`, `state: busy` (in its Bash call), with its claude's pid and cwd, beside a busy `codex exec`
/// thread as `host: codex`; once claude exits, only `--all` lists the session, as ended.
#[test]
fn threads_lists_a_live_claude_code_session_beside_a_codex_thread() {
    let (_model, env, hold) = CodexEnv::with_held_turn();
    let port = serve_hooks(&env);
    let api = ScriptedMessages::start_with(|r| match r.tool_results().is_empty() {
        true => Turn::bash("sleep 6"),
        false => Turn::text("done"),
    });
    let Some(cenv) = claude_env(&api, port) else { return };
    let broker = Broker::start_trusted(&env);
    broker.trust_claude(&cenv.claude);
    let codex = env.spawn_exec("CODEX keep busy");
    hold.wait_held(1, T);
    let thread = codex.wait_thread_id(T);
    let claude = cenv.spawn_print("sleep a while");

    let session = wait_claude_session(&broker);
    let list = broker.threads_json(false);
    assert_eq!(session["state"], "busy", "in its Bash call: {session}");
    assert_eq!(session["process"]["kind"], "claude", "{session}");
    assert_eq!(session["process"]["pid"].as_u64(), Some(u64::from(claude.pid())), "{session}");
    assert_eq!(Path::new(session["cwd"].as_str().unwrap()), cenv.work.canonicalize().unwrap(), "{session}");
    assert!(session["pending"].is_u64(), "{session}");
    let codexes = of_host(&list, "codex");
    assert_eq!(codexes.len(), 1, "{list:#?}");
    assert_eq!((codexes[0]["id"].as_str(), codexes[0]["state"].as_str()), (Some(thread.as_str()), Some("busy")), "{list:#?}");
    let table = broker.run_ok(&["threads"]);
    assert!(table.contains("claude-code") && table.contains(session["id"].as_str().unwrap()), "{table}");
    let mcp = mcp_list_threads(&env);
    let by_id = |id: &Value| mcp.iter().find(|t| t["id"] == *id).cloned().unwrap_or_else(|| panic!("MCP lists {id}: {mcp:#?}"));
    let (m_claude, m_codex) = (by_id(&session["id"]), by_id(&Value::from(thread.as_str())));
    assert_eq!((m_claude["host"].as_str(), m_claude["state"].as_str()), (Some("claude-code"), Some("busy")), "{m_claude}");
    assert_eq!(m_claude["process"], "claude", "{m_claude}");
    assert!(m_claude["handed"].is_u64(), "{m_claude}");
    assert_eq!(m_codex["host"], "codex", "{m_codex}");

    let out = claude.wait(PRINT_TIMEOUT);
    assert!(out.status.success(), "{:?}\n{}", out.status, out.stderr);
    let sid = session["id"].as_str().unwrap();
    assert!(of_host(&broker.threads_json(false), "claude-code").is_empty(), "an exited claude's session is not live");
    let all = broker.threads_json(true);
    let ended = all.iter().find(|t| t["id"] == sid).unwrap_or_else(|| panic!("--all lists {sid}: {all:#?}"));
    assert_eq!((ended["host"].as_str(), ended["state"].as_str()), (Some("claude-code"), Some("ended")), "{ended}");
    hold.release();
    assert!(codex.wait(T).status.success());
}

/// The sender of a `broker send` a Claude Code model runs is its session, verified: the broker
/// walks from the command to the nearest trusted claude and finds the claimed session pinned to
/// that very process. A second claude's command claiming the first's session
/// (`CLAUDE_CODE_SESSION_ID=<first>`), and a process under no claude claiming it, are sent as
/// plain labels with a note, never as the session.
#[test]
fn a_claude_commands_send_is_verified_as_its_session_and_no_other_claude_can_claim_it() {
    let cb = ClaudeBroker::new();
    let (env, port) = (&cb.env, cb.port);
    let first_api = ScriptedMessages::start_with(|r| match r.tool_results().is_empty() {
        true => Turn::bash("sleep 10"),
        false => Turn::text("done"),
    });
    let Some(first) = claude_env(&first_api, port) else { return };
    let command: Arc<Mutex<String>> = Arc::default();
    let script = Arc::clone(&command);
    let second_api = ScriptedMessages::start_with(move |r| match r.tool_results().is_empty() {
        true => Turn::bash(&script.lock().unwrap()),
        false => Turn::text("done"),
    });
    let second = claude_env(&second_api, port).unwrap();
    let broker = cb.start(&first.claude);
    let owner = first.spawn_print("sleep a while");
    let sid = wait_claude_session(&broker)["id"].as_str().unwrap().to_string();
    let target = "00000000-0000-4000-8000-00000000c1a0";
    let send = format!("{} send --thread {target} --future-thread", broker_in_claude(env));
    *command.lock().unwrap() =
        format!("{send} --key genuine hello 2>&1; echo rc1=$?; CLAUDE_CODE_SESSION_ID={sid} {send} --key claimed hello 2>&1; echo rc2=$?");
    let out = second.print("send them");
    assert!(out.status.success(), "{:?}\n{}", out.status, out.stderr);
    let seconds = poll_until(T, || {
        let l = broker.threads_json(true);
        l.iter().find(|t| t["host"] == "claude-code" && t["id"] != sid.as_str()).cloned()
    })
    .expect("the second claude's session is listed");
    let second_sid = seconds["id"].as_str().unwrap();

    let genuine = message_by_key(&broker, "genuine");
    assert_eq!(genuine["from"], format!("thread:{second_sid}"), "{genuine}\n{}", broker.log_text());
    let claimed = message_by_key(&broker, "claimed");
    assert!(!claimed["from"].as_str().unwrap_or("").starts_with("thread:"), "a claim of another claude's session: {claimed}");
    let tool_output = second_api
        .requests()
        .iter()
        .flat_map(|r| r.tool_results().into_iter().map(courier_tests::messages::content_text).collect::<Vec<_>>())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(tool_output.contains("rc1=0") && tool_output.contains("rc2=0"), "{tool_output}");
    assert!(tool_output.contains("not verified") && tool_output.contains("not to claude"), "{tool_output}");

    // A process under no claude at all, claiming the live session.
    let mut forger = env.command(broker_bin());
    forger.env("CLAUDE_CODE_SESSION_ID", &sid).args(["send", "--thread", target, "--future-thread", "--key", "outside", "hello"]);
    let out = courier_tests::broker::run_bounded(&mut forger, T);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not verified"), "{stderr}");
    // The walk looked for every host's binary, and its reason says so.
    assert!(stderr.contains("no trusted Codex, Claude Code or Copilot CLI executable"), "{stderr}");
    let outside = message_by_key(&broker, "outside");
    assert!(!outside["from"].as_str().unwrap_or("").starts_with("thread:"), "{outside}");
    assert!(owner.wait(PRINT_TIMEOUT).status.success());
}

/// A Codex agent and a Claude Code agent message each other with receipts: the `claude -p`
/// model's Bash runs `broker send --thread <codex thread> --wait confirmed`, the `codex exec`
/// model's command `broker send --thread <claude session> --wait confirmed` (its yield returns
/// the tool output while the wait runs, so neither turn waits on the other). Each message reaches
/// the other model exactly once, `confirmed`, from the other side's verified sender.
#[test]
fn a_codex_agent_and_a_claude_code_agent_message_each_other_with_receipts() {
    let hold = Hold::new();
    let h = hold.clone();
    let root = std::env::temp_dir().join(format!("courier-hosts-{}", courier_tests::util::unique_token()));
    std::fs::create_dir_all(&root).unwrap();
    let sid_file = root.join("claude-session");
    let (to_claude, to_codex) = (marker("TO_CLAUDE"), marker("TO_CODEX"));
    let bin = broker_bin().display().to_string();
    let codex_cmd = format!("{bin} send --thread \"$(cat {})\" --wait confirmed --timeout 60s '{to_claude}'", sid_file.display());
    let model = ScriptedModel::start_with(move |r| match r.function_calls().is_empty() {
        true => Reply::exec_with_yield(&codex_cmd, 1000).held(&h),
        false => Reply::message("done"),
    });
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let port = serve_hooks(&env);
    let broker = Broker::start_trusted(&env);
    let codex = env.spawn_exec("CODEX talk to claude");
    hold.wait_held(1, T);
    let thread = codex.wait_thread_id(T);
    let claude_cmd =
        format!("{} send --thread {thread} --wait confirmed --timeout 60s '{to_codex}'; echo rc=$?; sleep 1", broker_in_claude(&env));
    let api = ScriptedMessages::start_with(move |r| match r.tool_results().is_empty() {
        true => Turn::bash(&claude_cmd),
        false => Turn::text("done"),
    });
    let Some(cenv) = claude_env(&api, port) else {
        hold.release();
        return;
    };
    broker.trust_claude(&cenv.claude);
    let claude = cenv.spawn_print("talk to codex");
    let sid = wait_claude_session(&broker)["id"].as_str().unwrap().to_string();
    std::fs::write(&sid_file, &sid).unwrap();
    // Claude's message is queued for the held codex turn before it goes on.
    poll_until(T, || {
        let msgs = broker.inspect_json()["messages"].as_array().cloned().unwrap_or_default();
        msgs.iter().any(|m| m["thread"] == thread.as_str()).then_some(())
    })
    .unwrap_or_else(|| panic!("claude's send was not queued; log:\n{}", broker.log_text()));
    hold.release();
    let out = claude.wait(PRINT_TIMEOUT);
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());
    assert!(codex.wait(T).status.success());

    let msgs = broker.inspect_json()["messages"].as_array().cloned().unwrap_or_default();
    let find = |to: &str| msgs.iter().find(|m| m["thread"] == to).cloned().unwrap_or_else(|| panic!("none to {to}: {msgs:#?}"));
    let (codex_got, claude_got) = (find(&thread), find(&sid));
    assert_eq!((codex_got["state"].as_str(), codex_got["from"].as_str()), (Some("confirmed"), Some(format!("thread:{sid}").as_str())));
    assert_eq!((claude_got["state"].as_str(), claude_got["from"].as_str()), (Some("confirmed"), Some(format!("thread:{thread}").as_str())));
    // Each model saw the other's message once, from the other's verified sender.
    let codex_saw: Vec<String> =
        model.requests_for_thread(&thread).iter().flat_map(|r| r.developer_messages_containing(&to_codex)).collect();
    assert!(!codex_saw.is_empty(), "{}", model.dump());
    assert!(codex_saw.iter().all(|m| m.contains(&format!("from=\"thread:{sid}\" verified=\"true\""))), "{codex_saw:?}");
    let last = model.requests_for_thread(&thread).last().cloned().expect("codex requests");
    assert_eq!(last.body.to_string().matches(&to_codex).count(), 1, "once in codex's last request");
    let claude_last = api.requests().last().cloned().expect("claude requests");
    assert_eq!(claude_last.body.to_string().matches(&to_claude).count(), 1, "once in claude's last request: {}", api.dump());
    assert!(claude_last.body.to_string().contains(&format!("from=\\\"thread:{thread}\\\" verified=\\\"true\\\"")), "{}", api.dump());
    let _ = std::fs::remove_dir_all(root);
}

/// A message published over NATS for a live Claude Code session is delivered like one for a Codex
/// thread: host B's `courier-bridge send --thread <session> --wait confirmed` is queued on host A
/// (shown as `nats:hostb/relay`), handed at the session's next PostToolUse, reaches the model
/// once, and the receipt that comes back over NATS is `confirmed`.
#[test]
fn a_message_over_nats_reaches_a_claude_code_session_confirmed() {
    use courier_tests::bridge::{host_b, producer, queued, text, Bridge, Nats};
    let env_a = CodexEnv::with_base_url("http://127.0.0.1:9/v1");
    let port = serve_hooks(&env_a);
    let body = marker("OVER_NATS");
    let seen = body.clone();
    // Short tool calls until the message is in a request (each PostToolUse may carry it).
    let api = ScriptedMessages::start_with(move |r| match r.body_contains(&seen) || r.tool_results().len() >= 40 {
        true => Turn::text("done"),
        false => Turn::bash("sleep 1"),
    });
    let Some(cenv) = claude_env(&api, port) else { return };
    let env_b = host_b();
    let nats = Nats::start(&env_b.root);
    let a = Broker::start(&env_a);
    a.trust_claude(&cenv.claude);
    let bridge = Bridge::start(&env_a, &nats.url(), "hosta", None);
    let claude = cenv.spawn_print("wait for a message");
    let sid = wait_claude_session(&a)["id"].as_str().unwrap().to_string();

    let key = marker("key");
    let mut send = producer(
        &env_b,
        &nats.url(),
        "send",
        &["--thread", &sid, "--from", "relay", "--key", &key, "--wait", "confirmed", "--timeout", "60s", "--json", &body],
    );
    let out = courier_tests::broker::run_bounded(&mut send, Duration::from_secs(90));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout} {stderr}\nbridge: {}\nbroker: {}", bridge.log_text(), a.log_text());
    let r: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!((r["state"].as_str(), r["outcome"].as_str()), (Some("confirmed"), Some("reached")), "{r}");
    let m = queued(&a, &sid).into_iter().next().expect("queued for the session");
    assert_eq!((m["from"].as_str(), m["state"].as_str()), (Some("nats:hostb/relay"), Some("confirmed")), "{m}");
    let out = claude.wait(PRINT_TIMEOUT);
    assert!(out.status.success(), "{:?}\n{}", out.status, out.stderr);
    let last = api.requests().last().cloned().expect("claude requests");
    assert_eq!(last.body.to_string().matches(&body).count(), 1, "once in claude's last request: {}", api.dump());
}
