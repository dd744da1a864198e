//! The Claude Code gate on the real pinned binary (`COURIER_CLAUDE_BIN`): the broker serves
//! Claude Code's HTTP hooks on a loopback port (`[claude] hook_port`), proves each caller is the
//! digest-trusted claude process holding the connection, and refuses anything else with `{}` (the
//! session carries on). docs/claude-code.md "Gate design".
//!
//! Skips (and says so) only when COURIER_CLAUDE_BIN is unset; `install/test.sh` sets it.

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier_tests::claude::gate::{claude_refusals, proven_hooks, wait_proven, ClaudeBroker};
use courier_tests::claude::{env_or_skip, http_hooks, one_bash_call, ClaudeEnv};
use courier_tests::messages::{ScriptedMessages, Turn};
use courier_tests::model::Hold;
use courier_tests::util::{poll_until, shell_quote, str_field};
use courier_tests::Broker;
use serde_json::{json, Value};

/// Fail open on availability: a hook URL whose port refuses the connection, or a server that
/// accepts and never answers, does not stall or break the session. Claude Code runs the turn to
/// the end either way; a hung hook costs its `timeout` (seconds, a fraction allowed) per call,
/// so install writes a short one.
#[test]
fn a_refused_or_hung_hook_url_does_not_stall_the_session() {
    // Refused: a port that was bound, then closed.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let api = one_bash_call();
    let Some(env) = env_or_skip(&api) else { return };
    env.set_hook_entries(&http_hooks(&format!("http://{closed}/hook/x"), None));
    let out = env.print("run the command");
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());
    assert!(out.stdout.contains("\"result\":\"done\""), "{}", out.stdout);
    eprintln!("refused: claude -p took {:?} for 5 hook calls", out.duration);
    assert!(out.duration < Duration::from_secs(30), "{:?}", out.duration);

    // Hung: accepted (the backlog holds it), never answered; a 1 s timeout per hook.
    let hung = TcpListener::bind("127.0.0.1:0").unwrap();
    let api = one_bash_call();
    let env = ClaudeEnv::new(&api).unwrap();
    env.set_hook_entries(&http_hooks(&format!("http://{}/hook/x", hung.local_addr().unwrap()), Some(1.0)));
    let out = env.print("run the command");
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());
    assert!(out.stdout.contains("\"result\":\"done\""), "{}", out.stdout);
    eprintln!("hung, timeout 1: claude -p took {:?} for 5 hook calls", out.duration);
    assert!(out.duration < Duration::from_secs(30), "{:?}", out.duration);
    drop(hung);
}

/// The genuine session: every hook of a `claude -p` turn with one Bash call reaches the broker
/// and passes every step, from the claude process itself; nothing is refused.
#[test]
fn a_genuine_claude_sessions_hooks_pass_every_step() {
    let api = one_bash_call();
    let Some(env) = env_or_skip(&api) else { return };
    let cb = ClaudeBroker::new();
    let broker = cb.start(&env.claude);
    env.set_courier_hooks(cb.port);
    let child = env.spawn_print("run the command");
    let claude = child.pid();
    let out = child.wait(courier_tests::claude::PRINT_TIMEOUT);
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());
    let proven = wait_proven(&broker, 4);
    let events: Vec<&str> = proven.iter().map(|(e, _, _)| e.as_str()).collect();
    assert_eq!(events, ["UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop"], "{proven:?}");
    assert!(proven.iter().all(|(_, _, pid)| *pid == claude), "every hook from claude {claude}: {proven:?}");
    assert!(claude_refusals(&broker).is_empty(), "{:?}", claude_refusals(&broker));
}

/// A scripted model whose first answer in a turn runs `command` once it is set (else answers
/// "done" at once), then "done".
fn settable_bash() -> (ScriptedMessages, Arc<Mutex<Option<String>>>) {
    let command: Arc<Mutex<Option<String>>> = Default::default();
    let script = command.clone();
    let api = ScriptedMessages::start_with(move |r| match (r.tool_results().is_empty(), script.lock().unwrap().clone()) {
        (true, Some(cmd)) => Turn::bash(&cmd),
        _ => Turn::text("done"),
    });
    (api, command)
}

/// Runs one `claude -p` turn in `env` to its end: the session id its hooks pinned, and its
/// transcript. Its claude has exited, so its pin may pass to the next claude that opens a turn
/// in it (a `--resume`); the attacks below try to be that claude.
fn finished_session(env: &ClaudeEnv, broker: &Broker) -> (String, PathBuf) {
    let out = env.print("hello");
    assert!(out.status.success(), "{:?}\n{}", out.status, out.stderr);
    let proven = wait_proven(broker, 2);
    let sid = proven[0].1.clone();
    let transcript = std::fs::read_dir(env.home.join(".claude/projects"))
        .unwrap()
        .flatten()
        .map(|d| d.path().join(format!("{sid}.jsonl")))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("no transcript of {sid}"));
    (sid, transcript)
}

/// A forged hook body for `event` in session `sid`, as JSON text.
fn forged_body(event: &str, sid: &str, transcript: &std::path::Path) -> String {
    json!({"hook_event_name": event, "session_id": sid, "transcript_path": transcript, "prompt_id": "p-forged",
        "tool_use_id": "toolu_forged", "prompt": "forged", "cwd": "/"})
    .to_string()
}

/// Attack: a model's Bash command POSTs, with curl, a forged UserPromptSubmit for a session whose
/// claude has exited (so no live owner holds its pin), then a PostToolUse for it: were it
/// proven, the session's queued messages would go to curl. `sole_holder` names curl (it holds
/// its socket alone) and `trusted_claude` refuses it; the session's own hooks still pass.
#[test]
fn a_model_commands_curl_posing_as_a_hook_is_refused() {
    let (api, command) = settable_bash();
    let Some(env) = env_or_skip(&api) else { return };
    let cb = ClaudeBroker::new();
    let broker = cb.start(&env.claude);
    env.set_courier_hooks(cb.port);
    let (victim, transcript) = finished_session(&env, &broker);
    let post = |event: &str| {
        format!(
            "curl -s -m 5 -o /dev/null -w 'forged:%{{http_code}} ' -H 'Content-Type: application/json' --data {} http://127.0.0.1:{}/hook/{event}",
            shell_quote(&forged_body(event, &victim, &transcript)),
            cb.port
        )
    };
    *command.lock().unwrap() = Some(format!("{}; {}", post("UserPromptSubmit"), post("PostToolUse")));
    let out = env.print("run the command");
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());
    let after = api.wait_for(Duration::from_secs(5), "the tool result", |r| !r.tool_results().is_empty());
    let tool_use_id = str_field(after.tool_uses()[0], "id").to_string();
    let result = after.tool_result_text(&tool_use_id).unwrap_or_default();
    assert_eq!(result.matches("forged:200").count(), 2, "curl reached the port twice: {result}");

    let refused = poll_until(Duration::from_secs(10), || Some(claude_refusals(&broker)).filter(|r| r.len() >= 2)).unwrap_or_default();
    assert_eq!(refused.len(), 2, "{refused:?}\n{}", broker.log_text());
    for (code, detail) in &refused {
        assert_eq!(code, "untrusted_claude", "{detail}");
        assert!(detail.contains("curl"), "{detail}");
    }
    let proven = wait_proven(&broker, 6);
    assert!(proven.iter().filter(|(_, sid, _)| sid == &victim).all(|(_, _, pid)| *pid == proven[0].2), "{proven:?}");
    let claudes: std::collections::BTreeSet<u32> = proven.iter().map(|(_, _, pid)| *pid).collect();
    assert_eq!(claudes.len(), 2, "only the two sessions' own claude processes are proven: {proven:?}");
}

/// Attack: a copy of Claude Code with three bytes changed (it still runs) is not the trusted
/// binary: its hooks are refused `untrusted_claude`, none is proven. The copy is new to the
/// broker, so its first hook (UserPromptSubmit) is refused "not hashed yet": the background lane
/// never makes a hook wait. The model holds its answer until the broker logs the copy's digest
/// (the line comes once the digest is cached), so the hooks after it (PreToolUse, PostToolUse,
/// Stop) are refused for the digest itself: the trusted-digest comparison, end to end. An
/// unpatched copy has the trusted digest, and those three are proven.
#[test]
fn a_patched_copy_of_claude_is_refused() {
    let hold = Hold::new();
    let held = hold.clone();
    let api = ScriptedMessages::start_with(move |r| match (r.tool_results().is_empty(), r.is_stream()) {
        (_, false) => Turn::text("ok"),
        (true, true) => {
            held.park();
            Turn::bash("echo hi")
        }
        (false, true) => Turn::text("done"),
    });
    let Some(mut env) = env_or_skip(&api) else { return };
    let cb = ClaudeBroker::new();
    let broker = cb.start(&env.claude);
    let patched = env.root.join("claude");
    std::fs::copy(&env.claude, &patched).unwrap();
    // Three bytes of a help string, written in place (the binary is 400 MB: no second write).
    let at = find(&std::fs::read(&patched).unwrap(), b"Not logged in").expect("a help string to patch");
    let file = std::fs::OpenOptions::new().write(true).open(&patched).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, b"NOT", at as u64).unwrap();
    drop(file);
    env.claude = patched.clone();
    env.set_courier_hooks(cb.port);
    let child = env.spawn_print("run the command");
    // The prompt's hook queued the copy for hashing; its turn waits for the model meanwhile.
    hold.wait_held(1, Duration::from_secs(60));
    let hashed = format!("hashed {} (", patched.display());
    poll_until(Duration::from_secs(60), || broker.log_text().contains(&hashed).then_some(()))
        .unwrap_or_else(|| panic!("the broker never hashed the copy; log:\n{}", broker.log_text()));
    hold.release();
    let out = child.wait(courier_tests::claude::PRINT_TIMEOUT);
    assert!(out.status.success(), "the patched copy runs: {:?}\n{}\n{}", out.status, out.stderr, api.dump());

    let by_event = |b: &Broker| -> Vec<(String, String, String)> {
        courier_tests::broker::refusals(&b.inspect_json())
            .iter()
            .map(|r| (str_field(r, "event").to_string(), str_field(r, "reason").to_string(), str_field(r, "detail").to_string()))
            .collect()
    };
    let refused = poll_until(Duration::from_secs(10), || Some(by_event(&broker)).filter(|r| r.len() >= 4)).unwrap_or_default();
    assert_eq!(refused.len(), 4, "{refused:?}\n{}", broker.log_text());
    assert!(refused.iter().all(|(_, code, _)| code == "untrusted_claude"), "{refused:?}");
    for (event, _, detail) in &refused {
        match event.as_str() {
            "UserPromptSubmit" => assert!(detail.ends_with("not hashed yet"), "{event}: {detail}"),
            _ => assert!(
                detail.contains("(sha256 ") && detail.ends_with("not a trusted Claude Code"),
                "refused for its digest: {event}: {detail}"
            ),
        }
    }
    let events: std::collections::BTreeSet<&str> = refused.iter().map(|(e, _, _)| e.as_str()).collect();
    assert_eq!(events, ["PostToolUse", "PreToolUse", "Stop", "UserPromptSubmit"].into(), "{refused:?}");
    assert!(proven_hooks(&broker.log_text()).is_empty(), "{}", broker.log_text());
}

/// Where `needle` first occurs in `hay`: a byte scan, then a compare at each candidate (a window
/// compare at every offset takes seconds over 400 MB in a debug build).
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(k) = hay[from..].iter().position(|b| *b == needle[0]) {
        if hay[from + k..].starts_with(needle) {
            return Some(from + k);
        }
        from += k + 1;
    }
    None
}

/// Attack: the genuine binary running someone else's code. `BUN_OPTIONS=--preload=forge.js`
/// makes a trusted claude run any script before its own (probed on 2.1.332), so a model's Bash
/// command can start one that POSTs a forged UserPromptSubmit and PostToolUse for a session whose
/// claude has exited: every kernel proof names a trusted claude, the sole holder of its socket.
/// `clean_start` refuses a claude started with such a variable.
#[test]
fn a_claude_started_with_a_preload_script_is_refused() {
    let (api, command) = settable_bash();
    let Some(env) = env_or_skip(&api) else { return };
    let cb = ClaudeBroker::new();
    let broker = cb.start(&env.claude);
    env.set_courier_hooks(cb.port);
    let (victim, transcript) = finished_session(&env, &broker);
    let forge = env.root.join("forge.js");
    let post = |event: &str| {
        format!(
            "{{ const r = await fetch('http://127.0.0.1:{}/hook/{event}', {{method: 'POST', headers: {{'Content-Type': 'application/json'}}, body: {}}}); console.log('forged:' + r.status); }}\n",
            cb.port,
            serde_json::to_string(&forged_body(event, &victim, &transcript)).unwrap()
        )
    };
    std::fs::write(&forge, format!("{}{}", post("UserPromptSubmit"), post("PostToolUse"))).unwrap();
    *command.lock().unwrap() = Some(format!(
        "BUN_OPTIONS=--preload={} {} --version",
        shell_quote(&forge.display().to_string()),
        shell_quote(&env.claude.display().to_string())
    ));
    let out = env.print("run the command");
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());
    let after = api.wait_for(Duration::from_secs(5), "the tool result", |r| !r.tool_results().is_empty());
    let tool_use_id = str_field(after.tool_uses()[0], "id").to_string();
    let result = after.tool_result_text(&tool_use_id).unwrap_or_default();
    assert_eq!(result.matches("forged:200").count(), 2, "the preloaded claude reached the port twice: {result}");

    let refused = poll_until(Duration::from_secs(10), || Some(claude_refusals(&broker)).filter(|r| r.len() >= 2)).unwrap_or_default();
    assert_eq!(refused.len(), 2, "{refused:?}\n{}", broker.log_text());
    for (code, detail) in &refused {
        assert_eq!(code, "claude_loader_env", "{detail}");
        assert!(detail.contains("BUN_OPTIONS"), "{detail}");
    }
    let proven = wait_proven(&broker, 6);
    let claudes: std::collections::BTreeSet<u32> = proven.iter().map(|(_, _, pid)| *pid).collect();
    assert_eq!(claudes.len(), 2, "only the two sessions' own claude processes are proven: {proven:?}");
}

/// `turn_ticket`: a tool hook is answered once. Claude Code itself presents PostToolUse twice
/// here (registered at two URLs); the second presentation of the same (session, turn, call,
/// event) is refused `ticket_used`, so no message could be handed twice for one call.
#[test]
fn a_hook_presented_twice_is_refused_ticket_used() {
    let api = one_bash_call();
    let Some(env) = env_or_skip(&api) else { return };
    let cb = ClaudeBroker::new();
    let broker = cb.start(&env.claude);
    let url = |e: &str| json!({"type": "http", "url": format!("http://127.0.0.1:{}/hook/{e}", cb.port), "timeout": 5});
    let again = json!({"type": "http", "url": format!("http://127.0.0.1:{}/hook/PostToolUse?again", cb.port), "timeout": 5});
    env.set_hook_entries(&[
        ("UserPromptSubmit", "", url("UserPromptSubmit")),
        ("PostToolUse", "*", url("PostToolUse")),
        ("PostToolUse", "*", again),
    ]);
    let out = env.print("run the command");
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());
    let refused = poll_until(Duration::from_secs(10), || Some(claude_refusals(&broker)).filter(|r| !r.is_empty())).unwrap_or_default();
    assert_eq!(refused.len(), 1, "{refused:?}\n{}", broker.log_text());
    assert_eq!(refused[0].0, "ticket_used", "{refused:?}");
    assert!(refused[0].1.contains("claude:PostToolUse:"), "{refused:?}");
    let proven = wait_proven(&broker, 2);
    let events: Vec<&str> = proven.iter().map(|(e, _, _)| e.as_str()).collect();
    assert_eq!(events, ["UserPromptSubmit", "PostToolUse"], "{proven:?}");
}

/// `session_owner`: while a claude runs a turn in a session, a second claude resuming the same
/// session (a genuine binary, every kernel step passes) is refused `session_owned` at its
/// prompt and at its tool hooks: the session stays the first one's.
#[test]
fn a_second_live_claude_on_the_session_is_refused_session_owned() {
    let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let api = ScriptedMessages::start_with(move |r| match (r.tool_results().is_empty(), r.is_stream()) {
        (true, true) if first.swap(false, std::sync::atomic::Ordering::SeqCst) => Turn::bash("sleep 8"),
        (true, true) => Turn::bash("echo second"),
        _ => Turn::text("done"),
    });
    let Some(env) = env_or_skip(&api) else { return };
    let cb = ClaudeBroker::new();
    let broker = cb.start(&env.claude);
    env.set_courier_hooks(cb.port);
    let owner = env.spawn_print("sleep a while");
    let proven = wait_proven(&broker, 2); // its prompt, and the PreToolUse of its sleep
    let sid = proven[0].1.clone();
    let mut second = env.command();
    second.args(["-p", "me too", "--resume", &sid, "--output-format", "stream-json", "--verbose"]);
    let out = courier_tests::ExecChild::spawn(second).wait(courier_tests::claude::PRINT_TIMEOUT);
    assert!(out.status.success(), "{:?}\n{}", out.status, out.stderr);
    let first_out = owner.wait(courier_tests::claude::PRINT_TIMEOUT);
    assert!(first_out.status.success(), "{:?}\n{}", first_out.status, first_out.stderr);

    let refused = claude_refusals(&broker);
    assert!(refused.len() >= 2, "the second claude's prompt and tool hooks: {refused:?}\n{}", broker.log_text());
    assert!(refused.iter().all(|(code, _)| code == "session_owned"), "{refused:?}");
    let proven = proven_hooks(&broker.log_text());
    let pids: std::collections::BTreeSet<u32> = proven.iter().map(|(_, _, pid)| *pid).collect();
    assert_eq!(pids.len(), 1, "only the owner's hooks are proven: {proven:?}");
    assert!(proven.iter().all(|(_, s, _)| *s == sid), "{proven:?}");
}

/// Delivery mid-turn, end to end: `broker send --wait confirmed` to a live `claude -p` session
/// while its Bash call runs. The session's PostToolUse hands the message over (recorded before
/// the answer), the model's next request carries it exactly once as Claude Code's hook-context
/// system message, and the transcript's request records confirm it: the receipt is `confirmed`.
#[test]
fn a_message_sent_to_a_live_claude_session_reaches_its_model_once_and_is_confirmed() {
    let api = ScriptedMessages::start_with(|r| match r.tool_results().is_empty() {
        true => Turn::bash("sleep 4; echo slept"),
        false => Turn::text("done"),
    });
    let Some(env) = env_or_skip(&api) else { return };
    let cb = ClaudeBroker::new();
    let broker = cb.start(&env.claude);
    env.set_courier_hooks(cb.port);
    let child = env.spawn_print("run the command");
    let sid = wait_proven(&broker, 1)[0].1.clone();
    let text = courier_tests::util::marker("CLAUDE_DELIVERY");
    let sent = broker.run(&["send", "--thread", &sid, "--from", "ci-bot", "--wait", "confirmed", "--timeout", "60s", "--json", &text]);
    let out = child.wait(courier_tests::claude::PRINT_TIMEOUT);
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());
    let report = String::from_utf8_lossy(&sent.stdout).to_string();
    assert!(
        sent.status.success(),
        "send --wait confirmed: {:?}\n{report}\n{}\n{}",
        sent.status,
        String::from_utf8_lossy(&sent.stderr),
        broker.log_text()
    );
    let receipt: Value = serde_json::from_str(report.trim().lines().last().unwrap_or("")).unwrap_or_else(|e| panic!("{e}: {report}"));
    assert_eq!(
        (receipt["outcome"].as_str(), receipt.pointer("/message/state").and_then(Value::as_str)),
        (Some("reached"), Some("confirmed")),
        "{receipt}"
    );
    assert_eq!(receipt.pointer("/message/event").and_then(Value::as_str), Some("claude"), "{receipt}");
    let id = str_field(&receipt, "id").to_string();
    assert_eq!(broker.message_state(&id), "confirmed");

    // The model's request after the tool result carries the message once, as hook context.
    let after = api.wait_for(Duration::from_secs(5), "the tool result", |r| !r.tool_results().is_empty());
    assert_eq!(after.body.to_string().matches(&text).count(), 1, "exactly once in the request: {}", after.body);
    let system = after.texts("system");
    let carrying: Vec<&String> = system.iter().filter(|t| t.contains(&text)).collect();
    assert_eq!(carrying.len(), 1, "{system:?}");
    assert!(carrying[0].starts_with("PostToolUse:Bash hook additional context: "), "{}", carrying[0]);
    assert!(carrying[0].contains(&format!("<courier-message id={id}")) || carrying[0].contains(&id), "{}", carrying[0]);
    // No request before the tool result had it, and none after the one that did.
    let with: Vec<usize> = api.requests().iter().filter(|r| r.body.to_string().contains(&text)).map(|r| r.index).collect();
    assert_eq!(with.len(), api.requests().len() - with.first().copied().unwrap_or(0), "{with:?}");
    assert!(claude_refusals(&broker).is_empty(), "{:?}", claude_refusals(&broker));
}

/// `agent_scope`: a sub-agent's hooks carry the parent's session and an `agent_id`, and what they
/// inject reaches only the sub-agent. On 2.1.332 the Agent tool runs the sub-agent in the
/// background (the main conversation's PostToolUse of the Agent call comes at once); a message
/// queued while the sub-agent's Bash call runs is not handed at the sub-agent's PostToolUse: no
/// request carries it, and it stays `pending` for the main conversation's next tool call.
#[test]
fn a_sub_agents_hooks_get_nothing_addressed_to_the_session() {
    const TASK: &str = "SUBAGENT_TASK run the command";
    // The sub-agent's command runs until the test has queued the message (bounded: 60 s).
    let go = std::env::temp_dir().join(courier_tests::util::marker("courier-subagent-go"));
    let command = format!(
        "for i in $(seq 1200); do [ -e {0} ] && break; sleep 0.05; done; rm -f {0}; echo sub",
        shell_quote(&go.display().to_string())
    );
    let api = ScriptedMessages::start_with(move |r| {
        let sub = r.texts("user").first().is_some_and(|t| t.contains(TASK));
        match (sub, r.tool_results().is_empty(), r.is_stream()) {
            (_, _, false) => Turn::text("ok"),
            (true, true, _) => Turn::bash(&command),
            (true, false, _) => Turn::text("sub done"),
            (false, true, _) if !r.body_contains("SUBAGENT_TASK") => {
                Turn::tool_use("Agent", json!({"description": "run it", "prompt": TASK, "subagent_type": "general-purpose"}))
            }
            (false, _, _) => Turn::text("done"),
        }
    });
    let Some(env) = env_or_skip(&api) else { return };
    let cb = ClaudeBroker::new();
    let broker = cb.start(&env.claude);
    env.set_courier_hooks(cb.port);
    let child = env.spawn_print("delegate it");
    // The Agent call's PreToolUse and PostToolUse, and the sub-agent's Bash PreToolUse (in either
    // order: the sub-agent runs beside the main conversation), its command now waiting for `go`.
    let count = |p: &Vec<(String, String, u32)>, event: &str| p.iter().filter(|(e, _, _)| e == event).count();
    let proven = poll_until(Duration::from_secs(60), || {
        Some(proven_hooks(&broker.log_text())).filter(|p| count(p, "PreToolUse") >= 2 && count(p, "PostToolUse") >= 1)
    })
    .unwrap_or_else(|| panic!("no sub-agent PreToolUse and Agent PostToolUse; log:\n{}\n{}", broker.log_text(), api.dump()));
    let text = courier_tests::util::marker("CLAUDE_MAIN_ONLY");
    let id = broker.send(&proven[0].1, &text, None);
    std::fs::write(&go, "").unwrap();
    let out = child.wait(courier_tests::claude::PRINT_TIMEOUT);
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());

    let requests = api.requests();
    let sub_answered = requests.iter().any(|r| r.texts("user").first().is_some_and(|t| t.contains(TASK)) && !r.tool_results().is_empty());
    assert!(sub_answered, "the sub-agent's Bash result went to the model:\n{}", api.dump());
    let posts = proven_hooks(&broker.log_text()).iter().filter(|(e, _, _)| e == "PostToolUse").count();
    assert!(posts >= 2, "the main and the sub-agent's PostToolUse were proven:\n{}", broker.log_text());
    let carrying: Vec<usize> = requests.iter().filter(|r| r.body_contains(&text)).map(|r| r.index).collect();
    assert!(carrying.is_empty(), "requests {carrying:?} carried a message the sub-agent's hook must not get:\n{}", api.dump());
    assert_eq!(broker.message_state(&id), "pending");
    assert!(claude_refusals(&broker).is_empty(), "{:?}", claude_refusals(&broker));
}

/// A broker killed between a hand-off record and the hook's answer doubles nothing: claude gets
/// no answer (the connection closes) and carries on; the restarted broker serves the session's
/// next PostToolUse (the pin survives) but never offers the handed message again. Claude's next
/// request goes without it, so it is `uncertain` (`claude_answer_lost`) while claude still runs
/// its second command: a hand-off claude never took does not stay `handed` for as long as claude
/// lives.
#[test]
fn a_broker_killed_after_a_claude_hand_off_never_doubles_it() {
    let api = ScriptedMessages::start_with(|r| match r.tool_results().len() {
        0 => Turn::bash("sleep 3; echo one"),
        1 => Turn::bash("sleep 12; echo two"),
        _ => Turn::text("done"),
    });
    let Some(env) = env_or_skip(&api) else { return };
    let cb = ClaudeBroker::new();
    let cli = Broker::cli_only(&cb.env);
    cli.trust_claude(&env.claude);
    let mut serve = courier_tests::Serve::start(&cb.env, &[("COURIER_FAILPOINTS", "claude_after_hand_off")]);
    env.set_courier_hooks(cb.port);
    let child = env.spawn_print("run the commands");
    let sid = poll_until(Duration::from_secs(30), || proven_hooks(&serve.log_text()).first().map(|p| p.1.clone()))
        .unwrap_or_else(|| panic!("no proven prompt: {}", serve.log_text()));
    let text = courier_tests::util::marker("CLAUDE_CRASH");
    let id = cli.send(&sid, &text, None);
    let died = poll_until(Duration::from_secs(30), || serve.child.try_wait().ok().flatten());
    assert!(died.is_some(), "the failpoint killed the broker at the hand-off: {}", serve.log_text());
    assert_eq!(cli.message_state(&id), "handed", "the hand-off was on record before the answer");
    serve = courier_tests::Serve::start(&cb.env, &[]);

    // Settled from the transcript while claude runs its second command.
    let m = cli.wait_state(&id, "uncertain", Duration::from_secs(10));
    assert!(courier_tests::util::pid_alive(child.pid()), "settled only once claude exited: {m}");
    assert_eq!(m["reason"], "claude_answer_lost", "{m}");
    assert_eq!(m["attempts"], 1, "offered once: {m}");
    let out = child.wait(courier_tests::claude::PRINT_TIMEOUT);
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());
    let carrying: Vec<usize> = api.requests().iter().filter(|r| r.body_contains(&text)).map(|r| r.index).collect();
    assert!(carrying.is_empty(), "requests {carrying:?} carried it although no answer was written:\n{}", api.dump());
    let posts = proven_hooks(&serve.log_text()).into_iter().filter(|(e, s, _)| e == "PostToolUse" && *s == sid).count();
    assert!(posts >= 2, "the restarted broker served the session's next PostToolUse: {}", serve.log_text());
    drop(serve);
}

/// The broker's counters, bounded.
fn status(env: &courier_tests::CodexEnv) -> courier_shared::wire::StatusReply {
    courier_tests::util::wait_until(Duration::from_secs(10), "the broker's status", || broker_lib::client::query_status(&env.runtime_dir))
}

/// How many confirmation passes ran while the maintenance thread made `passes` more of its own
/// (500 ms each while a row can move, else one per `nudge`, the request `broker send` makes
/// after queueing directly, which the confirmation thread does not wait on: the clock).
fn confirm_looks_over(env: &courier_tests::CodexEnv, passes: u64) -> u64 {
    let s0 = status(env);
    let socket = courier_shared::paths::socket_path(&env.runtime_dir);
    let s1 = courier_tests::util::wait_until(Duration::from_secs(30), "maintenance passes", || {
        let _ = broker_lib::producer::line::call(&socket, &serde_json::json!({"op": "nudge"}), Some(Duration::from_secs(10)));
        broker_lib::client::query_status(&env.runtime_dir).filter(|s| s.maintenance_passes >= s0.maintenance_passes + passes)
    });
    s1.claude_confirm_looks - s0.claude_confirm_looks
}

/// The confirmation thread costs an idle broker nothing: with no hand-off open it makes no pass
/// (before any delivery, and again once the one it had is settled). A hand-off wakes it: while
/// the model holds its answer to the request that carried the message (so no later hook can
/// settle it), the thread reads the transcript and the receipt is `confirmed`.
#[test]
fn the_confirmation_thread_sleeps_until_a_hand_off_and_confirms_it_while_no_hook_comes() {
    let hold = Hold::new();
    let held = hold.clone();
    let api = ScriptedMessages::start_with(move |r| match (r.tool_results().is_empty(), r.is_stream()) {
        (_, false) => Turn::text("ok"),
        (true, true) => Turn::bash("sleep 3; echo slept"),
        (false, true) => {
            held.park();
            Turn::text("done")
        }
    });
    let Some(env) = env_or_skip(&api) else { return };
    let cb = ClaudeBroker::new();
    let broker = cb.start(&env.claude);
    env.set_courier_hooks(cb.port);
    assert_eq!(confirm_looks_over(&cb.env, 6), 0, "an idle broker's confirmation thread made passes");

    let child = env.spawn_print("run the command");
    let sid = wait_proven(&broker, 1)[0].1.clone();
    let text = courier_tests::util::marker("CLAUDE_CONFIRM_THREAD");
    let id = broker.send(&sid, &text, None);
    hold.wait_held(1, Duration::from_secs(30));
    let m = broker.wait_state(&id, "confirmed", Duration::from_secs(10));
    assert!(!hold.is_released(), "confirmed by the thread while the model held its answer: {m}");
    assert!(status(&cb.env).claude_confirm_looks >= 2, "the hand-off woke the thread");
    hold.release();
    let out = child.wait(courier_tests::claude::PRINT_TIMEOUT);
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());
    assert_eq!(api.requests().iter().filter(|r| r.body_contains(&text)).count(), 1, "{}", api.dump());

    confirm_looks_over(&cb.env, 2); // the pass that finds nothing open
    assert_eq!(confirm_looks_over(&cb.env, 6), 0, "the thread went on looking once nothing was open");
}
