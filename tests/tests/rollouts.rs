//! Rollout shapes the gate must read correctly with a real `broker serve` and the real
//! hook-client, driven by the step-by-step stand-in Codex (the kit's `standin::Stepped`).

use broker_lib::client::query_status;
use courier_tests::broker::refusal_codes;
use courier_tests::standin::records::*;
use courier_tests::standin::{standin_codex, world, Stepped};
use courier_tests::util::{fake_uuid_v7, marker};
use courier_tests::{Broker, Serve};
use serde_json::json;
use std::time::{Duration, Instant};

/// MiB of records written into the open turn before the broker restarts
/// (`COURIER_FAR_TURN_MIB`; 80 by default, beyond the former 64 MiB backward-scan window).
fn far_mib() -> usize {
    std::env::var("COURIER_FAR_TURN_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(80)
}

/// A turn opened more than 64 MiB back in a rollout the broker first sees
/// after a restart. Before: the backward scan gave up after 64 MiB, knew no open turn, and every
/// honest hook of that turn was refused `turn_mismatch` until the next turn. Now the first hook
/// after the restart is verified and delivers, reading a bounded number of bytes.
#[test]
fn turn_opened_far_back_is_found_after_a_broker_restart() {
    let env = world();
    let mut serve = Serve::start(&env, &[]);
    Broker::cli_only(&env).trust_codex(standin_codex());
    let (thread, turn) = (fake_uuid_v7(), fake_uuid_v7());
    let mut codex = Stepped::start(&env, &thread);
    codex.write(task_started(&turn));
    codex.write(turn_context(&turn));
    let ups = codex.hook("UserPromptSubmit", Some(&turn), json!({"prompt": "go"}));
    assert_eq!(ups.rc, 0, "{ups:?}");
    codex.write(user_message(&turn, "go"));

    // A long turn: tool calls with 1 MiB outputs, far more than 64 MiB of them.
    let mib = far_mib();
    let t0 = Instant::now();
    for i in 0..mib {
        let call = format!("call_big_{i}");
        codex.write(function_call(&call, &turn, "cat big"));
        codex.write(token_usage(&thread, &turn));
        codex.write(exec_completed(&thread, &turn, &call));
        codex.filler(1, 1 << 20);
        codex.write(function_call_output(&call));
    }
    let size = std::fs::metadata(&codex.rollout).unwrap().len();
    eprintln!("wrote {} MiB into the open turn in {:?}", size >> 20, t0.elapsed());
    assert!(size > (mib as u64) << 20);

    // The broker restarts (kill -9): it has never read this rollout.
    serve.kill9();
    let mut serve = Serve::start(&env, &[]);
    let read_before = query_status(&env.runtime_dir).unwrap().rollout_bytes_read;
    let text = marker("FAR_TURN");
    // --wake never: no wake attempt reads the rollout first; the hook below is its first sight.
    let id = Broker::cli_only(&env).run_ok(&["send", "--thread", &thread, "--wake", "never", "--from", "e2e", &text]).trim().to_string();

    // The next tool call of the same turn: its PreToolUse is the broker's first sight of the rollout.
    codex.write(function_call("call_next", &turn, "echo next"));
    codex.write(token_usage(&thread, &turn));
    let pre = codex.hook(
        "PreToolUse",
        Some(&turn),
        json!({"tool_name": "Bash", "tool_input": {"command": "echo next"}, "tool_use_id": "call_next"}),
    );
    let read = query_status(&env.runtime_dir).unwrap().rollout_bytes_read - read_before;
    eprintln!(
        "first hook call after the restart on a {} MiB rollout: {:.1} ms (hook-client wall time), {} KiB of the rollout read",
        size >> 20,
        pre.ms,
        read >> 10
    );
    let doc = Broker::cli_only(&env).inspect_json();
    assert!(
        pre.shown.as_deref().is_some_and(|s| s.contains(&text)),
        "the honest hook was not given the message: {pre:?}\nrefusals: {:?}",
        refusal_codes(&doc, Some(&thread))
    );
    assert!(refusal_codes(&doc, Some(&thread)).is_empty(), "{doc:#}");
    assert!(read < 64 << 20, "read {read} bytes: bounded, not the whole turn");
    assert!(read > 1 << 20, "read {read} bytes: the hook call was not the rollout's first sight");

    codex.write(exec_completed(&thread, &turn, "call_next"));
    let post = codex.hook(
        "PostToolUse",
        Some(&turn),
        json!({"tool_name": "Bash", "tool_input": {"command": "echo next"}, "tool_use_id": "call_next", "tool_response": "next"}),
    );
    assert_eq!(post.rc, 0, "{post:?}");
    codex.write(function_call_output("call_next"));
    codex.write(assistant_message(&turn, "done"));
    codex.write(token_usage(&thread, &turn));
    let stop = codex.hook("Stop", Some(&turn), json!({"stop_hook_active": false, "last_assistant_message": "done"}));
    assert_eq!(stop.rc, 0, "{stop:?}");
    codex.write(task_complete(&turn));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let doc = Broker::cli_only(&env).inspect_json();
        let m = courier_tests::broker::messages(&doc).into_iter().find(|m| m["id"] == id.as_str()).unwrap();
        if m["state"] == "confirmed" {
            break;
        }
        assert!(Instant::now() < deadline, "not confirmed: {m}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(refusal_codes(&Broker::cli_only(&env).inspect_json(), Some(&thread)).is_empty());
    serve.kill9();
}
