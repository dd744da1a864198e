//! GitHub Copilot CLI, the real pinned binary (`install/fetch-copilot.sh`, `COURIER_COPILOT_BIN`),
//! offline against the scripted chat completions API: the ground Courier's third host stands on.
//! `copilot -p` runs one `bash` tool call; a camelCase postToolUse command hook in the private
//! home gets the payload Courier reads, and the context it prints reaches the model with the
//! call's result and is written to the session record.
//!
//! Skips (and says so) only when COURIER_COPILOT_BIN is unset; `install/test.sh` sets it.

use std::path::Path;
use std::time::Duration;

use courier_tests::copilot::{env_or_skip, event_records};
use courier_tests::model::{Reply, Request, ScriptedChat};
use courier_tests::util::{marker, shell_quote};
use serde_json::{json, Value};

/// A hook script that saves its stdin payload under `dir` and prints `output`.
fn saving_hook(root: &Path, dir: &Path, output: &Value) -> String {
    let script = root.join("hook.sh");
    let body = format!(
        "#!/bin/sh\ncat > {}/payload.$$.json\nprintf '%s\\n' {}\n",
        shell_quote(&dir.display().to_string()),
        shell_quote(&output.to_string())
    );
    std::fs::write(&script, body).unwrap();
    courier_tests::codex::set_mode(&script, 0o755);
    shell_quote(&script.display().to_string())
}

/// One bash call running `cmd` while the conversation has none, then "done".
pub fn bash_then_done(cmd: &str) -> impl FnMut(&Request) -> Reply + Send + 'static {
    let cmd = cmd.to_string();
    move |r: &Request| match r.offers_tool("bash") && r.assistant_turns() == 0 {
        true => Reply::exec(&cmd),
        false => Reply::message("done"),
    }
}

#[test]
fn print_mode_runs_bash_and_a_post_tool_use_hook_whose_context_reaches_the_model() {
    let ran = marker("COPILOT_RAN");
    let context = marker("HOOK_CONTEXT");
    let api = ScriptedChat::start_with(bash_then_done(&format!("echo {ran}")));
    let Some(env) = env_or_skip(&api) else { return };
    let payloads = env.root.join("payloads");
    std::fs::create_dir(&payloads).unwrap();
    env.set_hooks("probe", &[("postToolUse", saving_hook(&env.root, &payloads, &json!({"additionalContext": context})))]);
    let out = env.print("run the command");
    assert!(out.status.success(), "copilot -p failed: {:?}\nstdout:\n{}\nstderr:\n{}\n{}", out.status, out.stdout, out.stderr, api.dump());
    eprintln!("copilot -p took {:?}", out.duration);

    // The model got the command's output and the hook's context in the call's tool message.
    let after = api.wait_for(Duration::from_secs(5), "a request with the tool result", |r| !r.tool_results().is_empty());
    let results = after.tool_results();
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(results[0].contains(&ran) && results[0].contains(&context), "tool message: {:?}", results[0]);
    assert_eq!(api.requests().iter().filter(|r| r.chat_messages_containing(&context) > 1).count(), 0, "never twice in one request");

    // The payload: camelCase, the session id, the tool's result; no event name.
    let saved: Vec<Value> = std::fs::read_dir(&payloads)
        .unwrap()
        .flatten()
        .map(|e| serde_json::from_str(&std::fs::read_to_string(e.path()).unwrap()).unwrap())
        .collect();
    assert_eq!(saved.len(), 1, "{saved:?}");
    let p = &saved[0];
    let session = p["sessionId"].as_str().expect("sessionId");
    assert_eq!(p["toolName"], "bash", "{p}");
    assert!(p["toolResult"]["textResultForLlm"].as_str().is_some_and(|t| t.contains(&ran)), "{p}");
    assert!(p.get("hookEventName").is_none() && p.get("hook_event_name").is_none(), "{p}");

    // The session record, complete once `-p` exits: the call's result holds the context.
    let records = event_records(&env.events_path(session));
    let complete = records.iter().find(|r| r["type"] == "tool.execution_complete").expect("a tool.execution_complete record");
    assert!(complete.to_string().contains(&context), "{complete}");
}
