//! Claude Code, the real pinned binary (`install/fetch-claude.sh`, `COURIER_CLAUDE_BIN`), offline
//! against the scripted Messages API: the ground Courier's second host stands on. `claude -p`
//! runs one Bash tool call; a PostToolUse command hook registered in the private home gets the
//! payload Courier will read, and the context it prints reaches the model and the transcript.
//!
//! Skips (and says so) only when COURIER_CLAUDE_BIN is unset; `install/test.sh` sets it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use courier_tests::claude::{transcript_records, ClaudeEnv, ClaudeHook};
use courier_tests::messages::{ScriptedMessages, Turn};
use courier_tests::util::{marker, shell_quote, str_field};
use serde_json::{json, Value};

/// A PostToolUse hook script that saves its stdin payload under `dir` and prints `context` as the
/// hook's `additionalContext`.
fn context_hook(root: &Path, dir: &Path, context: &str) -> String {
    let script = root.join("post-tool-use.sh");
    let output = json!({"hookSpecificOutput": {"hookEventName": "PostToolUse", "additionalContext": context}});
    let body = format!(
        "#!/bin/sh\ncat > {}/payload.$$.json\nprintf '%s\\n' {}\n",
        shell_quote(&dir.display().to_string()),
        shell_quote(&output.to_string())
    );
    std::fs::write(&script, body).unwrap();
    courier_tests::codex::set_mode(&script, 0o755);
    shell_quote(&script.display().to_string())
}

/// The payloads the hook saved, parsed.
fn saved_payloads(dir: &Path) -> Vec<Value> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap();
        out.push(serde_json::from_str(&text).unwrap_or_else(|err| panic!("hook payload {text:?}: {err}")));
    }
    out
}

#[test]
fn print_mode_runs_bash_and_a_post_tool_use_hook_whose_context_reaches_the_model() {
    let ran = marker("CLAUDE_RAN");
    let context = marker("HOOK_CONTEXT");
    let cmd = format!("echo {ran}");
    let api = ScriptedMessages::start_with(move |r| match r.tool_results().is_empty() {
        true => Turn::bash(&cmd),
        false => Turn::text("done"),
    });
    let Some(env) = ClaudeEnv::new(&api) else {
        eprintln!("skipped: COURIER_CLAUDE_BIN is unset (install/fetch-claude.sh prints the path; install/test.sh sets it)");
        return;
    };
    let payloads = env.root.join("payloads");
    std::fs::create_dir(&payloads).unwrap();
    env.set_hooks(&[ClaudeHook { event: "PostToolUse", matcher: "Bash", command: context_hook(&env.root, &payloads, &context) }]);
    let out = env.print("run the command");
    assert!(out.status.success(), "claude -p failed: {:?}\nstdout:\n{}\nstderr:\n{}\n{}", out.status, out.stdout, out.stderr, api.dump());
    eprintln!("claude -p took {:?}", out.duration);

    // The model got the command's output as the result of its tool call.
    let after = api.wait_for(Duration::from_secs(5), "a request with the tool result", |r| !r.tool_results().is_empty());
    let tool_use_id = str_field(after.tool_uses()[0], "id").to_string();
    let result = after.tool_result_text(&tool_use_id).expect("the tool result answers the call");
    assert!(result.contains(&ran), "tool result {result:?} lacks the command's output\n{}", api.dump());
    assert!(api.other_requests().is_empty(), "only /v1/messages: {:?}", api.other_requests());

    // The hook's payload names the session, its transcript and the tool call.
    let saved = saved_payloads(&payloads);
    assert_eq!(saved.len(), 1, "one PostToolUse run: {saved:?}");
    let p = &saved[0];
    assert_eq!(str_field(p, "hook_event_name"), "PostToolUse", "{p}");
    assert_eq!(str_field(p, "tool_use_id"), tool_use_id, "{p}");
    let session_id = str_field(p, "session_id");
    assert!(courier_tests::util::is_uuid(session_id), "session_id {session_id:?}");
    let transcript = PathBuf::from(str_field(p, "transcript_path"));
    assert!(transcript.starts_with(env.home.join(".claude/projects")), "{}", transcript.display());
    assert_eq!(transcript.file_name().unwrap().to_string_lossy(), format!("{session_id}.jsonl"));

    // The hook's additionalContext reached the model, once, as Claude Code's system message.
    let want = format!("PostToolUse:Bash hook additional context: {context}");
    let texts = after.texts("system");
    assert_eq!(texts.iter().filter(|t| t.contains(&want)).count(), 1, "system texts {texts:?}\nbody {}", after.body);

    // The transcript records it for the call, and the exact request text that carried it.
    let records = transcript_records(&transcript);
    let attachment = records
        .iter()
        .find(|r| r.pointer("/attachment/type").and_then(Value::as_str) == Some("hook_additional_context"))
        .unwrap_or_else(|| panic!("no hook_additional_context attachment in {records:#?}"));
    let a = &attachment["attachment"];
    assert_eq!(str_field(a, "toolUseID"), tool_use_id, "{a}");
    assert_eq!(str_field(a, "hookEvent"), "PostToolUse", "{a}");
    assert!(a["content"].to_string().contains(&context), "{a}");
    // The blob holding the exact text sent, named by hash in the `tail` of the request record after it.
    let types: Vec<&str> = records.iter().map(|r| str_field(r, "type")).collect();
    let at = records
        .iter()
        .position(|r| {
            str_field(r, "type") == "api-request-blob" && r.pointer("/message/content/0/text").and_then(Value::as_str) == Some(&want)
        })
        .unwrap_or_else(|| panic!("no api-request-blob holds {want:?}: {types:?}"));
    let hash = str_field(&records[at], "hash");
    let request = records[at..].iter().find(|r| str_field(r, "type") == "api-request").expect("an api-request after the blob");
    let tail: Vec<&str> = request["tail"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    assert!(tail.contains(&hash), "the request's tail {tail:?} names the blob {hash}");
}
