//! Self-test of the test kit against the real Codex binary, with no broker involved: the scripted
//! provider drives a real `codex exec`, the trust hashes the kit writes make Codex run our hooks
//! (and `hooks/list` reports them `trusted`), hook output lands in the next model request, and a
//! held reply really holds Codex.

use std::time::Duration;

use courier_tests::hooks::{Hook, COURIER_EVENTS};
use courier_tests::model::Request;
use courier_tests::model::{exec_held_then_done, parent_of_subagent};
use courier_tests::util::marker;
use courier_tests::{CodexEnv, Hold, Reply, ScriptedModel};

const T: Duration = Duration::from_secs(60);

/// A hook script printing `additionalContext` for PostToolUse, and a no-op for the other events.
fn kit_hooks(env: &CodexEnv, mark: &str) -> Vec<Hook> {
    let ctx = env.write_script(
        "post-tool-use.sh",
        &format!(
            "#!/bin/sh\ncat >/dev/null\nprintf '%s' '{{\"hookSpecificOutput\":{{\"hookEventName\":\"PostToolUse\",\"additionalContext\":\"{mark}\"}}}}'\n"
        ),
    );
    let noop = env.write_script("noop.sh", "#!/bin/sh\ncat >/dev/null\n");
    COURIER_EVENTS
        .iter()
        .map(|ev| {
            let cmd = if *ev == "PostToolUse" { &ctx } else { &noop };
            Hook::new(ev, &cmd.display().to_string())
        })
        .collect()
}

#[test]
fn trusted_hook_context_reaches_next_request() {
    let mark = marker("KIT_MARKER");
    let model = ScriptedModel::start();
    let env = CodexEnv::new(&model);
    env.install_hooks(&kit_hooks(&env, &mark));

    // Codex itself must report every handler trusted, with the hash we computed.
    let listed = env.hooks_list();
    assert_eq!(listed.len(), COURIER_EVENTS.len(), "hooks/list: {listed:#?}");
    for h in &listed {
        assert_eq!(h.trust_status, "trusted", "Codex does not trust {}: {:#?}", h.key, h.raw);
    }
    let ours: Vec<String> = env.hooks().iter().map(Hook::trust_hash).collect();
    for h in &listed {
        assert!(ours.contains(&h.current_hash), "hash {} of {} not one we computed", h.current_hash, h.key);
    }

    let out = env.exec("run a command please");
    out.assert_success();
    assert_eq!(out.stdout.trim(), "done", "stdout: {}", out.stdout);
    let thread = out.thread_id().expect("session id line");

    let reqs = model.requests();
    assert_eq!(reqs.len(), 2, "exec_command then done:\n{}", model.dump());
    assert!(reqs[0].developer_messages_containing(&mark).is_empty());
    assert_eq!(reqs[0].reply, "exec_command(echo hello)");
    assert_eq!(reqs[1].developer_messages_containing(&mark).len(), 1, "{:#?}", reqs[1].developer_messages());
    assert_eq!(model.first_request_with("developer", &mark), Some(1));
    for r in &reqs {
        assert_eq!(r.thread_id().as_deref(), Some(thread.as_str()), "request attributed to the thread");
        assert!(r.turn_id().is_some());
    }
    assert!(model.errors().is_empty(), "{:?}", model.errors());

    // Rollout helpers.
    let ro = env.rollout(&thread);
    assert_eq!(ro.thread_id().as_deref(), Some(thread.as_str()));
    assert_eq!(ro.turns().len(), 1);
    assert_eq!(ro.open_turn(), None, "turn closed after exec: {:?}", ro.turns());
    assert_eq!(ro.closed_turns(), vec![reqs[0].turn_id().unwrap()]);
    assert_eq!(ro.messages("developer").iter().filter(|m| m.contains(&mark)).count(), 1);
    assert_eq!(env.rollouts().len(), 1);
}

#[test]
fn wrong_hash_is_untrusted_and_skipped() {
    let mark = marker("KIT_UNTRUSTED");
    let model = ScriptedModel::start();
    let env = CodexEnv::new(&model);
    let hooks = kit_hooks(&env, &mark);
    env.install_hooks(&hooks);
    // Corrupt the trust of the PostToolUse handler only.
    let cfg = std::fs::read_to_string(env.config_toml_path()).unwrap();
    let good = hooks.iter().find(|h| h.event == "PostToolUse").unwrap().trust_hash();
    let bad = format!("sha256:{}", "0".repeat(64));
    std::fs::write(env.config_toml_path(), cfg.replace(&good, &bad)).unwrap();

    let listed = env.hooks_list();
    let post = listed.iter().find(|h| h.event == "postToolUse").expect("postToolUse listed");
    assert_ne!(post.trust_status, "trusted", "{:#?}", post.raw);
    assert_eq!(post.current_hash, good, "Codex's own hash equals ours");
    assert!(listed.iter().filter(|h| h.event != "postToolUse").all(|h| h.trust_status == "trusted"));

    env.exec("run a command please").assert_success();
    assert_eq!(model.requests_mentioning(&mark), 0, "an untrusted hook must not run");
}

#[test]
fn held_reply_holds_codex_until_released() {
    let hold = Hold::new();
    let model = ScriptedModel::start_with(exec_held_then_done("echo held", &hold));
    let env = CodexEnv::new(&model);
    let child = env.spawn_exec("hold me");
    let thread = child.wait_thread_id(T);
    let first = model.wait_for_requests(1, T);
    assert_eq!(first[0].thread_id().as_deref(), Some(thread.as_str()));
    hold.wait_held(1, T);
    // While held, Codex cannot have sent a second request.
    assert_eq!(model.request_count(), 1);
    assert_eq!(model.answered(), 0);
    hold.release();
    let out = child.wait(T);
    out.assert_success();
    assert_eq!(model.request_count(), 2, "{}", model.dump());
    assert_eq!(hold.passed(), 1);
}

#[test]
fn subagent_requests_are_attributed_to_the_child_thread() {
    let model = ScriptedModel::start_with(|r: &Request| {
        if r.is_subagent() {
            return if r.function_calls().is_empty() { Reply::exec("echo child") } else { Reply::message("child done") };
        }
        parent_of_subagent(r, "CHILD_TASK: run echo hello and report", 20_000)
    });
    let env = CodexEnv::new(&model);
    let out = env.exec("spawn a helper");
    out.assert_success();
    let parent = out.thread_id().unwrap();
    let threads = model.threads();
    assert_eq!(threads.len(), 2, "{}", model.dump());
    let child = threads.iter().find(|t| **t != parent).unwrap().clone();
    let child_reqs = model.requests_for_thread(&child);
    assert!(child_reqs.iter().all(|r| r.is_subagent() && r.header("session-id") == Some(parent.as_str())));
    assert!(child_reqs.iter().any(|r| r.reply == "exec_command(echo child)"), "{}", model.dump());
    assert!(model.requests().iter().any(|r| r.reply.starts_with("multi_agent_v1.wait_agent")), "{}", model.dump());
    // Both rollouts exist; the child's names the parent as its root session.
    let ro = env.rollout(&child);
    assert_eq!(ro.session_id().as_deref(), Some(parent.as_str()));
    assert_eq!(env.rollouts().len(), 2);
}

/// One HTTP/1.1 request to `addr` on a fresh connection: (status, body).
fn http(addr: std::net::SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    let req = format!("{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
    c.write_all(req.as_bytes()).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

/// The shared core under the Messages API: a side query (not streamed) gets the fallback and
/// leaves the queue alone, streamed requests take the queue in order, another path is a 404 kept
/// apart, and every request is recorded in order, numbered, its answer counted and awaited.
#[test]
fn the_scripted_core_queues_records_and_waits_for_the_messages_api() {
    use courier_tests::messages::{ScriptedMessages, Turn};
    let api = ScriptedMessages::start_queue(vec![Turn::bash("echo one"), Turn::text("two")], Turn::text("fallback"));
    let ask = |stream: bool| format!(r#"{{"model":"m","stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#);
    let (status, side) = http(api.addr(), "POST", "/v1/messages", &ask(false));
    assert_eq!(status, 200);
    assert!(side.contains("fallback"), "a side query takes nothing from the queue: {side}");
    let (_, first) = http(api.addr(), "POST", "/v1/messages?beta=true", &ask(true));
    assert!(first.contains("event: message_start") && first.contains("echo one"), "{first}");
    let (_, second) = http(api.addr(), "POST", "/v1/messages", &ask(true));
    assert!(second.contains("two") && !second.contains("echo one"), "{second}");
    assert_eq!(http(api.addr(), "GET", "/v1/models", "").0, 404);
    let all = api.wait_for_requests(3, T);
    assert_eq!(all.iter().map(|r| r.index).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(all.iter().map(|r| r.is_stream()).collect::<Vec<_>>(), [false, true, true]);
    assert_eq!(api.other_requests(), [("GET".to_string(), "/v1/models".to_string())]);
    api.wait_answered(3, T);
    assert!(api.errors().is_empty(), "{:?}", api.errors());
}
