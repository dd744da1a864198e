//! Drift check: does this Codex still send and write what Courier depends on? Runs one real
//! session on every supported Codex it is given (`COURIER_CODEX_BIN`, and
//! `COURIER_CODEX_BIN_OLDEST` when set; point either at a new release to vet it) with a recording
//! hook on Courier's seven events, then checks, with a message naming the field and the version:
//! - the hook payload fields the gate and delivery read (`codex-format/src/hook.rs`), with their types;
//! - the rollout records they rely on (`codex-format/src/rollout.rs`): `session_meta` naming the
//!   thread, a turn opened and closed under the payload's `turn_id`, and hook output
//!   (`additionalContext` and a Stop block reason) recognised as hook-injected, in full.

use std::path::PathBuf;

use codex_format::rollout::marker_ids;
use codex_format::rollout::{classify_line, RolloutEvent};
use courier_tests::{CodexEnv, Reply, ScriptedModel};
use serde_json::Value;

const RECORDER: &str = r#"
import json, sys
p = json.load(sys.stdin)
with open(sys.argv[1], "a") as f:
    f.write(json.dumps(p) + "\n")
ev = p.get("hook_event_name")
if ev == "PostToolUse":
    print(json.dumps({"hookSpecificOutput": {"hookEventName": ev, "additionalContext": '<courier-message id="m_drift_post" from="drift">post</courier-message>'}}))
elif ev == "Stop" and not p.get("stop_hook_active"):
    print(json.dumps({"decision": "block", "reason": '<courier-message id="m_drift_stop" from="drift">stop</courier-message>'}))
"#;

/// (event, field, JSON type) Courier reads; `turn_id` on every event but SessionStart.
const FIELDS: &[(&str, &str, &str)] = &[
    ("*", "session_id", "string"),
    ("*", "transcript_path", "string"),
    ("*", "cwd", "string"),
    ("*", "hook_event_name", "string"),
    ("UserPromptSubmit", "turn_id", "string"),
    ("PreToolUse", "turn_id", "string"),
    ("PreToolUse", "tool_use_id", "string"),
    ("PostToolUse", "turn_id", "string"),
    ("PostToolUse", "tool_use_id", "string"),
    ("Stop", "turn_id", "string"),
    ("Stop", "stop_hook_active", "boolean"),
    ("SessionStart", "source", "string"),
];

fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Every drift found in one session of `codex`.
fn drift(codex: PathBuf) -> Vec<String> {
    let model =
        ScriptedModel::start_with(|r| if r.function_calls().is_empty() { Reply::exec("echo drift") } else { Reply::message("done") });
    let mut env = CodexEnv::new(&model);
    env.codex = codex;
    let version = String::from_utf8_lossy(&env.codex_command().arg("--version").output().unwrap().stdout).trim().to_string();
    let script = env.write_script("recorder.py", RECORDER);
    let log = env.root.join("payloads.jsonl");
    env.install_hooks(&courier_tests::hooks::Hook::courier_set(&format!("python3 {} {}", script.display(), log.display())));
    env.exec("please run a command").assert_success();
    let mut drift = Vec::new();
    let payloads: Vec<Value> =
        std::fs::read_to_string(&log).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    for ev in ["SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop"] {
        let Some(p) = payloads.iter().find(|p| p["hook_event_name"] == ev) else {
            drift.push(format!("{version}: no {ev} hook ran (Courier registers it)"));
            continue;
        };
        for (_, field, ty) in FIELDS.iter().filter(|(e, ..)| *e == "*" || *e == ev) {
            let found = p.get(*field).map(type_of).unwrap_or("missing");
            if found != *ty {
                drift.push(format!("{version}: {ev} payload field `{field}` is {found}, Courier reads a {ty}"));
            }
        }
        if ev != "SessionStart" && p.get("turn_id").is_some() && p.get("transcript_path").and_then(Value::as_str).is_none() {
            drift.push(format!("{version}: {ev} has no transcript_path (the gate binds the thread by it)"));
        }
    }
    let Some(path) = payloads.iter().find_map(|p| p["transcript_path"].as_str()).map(PathBuf::from) else {
        drift.push(format!("{version}: no payload names its rollout"));
        return drift;
    };
    let thread = codex_format::rollout::thread_id_from_path(&path.to_string_lossy()).map(str::to_string);
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let events: Vec<RolloutEvent> = text.lines().filter_map(|l| classify_line(l.as_bytes())).collect();
    match events.first() {
        Some(RolloutEvent::SessionMeta { id, .. }) if Some(id) == thread.as_ref() => {}
        other => drift.push(format!("{version}: the rollout's first record is not a session_meta naming the thread ({other:?})")),
    }
    let turn = payloads.iter().find(|p| p["hook_event_name"] == "PostToolUse").and_then(|p| p["turn_id"].as_str()).unwrap_or("");
    if !events.iter().any(|e| matches!(e, RolloutEvent::TurnStarted { turn_id } if turn_id == turn)) {
        drift.push(format!("{version}: no task_started record for the hooks' turn_id {turn} (turn affinity reads it)"));
    }
    if !events.iter().any(|e| matches!(e, RolloutEvent::TurnClosed { turn_id, .. } if turn_id == turn)) {
        drift.push(format!("{version}: no task_complete/turn_aborted record for turn {turn} (uncertain receipts read it)"));
    }
    for (id, what) in [("m_drift_post", "PostToolUse additionalContext"), ("m_drift_stop", "a Stop block reason")] {
        let whole = events.iter().any(|e| match e {
            RolloutEvent::HookText { text, .. } => marker_ids(text).any(|m| m == id) && text.contains("</courier-message>"),
            _ => false,
        });
        if !whole {
            drift.push(format!(
                "{version}: {what} is not recognised as hook output in the rollout (delivery would read uncertain); see codex-format/src/rollout.rs"
            ));
        }
    }
    drift
}

#[test]
fn supported_codex_versions_send_and_record_what_courier_reads() {
    let mut bins = vec![courier_tests::codex::codex_bin()];
    if let Some(old) = std::env::var_os("COURIER_CODEX_BIN_OLDEST") {
        bins.push(PathBuf::from(old));
    }
    let found: Vec<String> = bins.into_iter().flat_map(drift).collect();
    assert!(found.is_empty(), "Codex drifted from what Courier depends on:\n  {}", found.join("\n  "));
}
