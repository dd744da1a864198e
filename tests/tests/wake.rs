//! The wake channel on the real Codex: a message for a thread that is waiting (no open turn) in a
//! live app-server starts a turn there, exactly once, `confirmed` from the rollout's user message
//! that carries its id as Codex's client id. Threads that cannot be woken say why and wait for
//! their next hook. Needs `cargo build --workspace` and the pinned Codex.

use std::time::{Duration, Instant};

use courier_tests::appserver::{ListeningAppServer, ManagedDaemon, WsAppServer};
use courier_tests::broker::hook_command;
use courier_tests::util::{marker, str_field};
use courier_tests::{Broker, CodexEnv, Hold, Reply, ScriptedModel};
use serde_json::Value;

const T: Duration = Duration::from_secs(60);

fn idle_app_server_thread(env: &CodexEnv) -> (ListeningAppServer, WsAppServer, String) {
    courier_tests::appserver::idle_thread(env, T)
}

/// `broker send`, then the time until the model request that carries `text`.
fn send_and_time(broker: &Broker, model: &ScriptedModel, thread: &str, text: &str) -> (String, Duration) {
    let t0 = Instant::now();
    let id = broker.send_opts(thread, text, None, Some("waker"));
    model.wait_for(T, "the woken turn's request", |r| r.items_containing(text) > 0);
    (id, t0.elapsed())
}

fn assert_once(model: &ScriptedModel, text: &str) {
    model.assert_received_once(text, T);
}

/// The wrapped text as the model sees it, as a user message.
fn user_messages_with(model: &ScriptedModel, text: &str) -> usize {
    model.requests().iter().map(|r| r.user_messages_containing(text).len()).max().unwrap_or(0)
}

fn assert_woken(broker: &Broker, id: &str) -> Value {
    let m = broker.wait_state(id, "confirmed", Duration::from_secs(15));
    assert_eq!(str_field(&m, "event"), "wake", "delivered by the wake channel: {m}");
    assert!(!str_field(&m, "turn_id").is_empty(), "the woken turn is recorded: {m}");
    let lag = m["handed_at"].as_i64().unwrap_or(0) - m["created_at"].as_i64().unwrap_or(0);
    eprintln!("{id}: broker send -> turn/start answered {lag} ms");
    m
}

/// Waits for the woken turn of message `m` to end (the thread is idle again).
fn wait_turn_of(client: &mut WsAppServer, m: &Value) {
    client.wait_turn_completed(str_field(m, "turn_id"), T);
}

/// An idle thread of a real `codex app-server --listen unix://`: `broker send` starts a turn whose
/// first model request carries the message once, as a user message; `confirmed`. A second
/// message later: another turn, once, `confirmed`. Two sent back to back: each once.
#[test]
fn idle_app_server_thread_is_woken_once_and_confirmed() {
    let model = ScriptedModel::start_with(|_| Reply::message("done"));
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let broker = Broker::start_trusted(&env);
    let (_server, mut client, thread) = idle_app_server_thread(&env);
    let before = model.requests().len();

    let text = marker("WOKEN_ONE");
    let (id, latency) = send_and_time(&broker, &model, &thread, &text);
    eprintln!("idle app-server thread: broker send -> model request {latency:?}");
    let m = assert_woken(&broker, &id);
    assert_once(&model, &text);
    assert_eq!(user_messages_with(&model, &text), 1, "{}", model.dump());
    assert!(latency < Duration::from_secs(3), "woken within about a second: {latency:?}");
    wait_turn_of(&mut client, &m);

    let second = marker("WOKEN_TWO");
    let (id2, latency2) = send_and_time(&broker, &model, &thread, &second);
    eprintln!("second wake: {latency2:?}");
    let m2 = assert_woken(&broker, &id2);
    assert_once(&model, &second);
    wait_turn_of(&mut client, &m2);

    // Two back to back: the first may wake the thread before the second is queued; then the
    // second reaches that turn through its hooks. Either way each arrives once, confirmed.
    let (a, b) = (marker("PAIR_A"), marker("PAIR_B"));
    let ida = broker.send_opts(&thread, &a, None, Some("waker"));
    let idb = broker.send_opts(&thread, &b, None, Some("waker"));
    let ma = assert_woken(&broker, &ida);
    let mb = broker.wait_state(&idb, "confirmed", Duration::from_secs(15));
    eprintln!("pair: {} then {}", str_field(&ma, "event"), str_field(&mb, "event"));
    assert_once(&model, &a);
    assert_once(&model, &b);
    let turns_started = model.requests().len() - before;
    assert!(turns_started <= 4, "one request per woken turn: {turns_started}\n{}", model.dump());
    let refused = courier_tests::broker::refusals(&broker.inspect_json());
    assert!(refused.is_empty(), "the woken turns' own hooks verify: {refused:#?}");
}

/// The TUI's managed daemon (started the way the TUI starts it, `codex app-server daemon
/// start`): an idle thread in it is woken, delivered once, `confirmed`.
#[test]
fn idle_managed_daemon_thread_is_woken() {
    let model = ScriptedModel::start_with(|_| Reply::message("done"));
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let broker = Broker::start_trusted(&env);
    let daemon = ManagedDaemon::start(&env, T);
    let mut client = daemon.client(T);
    client.initialize(false, T);
    let thread = client.start_thread(&env.work, T);
    client.run_turn(&thread, "hello", T);
    let text = marker("DAEMON_WOKEN");
    let (id, latency) = send_and_time(&broker, &model, &thread, &text);
    eprintln!("idle managed-daemon thread: broker send -> model request {latency:?}");
    assert_woken(&broker, &id);
    assert_once(&model, &text);
}

/// `--wake never`: the idle thread is left alone (no new turn while nobody types); the next
/// user turn's hook delivers it, mid-turn, `confirmed`.
#[test]
fn wake_never_waits_for_the_next_hook() {
    let model = ScriptedModel::start_with(|_| Reply::message("done"));
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let broker = Broker::start_trusted(&env);
    let (_server, mut client, thread) = idle_app_server_thread(&env);
    let text = marker("NOT_WOKEN");
    let id = broker.run_ok(&["send", "--thread", &thread, "--wake", "never", "--from", "waker", &text]).trim().to_string();
    let requests = model.requests().len();
    // Several wake passes (one per second at least, and one at once on the send) go by.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert_eq!(model.requests().len(), requests, "a turn was started for a --wake never message");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(str_field(&broker.message(&id).unwrap_or_default(), "state"), "pending");
    client.run_turn(&thread, "next task", T);
    let m = broker.wait_state(&id, "confirmed", Duration::from_secs(15));
    assert_ne!(str_field(&m, "event"), "wake", "{m}");
    assert_once(&model, &text);
}

/// A `codex exec` thread has no app-server and ends with its process: the message waits with a
/// reason (`thread_not_loaded`), and `codex exec resume` delivers it through its hooks.
#[test]
fn exec_thread_waits_with_its_reason_until_resumed() {
    let model = ScriptedModel::start_with(|_| Reply::message("done"));
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let broker = Broker::start_trusted(&env);
    let out = env.exec("hello");
    out.assert_success();
    let thread = out.thread_id().expect("thread id");
    let text = marker("FOR_EXEC");
    let id = broker.send_opts(&thread, &text, None, Some("waker"));
    let m = courier_tests::util::wait_until(Duration::from_secs(10), "a reason on the waiting message", || {
        let m = broker.message(&id).unwrap_or_default();
        (str_field(&m, "reason") == "thread_not_loaded").then_some(m)
    });
    assert_eq!(str_field(&m, "state"), "pending", "{m}");
    let resumed = env.exec_args(&["resume", &thread], "go on", T);
    resumed.assert_success();
    let m = broker.wait_state(&id, "confirmed", Duration::from_secs(15));
    assert_ne!(str_field(&m, "event"), "wake", "{m}");
    assert_once(&model, &text);
}

/// The app-server killed (-9) while the woken turn's model request is in flight, i.e. right after
/// `turn/start` was answered: the message is never delivered twice, and reads `confirmed` (the
/// rollout holds the user message with its client id) or `uncertain`, never `pending`.
#[test]
fn app_server_killed_after_turn_start_is_never_delivered_twice() {
    let hold = Hold::new();
    let h = hold.clone();
    let model = ScriptedModel::start_with(move |r| {
        if r.user_messages().iter().any(|m| m.contains("KILLED_MID")) {
            Reply::message("done").held(&h)
        } else {
            Reply::message("done")
        }
    });
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let broker = Broker::start_trusted(&env);
    let (server, _client, thread) = idle_app_server_thread(&env);
    let text = marker("KILLED_MID");
    let id = broker.send_opts(&thread, &text, None, Some("waker"));
    hold.wait_held(1, T);
    let _ = std::process::Command::new("kill").args(["-KILL", &server.pid().to_string()]).status();
    hold.release();
    let m = courier_tests::util::wait_until(Duration::from_secs(15), "a final state", || {
        let m = broker.message(&id).unwrap_or_default();
        matches!(str_field(&m, "state"), "confirmed" | "uncertain").then_some(m)
    });
    eprintln!("after the kill: {m}");
    assert_eq!(str_field(&m, "state"), "confirmed", "the rollout holds the woken user message: {m}");
    assert_once(&model, &text);
    // Nothing re-sends it: no other request carries it, whatever happens next.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(model.requests_mentioning(&text), 1, "{}", model.dump());
}

/// Race: a message sent while the person submits a prompt to the same idle thread (both at
/// once, repeated) reaches the model exactly once each time, `confirmed`: whichever turn/start
/// Codex sees second is folded into the running turn or refused (then the hooks deliver).
#[test]
fn message_sent_while_a_prompt_is_submitted_arrives_once() {
    let model = ScriptedModel::start_with(|_| Reply::message("done"));
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let broker = Broker::start_trusted(&env);
    let (_server, mut client, thread) = idle_app_server_thread(&env);
    // Even rounds: the prompt is submitted while `broker send` runs. Odd rounds: right after
    // `broker send` returns, racing the wake that the new message sets off.
    let mut by = Vec::new();
    for round in 0..6u64 {
        let text = marker(&format!("RACE_{round}"));
        let sender = {
            let (bin, envs, thread, text) = (broker.bin.clone(), env.env_vars(), thread.clone(), text.clone());
            std::thread::spawn(move || {
                let out = std::process::Command::new(bin)
                    .env_clear()
                    .envs(envs)
                    .args(["send", "--thread", &thread, "--from", "race", &text])
                    .output()
                    .unwrap();
                assert!(out.status.success(), "{out:?}");
                String::from_utf8(out.stdout).unwrap().trim().to_string()
            })
        };
        let id = if round % 2 == 1 {
            let id = sender.join().unwrap();
            client.run_turn(&thread, &format!("prompt {round}"), T);
            id
        } else {
            client.run_turn(&thread, &format!("prompt {round}"), T);
            sender.join().unwrap()
        };
        let m = broker.wait_state(&id, "confirmed", Duration::from_secs(15));
        by.push(str_field(&m, "event").to_string());
        assert_once(&model, &text);
        // Let a woken turn (if the wake won) finish before the next round.
        if str_field(&m, "event") == "wake" {
            wait_turn_of(&mut client, &m);
        }
    }
    eprintln!("delivered by: {by:?}");
}

/// Wake hand-offs per thread so far, from `broker inspect`: the distinct hand-off times of
/// messages the wake channel took.
fn wakes_by_thread(broker: &Broker) -> std::collections::HashMap<String, usize> {
    let mut seen = std::collections::HashSet::new();
    let mut by = std::collections::HashMap::new();
    for m in courier_tests::broker::messages(&broker.inspect_json()) {
        if str_field(&m, "event") == "wake" && seen.insert((str_field(&m, "thread").to_string(), m["handed_at"].clone())) {
            *by.entry(str_field(&m, "thread").to_string()).or_default() += 1;
        }
    }
    by
}

/// Two idle threads whose woken turns message each other (each new message the model sees in one
/// thread makes it send one to the other, as two agents would): unbounded, they wake each other
/// without end. With `[wake] max_in_a_row = 3` neither is woken more than 3 times; the message
/// over the bound waits `pending`, `wake_loop_guard` in `broker inspect`; a turn the person starts
/// in that thread delivers it through its hooks.
#[test]
fn woken_threads_messaging_each_other_are_bounded() {
    let pair: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let (p, seen) = (pair.clone(), std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashSet::<String>::new())));
    let env_vars = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let ev = env_vars.clone();
    let model = ScriptedModel::start_with(move |r| {
        let threads = p.lock().unwrap().clone();
        let from = r.header("thread-id").unwrap_or_default().to_string();
        let text = r.input().iter().map(Value::to_string).collect::<String>();
        let new: Vec<String> = text
            .match_indices("courier-message id=")
            .filter_map(|(at, _)| text[at..].split(['"', '\\']).find(|s| s.starts_with("m_")).map(str::to_string))
            .filter(|id| seen.lock().unwrap().insert(id.clone()))
            .collect();
        if let (Some(to), false) = (threads.iter().find(|t| **t != from && threads.contains(&from)), new.is_empty()) {
            let (to, vars) = (to.clone(), ev.lock().unwrap().clone());
            std::thread::spawn(move || {
                let mut cmd = std::process::Command::new(courier_tests::broker_bin());
                cmd.env_clear().envs(vars).args(["send", "--thread", &to, "--from", "peer", &marker("PING")]);
                let _ = courier_tests::broker::run_bounded(&mut cmd, Duration::from_secs(30));
            });
        }
        Reply::message("done")
    });
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    std::fs::write(&env.courier_config, "[wake]\nmax_in_a_row = 3\nmax_per_minute = 100\n").unwrap();
    *env_vars.lock().unwrap() = env.env_vars();
    let broker = Broker::start_trusted(&env);
    let server = ListeningAppServer::start(env.codex_command(), env.root.join("as.sock"), &[], env.root.join("app-server.log"));
    let mut client = server.client(T);
    client.initialize(false, T);
    let (a, b) = (client.start_thread(&env.work, T), client.start_thread(&env.work, T));
    client.run_turn(&a, "hello", T);
    client.run_turn(&b, "hello", T);
    *pair.lock().unwrap() = vec![a.clone(), b.clone()];

    broker.send_opts(&a, &marker("FIRST"), None, Some("peer"));
    let guarded = courier_tests::util::poll_until(Duration::from_secs(30), || {
        courier_tests::broker::messages(&broker.inspect_json())
            .into_iter()
            .find(|m| str_field(m, "state") == "pending" && str_field(m, "reason") == "wake_loop_guard")
    });
    // Let any wake over the bound show before counting.
    std::thread::sleep(Duration::from_secs(3));
    let wakes = wakes_by_thread(&broker);
    eprintln!("wakes per thread: {wakes:?}; model requests {}", model.requests().len());
    assert!(wakes.values().all(|n| *n <= 3), "more wakes than max_in_a_row = 3: {wakes:?}\n{}", model.dump());
    assert!(wakes.values().sum::<usize>() >= 3, "the loop ran until the bound: {wakes:?}");
    let waiting = guarded.expect("a message over the bound waits with reason wake_loop_guard");
    let (thread, id) = (str_field(&waiting, "thread").to_string(), str_field(&waiting, "id").to_string());
    assert!(broker.inspect_text().contains("wake_loop_guard"), "inspect shows why");
    // A turn the person starts in that thread: its hooks deliver the waiting message.
    client.run_turn(&thread, "typed by the person", T);
    let m = broker.wait_state(&id, "confirmed", Duration::from_secs(15));
    assert_ne!(str_field(&m, "event"), "wake", "delivered by a hook of the person's turn: {m}");
}

/// A producer sending to an idle thread again and again: with `[wake] max_per_minute = 2`, the
/// third message within the minute starts no turn; it waits `pending` with `wake_rate_limited`
/// (so `broker inspect` says why), and the person's next turn delivers it through its hooks.
#[test]
fn wakes_per_minute_are_bounded() {
    let model = ScriptedModel::start_with(|_| Reply::message("done"));
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    std::fs::write(&env.courier_config, "[wake]\nmax_per_minute = 2\nmax_in_a_row = 100\n").unwrap();
    let broker = Broker::start_trusted(&env);
    let (_server, mut client, thread) = idle_app_server_thread(&env);
    for n in 0..2 {
        let text = marker(&format!("RATE_{n}"));
        let (id, _) = send_and_time(&broker, &model, &thread, &text);
        let m = assert_woken(&broker, &id);
        wait_turn_of(&mut client, &m);
    }
    let requests = model.requests().len();
    let id = broker.send_opts(&thread, &marker("RATE_OVER"), None, Some("waker"));
    let m = courier_tests::util::wait_until(Duration::from_secs(10), "the third message held by the rate", || {
        let m = broker.message(&id).unwrap_or_default();
        (str_field(&m, "reason") == "wake_rate_limited").then_some(m)
    });
    assert_eq!(str_field(&m, "state"), "pending", "{m}");
    assert_eq!(model.requests().len(), requests, "no turn was started for it\n{}", model.dump());
    assert!(broker.inspect_text().contains("wake_rate_limited"), "inspect says why");
    client.run_turn(&thread, "typed by the person", T);
    let m = broker.wait_state(&id, "confirmed", Duration::from_secs(15));
    assert_ne!(str_field(&m, "event"), "wake", "{m}");
}
