//! The interactive Claude Code TUI (the real pinned binary, `COURIER_CLAUDE_BIN`) under tmux, as
//! a person runs it: a private home, Courier's four HTTP hooks, a broker serving the hook port.
//! The person types a prompt; a message queued with `send --wait confirmed` while the model's
//! Bash call runs reaches the model once, the receipt is `confirmed`, and the pane shows what the
//! person sees of it (docs/claude-code.md "In the TUI").
//!
//! Skips (and says so) only when COURIER_CLAUDE_BIN is unset; `install/test.sh` sets it.

use std::time::Duration;

use courier_tests::claude::env_or_skip;
use courier_tests::claude::gate::{claude_refusals, proven_hooks, wait_proven, ClaudeBroker};
use courier_tests::messages::{ScriptedMessages, Turn};
use courier_tests::tmux::Tmux;
use courier_tests::util::{marker, poll_until, str_field};
use serde_json::{json, Value};

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

/// A prompt the person submits while the ending turn's Stop hooks still run (probed on 2.1.332;
/// a Stop command hook holds them here until the test lets it go): Claude Code queues it
/// (`queue-operation` records), its UserPromptSubmit repeats the ending turn's `prompt_id`
/// (refused `ticket_used` with no alarm: it opens nothing), and the turn it opens has another,
/// whose prompt record (`promptSource: "queued"`) Claude Code writes before the turn's first
/// request but flushes to the transcript in a batch, often after that turn's first tool hook. The
/// gate waits for the record within the hook's budget and moves the session's pin to that turn
/// (`claude/turn.rs`), so the turn's PreToolUse is proven, and a message sent while its Bash call
/// runs reaches the model mid-turn, once, `confirmed`; no hook of the turn is refused
/// `claude_turn`. No timing window: the Stop hook and the Bash call each wait for a file the test
/// creates once what must come first has happened.
#[test]
fn a_prompt_queued_during_stop_hooks_gets_its_messages_mid_turn() {
    let api_gates = courier_shared::scratch::dir("courier-tui-gates");
    let (stop_gate, bash_gate) = (api_gates.join("stop-may-end"), api_gates.join("bash-may-end"));
    let bash = format!("while [ ! -e {} ]; do sleep 0.05; done; echo two", bash_gate.display());
    let api = ScriptedMessages::start_with(move |r| {
        let (second, first) = (r.is_stream() && r.body_contains("SECOND-PROMPT"), r.is_stream() && r.body_contains("FIRST-PROMPT"));
        match (second, first, r.tool_results().is_empty()) {
            (true, _, true) => Turn::bash(&bash),
            (true, _, false) => Turn::text("second all done"),
            (false, true, _) => Turn::text("first all done"),
            _ => Turn::text("ok"),
        }
    });
    let Some(env) = env_or_skip(&api) else { return };
    let cb = ClaudeBroker::new();
    let broker = cb.start(&env.claude);
    let mut hooks: Vec<(&str, &str, Value)> = courier_tests::claude::COURIER_EVENTS
        .iter()
        .map(|e| {
            let url = format!("http://127.0.0.1:{}/hook/{e}", cb.port);
            (*e, if e.ends_with("ToolUse") { "*" } else { "" }, json!({"type": "http", "url": url, "timeout": 5}))
        })
        .collect();
    // The first turn's Stop hooks run until the test has queued the second prompt (the second
    // turn's Stop passes at once: the file is there by then).
    let hold_stop = format!("while [ ! -e {} ]; do sleep 0.05; done", stop_gate.display());
    hooks.push(("Stop", "", json!({"type": "command", "command": hold_stop, "timeout": 60})));
    env.set_hook_entries(&hooks);

    let mut vars = env.env_vars();
    vars.push(("TERM".into(), "xterm-256color".into()));
    let tui = Tmux::start(&[env.claude.display().to_string()], &vars, &env.work);
    tui.wait_for("shift+tab to cycle", BOUND);
    tui.send_keys(&["-l", "FIRST-PROMPT"]);
    tui.send_keys(&["Enter"]);
    tui.wait_for("first all done", BOUND);
    tui.wait_for("running Stop hooks", BOUND);
    tui.send_keys(&["-l", "SECOND-PROMPT"]);
    tui.send_keys(&["Enter"]);
    // Queued: its UserPromptSubmit (the ending turn's id again) reached the broker. Then the
    // Stop hooks may end, and the queued turn begins.
    poll_until(BOUND, || broker.log_text().contains("(a queued prompt)").then_some(()))
        .unwrap_or_else(|| panic!("the queued prompt's UserPromptSubmit: {:?}\n{}", claude_refusals(&broker), broker.log_text()));
    std::fs::write(&stop_gate, "").unwrap();

    // The queued prompt's turn: its first tool hook is proven, then a message sent meanwhile
    // reaches it at its PostToolUse, once the Bash call may end.
    let pre = poll_until(BOUND, || proven_hooks(&broker.log_text()).into_iter().find(|(e, _, _)| e == "PreToolUse"))
        .unwrap_or_else(|| panic!("the queued prompt's turn: no tool hook proven: {:?}\n{}", claude_refusals(&broker), broker.log_text()));
    let text = marker("CLAUDE_QUEUED");
    let id = broker.send_opts(&pre.1, &text, None, Some("ci-bot"));
    std::fs::write(&bash_gate, "").unwrap();
    let m = broker.wait_state(&id, "confirmed", BOUND);
    assert_eq!(m["event"], "claude", "handed mid-turn, at a PostToolUse: {m}");
    tui.wait_for("second all done", BOUND);
    let with: Vec<usize> = api.requests().iter().filter(|r| r.body_contains(&text)).map(|r| r.index).collect();
    let after = api.wait_for(Duration::from_secs(5), "the tool result", |r| !r.tool_results().is_empty());
    assert_eq!(with, [after.index], "only the request after the queued turn's tool result carries it:\n{}", api.dump());

    // It was a queued prompt, as the transcript records it, and only its UserPromptSubmit (the
    // ending turn's id again) was refused.
    let projects = env.home.join(".claude/projects");
    let transcript = std::fs::read_dir(&projects)
        .unwrap()
        .map(|d| d.unwrap().path().join(format!("{}.jsonl", pre.1)))
        .find(|p| p.exists())
        .expect("the session's transcript");
    let records = courier_tests::claude::transcript_records(&transcript);
    let second = records.iter().find(|r| r["type"] == "user" && r["message"]["content"] == "SECOND-PROMPT").expect("the prompt record");
    assert_eq!(second["promptSource"], "queued", "{second}");
    assert!(records.iter().any(|r| r["type"] == "queue-operation" && r["operation"] == "enqueue"), "no enqueue record");
    let turns: std::collections::BTreeSet<&str> =
        records.iter().filter(|r| r["type"] == "user").filter_map(|r| r["promptId"].as_str()).collect();
    assert_eq!(turns.len(), 2, "two turns: {turns:?}");
    let refused = claude_refusals(&broker);
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(refused[0].0 == "ticket_used" && refused[0].1.contains("claude:UserPromptSubmit:"), "{refused:?}");
    let log = broker.log_text();
    assert!(log.contains("(a queued prompt)") && !log.contains("ALARM"), "a queued prompt raises no alarm:\n{log}");
    std::fs::remove_dir_all(&api_gates).ok();
}
