//! Reasoning-effort changes through the app-server that owns the thread, end to end with the real
//! Codex (`codex app-server --listen unix://PATH --enable step_model_switching`, model gpt-5.5),
//! the broker and hook-client. Needs `cargo build --workspace` and the pinned Codex.

use std::os::unix::net::UnixListener;
use std::time::Duration;

use courier_tests::appserver::{ListeningAppServer, WsAppServer};
use courier_tests::broker::hook_command;
use courier_tests::model::Request;
use courier_tests::util::str_field;
use courier_tests::{Broker, CodexEnv, Hold, Reply, ScriptedModel};
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(60);

fn effort_of(r: &Request) -> Option<String> {
    r.body.pointer("/reasoning/effort").and_then(Value::as_str).map(str::to_string)
}

struct Rig {
    model: ScriptedModel,
    env: CodexEnv,
}

fn rig(script: impl FnMut(&Request) -> Reply + Send + 'static) -> Rig {
    let model = ScriptedModel::start_with(script);
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    Rig { model, env }
}

/// An app-server that owns threads (and runs their hooks), plus a client connected through
/// `codex app-server proxy`.
fn app_server(env: &CodexEnv) -> (ListeningAppServer, WsAppServer) {
    let server = ListeningAppServer::start(
        env.codex_command(),
        env.root.join("as.sock"),
        &["--enable", "step_model_switching"],
        env.root.join("app-server.log"),
    );
    let mut client = server.client(T);
    client.initialize(true, T);
    (server, client)
}

fn effort(broker: &Broker, args: &[&str]) -> String {
    let mut a = vec!["effort"];
    a.extend_from_slice(args);
    broker.run_ok(&a).trim().to_string()
}

/// How many exchanges the broker logged for effort row `id` (one per request sent).
fn sends(broker: &Broker, id: &str) -> usize {
    broker.log_text().lines().filter(|l| l.contains(&format!("effort {id} "))).count()
}

/// Turn scope: queued while the model thinks, applied by the next hook of that turn, carried by
/// the very next model request of the SAME turn; later hooks of the turn do not send it again.
#[test]
fn turn_scope_applies_within_the_running_turn_exactly_once() {
    let hold = Hold::new();
    let h = hold.clone();
    let r = rig(move |req| match req.function_calls().len() {
        0 => Reply::exec("echo one").held(&h),
        1 => Reply::exec("echo two"),
        _ => Reply::message("done"),
    });
    let broker = Broker::start_trusted(&r.env);
    let (_server, mut client) = app_server(&r.env);
    let thread = client.start_thread(&r.env.work, T);
    let turn = client.start_turn(&thread, "run two commands", T);
    hold.wait_held(1, T);
    let id = effort(&broker, &["--thread", &thread, "high"]);
    assert_eq!(broker.message_state(&id), "pending");
    hold.release();
    client.wait_turn_completed(&turn, T);

    let reqs = r.model.requests();
    assert_eq!(reqs.len(), 3, "{}", r.model.dump());
    assert!(reqs.iter().all(|q| q.turn_id().as_deref() == Some(turn.as_str())), "one turn");
    assert_ne!(effort_of(&reqs[0]).as_deref(), Some("high"), "sent before the change was queued");
    assert_eq!(effort_of(&reqs[1]).as_deref(), Some("high"), "the next request of the same turn: {:?}", reqs[1].body.get("reasoning"));
    assert_eq!(effort_of(&reqs[2]).as_deref(), Some("high"), "it stays for the rest of the turn");

    let m = broker.wait_state(&id, "applied", Duration::from_secs(10));
    assert_eq!(str_field(&m, "turn_id"), turn);
    assert_eq!(str_field(&m, "event"), "PreToolUse", "the first hook after queueing took it: {m}");
    assert_eq!(m["attempts"], 1, "{m}");
    assert_eq!(m["scope"], "turn");
    assert!(m["confirmed_at"].is_i64(), "the acknowledged status confirms a turn-scope change: {m}");
    // Four more hooks of this turn (PostToolUse, PreToolUse, PostToolUse, Stop) ran after it.
    assert_eq!(sends(&broker, &id), 1, "exactly one exchange:\n{}", broker.log_text());
}

/// Thread scope: `thread/settings/update` applies from the NEXT turn; the rollout confirms it
/// (`thread_settings_applied`, `turn_context.effort`).
#[test]
fn thread_scope_applies_from_the_next_turn() {
    let hold = Hold::new();
    let h = hold.clone();
    let r = rig(move |req| match req.function_calls().len() {
        0 if req.user_messages_containing("FIRST").len() == 1 && !h.is_released() => Reply::exec("echo one").held(&h),
        0 => Reply::exec("echo again"),
        _ => Reply::message("done"),
    });
    let broker = Broker::start_trusted(&r.env);
    let (_server, mut client) = app_server(&r.env);
    let thread = client.start_thread(&r.env.work, T);
    let turn1 = client.start_turn(&thread, "FIRST turn", T);
    hold.wait_held(1, T);
    let id = effort(&broker, &["--thread", &thread, "--scope", "thread", "low"]);
    hold.release();
    client.wait_turn_completed(&turn1, T);
    let m = broker.wait_state(&id, "applied", Duration::from_secs(10));
    assert_eq!(m["scope"], "thread");
    let first_turn: Vec<Request> = r.model.requests();
    assert!(first_turn.iter().all(|q| effort_of(q).as_deref() != Some("low")), "not in the running turn");

    let turn2 = client.start_turn(&thread, "SECOND turn", T);
    client.wait_turn_completed(&turn2, T);
    let second: Vec<Request> = r.model.requests().into_iter().filter(|q| q.turn_id().as_deref() == Some(turn2.as_str())).collect();
    assert!(!second.is_empty());
    assert!(second.iter().all(|q| effort_of(q).as_deref() == Some("low")), "{}", r.model.dump());
    let records = courier_tests::rollout::read_records(&r.env.rollout_path(&thread).unwrap());
    let ctx_effort = |turn: &str| {
        records
            .iter()
            .find(|c| c["type"] == "turn_context" && c.pointer("/payload/turn_id").and_then(Value::as_str) == Some(turn))
            .and_then(|c| c.pointer("/payload/effort"))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    assert_ne!(ctx_effort(&turn1).as_deref(), Some("low"));
    assert_eq!(ctx_effort(&turn2).as_deref(), Some("low"), "turn_context of the next turn");
    let applied = r.env.rollout(&thread);
    let tsa = applied.events("thread_settings_applied");
    assert!(tsa.iter().any(|p| p.pointer("/thread_settings/reasoning_effort") == Some(&json!("low"))), "{tsa:?}");
    // The broker saw it in the rollout too.
    let confirmed = courier_tests::util::poll_until(Duration::from_secs(10), || broker.message(&id).filter(|m| m["confirmed_at"].is_i64()));
    assert!(confirmed.is_some(), "thread-scope change never confirmed from the rollout: {:?}", broker.message(&id));
    assert_eq!(sends(&broker, &id), 1);
}

/// A newer request supersedes an unapplied older one; levels outside the allowlist are refused
/// at enqueue with an error naming what is allowed.
#[test]
fn newer_request_supersedes_and_allowlist_refuses() {
    let model = ScriptedModel::start_with(|_| Reply::message("done"));
    let env = CodexEnv::new(&model);
    std::fs::write(&env.courier_config, "[effort]\nallow = [\"low\", \"medium\", \"high\"]\n").unwrap();
    let b = Broker::cli_only(&env);
    let thread = courier_tests::util::fake_uuid_v7();
    let first = effort(&b, &["--thread", &thread, "high"]);
    let second = effort(&b, &["--thread", &thread, "--scope", "thread", "low"]);
    let doc = b.inspect_json();
    let find = |id: &str| courier_tests::broker::messages(&doc).into_iter().find(|m| str_field(m, "id") == id).unwrap();
    assert_eq!(str_field(&find(&first), "state"), "cancelled");
    assert_eq!(str_field(&find(&first), "reason"), "superseded");
    assert_eq!(str_field(&find(&second), "state"), "pending");
    assert_eq!(str_field(&find(&second), "effort"), "low");
    let out = b.run(&["effort", "--thread", &thread, "xhigh"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not allowed") && err.contains("low, medium, high"), "{err}");
    let out = b.run(&["effort", "--thread", &thread, "turbo"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not one of"));
    let out = b.run(&["effort", "--thread", &thread, "--scope", "forever", "low"]);
    assert!(!out.status.success());
    // Nothing the refusals touched: the pending request is still the one that waits.
    assert_eq!(b.message_state(&second), "pending");
}

/// `codex exec` serves no app-server: the change stays pending (`no_settings_channel`), context
/// messages are delivered as usual, and a planted "managed daemon" record pointing at a socket
/// of another process gets no connection at all.
#[test]
fn exec_session_keeps_change_pending_and_foreign_endpoint_gets_nothing() {
    let hold = Hold::new();
    let h = hold.clone();
    let r = rig(move |req| match req.function_calls().len() {
        0 => Reply::exec("echo one").held(&h),
        _ => Reply::message("done"),
    });
    let broker = Broker::start_trusted(&r.env);
    let child = r.env.spawn_exec("run one command");
    hold.wait_held(1, T);
    let thread = child.wait_thread_id(T);

    // A foreign endpoint dressed up as this process's managed daemon.
    let foreign = r.env.root.join("foreign.sock");
    let listener = UnixListener::bind(&foreign).unwrap();
    listener.set_nonblocking(true).unwrap();
    let control = r.env.codex_home.join("app-server-control");
    std::fs::create_dir_all(&control).unwrap();
    std::os::unix::fs::symlink(&foreign, control.join("app-server-control.sock")).unwrap();
    let pid = child.pid() as i32;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let ticks: u64 = stat[stat.rfind(')').unwrap() + 1..].split_whitespace().nth(19).unwrap().parse().unwrap();
    let daemon = r.env.codex_home.join("app-server-daemon");
    std::fs::create_dir_all(&daemon).unwrap();
    std::fs::write(daemon.join("daemon.pid"), json!({"pid": pid, "processIdentity": {"startTicks": ticks}}).to_string()).unwrap();

    let id = effort(&broker, &["--thread", &thread, "high"]);
    let msg = broker.send_opts(&thread, "CONTEXT_STILL_ARRIVES", None, Some("e2e"));
    hold.release();
    child.wait(T).assert_success();

    broker.wait_state(&msg, "confirmed", Duration::from_secs(10));
    let m = broker.message(&id).unwrap();
    assert_eq!(str_field(&m, "state"), "pending", "{m}");
    assert_eq!(str_field(&m, "reason"), "no_settings_channel", "{m}");
    assert!(broker.inspect_text().contains("no_settings_channel"), "visible in the table too");
    assert!(r.model.requests().iter().all(|q| effort_of(q).as_deref() != Some("high")));
    assert!(listener.accept().is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock), "the foreign socket was contacted");
    assert_eq!(sends(&broker, &id), 0);
}

/// Queued while the final answer is generated: only the Stop hook follows, when Codex no longer
/// takes step settings for that turn. Whatever Codex answers is recorded once and never retried.
#[test]
fn change_at_turn_end_is_settled_once() {
    let hold = Hold::new();
    let h = hold.clone();
    let r = rig(move |req| match req.function_calls().len() {
        0 => Reply::exec("echo one"),
        _ => Reply::message("done").held(&h),
    });
    let broker = Broker::start_trusted(&r.env);
    let (_server, mut client) = app_server(&r.env);
    let thread = client.start_thread(&r.env.work, T);
    let turn = client.start_turn(&thread, "run one command", T);
    hold.wait_held(1, T);
    let id = effort(&broker, &["--thread", &thread, "high"]);
    hold.release();
    client.wait_turn_completed(&turn, T);
    let m = courier_tests::util::wait_until(Duration::from_secs(10), "effort settled", || {
        broker.message(&id).filter(|m| !matches!(str_field(m, "state"), "pending" | "applying"))
    });
    // codex-cli 0.171.0 still takes it at Stop (`applied`); a finished turn would be `failed`.
    assert!(matches!(str_field(&m, "state"), "applied" | "failed"), "{m}");
    assert_eq!(str_field(&m, "event"), "Stop");
    assert_eq!(sends(&broker, &id), 1);
}

/// The effort policy (off by default) reacts to PostToolUse outcomes: a failing `Bash` command
/// raises effort for the next request of the turn, a success sets it back once the raise was
/// applied. The exit code comes from Codex's own record of the call (the hook payload's
/// `tool_response` is only the output text in codex-cli 0.171.0).
#[test]
fn policy_raises_after_failure_and_lowers_after_success() {
    let r = rig(|req| match req.function_calls().len() {
        0 => Reply::exec("echo failing; exit 3"),
        1 => Reply::exec("echo fine"),
        _ => Reply::message("done"),
    });
    std::fs::write(
        &r.env.courier_config,
        "[effort.policy]\nenabled = true\n\
         [[effort.policy.rules]]\ntool = \"Bash\"\nafter_failures = 1\nset = \"high\"\n\
         [[effort.policy.rules]]\ntool = \"Bash\"\nafter_successes = 1\nset = \"medium\"\n",
    )
    .unwrap();
    let broker = Broker::start_trusted(&r.env);
    let (_server, mut client) = app_server(&r.env);
    let thread = client.start_thread(&r.env.work, T);
    let turn = client.start_turn(&thread, "run two commands", T);
    client.wait_turn_completed(&turn, T);

    let reqs = r.model.requests();
    assert_eq!(reqs.len(), 3, "{}", r.model.dump());
    let efforts: Vec<Option<String>> = reqs.iter().map(effort_of).collect();
    assert_ne!(efforts[0].as_deref(), Some("high"));
    assert_eq!(efforts[1].as_deref(), Some("high"), "raised after `exit 3`: {efforts:?}");
    assert_eq!(efforts[2].as_deref(), Some("medium"), "set back after the success: {efforts:?}");
    let rows: Vec<Value> =
        courier_tests::broker::messages(&broker.inspect_json()).into_iter().filter(|m| str_field(m, "kind") == "effort").collect();
    let summary: Vec<(&str, &str, &str, &str)> =
        rows.iter().map(|m| (str_field(m, "effort"), str_field(m, "state"), str_field(m, "from"), str_field(m, "event"))).collect();
    assert_eq!(summary, [("high", "applied", "policy", "PostToolUse"), ("medium", "applied", "policy", "PostToolUse")]);
    // The effort lines (policy decisions, exchanges) carry their level like every other line.
    let log = broker.log_text();
    assert!(log.contains("broker: info: effort policy: Bash exit 3") && log.contains("broker: info: effort m_"), "{log}");
    courier_tests::broker::assert_log_levelled(&log);
}

/// Off by default: the same failing command changes nothing.
#[test]
fn policy_is_off_by_default() {
    let r = rig(|req| match req.function_calls().len() {
        0 => Reply::exec("exit 3"),
        _ => Reply::message("done"),
    });
    let broker = Broker::start_trusted(&r.env);
    let (_server, mut client) = app_server(&r.env);
    let thread = client.start_thread(&r.env.work, T);
    let turn = client.start_turn(&thread, "fail once", T);
    client.wait_turn_completed(&turn, T);
    assert!(courier_tests::broker::messages(&broker.inspect_json()).is_empty());
    assert!(r.model.requests().iter().all(|q| effort_of(q).as_deref() != Some("high")));
}
