//! Attacks across the threads of one Codex process (docs/security.md; `broker/src/gate/`): a
//! sub-agent runs in its parent's codex, and each thread's hooks must take only its own messages.
//!
//! Each test tries one attack and checks that the attacker gets nothing, that the queue is
//! untouched (message still `pending`, `attempts` 0) and that `broker inspect --json` records the
//! refusal with its reason code; where it is cheap, the same message is then delivered by an
//! honest hook of the same turn, so the refusal is shown to be the only thing that kept it back.
//! The real Codex CLI, broker and hook-client; the other attack surfaces are the other
//! `attacks_*.rs` (docs/security.md maps each gate check to its test). Needs
//! `cargo build --workspace` and the pinned Codex (`install/fetch-codex.sh`).

use std::time::Duration;

use courier_tests::attack::{assert_untouched, attack_codes, carries, SETTLE};
use courier_tests::broker::hook_command;
use courier_tests::model::Request;
use courier_tests::util::{marker, shell_quote, str_field, wait_until};
use courier_tests::{Broker, CodexEnv, Hold, Reply, ScriptedModel};

const T: Duration = Duration::from_secs(60);

/// A sub-agent runs in its parent's codex process. Each thread's hooks take only that thread's
/// messages, once: the child's PostToolUse takes the child's message, the parent's message queued
/// while the child runs reaches only parent requests, the parent's Stop takes only the parent's
/// message, and a child message queued after the child's last tool call is never taken by the
/// parent (the child's SubagentStop cannot deliver, so it stays pending).
#[test]
fn subagent_and_parent_each_get_only_their_own_messages() {
    let end_hold = Hold::new();
    let child_end_hold = Hold::new();
    let model = ScriptedModel::start();
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let started = env.root.join("child-started");
    let go = env.root.join("child-go");
    // The child's command reports that it runs (its PreToolUse is over), then waits for the test.
    let child_cmd = format!(
        "touch {s}; for i in $(seq 1500); do [ -e {g} ] && break; sleep 0.02; done; echo child-ran",
        s = shell_quote(&started.display().to_string()),
        g = shell_quote(&go.display().to_string())
    );
    let (eh, ceh) = (end_hold.clone(), child_end_hold.clone());
    model.set_script(move |r: &Request| {
        if r.is_subagent() {
            return if r.function_calls().is_empty() { Reply::exec(&child_cmd) } else { Reply::message("child done").held(&ceh) };
        }
        if r.function_calls().is_empty() {
            Reply::spawn_agent("CHILD_TASK: run the command and report")
        } else if let Some(agent) = r.spawned_agent() {
            Reply::wait_agent(&[&agent], 30_000)
        } else {
            Reply::message("done").held(&eh)
        }
    });
    let broker = Broker::start_trusted(&env);
    let proc = env.spawn_exec("spawn a helper");
    let parent = proc.wait_thread_id(T);
    let first_child = model.wait_for(T, "the sub-agent's first request", Request::is_subagent);
    let child = first_child.thread_id().unwrap();
    assert_ne!(child, parent);

    // While the child's command runs: one message for each thread.
    wait_until(T, "the child's command to start", || started.exists().then_some(()));
    let (c_post, p_mid) = (marker("CHILD_POST"), marker("PARENT_MID"));
    let id_c_post = broker.send_opts(&child, &c_post, None, Some("e2e"));
    let id_p_mid = broker.send_opts(&parent, &p_mid, None, Some("e2e"));
    std::fs::write(&go, "").unwrap();

    // The child's final answer is held: a late message for the child.
    child_end_hold.wait_held(1, T);
    let c_late = marker("CHILD_LATE");
    let id_c_late = broker.send_opts(&child, &c_late, None, Some("e2e"));
    child_end_hold.release();

    // The parent's final answer is held: a message for the parent's Stop.
    end_hold.wait_held(1, T);
    let p_stop = marker("PARENT_STOP");
    let id_p_stop = broker.send_opts(&parent, &p_stop, None, Some("e2e"));
    end_hold.release();
    proc.wait(T).assert_success();

    let child_reqs = model.requests_for_thread(&child);
    let parent_reqs = model.requests_for_thread(&parent);
    let dump = model.dump();
    for r in &child_reqs {
        for (text, id) in [(&p_mid, &id_p_mid), (&p_stop, &id_p_stop)] {
            assert!(!r.body_contains(text) && !carries(r, id), "child request {} carries a parent message:\n{dump}", r.index);
        }
        assert!(!r.body_contains(&c_late), "nothing delivered the late child message:\n{dump}");
    }
    for r in &parent_reqs {
        for text in [&c_post, &c_late] {
            assert!(!r.body_contains(text), "parent request {} carries a child message:\n{dump}", r.index);
        }
    }
    // Once: in at most one item of any request, and present from its first request on.
    for (text, reqs) in [(&c_post, &child_reqs), (&p_mid, &parent_reqs), (&p_stop, &parent_reqs)] {
        let counts: Vec<usize> = reqs.iter().map(|r| r.items_containing(text)).collect();
        assert!(counts.iter().all(|c| *c <= 1), "{text} duplicated: {counts:?}\n{dump}");
        assert_eq!(*counts.last().unwrap(), 1, "{text} reached its thread:\n{dump}");
    }
    let last_child = child_reqs.iter().find(|r| r.items_containing(&c_post) == 1).unwrap();
    assert_eq!(last_child.developer_messages_containing(&c_post).len(), 1, "as hook context: {dump}");

    for (id, thread, events) in [
        (&id_c_post, &child, &["PostToolUse"][..]),
        (&id_p_mid, &parent, &["PreToolUse", "PostToolUse", "Stop"][..]),
        (&id_p_stop, &parent, &["Stop"][..]),
    ] {
        let m = broker.wait_state(id, "confirmed", SETTLE);
        assert_eq!(str_field(&m, "thread"), thread.as_str(), "{m}");
        assert!(events.contains(&str_field(&m, "event")), "taken by {events:?}: {m}");
    }
    assert_untouched(&broker, &id_c_late);
    let inspect = broker.inspect_json();
    assert!(attack_codes(&inspect, None).is_empty(), "honest hooks are never refused: {inspect:#}");
}
