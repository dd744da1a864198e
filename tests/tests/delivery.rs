//! End-to-end delivery through the real Codex CLI, the broker and hook-client, as docs/delivery.md
//! describes it. Every test has its own scripted model, CODEX_HOME and broker, so they run in
//! parallel. Needs `cargo build --workspace` (target/debug/broker and hook-client) and the pinned
//! Codex (`install/fetch-codex.sh`).

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::time::Duration;

use courier_tests::broker::{hook_command, messages, refusals, run_hook_client};
use courier_tests::hooks::{Hook, COURIER_EVENTS};
use courier_tests::model::Request;
use courier_tests::model::{exec_held_then_done, parent_of_subagent};
use courier_tests::util::{fake_uuid_v7, marker, str_field};
use courier_tests::{Broker, CodexEnv, Hold, Reply, ScriptedModel};
use serde_json::Value;

const T: Duration = Duration::from_secs(60);
/// hook-client's documented default deadline.
const CLIENT_DEADLINE: Duration = Duration::from_millis(500);
/// Process start-up and scheduling on a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(750);

/// The exact text a delivered message reaches the model as.
fn wrapped(id: &str, from: &str, text: &str) -> String {
    format!("<courier-message id=\"{id}\" from=\"{from}\">{text}</courier-message>")
}

/// A model, a Codex home whose Courier events run target/debug/hook-client.
fn rig(script: impl FnMut(&Request) -> Reply + Send + 'static) -> (ScriptedModel, CodexEnv) {
    let model = ScriptedModel::start_with(script);
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    (model, env)
}

/// Each request carries `needle` in at most one input item; returns the per-request counts.
fn assert_at_most_once_per_request(model: &ScriptedModel, needle: &str) -> Vec<usize> {
    let counts: Vec<usize> = model.requests().iter().map(|r| r.items_containing(needle)).collect();
    assert!(counts.iter().all(|c| *c <= 1), "{needle} duplicated in a request: {counts:?}\n{}", model.dump());
    counts
}

/// Undo the XML escaping Codex applies to hook prompt text.
fn xml_unescape(s: &str) -> String {
    s.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&#39;", "'").replace("&amp;", "&")
}

/// (1) A message queued while the model is generating reaches the next request exactly once, as a
/// developer message from PreToolUse/PostToolUse, and reads `confirmed` afterwards.
#[test]
fn message_sent_mid_turn_reaches_next_request_once() {
    let hold = Hold::new();
    let (model, env) = rig(exec_held_then_done("echo hello", &hold));
    let broker = Broker::start_trusted(&env);
    let text = marker("MIDTURN");

    let child = env.spawn_exec("please run a command");
    let first = model.wait_for_requests(1, T).remove(0);
    hold.wait_held(1, T);
    let thread = first.thread_id().expect("thread id of first request");
    assert_eq!(child.wait_thread_id(T), thread);

    let id = broker.send_opts(&thread, &text, None, Some("e2e"));
    assert_eq!(broker.message_state(&id), "pending");
    hold.release();
    let out = child.wait(T);
    out.assert_success();
    assert_eq!(out.stdout.trim(), "done");

    let reqs = model.requests();
    assert_eq!(reqs.len(), 2, "one tool call then done:\n{}", model.dump());
    assert_eq!(reqs[0].items_containing(&text), 0, "not in the request made before it was sent");
    let last = &reqs[1];
    let dev = last.developer_messages_containing(&text);
    assert_eq!(dev.len(), 1, "exactly one developer message carries it: {:#?}", last.developer_messages());
    assert!(dev[0].contains(&wrapped(&id, "e2e", &text)), "wrapper: {}", dev[0]);
    assert!(last.user_messages_containing(&text).is_empty(), "not as a user message");
    assert_eq!(model.first_request_with("developer", &text), Some(1));
    assert_at_most_once_per_request(&model, &text);

    let m = broker.wait_state(&id, "confirmed", Duration::from_secs(10));
    assert_eq!(str_field(&m, "thread"), thread);
    // Still confirmed with the session over and the broker gone (inspect reconciles itself).
    let mut broker = broker;
    broker.stop();
    assert_eq!(broker.message_state(&id), "confirmed");
    assert!(matches!(str_field(&m, "event"), "PreToolUse" | "PostToolUse"), "taken by a tool hook of the turn: {m}");
    assert_eq!(m.get("turn_id").and_then(Value::as_str), last.turn_id().as_deref(), "{m}");
    // The rollout holds it once too.
    let ro = env.rollout(&thread);
    assert_eq!(ro.messages("developer").iter().filter(|t| t.contains(&text)).count(), 1);
}

/// (2) Two sessions at once on one CODEX_HOME and one broker: each message reaches only its own
/// thread.
#[test]
fn two_sessions_messages_never_cross_threads() {
    let hold = Hold::new();
    let (model, env) = rig(exec_held_then_done("echo hello", &hold));
    let broker = Broker::start_trusted(&env);
    let a = env.spawn_exec("SESSION_ALPHA run something");
    let b = env.spawn_exec("SESSION_BRAVO run something");
    hold.wait_held(2, T);
    let reqs = model.wait_for_requests(2, T);
    let thread_of = |prompt: &str| -> String {
        reqs.iter()
            .find(|r| !r.user_messages_containing(prompt).is_empty())
            .and_then(Request::thread_id)
            .unwrap_or_else(|| panic!("no request for {prompt}:\n{}", model.dump()))
    };
    let (ta, tb) = (thread_of("SESSION_ALPHA"), thread_of("SESSION_BRAVO"));
    assert_ne!(ta, tb);
    assert_eq!(a.wait_thread_id(T), ta);
    assert_eq!(b.wait_thread_id(T), tb);

    let (text_a, text_b) = (marker("FOR_ALPHA"), marker("FOR_BRAVO"));
    let id_a = broker.send_opts(&ta, &text_a, None, Some("e2e"));
    let id_b = broker.send_opts(&tb, &text_b, None, Some("e2e"));
    hold.release();
    a.wait(T).assert_success();
    b.wait(T).assert_success();

    for r in model.requests() {
        let t = r.thread_id().expect("every request names its thread");
        let (mine, other) = if t == ta { (&text_a, &text_b) } else { (&text_b, &text_a) };
        assert!(t == ta || t == tb, "unknown thread {t}");
        assert!(!r.body_contains(other), "request {} of {t} carries the other thread's message", r.index);
        assert!(r.items_containing(mine) <= 1);
    }
    for (t, text, id) in [(&ta, &text_a, &id_a), (&tb, &text_b, &id_b)] {
        let last = model.requests_for_thread(t).pop().unwrap();
        assert_eq!(last.developer_messages_containing(text).len(), 1, "{t}:\n{}", model.dump());
        let m = broker.wait_state(id, "confirmed", Duration::from_secs(10));
        assert_eq!(str_field(&m, "thread"), t.as_str());
    }
}

/// (3) A message sent while the final answer is generated is delivered by the Stop hook in the
/// same turn (a `<hook_prompt>` user message), once, and the turn then ends.
#[test]
fn message_during_final_answer_is_delivered_by_stop_hook() {
    let hold = Hold::new();
    let h = hold.clone();
    let (model, env) =
        rig(move |r| if r.function_calls().is_empty() { Reply::exec("echo hello") } else { Reply::message("done").held(&h) });
    let broker = Broker::start_trusted(&env);
    let text = marker("AT_STOP");

    let child = env.spawn_exec("please run a command");
    let second = model.wait_for(T, "request after the tool call", |r| !r.function_calls().is_empty());
    hold.wait_held(1, T);
    let thread = second.thread_id().unwrap();
    let id = broker.send_opts(&thread, &text, None, Some("e2e"));
    hold.release();
    let out = child.wait(T);
    out.assert_success();
    assert_eq!(out.stdout.trim(), "done");

    let reqs = model.requests();
    assert_eq!(reqs.len(), 3, "exactly one extra request after the Stop block:\n{}", model.dump());
    assert_eq!(reqs[0].items_containing(&text) + reqs[1].items_containing(&text), 0);
    let prompts = reqs[2].user_messages_containing(&text);
    assert_eq!(prompts.len(), 1, "{:#?}", reqs[2].user_messages());
    assert!(prompts[0].trim_start().starts_with("<hook_prompt"), "Stop hook prompt: {}", prompts[0]);
    // Codex XML-escapes a Stop block reason inside <hook_prompt> (observed with 0.171.0), so the
    // model reads the wrapper as `&lt;courier-message ...&gt;`: compare unescaped.
    assert!(xml_unescape(&prompts[0]).contains(&wrapped(&id, "e2e", &text)), "{}", prompts[0]);
    assert!(reqs[2].developer_messages_containing(&text).is_empty());
    assert_eq!(reqs[2].turn_id(), reqs[0].turn_id(), "same turn continued");

    let ro = env.rollout(&thread);
    assert_eq!(ro.turns().len(), 1, "{:?}", ro.turns());
    assert_eq!(ro.open_turn(), None, "turn ended");
    let m = broker.wait_state(&id, "confirmed", Duration::from_secs(10));
    assert_eq!(str_field(&m, "event"), "Stop", "{m}");
}

/// (4) The same `--key` twice gives one message.
#[test]
fn same_key_twice_is_one_message() {
    let model = ScriptedModel::start();
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let broker = Broker::start_trusted(&env);
    let thread = fake_uuid_v7();
    let key = marker("key");
    let text = marker("IDEMPOTENT");
    let id1 = broker.send_future(&thread, &text, Some(&key), None);
    let id2 = broker.send_future(&thread, &text, Some(&key), None);
    assert_eq!(id1, id2, "same key, same message id");
    let other = broker.send_future(&thread, &text, Some(&marker("key")), None);
    assert_ne!(other, id1, "a different key is a different message");

    let inspect = broker.inspect_json();
    let mine: Vec<Value> = messages(&inspect).into_iter().filter(|m| str_field(m, "thread") == thread).collect();
    assert_eq!(mine.len(), 2, "{inspect:#}");
    assert_eq!(mine.iter().filter(|m| str_field(m, "id") == id1).count(), 1);
    for m in &mine {
        assert_eq!(str_field(m, "state"), "pending");
        for k in ["id", "thread", "state", "created_at", "event", "turn_id", "reason"] {
            assert!(m.get(k).is_some(), "inspect message lacks {k}: {m}");
        }
    }
    assert!(inspect.get("refusals").is_some_and(Value::is_array) && inspect.get("broker").is_some_and(Value::is_object));
}

/// (5a) With no broker running, a session whose hooks all run hook-client completes normally, and
/// every hook-client call (timed inside the session by a wrapper) stays under its deadline.
#[test]
fn no_broker_session_completes_normally() {
    let model = ScriptedModel::start_with(courier_tests::model::exec_then_done("echo hello"));
    let env = CodexEnv::new(&model);
    let log = env.root.join("hook-times.log");
    let timer = env.write_script(
        "time-hook.sh",
        &format!(
            "#!/bin/bash\n# Runs hook-client with the hook's stdin/stdout and logs: <event> <ms> <exit>\n\
             s=$(date +%s%N)\n{}\nrc=$?\ne=$(date +%s%N)\n\
             echo \"$1 $(( (e - s) / 1000000 )) $rc\" >> {}\nexit $rc\n",
            hook_command(),
            courier_tests::util::shell_quote(&log.display().to_string())
        ),
    );
    let hooks: Vec<Hook> = COURIER_EVENTS.iter().map(|e| Hook::new(e, &format!("{} {e}", timer.display()))).collect();
    env.install_hooks(&hooks);

    let out = env.exec("please run a command");
    out.assert_success();
    assert_eq!(out.stdout.trim(), "done");
    assert!(!out.stderr.contains(" Failed"), "a hook failed:\n{}", out.stderr);
    for ev in ["SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop"] {
        assert!(out.stderr.contains(&format!("hook: {ev} Completed")), "{ev} ran:\n{}", out.stderr);
    }
    assert_eq!(model.request_count(), 2);
    assert_eq!(model.requests_mentioning("courier-message"), 0);

    let times = std::fs::read_to_string(&log).expect("hook timing log");
    eprintln!("hook-client calls without a broker (event ms exit):\n{times}");
    let lines: Vec<Vec<&str>> = times.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines.len(), 5, "one call per fired event: {times}");
    for l in &lines {
        let ms: u64 = l[1].parse().unwrap();
        assert_eq!(l[2], "0", "{l:?}");
        assert!(Duration::from_millis(ms) < CLIENT_DEADLINE + SLACK, "{} took {ms} ms", l[0]);
    }
}

/// A realistic PostToolUse payload (captured from codex 0.171.0) pointing into `env`.
fn captured_payload(env: &CodexEnv) -> String {
    let thread = fake_uuid_v7();
    serde_json::json!({
        "session_id": thread, "turn_id": fake_uuid_v7(),
        "transcript_path": env.codex_home.join(format!("sessions/2026/11/29/rollout-2026-11-29T08-01-16-{thread}.jsonl")),
        "cwd": env.work, "hook_event_name": "PostToolUse", "model": "gpt-5.5",
        "permission_mode": "bypassPermissions", "tool_name": "Bash",
        "tool_input": {"command": "echo hello"}, "tool_response": "hello\n", "tool_use_id": "call_0002"
    })
    .to_string()
}

fn assert_fail_open(out: &std::process::Output, took: Duration, what: &str) {
    eprintln!("hook-client ({what}) returned in {took:?}");
    assert!(out.status.success(), "{what}: exit {} stderr {}", out.status, String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(matches!(stdout.trim(), "" | "{}"), "{what}: stdout must be empty, got {stdout:?}");
    assert!(took < CLIENT_DEADLINE + SLACK, "{what}: took {took:?}, deadline {CLIENT_DEADLINE:?}");
}

/// (5b) hook-client alone, no broker: exits 0, prints nothing, well within its deadline.
#[test]
fn hook_client_without_broker_fails_open_fast() {
    let model = ScriptedModel::start();
    let env = CodexEnv::new(&model);
    let payload = captured_payload(&env);
    for _ in 0..3 {
        let (out, took) = run_hook_client(&env, &payload, &[]);
        assert_fail_open(&out, took, "no broker");
    }
}

/// (5c) A broker that accepts and never answers: hook-client gives up at its deadline, exit 0.
#[test]
fn hook_client_with_stalled_broker_respects_deadline() {
    use std::os::unix::fs::PermissionsExt;
    let model = ScriptedModel::start();
    let env = CodexEnv::new(&model);
    let secret = env.runtime_dir.join("secret");
    std::fs::write(&secret, [7u8; 32]).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let sock = env.runtime_dir.join("broker.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    // Accept and hold connections open without reading or answering; report each accept.
    let (tx, rx) = std::sync::mpsc::channel();
    let held = std::thread::spawn(move || {
        let mut conns = Vec::new();
        for c in listener.incoming() {
            let Ok(c) = c else { break };
            conns.push(c);
            if tx.send(()).is_err() {
                break;
            }
        }
        conns
    });
    let (out, took) = run_hook_client(&env, &captured_payload(&env), &[]);
    assert!(rx.try_recv().is_ok(), "hook-client never connected to the stalled broker (took {took:?})");
    assert_fail_open(&out, took, "stalled broker");
    drop(rx);
    // Wake the accept loop so the thread ends (its next send fails).
    let _wake = std::os::unix::net::UnixStream::connect(&sock);
    drop(held.join());
}

/// (6) A hook payload whose `turn_id` is not the rollout's open turn gets nothing: every hook runs
/// a wrapper that rewrites `turn_id` and then execs hook-client. The message stays `pending`, no
/// request carries it, and the broker records refusals.
#[test]
fn wrong_turn_id_gets_nothing() {
    let hold = Hold::new();
    let model = ScriptedModel::start_with(exec_held_then_done("echo hello", &hold));
    let env = CodexEnv::new(&model);
    // A real, closed turn id of another session (from the reference captures).
    let stale = "01a22652-96da-72f3-91e4-849f702952b8";
    let wrapper = env.write_script(
        "wrong-turn.sh",
        &format!(
            "#!/bin/bash\n# Rewrite turn_id to a turn that is not open, then become hook-client.\n\
             payload=$(cat)\n\
             payload=$(printf '%s' \"$payload\" | sed -E 's/\"turn_id\":\"[^\"]*\"/\"turn_id\":\"{stale}\"/g')\n\
             exec {} <<<\"$payload\"\n",
            hook_command()
        ),
    );
    let hooks: Vec<Hook> = COURIER_EVENTS.iter().map(|e| Hook::new(e, &wrapper.display().to_string())).collect();
    env.install_hooks(&hooks);
    let broker = Broker::start_trusted(&env);
    let text = marker("WRONG_TURN");

    let child = env.spawn_exec("please run a command");
    let first = model.wait_for_requests(1, T).remove(0);
    hold.wait_held(1, T);
    let thread = first.thread_id().unwrap();
    let id = broker.send_opts(&thread, &text, None, Some("e2e"));
    hold.release();
    let out = child.wait(T);
    out.assert_success();

    assert_eq!(model.requests_mentioning(&text), 0, "no request may carry it:\n{}", model.dump());
    assert_eq!(model.request_count(), 2);
    let inspect = broker.inspect_json();
    let m = messages(&inspect).into_iter().find(|m| str_field(m, "id") == id).expect("listed");
    assert_eq!(str_field(&m, "state"), "pending", "{inspect:#}");
    let mine: Vec<Value> =
        refusals(&inspect).into_iter().filter(|r| str_field(r, "thread") == thread || str_field(r, "reason").contains("turn")).collect();
    assert!(!mine.is_empty(), "the wrong-turn hook calls are recorded as refusals: {inspect:#}");
    assert!(mine.iter().all(|r| !str_field(r, "reason").is_empty()), "{mine:#?}");
}

/// (7) Parent and sub-agent threads live in one codex process: a message for the parent never
/// reaches the child's requests and vice versa.
#[test]
fn subagent_and_parent_keep_their_own_messages() {
    let hold = Hold::new();
    let h = hold.clone();
    let (model, env) = rig(move |r: &Request| {
        if r.is_subagent() {
            return if r.function_calls().is_empty() { Reply::exec("echo child").held(&h) } else { Reply::message("child done") };
        }
        parent_of_subagent(r, "CHILD_TASK: run echo hello and report", 30_000)
    });
    let broker = Broker::start_trusted(&env);
    let child_proc = env.spawn_exec("spawn a helper");
    let parent = child_proc.wait_thread_id(T);
    let first_child = model.wait_for(T, "the sub-agent's first request", Request::is_subagent);
    hold.wait_held(1, T);
    let child = first_child.thread_id().unwrap();
    assert_eq!(first_child.header("session-id"), Some(parent.as_str()));

    let (to_parent, to_child) = (marker("FOR_PARENT"), marker("FOR_CHILD"));
    let id_p = broker.send_opts(&parent, &to_parent, None, Some("e2e"));
    let id_c = broker.send_opts(&child, &to_child, None, Some("e2e"));
    hold.release();
    child_proc.wait(T).assert_success();

    for r in model.requests_for_thread(&child) {
        assert!(!r.body_contains(&to_parent), "child request {} carries the parent's message:\n{}", r.index, model.dump());
    }
    for r in model.requests_for_thread(&parent) {
        assert!(!r.body_contains(&to_child), "parent request {} carries the child's message:\n{}", r.index, model.dump());
    }
    let last_child = model.requests_for_thread(&child).pop().unwrap();
    assert_eq!(last_child.developer_messages_containing(&to_child).len(), 1, "{}", model.dump());
    let last_parent = model.requests_for_thread(&parent).pop().unwrap();
    assert_eq!(last_parent.items_containing(&to_parent), 1, "{}", model.dump());
    for (id, t) in [(&id_p, &parent), (&id_c, &child)] {
        let m = broker.wait_state(id, "confirmed", Duration::from_secs(10));
        assert_eq!(str_field(&m, "thread"), t.as_str());
    }
}

/// The Stop loop guard: a producer that queues a new message at every model request would keep a
/// turn alive forever through Stop blocks (Codex has no guard of its own). Courier continues a turn
/// at Stop at most `MAX_STOP_BLOCKS_PER_TURN` (3) times; then the turn ends and the next message
/// waits, pending, with the reason.
#[test]
fn stop_continuations_are_capped_per_turn() {
    use std::sync::{Arc, Mutex};
    type Cli = Option<(PathBuf, Vec<(String, String)>)>;
    let cli: Arc<Mutex<Cli>> = Arc::new(Mutex::new(None));
    let sent: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let (c, s) = (cli.clone(), sent.clone());
    let (model, env) = rig(move |r| {
        // Every model request queues one more message for this thread, up to 6.
        let mut sent = s.lock().unwrap();
        if let (Some((bin, vars)), Some(thread)) = (c.lock().unwrap().as_ref(), r.thread_id()) {
            if sent.len() < 6 {
                let text = marker(&format!("LOOP{}", sent.len()));
                let out = std::process::Command::new(bin)
                    .env_clear()
                    .envs(vars.iter().map(|(k, v)| (k, v)))
                    .args(["send", "--thread", &thread, "--from", "loop", &text])
                    .output()
                    .unwrap();
                assert!(out.status.success(), "send: {out:?}");
                sent.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
            }
        }
        Reply::message("done")
    });
    let broker = Broker::start_trusted(&env);
    *cli.lock().unwrap() = Some((courier_tests::broker::broker_bin(), env.env_vars()));

    let out = env.exec("just answer");
    out.assert_success();
    let reqs = model.requests();
    let blocks: usize = reqs.iter().map(|r| r.user_messages_containing("<hook_prompt").len()).max().unwrap_or(0);
    assert_eq!(blocks, 3, "three Stop continuations, then the turn ends:\n{}", model.dump());
    assert_eq!(reqs.len(), 4, "one request per continuation plus the first:\n{}", model.dump());
    let thread = reqs[0].thread_id().unwrap();
    let ro = env.rollout(&thread);
    assert_eq!(ro.turns().len(), 1, "{:?}", ro.turns());
    assert_eq!(ro.open_turn(), None, "turn ended");

    let sent = sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 4, "one message per request");
    for id in &sent[..3] {
        broker.wait_state(id, "confirmed", Duration::from_secs(10));
    }
    let last = broker.message(&sent[3]).expect("fourth message listed");
    assert_eq!(str_field(&last, "state"), "pending", "{last}");
    // Deferred by the cap; once `codex exec` has ended, the wake channel's next pass may have
    // noted why it cannot wake the ended session (not loaded, or its process and app-server are
    // gone, depending on which it sees first): a resume delivers it.
    let reason = str_field(&last, "reason");
    assert!(["deferred_stop_block_limit", "thread_not_loaded", "no_app_server"].contains(&reason), "{last}");
}

/// (12) Hook output stays within Codex's budget. 60 messages of 2,000 bytes
/// (bodies with `<`, `&`, quotes, a tab, a newline and a non-ASCII letter) are queued while the
/// first model request is held; they go out over several tool hooks, each output within
/// `MAX_OUTPUT_BYTES`, none cut by Codex, every one of them whole in the model's requests and `confirmed`,
/// and nothing is spilled to `/tmp/hook_outputs`. (Before: all 60 in one 12 KB output that Codex
/// cut: 49 confirmed, 11 uncertain, one confirmed whose body the model saw cut.)
#[test]
fn sixty_messages_stay_within_codex_hook_budget_and_all_confirm() {
    let hold = Hold::new();
    let h = hold.clone();
    let (model, env) = rig(move |r| match r.function_calls().len() {
        0 => Reply::exec("echo one").held(&h),
        n if n < 4 => Reply::exec(&format!("echo {n}")),
        _ => Reply::message("done"),
    });
    let broker = Broker::start_trusted(&env);
    let child = env.spawn_exec("please run commands");
    hold.wait_held(1, T);
    let thread = child.wait_thread_id(T);
    let mut sent = Vec::new();
    for i in 0..60 {
        let mut body = format!("{} <b>&\"\u{e9}\tx\nnext line ", marker(&format!("M{i:02}")));
        while body.len() < 2_000 {
            body.push('.');
        }
        assert_eq!(body.len(), 2_000);
        sent.push((broker.send_opts(&thread, &body, None, Some("e2e")), body));
    }
    // A 6,000-character --from is refused at send time, with the reason.
    let out = broker.run(&["send", "--thread", &thread, "--from", &"f".repeat(6000), "x"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--from is 6000 characters"), "{out:?}");
    hold.release();
    child.wait(T).assert_success();

    let reqs = model.requests();
    let last = reqs.last().unwrap();
    let carriers: Vec<String> = last.developer_messages().into_iter().filter(|d| d.contains("<courier-message")).collect();
    for d in &carriers {
        assert!(d.len() <= broker_lib::envelope::MAX_OUTPUT_BYTES, "a hook output of {} bytes", d.len());
        assert!(!d.contains("truncated"), "Codex cut a hook output: {d}");
    }
    assert!(carriers.len() >= 2, "60 messages need several hooks: {} outputs", carriers.len());
    for (id, body) in &sent {
        let whole = broker_lib::envelope::wrap_message(id, "e2e", body);
        let holding: Vec<&String> = carriers.iter().filter(|d| d.contains(&whole)).collect();
        assert_eq!(holding.len(), 1, "{id} whole in exactly one hook output:\n{}", model.dump());
        let m = broker.wait_state(id, "confirmed", Duration::from_secs(10));
        assert!(matches!(str_field(&m, "event"), "PreToolUse" | "PostToolUse"), "{m}");
    }
    let spill = std::path::Path::new("/tmp/hook_outputs").join(&thread);
    assert!(!spill.exists(), "Codex spilled hook output to {}", spill.display());
    assert!(!env.codex_home.join("hook_outputs").exists());
    eprintln!(
        "60 messages of 2,000 bytes: {} hook outputs of {:?} bytes, all confirmed",
        carriers.len(),
        carriers.iter().map(String::len).collect::<Vec<_>>()
    );
}

/// (13) Confirmation compares the whole wrapped text, so it must survive what Codex does to it: a
/// body with quotes, `&`, `<`/`>`, a tab, CR/LF, a fullwidth `<` and an already-escaped `&lt;`,
/// delivered once by a tool hook (`additionalContext`, verbatim) and once at Stop (Codex
/// XML-escapes `&`, `<`, `>` inside `<hook_prompt>`), reads `confirmed` both times.
#[test]
fn messages_with_special_characters_confirm_whole_by_tool_hook_and_at_stop() {
    let (first, last) = (Hold::new(), Hold::new());
    let (f, l) = (first.clone(), last.clone());
    let (model, env) =
        rig(move |r| if r.function_calls().is_empty() { Reply::exec("echo hello").held(&f) } else { Reply::message("done").held(&l) });
    let broker = Broker::start_trusted(&env);
    let child = env.spawn_exec("please run a command");
    first.wait_held(1, T);
    let thread = child.wait_thread_id(T);
    let body = |tag: &str| format!("{} it's \"quoted\" & <b>bold</b>\ttab\r\nnext \u{FF1C}x &lt;y &amp; caf\u{e9}", marker(tag));
    let tool = broker.send_opts(&thread, &body("TOOL"), None, Some("e2e & café"));
    first.release();
    last.wait_held(1, T);
    let stop = broker.send_opts(&thread, &body("STOP"), None, Some("e2e & café"));
    last.release();
    child.wait(T).assert_success();
    for (id, event) in [(&tool, "PreToolUse|PostToolUse"), (&stop, "Stop")] {
        let m = broker.wait_state(id, "confirmed", Duration::from_secs(10));
        assert!(event.split('|').any(|e| e == str_field(&m, "event")), "{m}");
        assert!(model.requests().last().unwrap().body_contains(id), "{id} reached the model:\n{}", model.dump());
    }
}
