//! Messages of a real size: what Codex does with large hook output under the context limit
//! `broker install` writes, and Courier delivering a 60 KiB message whole. Runs on the Codex
//! `COURIER_CODEX_BIN` names (0.171.0 by default; run it on 0.160.0 too).

use std::path::Path;
use std::time::Duration;

use courier_tests::hooks::{Hook, COURIER_EVENTS};
use courier_tests::model::Request;
use courier_tests::util::marker;
use courier_tests::{CodexEnv, Reply, ScriptedModel};
use serde_json::json;

const T: Duration = Duration::from_secs(60);

/// The limit install writes, and the largest output Courier renders.
use broker_lib::delivery::MAX_OUTPUT_BYTES;
use broker_lib::install::HOOK_CONTEXT_LIMIT;

/// A text of exactly `n` bytes, distinct along its length (a cut anywhere shows).
fn long_text(tag: &str, n: usize) -> String {
    let mut s = format!("{tag} ");
    let mut i = 0u64;
    while s.len() < n {
        s.push_str(&format!("{i:08} line of text; "));
        i += 1;
    }
    s.truncate(n);
    s
}

/// Hooks for every Courier event with `limit`: `event` prints `output` (once), the rest nothing.
fn one_hook_prints(env: &CodexEnv, event: &str, output: &serde_json::Value, limit: Option<u64>) -> Vec<Hook> {
    let out = env.codex_home.join("hook-output.json");
    std::fs::write(&out, output.to_string()).unwrap();
    let flag = env.codex_home.join("hook-printed");
    let script = env.write_script(
        "print-once.sh",
        &format!("#!/bin/sh\ncat >/dev/null\n[ -e '{f}' ] && exit 0\n: > '{f}'\ncat '{o}'\n", f = flag.display(), o = out.display()),
    );
    let noop = env.write_script("noop.sh", "#!/bin/sh\ncat >/dev/null\n");
    COURIER_EVENTS
        .iter()
        .map(|ev| Hook::new(ev, &if *ev == event { &script } else { &noop }.display().to_string()).context_limit(limit))
        .collect()
}

fn spilled(thread: &str) -> bool {
    Path::new("/tmp/hook_outputs").join(thread).exists()
}

/// Codex trusts the handlers with the hash the kit (the broker's own function) computed.
fn assert_trusted_with_our_hash(env: &CodexEnv) {
    let ours: Vec<String> = env.hooks().iter().map(Hook::trust_hash).collect();
    for h in env.hooks_list() {
        eprintln!("LISTED {} {} {} {}", h.event, h.raw["additionalContextLimit"], h.trust_status, h.current_hash);
    }
    for h in env.hooks_list() {
        assert_eq!(h.trust_status, "trusted", "{:#?}", h.raw);
        assert!(ours.contains(&h.current_hash), "Codex hashes {} as {}, not one of ours", h.key, h.current_hash);
    }
}

/// PostToolUse `additionalContext` of the largest size Courier renders reaches the next request
/// byte for byte under Courier's limit, with nothing spilled; `systemMessage` beside it is
/// neither sent to the model nor kept in the rollout.
#[test]
fn codex_passes_courier_sized_context_whole() {
    let text = long_text(&marker("CTX"), MAX_OUTPUT_BYTES);
    let sys = marker("SYSMSG");
    let model = ScriptedModel::start_with(|r: &Request| if r.function_calls().is_empty() { Reply::exec("echo hi") } else { Reply::message("done") });
    let env = CodexEnv::new(&model);
    let output = json!({"systemMessage": sys, "hookSpecificOutput": {"hookEventName": "PostToolUse", "additionalContext": text}});
    env.install_hooks(&one_hook_prints(&env, "PostToolUse", &output, Some(HOOK_CONTEXT_LIMIT)));
    assert_trusted_with_our_hash(&env);
    let out = env.exec("run a command");
    out.assert_success();
    let thread = out.thread_id().unwrap();
    let reqs = model.requests();
    assert_eq!(reqs.len(), 2, "{}", model.dump());
    let dev = reqs[1].developer_messages_containing(&text[..40]);
    assert_eq!(dev, vec![text.clone()], "the context, whole and alone");
    assert_eq!(model.requests_mentioning(&sys), 0, "systemMessage is not sent to the model");
    let rollout = std::fs::read_to_string(env.rollout_path(&thread).unwrap()).unwrap();
    assert!(!rollout.contains(&sys), "systemMessage is not kept in the rollout");
    assert!(!spilled(&thread));
}

/// The same under Codex's default limit is cut and spilled: the limit is what lets it through
/// (and shows this test can fail).
#[test]
fn codex_cuts_large_context_without_the_limit() {
    let text = long_text(&marker("CTX"), 12_000);
    let model = ScriptedModel::start_with(|r: &Request| if r.function_calls().is_empty() { Reply::exec("echo hi") } else { Reply::message("done") });
    let env = CodexEnv::new(&model);
    let output = json!({"hookSpecificOutput": {"hookEventName": "PostToolUse", "additionalContext": text}});
    env.install_hooks(&one_hook_prints(&env, "PostToolUse", &output, None));
    let out = env.exec("run a command");
    out.assert_success();
    let reqs = model.requests();
    assert!(reqs[1].developer_messages_containing(&text).is_empty(), "cut without the limit");
    assert_eq!(reqs[1].developer_messages_containing(&text[..40]).len(), 1, "its head is shown");
}

/// A Stop block reason of the largest size Courier renders: is it passed whole under Courier's
/// limit?
#[test]
fn codex_passes_courier_sized_stop_reason_whole() {
    let text = long_text(&marker("STOP"), MAX_OUTPUT_BYTES);
    let model = ScriptedModel::start_with(|_r: &Request| Reply::message("done"));
    let env = CodexEnv::new(&model);
    let output = json!({"decision": "block", "reason": text});
    env.install_hooks(&one_hook_prints(&env, "Stop", &output, Some(HOOK_CONTEXT_LIMIT)));
    assert_trusted_with_our_hash(&env);
    let out = env.exec("say done");
    out.assert_success();
    let thread = out.thread_id().unwrap();
    let reqs = model.requests();
    assert_eq!(reqs.len(), 2, "{}", model.dump());
    let shown = reqs[1].user_messages_containing(&text[..40]);
    assert_eq!(shown.len(), 1, "{:#?}", reqs[1].user_messages().iter().map(|m| m.len()).collect::<Vec<_>>());
    assert!(shown[0].contains(&text), "Stop reason cut: {} bytes shown of {}", shown[0].len(), text.len());
    assert!(!spilled(&thread));
}
