//! The interactive Claude Code TUI (the real pinned binary, `COURIER_CLAUDE_BIN`) under tmux, as
//! a person runs it: a private home, Courier's four HTTP hooks, a broker serving the hook port.
//! The person types a prompt; a message queued with `send --wait confirmed` while the model's
//! Bash call runs reaches the model once, the receipt is `confirmed`, and the pane shows what the
//! person sees of it (docs/claude-code.md "In the TUI").
//!
//! Skips (and says so) only when COURIER_CLAUDE_BIN is unset; `install/test.sh` sets it.

use std::time::Duration;

use courier_tests::claude::env_or_skip;
use courier_tests::claude::gate::{wait_proven, ClaudeBroker};
use courier_tests::messages::{ScriptedMessages, Turn};
use courier_tests::tmux::Tmux;
use courier_tests::util::{marker, str_field};
use serde_json::Value;

const PROMPT: &str = "please run the command";
const BOUND: Duration = Duration::from_secs(60);

#[test]
fn a_message_reaches_the_interactive_tui_session_once_and_is_confirmed() {
    // The prompt's turn runs one Bash call long enough to queue a message, then ends; side
    // queries (titles and the like, not streamed or not the prompt's) get plain text.
    let api = ScriptedMessages::start_with(|r| match (r.is_stream() && r.body_contains(PROMPT), r.tool_results().is_empty()) {
        (true, true) => Turn::bash("sleep 4; echo slept"),
        (true, false) => Turn::text("all done"),
        (false, _) => Turn::text("ok"),
    });
    let Some(env) = env_or_skip(&api) else { return };
    let cb = ClaudeBroker::new();
    let broker = cb.start(&env.claude);
    env.set_installed_hooks(cb.port);

    // The TUI, and the person typing the prompt once it is ready for input.
    let mut vars = env.env_vars();
    vars.push(("TERM".into(), "xterm-256color".into()));
    let tui = Tmux::start(&[env.claude.display().to_string()], &vars, &env.work);
    tui.wait_for("shift+tab to cycle", BOUND);
    tui.send_keys(&["-l", PROMPT]);
    tui.send_keys(&["Enter"]);

    // While the Bash call sleeps: queue a message for the session the hooks proved.
    let sid = wait_proven(&broker, 1)[0].1.clone();
    let text = marker("CLAUDE_TUI");
    let sent = broker.run(&["send", "--thread", &sid, "--from", "ci-bot", "--wait", "confirmed", "--timeout", "60s", "--json", &text]);
    let report = String::from_utf8_lossy(&sent.stdout).to_string();
    assert!(sent.status.success(), "send: {:?}\n{report}\n{}\n{}", sent.status, String::from_utf8_lossy(&sent.stderr), broker.log_text());
    let receipt: Value = serde_json::from_str(report.trim().lines().last().unwrap_or("")).unwrap_or_else(|e| panic!("{e}: {report}"));
    assert_eq!(receipt.pointer("/message/state").and_then(Value::as_str), Some("confirmed"), "{receipt}");
    let id = str_field(&receipt, "id").to_string();
    assert_eq!(broker.message_state(&id), "confirmed");

    // The model got it once: in the request after the tool result, as the hook's context.
    let screen = tui.wait_for("all done", BOUND);
    let after = api.wait_for(Duration::from_secs(5), "the tool result", |r| !r.tool_results().is_empty());
    assert_eq!(after.body.to_string().matches(&text).count(), 1, "once in the request: {}", after.body);
    let with: Vec<usize> = api.requests().iter().filter(|r| r.body_contains(&text)).map(|r| r.index).collect();
    assert_eq!(with, [after.index], "only the request after the tool result carries it:\n{}", api.dump());
    let system = after.texts("system");
    let carrying: Vec<&String> = system.iter().filter(|t| t.contains(&text)).collect();
    assert_eq!(carrying.len(), 1, "{system:?}");
    assert!(carrying[0].starts_with("PostToolUse:Bash hook additional context: "), "{}", carrying[0]);

    // The person's receipt line (`systemMessage`) is for the screen only: no model request has it.
    let line = format!("Courier delivered 1 message from ci-bot ({id})");
    let leaked: Vec<usize> = api.requests().iter().filter(|r| r.body_contains("Courier delivered")).map(|r| r.index).collect();
    assert!(leaked.is_empty(), "the receipt line reached the model in requests {leaked:?}:\n{}", api.dump());

    // What the person sees of it: the turn and the receipt line, not the message, neither in the
    // normal view nor in the detailed transcript (ctrl+o), which names the hook and not its context.
    eprintln!("--- TUI\n{screen}");
    assert!(screen.contains(PROMPT) && screen.contains("Ran 1 shell command"), "{screen}");
    assert!(!screen.contains(&text) && !screen.contains("additional context"), "the TUI shows the hook's context:\n{screen}");
    let shown = tui.wait_for(&line, Duration::from_secs(10));
    assert!(shown.contains(&format!("says: {line}")), "the receipt line as Claude Code shows it:\n{shown}");
    tui.send_keys(&["C-o"]);
    let detail = tui.wait_for("Showing detailed transcript", Duration::from_secs(10));
    eprintln!("--- TUI, ctrl+o\n{detail}");
    assert!(detail.contains("Bash(sleep 4; echo slept)") && detail.contains("1 PostToolUse hook ran"), "{detail}");
    assert!(!detail.contains(&text) && !detail.contains("additional context"), "the transcript view shows the hook's context:\n{detail}");
}
