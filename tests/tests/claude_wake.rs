//! Claude Code's idle wake on the real pinned binary (`COURIER_CLAUDE_BIN`): the `Stop` command
//! hook with `asyncRewake` (`hook-client --claude-wake`) is held by the broker while the session
//! waits for the person; a queued message is recorded as handed, printed on the hook's stderr
//! with exit 2, and Claude Code starts a turn whose model gets it (docs/claude-code.md "Idle
//! wake"). The proof is the sockets claude made for the hook; a model's command running
//! hook-client is refused.
//!
//! Skips (and says so) only when COURIER_CLAUDE_BIN is unset; `install/test.sh` sets it.

use std::time::{Duration, Instant};

use courier_tests::broker::hook_client_bin;
use courier_tests::claude::gate::{claude_refusals, serve_hooks};
use courier_tests::claude::{env_or_skip, transcript_records, ClaudeEnv, PRINT_TIMEOUT};
use courier_tests::codex::ExecChild;
use courier_tests::messages::{ScriptedMessages, Turn};
use courier_tests::tmux::Tmux;
use courier_tests::util::{fake_uuid_v7, marker, poll_until, str_field};
use courier_tests::{Broker, CodexEnv};
use serde_json::{json, Value};

const BOUND: Duration = Duration::from_secs(60);

/// A Courier config with the Claude hook port (debug logs: proven hooks and held wakes are logged).
fn claude_world() -> (CodexEnv, u16) {
    let env = CodexEnv::with_base_url("http://127.0.0.1:9/v1");
    let port = serve_hooks(&env);
    (env, port)
}

/// A scripted model that answers `answer` to a request holding `text`, "first answer" to others.
fn answering(text: &str, answer: &'static str) -> ScriptedMessages {
    let wanted = text.to_string();
    ScriptedMessages::start_with(move |r| match r.body_contains(&wanted) {
        true => Turn::text(answer),
        false => Turn::text("first answer"),
    })
}

/// A running broker on `world`, the pinned claude trusted, and claude's settings holding
/// Courier's hooks (on `port`) as install writes them.
fn started<'a>(env: &ClaudeEnv, world: &'a CodexEnv, port: u16) -> Broker<'a> {
    let broker = Broker::start(world);
    broker.run_ok(&["trust-claude", &env.claude.display().to_string()]);
    install_hooks(env, port);
    broker
}

/// The hook command install registers for the idle wake.
fn wake_command() -> String {
    format!("{} --claude-wake", hook_client_bin().display())
}

/// Courier's hooks as install writes them: the four HTTP hooks, and at Stop the idle wake.
fn install_hooks(env: &ClaudeEnv, port: u16) {
    env.set_installed_hooks(port);
    let path = env.home.join(".claude/settings.json");
    let mut doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let wake = json!({"type": "command", "command": wake_command(), "asyncRewake": true, "timeout": 600});
    doc["hooks"]["Stop"][0]["hooks"].as_array_mut().unwrap().push(wake);
    std::fs::write(&path, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
}

/// claude's environment with the broker's runtime directory (where hook-client finds the socket).
fn claude_vars(env: &ClaudeEnv, world: &CodexEnv) -> Vec<(String, String)> {
    let mut vars = env.env_vars();
    vars.push(("COURIER_RUNTIME_DIR".into(), world.runtime_dir.display().to_string()));
    vars
}

/// `claude -p PROMPT --session-id SID` (stream-json), with the broker's runtime directory.
fn spawn_print(env: &ClaudeEnv, world: &CodexEnv, sid: &str, prompt: &str) -> ExecChild {
    let mut c = env.command();
    c.envs(claude_vars(env, world)).args(["-p", prompt, "--session-id", sid, "--output-format", "stream-json", "--verbose"]);
    ExecChild::spawn(c)
}

/// The interactive TUI, idle after its first answer, with the wake held: a message sent with
/// `--wait confirmed` starts a turn whose model request holds it exactly once, the receipt is
/// `confirmed`, and the transcript records the turn as a task notification.
#[test]
fn an_idle_tui_session_is_woken_once_by_a_queued_message_and_it_is_confirmed() {
    let text = marker("CLAUDE_WAKE");
    let api = answering(&text, "woken answer");
    let Some(env) = env_or_skip(&api) else { return };
    let (world, port) = claude_world();
    let broker = started(&env, &world, port);
    let mut vars = claude_vars(&env, &world);
    vars.push(("TERM".into(), "xterm-256color".into()));
    let tui = Tmux::start(&[env.claude.display().to_string()], &vars, &env.work);
    tui.wait_for("shift+tab to cycle", BOUND);
    tui.send_keys(&["-l", "say hello"]);
    tui.send_keys(&["Enter"]);
    tui.wait_for("first answer", BOUND);

    // Idle: the turn ended and its wake is held (the broker says so once it proved the hook).
    let held = poll_until(BOUND, || {
        broker.log_text().lines().find(|l| l.contains("claude wake of session") && l.contains("held")).map(String::from)
    })
    .unwrap_or_else(|| panic!("no held wake; log:\n{}", broker.log_text()));
    let sid = held.split("claude wake of session ").nth(1).and_then(|r| r.split(' ').next()).unwrap().to_string();
    // The person is not kept waiting: the turn is done while the wake is held. (A prompt typed
    // before that, during the Stop hooks, is queued under the ending turn's prompt_id: wait.)
    tui.wait_for("· done", BOUND);

    // The person types again: the held wake of the first turn answers nothing (the new turn's
    // HTTP hooks, and then its own wake, take over).
    tui.send_keys(&["-l", "and again"]);
    tui.send_keys(&["Enter"]);
    let released = format!("claude wake of session {sid} released: another turn opened");
    poll_until(BOUND, || broker.log_text().contains(&released).then_some(()))
        .unwrap_or_else(|| panic!("the first wake was not released; log:\n{}", broker.log_text()));
    let helds = |log: &str| log.lines().filter(|l| l.contains(&format!("claude wake of session {sid}")) && l.contains("held")).count();
    poll_until(BOUND, || (helds(&broker.log_text()) >= 2).then_some(()))
        .unwrap_or_else(|| panic!("the second turn's wake is not held; log:\n{}", broker.log_text()));
    let requests_before = api.requests().len();

    let sent_at = Instant::now();
    let mut send = world.command(courier_tests::broker::broker_bin());
    send.args(["send", "--thread", &sid, "--from", "ci-bot", "--wait", "confirmed", "--timeout", "60s", "--json", &text]);
    let send = ExecChild::spawn(send);
    let woken = api.wait_for(BOUND, "the woken request", |r| r.body_contains(&text));
    eprintln!("send -> the model's request carrying it: {:?}", woken.received_at.duration_since(sent_at));
    let sent = send.wait(BOUND);
    assert!(sent.status.success(), "send: {:?}\n{}\n{}\n{}", sent.status, sent.stdout, sent.stderr, broker.log_text());
    let receipt: Value =
        serde_json::from_str(sent.stdout.trim().lines().last().unwrap_or("")).unwrap_or_else(|e| panic!("{e}: {}", sent.stdout));
    assert_eq!(receipt.pointer("/message/state").and_then(Value::as_str), Some("confirmed"), "{receipt}");
    eprintln!("send -> confirmed receipt: {:?}", sent.duration);
    let id = str_field(&receipt, "id").to_string();
    let m = broker.message(&id).unwrap();
    assert_eq!(m["event"], "claude-wake", "handed by the wake: {m}");
    assert_eq!(m["attempts"], 1, "{m}");

    // Once: one request carries it, once, and the woken turn answered.
    tui.wait_for("woken answer", BOUND);
    assert_eq!(woken.body.to_string().matches(&text).count(), 1, "once in the request: {}", woken.body);
    let carrying: Vec<usize> = api.requests().iter().filter(|r| r.body_contains(&text)).map(|r| r.index).collect();
    assert_eq!(carrying, [woken.index], "only the woken request carries it:\n{}", api.dump());
    assert!(woken.index >= requests_before, "{}", api.dump());

    // The transcript: a turn opened by a task notification, holding the message.
    let transcript = std::fs::read_dir(env.home.join(".claude/projects"))
        .unwrap()
        .flatten()
        .map(|d| d.path().join(format!("{sid}.jsonl")))
        .find(|p| p.exists())
        .unwrap();
    let notified: Vec<Value> = transcript_records(&transcript)
        .into_iter()
        .filter(|r| r["type"] == "user" && r.pointer("/origin/kind") == Some(&json!("task-notification")))
        .collect();
    assert_eq!(notified.len(), 1, "{notified:?}");
    assert!(notified[0]["message"]["content"].as_str().is_some_and(|c| c.contains(&text)), "{}", notified[0]);
    eprintln!("--- TUI\n{}", tui.screen());
}

/// `claude -p` waits for a Stop hook however it is marked, so its wake is never held: a run with
/// nothing queued ends at once; a message queued before the run, pending at its Stop, goes
/// through the wake (as Stop hook feedback, one more turn) and is confirmed.
#[test]
fn claude_p_is_never_held_and_gets_what_is_pending_at_its_stop() {
    let text = marker("CLAUDE_P_WAKE");
    let api = answering(&text, "got it");
    let Some(env) = env_or_skip(&api) else { return };
    let (world, port) = claude_world();
    let broker = started(&env, &world, port);

    // Nothing queued: the wake answers nothing within its short bound.
    let out = spawn_print(&env, &world, &fake_uuid_v7(), "say hello").wait(PRINT_TIMEOUT);
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());
    eprintln!("claude -p with nothing queued took {:?}", out.duration);
    assert!(out.duration < Duration::from_secs(30), "{:?}", out.duration);
    assert!(broker.log_text().contains("held for 5s"), "the -p wake was proven and not held long:\n{}", broker.log_text());

    // Queued for the session before it starts: pending at its first Stop.
    let sid = fake_uuid_v7();
    let id = broker.send_future(&sid, &text, None, Some("ci-bot"));
    let out = spawn_print(&env, &world, &sid, "say hello").wait(PRINT_TIMEOUT);
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());
    let m = broker.wait_state(&id, "confirmed", Duration::from_secs(15));
    assert_eq!(m["event"], "claude-wake", "{m}");
    let carrying: Vec<_> = api.requests().into_iter().filter(|r| r.body_contains(&text)).collect();
    assert_eq!(carrying.len(), 1, "{}", api.dump());
    assert_eq!(carrying[0].body.to_string().matches(&text).count(), 1, "{}", carrying[0].body);
    assert!(claude_refusals(&broker).is_empty(), "{:?}", claude_refusals(&broker));
}

/// A model's Bash command running `hook-client --claude-wake` with a Stop payload forged for
/// its own live session (id, transcript and open turn all right) is refused and handed nothing:
/// as it is (stdout a file), with bash's stdin socket to claude as stdout and stderr (one socket
/// claude made), and with two socket pairs of its own (made by python, not claude).
#[test]
fn a_model_command_running_the_wake_hook_is_refused_and_gets_nothing() {
    let root = std::env::temp_dir().join(format!("courier-wake-attack-{}", marker("")));
    std::fs::create_dir_all(&root).unwrap();
    let forge = root.join("forge.sh");
    // The payload a forger can build: its session id from the environment, the transcript path,
    // the open turn's promptId from the transcript.
    std::fs::write(
        &forge,
        r#"sid=$CLAUDE_CODE_SESSION_ID
t=$(ls "$HOME"/.claude/projects/*/"$sid".jsonl)
p=$(grep -o '"promptId":"[^"]*"' "$t" | tail -1 | cut -d'"' -f4)
printf '{"session_id":"%s","transcript_path":"%s","cwd":"%s","prompt_id":"%s","hook_event_name":"Stop","stop_hook_active":false,"last_assistant_message":"x"}' "$sid" "$t" "$PWD" "$p"
"#,
    )
    .unwrap();
    let hc = hook_client_bin().display().to_string();
    let (r, f) = (root.display().to_string(), forge.display().to_string());
    let plain = format!("sh {f} | {hc} --claude-wake > {r}/plain.out 2> {r}/plain.err; echo $? > {r}/plain.rc");
    let fd10 = format!("sh {f} | {hc} --claude-wake 1>&10 2>&10; echo $? > {r}/fd10.rc");
    let pairs = format!(
        "sh {f} > {r}/payload; python3 -c 'import socket,subprocess,sys; a=socket.socketpair(); b=socket.socketpair(); \
         sys.exit(subprocess.call([sys.argv[1], \"--claude-wake\"], stdin=open(sys.argv[2]), stdout=a[0], stderr=b[0]))' {hc} {r}/payload; \
         echo $? > {r}/pairs.rc"
    );
    let script = [plain, fd10, pairs];
    let api = ScriptedMessages::start_with(move |r| match script.get(r.tool_results().len()) {
        Some(cmd) => Turn::bash(cmd),
        None => Turn::text("done"),
    });
    let Some(env) = env_or_skip(&api) else { return };
    let (world, port) = claude_world();
    let broker = started(&env, &world, port);
    let sid = fake_uuid_v7();
    let text = marker("CLAUDE_WAKE_FORGED");
    let id = broker.send_future(&sid, &text, None, None);
    let out = spawn_print(&env, &world, &sid, "run the commands").wait(PRINT_TIMEOUT);
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());

    for name in ["plain", "fd10", "pairs"] {
        let rc = std::fs::read_to_string(root.join(format!("{name}.rc"))).unwrap_or_default();
        assert_eq!(rc.trim(), "0", "{name}: the forged wake exits 0 with nothing (2 would be a message)\n{}", broker.log_text());
    }
    assert_eq!(std::fs::read_to_string(root.join("plain.err")).unwrap(), "", "nothing printed");
    let refused = claude_refusals(&broker);
    let has = |code: &str, detail: &str| refused.iter().any(|(c, d)| c == code && d.contains(detail));
    assert!(has("claude_wake_fd", "not a stream socket"), "plain: {refused:?}");
    assert!(has("claude_wake_fd", "one socket"), "fd 10: {refused:?}");
    assert!(has("untrusted_claude", "python"), "own pairs: {refused:?}");
    // The message went the genuine way (a proven PostToolUse mid-turn), never to a forger.
    let m = broker.wait_state(&id, "confirmed", Duration::from_secs(15));
    assert_eq!(m["event"], "claude", "{m}");
    std::fs::remove_dir_all(&root).ok();
}

/// A broker killed after a wake's hand-off record, before its answer, doubles nothing: the
/// hook-client gets no answer and exits 0 (nothing printed), claude carries on and exits; the
/// restarted broker never offers the message again and settles it `uncertain` (`claude_exited`).
#[test]
fn a_broker_killed_after_a_wake_hand_off_never_doubles_it() {
    let api = ScriptedMessages::start_with(|_| Turn::text("first answer"));
    let Some(env) = env_or_skip(&api) else { return };
    let (world, port) = claude_world();
    let cli = Broker::cli_only(&world);
    cli.run_ok(&["trust-claude", &env.claude.display().to_string()]);
    let mut serve = courier_tests::Serve::start(&world, &[("COURIER_FAILPOINTS", "claude_wake_after_hand_off")]);
    install_hooks(&env, port);
    let sid = fake_uuid_v7();
    let text = marker("CLAUDE_WAKE_CRASH");
    let id = cli.send_future(&sid, &text, None, None);
    let child = spawn_print(&env, &world, &sid, "say hello");
    let died = poll_until(BOUND, || serve.child.try_wait().ok().flatten());
    assert!(died.is_some(), "the failpoint killed the broker at the wake's hand-off: {}", serve.log_text());
    assert_eq!(cli.message_state(&id), "handed", "the hand-off was on record before the answer");
    serve = courier_tests::Serve::start(&world, &[]);
    let out = child.wait(PRINT_TIMEOUT);
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());

    let m = cli.wait_state(&id, "uncertain", Duration::from_secs(15));
    assert_eq!(m["reason"], "claude_exited", "{m}");
    assert_eq!(m["attempts"], 1, "offered once: {m}");
    let carrying: Vec<usize> = api.requests().iter().filter(|r| r.body_contains(&text)).map(|r| r.index).collect();
    assert!(carrying.is_empty(), "requests {carrying:?} carried it although no answer was written:\n{}", api.dump());
    drop(serve);
}

/// Fail open: with no broker (no socket), or a socket that accepts and never answers,
/// `hook-client --claude-wake` exits 0 at once or at its deadline, printing nothing.
#[test]
fn a_missing_or_silent_broker_costs_the_wake_hook_nothing() {
    use std::io::Write;
    let dir = std::env::temp_dir().join(format!("courier-wake-failopen-{}", marker("")));
    std::fs::create_dir_all(&dir).unwrap();
    let run = || {
        let mut c = std::process::Command::new(hook_client_bin());
        c.arg("--claude-wake").env("COURIER_RUNTIME_DIR", &dir).env("CLAUDE_CODE_ENTRYPOINT", "cli");
        c.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        let started = Instant::now();
        let mut child = c.spawn().unwrap();
        child.stdin.take().unwrap().write_all(br#"{"hook_event_name":"Stop","session_id":"x"}"#).unwrap();
        let out = child.wait_with_output().unwrap();
        (out, started.elapsed())
    };
    let (out, took) = run();
    assert_eq!((out.status.code(), out.stdout.len(), out.stderr.len()), (Some(0), 0, 0), "no broker: {out:?}");
    assert!(took < Duration::from_secs(2), "no broker: {took:?}");
    // Accepts (the backlog holds the connection) and never answers.
    let _silent = std::os::unix::net::UnixListener::bind(dir.join("claude-wake.sock")).unwrap();
    let (out, took) = run();
    assert_eq!((out.status.code(), out.stdout.len(), out.stderr.len()), (Some(0), 0, 0), "silent broker: {out:?}");
    assert!(took < Duration::from_secs(4), "silent broker: the 2 s deadline, not the hold: {took:?}");
    eprintln!("silent broker: the wake hook exited 0 after {took:?}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A same-uid process holding the wake socket's connections open: each sends a frame header and
/// then one byte at a time, slower than anything waits for; a connection the broker closes is
/// opened again at once, so the attacker always has `n` open. Stops (and says how many it
/// opened) when dropped.
struct SlowPeers {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<usize>>,
}

impl SlowPeers {
    fn start(socket: std::path::PathBuf, n: usize) -> SlowPeers {
        use std::io::Write;
        use std::os::unix::net::UnixStream;
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        let open = move || {
            let mut c = UnixStream::connect(&socket).ok()?;
            c.write_all(&1000u32.to_be_bytes()).ok()?; // a frame of 1000 bytes, sent one by one
            Some(c)
        };
        let thread = std::thread::spawn(move || {
            let mut conns: Vec<Option<UnixStream>> = (0..n).map(|_| open()).collect();
            let mut opened = n;
            while !stopping.load(Ordering::Relaxed) {
                for c in conns.iter_mut() {
                    if c.as_mut().is_none_or(|s| s.write_all(b" ").is_err()) {
                        *c = open();
                        opened += 1;
                    }
                }
                std::thread::sleep(Duration::from_millis(300)); // the attacker's pace, not a wait
            }
            opened
        });
        SlowPeers { stop, thread: Some(thread) }
    }
}

impl Drop for SlowPeers {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(opened) = self.thread.take().and_then(|t| t.join().ok()) {
            eprintln!("slow peers: {opened} connections opened in all");
        }
    }
}

/// Attack on availability: 32 same-uid connections to the wake socket that trickle a byte every
/// 300 ms (each read waited at most 2 s, so they were never closed) held every wake slot, and
/// no Claude session got an idle wake. With them open (and reopened whenever the broker closes
/// one), a `claude -p` run whose message is pending at its Stop still gets it by the wake,
/// confirmed.
#[test]
fn slow_connections_to_the_wake_socket_do_not_keep_a_session_from_its_wake() {
    let text = marker("CLAUDE_WAKE_SLOTS");
    let api = answering(&text, "got it");
    let Some(env) = env_or_skip(&api) else { return };
    let (world, port) = claude_world();
    let broker = started(&env, &world, port);
    let attack = SlowPeers::start(courier_shared::paths::claude_wake_socket_path(&world.runtime_dir), 32);
    let sid = fake_uuid_v7();
    let id = broker.send_future(&sid, &text, None, Some("ci-bot"));
    let out = spawn_print(&env, &world, &sid, "say hello").wait(PRINT_TIMEOUT);
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());
    let m = broker.wait_state(&id, "confirmed", Duration::from_secs(15));
    assert_eq!(m["event"], "claude-wake", "{m}");
    drop(attack);
    let carrying: Vec<_> = api.requests().into_iter().filter(|r| r.body_contains(&text)).collect();
    assert_eq!(carrying.len(), 1, "{}", api.dump());
}

/// A broker that stops while it holds an idle TUI session's wake (killed, as a crash or a
/// `broker restart` that does not wait leaves it) loses nothing: the wake hook presents itself
/// again to the broker that starts next, which proves it anew (its ticket was the same claude's,
/// taken before this broker started) and knows the turn stopped from the session's pin. A
/// message sent after the restart starts a turn and is `confirmed`; `send` has no note, and
/// `broker threads` says nothing of a missing wake.
#[test]
fn an_idle_tui_session_is_woken_after_a_broker_restart() {
    let text = marker("CLAUDE_WAKE_RESTART");
    let api = answering(&text, "woken after restart");
    let Some(env) = env_or_skip(&api) else { return };
    let (world, port) = claude_world();
    let mut broker = started(&env, &world, port);
    let mut vars = claude_vars(&env, &world);
    vars.push(("TERM".into(), "xterm-256color".into()));
    let tui = Tmux::start(&[env.claude.display().to_string()], &vars, &env.work);
    tui.wait_for("shift+tab to cycle", BOUND);
    tui.send_keys(&["-l", "say hello"]);
    tui.send_keys(&["Enter"]);
    tui.wait_for("first answer", BOUND);
    let held = poll_until(BOUND, || {
        broker.log_text().lines().find(|l| l.contains("claude wake of session") && l.contains("held")).map(String::from)
    })
    .unwrap_or_else(|| panic!("no held wake; log:\n{}", broker.log_text()));
    let sid = held.split("claude wake of session ").nth(1).and_then(|r| r.split(' ').next()).unwrap().to_string();
    tui.wait_for("· done", BOUND);

    broker.stop();
    let old_log = broker.log_text();
    let restarted_at = Instant::now();
    let broker = Broker::start(&world);
    let rearmed = poll_until(BOUND, || {
        broker.log_text().lines().any(|l| l.contains(&format!("claude wake of session {sid}")) && l.contains("held")).then_some(())
    });
    assert!(
        rearmed.is_some(),
        "the wake was not presented again to the new broker; log:\n{}\n--- the killed broker's log:\n{old_log}",
        broker.log_text()
    );
    eprintln!("restart -> the wake held again: {:?}", restarted_at.elapsed());
    let threads = broker.threads_json(false);
    let listed = threads.iter().find(|t| t["id"] == sid.as_str()).unwrap_or_else(|| panic!("{threads:#?}"));
    assert_eq!((listed["state"].as_str(), listed.get("not_woken")), (Some("idle"), None), "{listed}");

    let sent_at = Instant::now();
    let mut send = world.command(courier_tests::broker::broker_bin());
    send.args(["send", "--thread", &sid, "--from", "ci-bot", "--wait", "confirmed", "--timeout", "60s", "--json", &text]);
    let sent = ExecChild::spawn(send).wait(BOUND);
    assert!(sent.status.success(), "send: {:?}\n{}\n{}\n{}", sent.status, sent.stdout, sent.stderr, broker.log_text());
    eprintln!("send -> confirmed after the restart: {:?}", sent_at.elapsed());
    let receipt: Value =
        serde_json::from_str(sent.stdout.trim().lines().last().unwrap_or("")).unwrap_or_else(|e| panic!("{e}: {}", sent.stdout));
    assert_eq!(receipt.pointer("/message/state").and_then(Value::as_str), Some("confirmed"), "{receipt}");
    assert!(!sent.stdout.contains("no wake hook"), "{}", sent.stdout);
    let m = broker.message(str_field(&receipt, "id")).unwrap();
    assert_eq!((m["event"].as_str(), m["attempts"].as_u64()), (Some("claude-wake"), Some(1)), "{m}");
    tui.wait_for("woken after restart", BOUND);
    assert!(claude_refusals(&broker).is_empty(), "no refusal, no alarm: {:?}", claude_refusals(&broker));
    assert!(broker.inspect_json()["alarms"].as_array().is_none_or(|a| a.is_empty()), "{}", broker.inspect_text());
}
