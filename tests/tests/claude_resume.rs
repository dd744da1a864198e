//! Who may take over a Claude Code session whose claude has ended (`claude --resume`), on the
//! real pinned binary (`COURIER_CLAUDE_BIN`): the person, in a terminal, yes; a claude that a
//! host session's model runs as a tool command, no (docs/claude-code.md "Resuming an ended
//! session").
//!
//! Skips (and says so) only when COURIER_CLAUDE_BIN is unset; `install/test.sh` sets it.

use std::time::Duration;

use courier_tests::claude::gate::{broker_in_claude, claude_refusals, message_by_key, wait_proven, ClaudeBroker};
use courier_tests::claude::{env_or_skip, ClaudeEnv};
use courier_tests::messages::{content_text, ScriptedMessages, Turn};
use courier_tests::tmux::Tmux;
use courier_tests::util::{marker, poll_until};
use courier_tests::Broker;

const BOUND: Duration = Duration::from_secs(60);
/// The prompt the nested claude is given (and nothing else sends).
const NESTED: &str = "NESTED-PROMPT";

/// Runs one `claude -p` turn to its end: the session id its hooks pinned. Its claude has exited,
/// so the session is "ended": the pin may pass to the next claude that opens a turn in it.
fn ended_session(env: &ClaudeEnv, broker: &Broker) -> String {
    let out = env.print("hello");
    assert!(out.status.success(), "{:?}\n{}", out.status, out.stderr);
    wait_proven(broker, 2)[0].1.clone()
}

/// Attack: session A's model runs `claude -p --resume B` as its Bash command, B being a session
/// whose claude ended with a message queued for it. The nested claude is a genuine, trusted,
/// cleanly started claude on B's own transcript: every kernel step of the gate passes. Were it
/// accepted as B, A's model would read B's message (the nested claude's output) and could
/// `broker send` as verified `thread:B`. It must be refused at its first hook, B's message stay
/// pending for B, and its `broker send` not be B's.
#[test]
fn a_claude_run_as_a_tool_command_does_not_take_over_an_ended_session() {
    let command = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let nested_command = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let (outer, nested) = (command.clone(), nested_command.clone());
    let api = ScriptedMessages::start_with(move |r| {
        let in_nested = r.texts("user").iter().any(|t| t.contains(NESTED));
        let asked = r.texts("user").iter().any(|t| t.contains("run the command"));
        match (in_nested, asked, r.tool_results().is_empty()) {
            (true, _, true) => Turn::bash(&nested.lock().unwrap()),
            (true, _, false) => Turn::text("nested done"),
            (false, true, true) => Turn::bash(&outer.lock().unwrap()),
            _ => Turn::text("done"),
        }
    });
    let Some(env) = env_or_skip(&api) else { return };
    let cb = ClaudeBroker::new();
    let broker = cb.start(&env.claude);
    env.set_courier_hooks(cb.port);
    let victim = ended_session(&env, &broker);
    let text = marker("RESUME_TAKEN");
    let queued = broker.send_opts(&victim, &text, Some("for-b"), Some("ci-bot"));

    // The nested claude's model sends as whatever session it runs in; the outer command runs it
    // as a model would (CLAUDECODE unset: Claude Code refuses to start nested otherwise).
    let target = "00000000-0000-4000-8000-00000000c1a2";
    *nested_command.lock().unwrap() =
        format!("{} send --thread {target} --future-thread --key nested hello 2>&1; echo nested-rc=$?", broker_in_claude(&cb.env));
    *command.lock().unwrap() = format!("env -u CLAUDECODE {} -p {NESTED} --resume {victim} 2>&1; echo outer-rc=$?", env.claude.display());
    let out = env.print("run the command");
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());
    let tool_output: Vec<String> =
        api.requests().iter().flat_map(|r| r.tool_results().into_iter().map(content_text).collect::<Vec<_>>()).collect();
    let tool_output = tool_output.join("\n");
    assert!(
        tool_output.contains("nested-rc=0") && tool_output.contains("outer-rc=0"),
        "the nested claude ran its command:\n{tool_output}\n{}",
        api.dump()
    );

    // B's message reached no model, and stays pending for B.
    let carrying: Vec<usize> = api.requests().iter().filter(|r| r.body_contains(&text)).map(|r| r.index).collect();
    assert!(carrying.is_empty(), "B's message went to the nested claude's model in requests {carrying:?}:\n{}", api.dump());
    assert_eq!(broker.message_state(&queued), "pending", "{}", broker.log_text());
    // The nested claude's send is not B's.
    let sent = message_by_key(&broker, "nested");
    assert_ne!(sent["from"], format!("thread:{victim}"), "the nested claude sent as B: {sent}");
    // And the gate said why.
    let refused = claude_refusals(&broker);
    assert!(
        refused.iter().any(|(code, detail)| code == "claude_resume" && detail.contains("tool command")),
        "{refused:?}\n{}",
        broker.log_text()
    );
}

/// The person resuming an ended session in a terminal (the TUI under tmux, `claude --resume B`):
/// the session passes to that claude, and the message queued for B while it was ended reaches
/// its model at its first tool call, `confirmed`.
#[test]
fn a_person_resuming_an_ended_session_in_a_terminal_gets_its_messages() {
    let api = ScriptedMessages::start_with(|r| {
        let resumed = r.is_stream() && r.texts("user").iter().any(|t| t.contains("go on"));
        match (resumed, r.tool_results().is_empty()) {
            (true, true) => Turn::bash("echo resumed"),
            (true, false) => Turn::text("resumed all done"),
            _ => Turn::text("done"),
        }
    });
    let Some(env) = env_or_skip(&api) else { return };
    let cb = ClaudeBroker::new();
    let broker = cb.start(&env.claude);
    env.set_courier_hooks(cb.port);
    let sid = ended_session(&env, &broker);
    let text = marker("RESUMED_BY_PERSON");
    let id = broker.send_opts(&sid, &text, None, Some("ci-bot"));

    let mut vars = env.env_vars();
    vars.push(("TERM".into(), "xterm-256color".into()));
    let tui = Tmux::start(&[env.claude.display().to_string(), "--resume".into(), sid.clone()], &vars, &env.work);
    tui.wait_for("shift+tab to cycle", BOUND);
    tui.send_keys(&["-l", "go on"]);
    tui.send_keys(&["Enter"]);
    tui.wait_for("resumed all done", BOUND);
    let state = poll_until(BOUND, || Some(broker.message_state(&id)).filter(|s| s == "confirmed"));
    assert_eq!(state.as_deref(), Some("confirmed"), "{:?}\n{}", claude_refusals(&broker), broker.log_text());
    let with: Vec<usize> = api.requests().iter().filter(|r| r.body_contains(&text)).map(|r| r.index).collect();
    assert_eq!(with.len(), 1, "once:\n{}", api.dump());
    assert!(claude_refusals(&broker).is_empty(), "{:?}", claude_refusals(&broker));
}
