//! The sending side on the real Codex: receipts (`send --wait`, `wait`, `status`), refusal of
//! thread ids no rollout has, `broker threads`, `send --cwd`, and the JSON-lines socket protocol
//! (the Python example of docs/producers.md, run as written). Each test has its own scripted model, Codex
//! home and broker.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use courier_tests::broker::line_request;
use courier_tests::broker::{broker_bin, hook_command, run_bounded};
use courier_tests::model::parent_of_subagent;
use courier_tests::util::marker;
use courier_tests::{Broker, CodexEnv, ExecChild, Hold, Reply, ScriptedModel};
use serde_json::Value;

const T: Duration = Duration::from_secs(60);

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// `broker <args>` run in the background; joined with its output and the wall-clock time (ms) it
/// exited at.
struct Bg(std::thread::JoinHandle<(Output, i64)>);

fn bg(env: &CodexEnv, args: &[&str]) -> Bg {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let mut cmd = env.command(courier_tests::broker_bin());
    cmd.args(args).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let child = cmd.spawn().expect("spawn broker");
    let pid = child.id() as i32;
    let done = Arc::new(AtomicBool::new(false));
    let watchdog = Arc::clone(&done);
    // Bounded: killed after 120 s (a test that waits longer has failed anyway).
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(120));
        if !watchdog.load(Ordering::SeqCst) {
            // SAFETY: kill(2) on the child's pid, which is not reaped before `done` is set.
            unsafe { libc_kill(pid) };
        }
    });
    Bg(std::thread::spawn(move || {
        // A blocking wait, so the exit time is exact (no polling interval in the measurement).
        let out = child.wait_with_output().expect("wait for broker");
        let at = now_ms();
        done.store(true, Ordering::SeqCst);
        (out, at)
    }))
}

unsafe fn libc_kill(pid: i32) {
    extern "C" {
        fn kill(pid: i32, sig: i32) -> i32;
    }
    kill(pid, 9);
}

impl Bg {
    fn join(self) -> (Output, i64) {
        self.0.join().expect("background broker command")
    }
}

/// A `codex exec` of `prompt` run in `dir`.
fn exec_in(env: &CodexEnv, dir: &Path, prompt: &str) -> ExecChild {
    let mut c = env.codex_command();
    c.current_dir(dir).arg("exec").arg("--skip-git-repo-check").arg(prompt);
    ExecChild::spawn(c)
}

fn find<'a>(threads: &'a [Value], id: &str) -> Option<&'a Value> {
    threads.iter().find(|t| t["id"] == id)
}

/// An ended thread: one `codex exec` run to completion.
fn ended_thread(env: &CodexEnv) -> String {
    let model_done = env.exec("finish at once");
    model_done.assert_success();
    model_done.thread_id().expect("session id")
}

/// `send --wait confirmed` returns 0 once the message reached the model, with the id on stdout;
/// a parallel `broker wait` returns within milliseconds of the state change (the broker's
/// notification, not a poll); `status --json` and `wait --for handed` agree afterwards.
#[test]
fn send_wait_confirmed_returns_zero_once_delivered() {
    let (model, env, hold) = CodexEnv::with_held_turn();
    let broker = Broker::start_trusted(&env);
    let child = env.spawn_exec("please run a command");
    hold.wait_held(1, T);
    let thread = child.wait_thread_id(T);
    let body = marker("RECEIPT");

    let send = bg(&env, &["send", "--thread", &thread, "--from", "relay", "--wait", "confirmed", "--timeout", "60s", &body]);
    // The id is queued before the turn goes on: find it, and wait on it from a second process.
    let id = courier_tests::util::wait_until(T, "the message to be queued", || {
        broker.inspect_json()["messages"]
            .as_array()?
            .iter()
            .find(|m| m["thread"] == thread.as_str())
            .map(|m| m["id"].as_str().unwrap().to_string())
    });
    let waiter = bg(&env, &["wait", &id, "--json"]);
    // Both are parked in the broker now, not polling.
    courier_tests::util::wait_until(T, "two parked waits", || {
        (broker.inspect_json()["broker"]["parked_waits"].as_u64() == Some(2)).then_some(())
    });
    assert_eq!(broker.message_state(&id), "pending");
    hold.release();
    child.wait(T).assert_success();

    let (out, _) = send.join();
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "send --wait confirmed: {stdout} {stderr}");
    assert_eq!(stdout.trim(), id, "stdout is the id alone");
    let (wout, returned_at) = waiter.join();
    let (wstdout, wstderr) = text(&wout);
    assert_eq!(wout.status.code(), Some(0), "{wstdout} {wstderr}");
    let rec: Value = serde_json::from_str(wstdout.trim()).unwrap();
    assert_eq!((rec["id"].as_str(), rec["state"].as_str()), (Some(id.as_str()), Some("confirmed")));
    let confirmed_at = rec["confirmed_at"].as_i64().unwrap();
    let latency = returned_at - confirmed_at;
    eprintln!("wait latency: state change (confirmed_at) to `broker wait` exit: {latency} ms");
    assert!((0..2000).contains(&latency), "latency {latency} ms");
    assert_eq!(model.count_messages_containing("developer", &body), 1, "{}", model.dump());

    let status: Value = serde_json::from_str(&broker.run_ok(&["status", &id, "--json"])).unwrap();
    assert_eq!(status["state"], "confirmed");
    assert_eq!(status["from"], "relay");
    assert_eq!(status["thread"], thread.as_str());
    let human = broker.run_ok(&["status", &id]);
    assert!(human.starts_with(&format!("{id} confirmed")), "{human}");
    let out = broker.run(&["wait", &id, "--for", "handed", "--timeout", "5s"]);
    assert_eq!(out.status.code(), Some(0), "confirmed passes handed: {:?}", text(&out));
    assert_eq!(text(&out).0.trim(), format!("{id} confirmed"));
}

/// A message for an ended thread is accepted with a note, and one whose `--ttl` runs out makes
/// `send --wait` exit 4 with the reason; `wait` says the same with no broker running (its
/// fallback), and a timeout with the message still queued exits 3.
#[test]
fn expiry_exits_4_with_the_reason_and_timeout_exits_3() {
    let (_model, env, hold) = CodexEnv::with_held_turn();
    hold.release();
    let mut broker = Broker::start_trusted(&env);
    let thread = ended_thread(&env);

    let started = Instant::now();
    let out = broker.run(&["send", "--thread", &thread, "--ttl", "1s", "--wait", "confirmed", "--timeout", "30s", "too late"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(4), "{stdout} {stderr}");
    let id = stdout.trim().to_string();
    assert!(stderr.contains("waits until the thread is resumed"), "the ended-thread note: {stderr}");
    assert!(stderr.contains(&format!("{id} expired without reaching confirmed (ttl_elapsed)")), "{stderr}");
    let took = started.elapsed();
    eprintln!("send --ttl 1s --wait returned 4 after {took:?}");
    assert!(took < Duration::from_secs(5), "expired within about a second: {took:?}");

    // Still queued at the timeout: 3, with the state; `--json` prints the record.
    let pending = broker.run_ok(&["send", "--thread", &thread, "waits for a resume"]).trim().to_string();
    let out = broker.run(&["wait", &pending, &id, "--timeout", "1s"]);
    assert_eq!(out.status.code(), Some(4), "one ended: 4 wins over the timeout: {:?}", text(&out));
    let out = broker.run(&["wait", &pending, "--timeout", "1s", "--json"]);
    assert_eq!(out.status.code(), Some(3), "{:?}", text(&out));
    let rec: Value = serde_json::from_str(text(&out).0.trim()).unwrap();
    assert_eq!(rec["state"], "pending");
    let out = broker.run(&["wait", &pending, "--for", "handed", "--timeout", "1s"]);
    assert_eq!(out.status.code(), Some(3));
    // The wake channel says why it waits: its thread is not loaded anywhere.
    assert_eq!(text(&out).0.trim(), format!("{pending} still pending (timed out; thread_not_loaded)"));

    // No broker: the client polls the queue itself and still sees the ttl run out.
    broker.stop();
    let late = broker.run_ok(&["send", "--thread", &thread, "--ttl", "1500ms", "nobody delivers this"]).trim().to_string();
    let out = broker.run(&["wait", &late, "--timeout", "20s"]);
    assert_eq!(out.status.code(), Some(4), "{:?}", text(&out));
    assert!(text(&out).0.contains(&format!("{late} expired without reaching confirmed (ttl_elapsed)")), "{:?}", text(&out));
    let out = broker.run(&["wait", &pending, "--timeout", "1500ms"]);
    assert_eq!(out.status.code(), Some(3), "{:?}", text(&out));
    // Usage and lookup errors.
    assert_eq!(broker.run(&["wait", "not-an-id"]).status.code(), Some(2));
    assert_eq!(broker.run(&["wait", &pending, "--for", "seen"]).status.code(), Some(2));
    let out = broker.run(&["status", "m_00000000000000ff"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).1.contains("no message m_00000000000000ff"), "{:?}", text(&out));
    assert_eq!(broker.run(&["send", "--thread", &thread, "--timeout", "1s", "x"]).status.code(), Some(2), "--timeout needs --wait");
}

/// A thread id no rollout has is refused (exit 2, nothing queued) unless `--future-thread`; a
/// message for an ended thread waits and is delivered, confirmed, when the thread is resumed.
#[test]
fn unknown_threads_are_refused_and_ended_ones_wait_for_a_resume() {
    let (model, env, hold) = CodexEnv::with_held_turn();
    hold.release();
    let broker = Broker::start_trusted(&env);
    // A typo of a real id: same time bits, another tail.
    let thread = ended_thread(&env);
    let typo = format!("{}{}", &thread[..35], if thread.ends_with('0') { '1' } else { '0' });
    let v4 = "2b0c2c5e-3c3d-4f7e-9d1a-5b6c7d8e9f00";
    for bad in [typo.as_str(), v4] {
        let out = broker.run(&["send", "--thread", bad, "lost"]);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{bad}: {stdout} {stderr}");
        assert!(stdout.is_empty(), "no id printed: {stdout}");
        assert!(stderr.contains("no rollout under") && stderr.contains(bad) && stderr.contains("--future-thread"), "{stderr}");
    }
    assert!(broker.inspect_json()["messages"].as_array().unwrap().is_empty(), "nothing queued");
    let out = broker.run(&["send", "--thread", v4, "--future-thread", "--json", "for later"]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let sent: Value = serde_json::from_str(text(&out).0.trim()).unwrap();
    assert_eq!(sent["thread_status"], "not_started");
    assert!(sent["note"].as_str().unwrap().contains("at most 24 h"), "{sent}");

    let body = marker("AFTER_RESUME");
    let out = broker.run(&["send", "--thread", &thread, "--json", &body]);
    let sent: Value = serde_json::from_str(text(&out).0.trim()).unwrap();
    assert_eq!(sent["thread_status"], "ended");
    let id = sent["id"].as_str().unwrap().to_string();
    let waiter = bg(&env, &["wait", &id, "--timeout", "60s"]);
    let resumed = env.exec_args(&["resume", &thread], "carry on", T);
    resumed.assert_success();
    let (out, _) = waiter.join();
    assert_eq!(out.status.code(), Some(0), "delivered after the resume: {:?}", text(&out));
    assert_eq!(model.count_messages_containing("developer", &body), 1, "{}", model.dump());
}

/// `broker threads` lists what trusted codex processes hold: two busy `codex exec` sessions with
/// their pid, cwd, title and queue counts (from the broker, and read locally with no broker);
/// once they end, only `--all` lists them, as ended, most recently active first. `send --cwd` picks the one
/// thread of a directory and lists the candidates when there are none or several.
#[test]
fn threads_and_cwd_addressing() {
    let (_model, env, hold) = CodexEnv::with_held_turn();
    let mut broker = Broker::start_trusted(&env);
    let (dir_a, dir_b) = (env.root.join("proj-a"), env.root.join("proj-b"));
    std::fs::create_dir_all(&dir_a).unwrap();
    std::fs::create_dir_all(&dir_b).unwrap();
    let a = exec_in(&env, &dir_a, "ALPHA fix the parser");
    let b = exec_in(&env, &dir_b, "BRAVO write the docs");
    hold.wait_held(2, T);
    let (ta, tb) = (a.wait_thread_id(T), b.wait_thread_id(T));

    let id = broker.run_ok(&["send", "--cwd", &dir_a.display().to_string(), "for alpha"]).trim().to_string();
    let m = broker.message(&id).unwrap();
    assert_eq!(m["thread"], ta.as_str(), "--cwd names A's thread");
    let out = broker.run(&["send", "--cwd", &env.root.display().to_string(), "nobody there"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("no live Codex thread or Claude Code session runs in") && stderr.contains(&ta) && stderr.contains(&tb),
        "lists the candidates: {stderr}"
    );

    for local in [false, true] {
        if local {
            broker.stop(); // read from /proc and the rollouts by the CLI itself
        }
        let list = broker.threads_json(false);
        assert_eq!(list.len(), 2, "local={local}: {list:#?}");
        for (t, dir, title, pid) in [(&ta, &dir_a, "ALPHA fix the parser", a.pid()), (&tb, &dir_b, "BRAVO write the docs", b.pid())] {
            let e = find(&list, t).unwrap_or_else(|| panic!("{t} not listed: {list:#?}"));
            assert_eq!(e["state"], "busy", "{e}");
            assert!(e["turn_id"].is_string(), "{e}");
            assert_eq!(e["process"]["kind"], "exec");
            assert_eq!(e["process"]["pid"].as_u64(), Some(u64::from(pid)));
            assert_eq!(Path::new(e["cwd"].as_str().unwrap()), dir.canonicalize().unwrap());
            assert_eq!(e["title"], title);
            assert_eq!(e["parent"], Value::Null);
            assert_eq!(e["originator"], "codex_exec");
        }
        assert_eq!(find(&list, &ta).unwrap()["pending"], 1);
        assert_eq!(find(&list, &tb).unwrap()["pending"], 0);
        let table = broker.run_ok(&["threads"]);
        assert!(table.contains(&ta) && table.contains("ALPHA fix the parser") && table.contains("busy"), "{table}");
    }
    let mut broker = Broker::start(&env);

    // A second session in A's directory: --cwd is ambiguous now.
    let a2 = exec_in(&env, &dir_a, "ALPHA2 also here");
    hold.wait_held(3, T);
    let ta2 = a2.wait_thread_id(T);
    let out = broker.run(&["send", "--cwd", &dir_a.display().to_string(), "which one?"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("2 live threads run in") && stderr.contains(&ta) && stderr.contains(&ta2) && !stderr.contains(&tb), "{stderr}");

    hold.release();
    for c in [a, b, a2] {
        c.wait(T).assert_success();
    }
    assert!(broker.threads_json(false).is_empty(), "ended threads are not live");
    let all = broker.threads_json(true);
    let ids: Vec<&str> = all.iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 3, "{all:#?}");
    assert!(all.iter().all(|t| t["state"] == "ended" && t["process"].is_null()), "{all:#?}");
    let activity: Vec<i64> = all.iter().map(|t| t["last_activity_at"].as_i64().unwrap()).collect();
    assert!(activity.windows(2).all(|w| w[0] >= w[1]), "most recently active first: {activity:?}");
    for t in [&ta, &tb, &ta2] {
        assert!(ids.contains(&t.as_str()), "{t} in {ids:?}");
    }
    let e = find(&all, &ta).unwrap();
    assert_eq!((e["pending"].as_u64(), e["messages"]["confirmed"].as_u64()), (Some(0), Some(1)), "{e}");
    broker.stop();
}

/// The Python producer of docs/producers.md (the block between the `producer-example` markers), run as
/// written: it lists threads, sends by cwd over the socket and blocks until `confirmed`.
#[test]
fn readme_python_example_sends_and_waits_over_the_socket() {
    let doc = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/producers.md")).unwrap();
    let start = doc.find("<!-- producer-example -->").expect("docs/producers.md has the producer example");
    let block = &doc[start..];
    let code = block.split("```python\n").nth(1).and_then(|b| b.split("```").next()).expect("a python block");
    let lines = code.lines().count();
    assert!(lines <= 25, "the example stays short ({lines} lines)");

    let (model, env, hold) = CodexEnv::with_held_turn();
    let broker = Broker::start_trusted(&env);
    let script = env.root.join("producer.py");
    std::fs::write(&script, code).unwrap();
    let child = env.spawn_exec("SOCKET please run a command");
    hold.wait_held(1, T);
    let thread = child.wait_thread_id(T);
    let body = marker("FROM_PYTHON");
    let mut py = env.command("python3");
    // The example asks `broker socket-path`: the broker under test first on PATH.
    let path = format!("{}:{}", broker_bin().parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    py.arg(&script).arg(&env.work).arg(&body).env("PATH", path);
    let py = std::thread::spawn(move || run_bounded(&mut py, Duration::from_secs(90)));
    courier_tests::util::wait_until(T, "the Python producer's wait to park", || {
        (broker.inspect_json()["broker"]["parked_waits"].as_u64() == Some(1)).then_some(())
    });
    hold.release();
    child.wait(T).assert_success();
    let out = py.join().unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains(&thread), "it listed the thread: {stdout}");
    let last = stdout.lines().last().unwrap();
    assert!(last.starts_with("m_") && last.ends_with(" reached confirmed"), "{stdout}");
    assert_eq!(model.count_messages_containing("developer", &body), 1);

    // The protocol's errors are lines too.
    let sock = env.runtime_dir.join("broker.sock");
    for (req, code) in [
        ("{\"op\":\"send\",\"thread\":\"2b0c2c5e-3c3d-4f7e-9d1a-5b6c7d8e9f00\",\"text\":\"x\"}", "no_such_thread"),
        ("{\"op\":\"status\",\"id\":\"m_00000000000000ff\"}", "not_found"),
        ("{\"op\":\"send\",\"thred\":\"x\",\"text\":\"x\"}", "bad_request"),
    ] {
        let reply = line_request(&sock, req);
        assert_eq!((reply["ok"].as_bool(), reply["error"].as_str()), (Some(false), Some(code)), "{req}: {reply}");
    }
    // A hook frame on the same socket still works afterwards (inspect asks for the status).
    assert_eq!(broker.inspect_json()["broker"]["running"], true);
}

/// Two sessions, as the agent-to-agent tests run them: B starts and is held in its first request,
/// its thread id goes into `tb_slot` (where A's script reads it), then A runs `alpha_prompt`;
/// once A's waiting send has parked in the broker, B is released, and both sessions end well.
/// Returns A's and B's thread ids.
fn alpha_messages_bravo(
    env: &CodexEnv,
    broker: &Broker,
    hold: &Hold,
    tb_slot: &std::sync::Mutex<Option<String>>,
    alpha_prompt: &str,
) -> (String, String) {
    let b = env.spawn_exec("BRAVO wait for a message");
    hold.wait_held(1, T);
    let tb = b.wait_thread_id(T);
    *tb_slot.lock().unwrap() = Some(tb.clone());
    let a = env.spawn_exec(alpha_prompt);
    let ta = a.wait_thread_id(T);
    courier_tests::util::wait_until(T, "A's waiting send to park", || {
        (broker.inspect_json()["broker"]["parked_waits"].as_u64() == Some(1)).then_some(())
    });
    hold.release();
    b.wait(T).assert_success();
    a.wait(T).assert_success();
    (ta, tb)
}

/// A `broker send` run by the model of session A (its `exec_command`) reaches session B with
/// `from="thread:<A>" verified="true"`: the broker proved which thread's tool command sent it.
/// The same command with `--from relay` is a plain label, and a self-declared `--from thread:...`
/// is refused (exit 2). A's `send --wait confirmed` returns 0 once B's model has it, so A's model
/// sees the receipt in its tool output.
#[test]
fn tool_command_sender_is_verified_and_labels_cannot_pose_as_it() {
    use std::sync::{Arc, Mutex};
    let hold = Hold::new();
    let h = hold.clone();
    let tb_slot: Arc<Mutex<Option<String>>> = Arc::default();
    let slot = Arc::clone(&tb_slot);
    let bin = courier_tests::broker_bin().display().to_string();
    let (verified_text, relayed_text) = (marker("VERIFIED"), marker("RELAYED"));
    let (vt, rt) = (verified_text.clone(), relayed_text.clone());
    let model = ScriptedModel::start_with(move |r| {
        let first = r.function_calls().is_empty();
        if !r.user_messages_containing("BRAVO").is_empty() {
            return if first { Reply::exec("echo bravo").held(&h) } else { Reply::message("done") };
        }
        if !first {
            return Reply::message("done");
        }
        let tb = slot.lock().unwrap().clone().expect("B's thread id first");
        let ta = r.thread_id().unwrap();
        let cmd = format!(
            "{bin} send --thread {tb} --key kv --wait confirmed --timeout 60s '{vt}'; echo rc1=$?; \
             {bin} send --thread {tb} --key kr --from relay '{rt}'; echo rc2=$?; \
             {bin} send --thread {tb} --from 'thread:{ta}' forged 2>&1; echo rc3=$?"
        );
        Reply::exec_with_yield(&cmd, 60_000)
    });
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let broker = Broker::start_trusted(&env);
    let (ta, tb) = alpha_messages_bravo(&env, &broker, &hold, &tb_slot, "ALPHA message your peer");

    let wrapped = model.requests_for_thread(&tb).iter().flat_map(|r| r.developer_messages_containing(&verified_text)).collect::<Vec<_>>();
    assert!(!wrapped.is_empty(), "{}", model.dump());
    for w in &wrapped {
        assert!(w.contains(&format!("from=\"thread:{ta}\" verified=\"true\">{verified_text}")), "{w}");
    }
    let out = model.requests_for_thread(&ta).iter().flat_map(|r| r.exec_results()).find_map(|(_, out)| out).expect("A's tool output");
    assert!(out.contains("rc1=0") && out.contains("rc2=0") && out.contains("rc3=2"), "{out}");
    assert!(out.contains("reserved for senders the broker verified"), "{out}");
    let msgs = broker.inspect_json()["messages"].as_array().unwrap().clone();
    let by_key = |k: &str| msgs.iter().find(|m| m["key"] == k).cloned().unwrap_or_else(|| panic!("no message with key {k}: {msgs:#?}"));
    assert_eq!(by_key("kv")["from"], format!("thread:{ta}"));
    assert_eq!(by_key("kv")["state"], "confirmed");
    assert_eq!(by_key("kr")["from"], "relay");
    let relayed = model.requests_for_thread(&tb).iter().flat_map(|r| r.user_messages_containing(&relayed_text)).collect::<Vec<_>>();
    assert!(relayed.iter().all(|m| !m.contains("verified=")), "a label is never marked verified: {relayed:?}");
    assert_eq!(msgs.len(), 2, "the forged one was not queued: {msgs:#?}");
}

/// Registers `broker mcp` as Codex's MCP server `courier` in `env` (Codex passes an MCP server
/// only a few variables of its own environment, so Courier's directories are given).
fn register_mcp(env: &CodexEnv) {
    env.set_extra_config(&format!(
        "[mcp_servers.courier]\ncommand = {:?}\nargs = [\"mcp\"]\nenv = {{ COURIER_RUNTIME_DIR = {:?}, COURIER_STATE_DIR = {:?} }}\n",
        courier_tests::broker_bin().display().to_string(),
        env.runtime_dir.display().to_string(),
        env.state_dir.display().to_string()
    ));
}

/// An agent messages an agent through MCP: the scripted model of session A finds Courier's tools
/// (Codex defers MCP tools behind `tool_search`), calls `send_message` for session B with
/// `wait: "confirmed"`, then `message_status`. B's model gets the message once, from
/// `thread:<A>` marked verified (the broker checked the MCP server's codex runs A and A's open
/// turn has that call); A's `send_message` returns `reached` and `message_status` says `confirmed`.
#[test]
fn mcp_agent_messages_agent_and_sees_the_receipt() {
    use std::sync::{Arc, Mutex};
    let hold = Hold::new();
    let h = hold.clone();
    let tb_slot: Arc<Mutex<Option<String>>> = Arc::default();
    let slot = Arc::clone(&tb_slot);
    let body = marker("OVER_MCP");
    let b2 = body.clone();
    let model = ScriptedModel::start_with(move |r| {
        if !r.user_messages_containing("BRAVO").is_empty() {
            return if r.function_calls().is_empty() { Reply::exec("echo bravo").held(&h) } else { Reply::message("done") };
        }
        let last = r.input().last().cloned().unwrap_or_default();
        let last_text = last.to_string();
        match last["type"].as_str() {
            Some("message") => Reply::raw_items(vec![serde_json::json!({
                "type": "tool_search_call", "call_id": "ts_courier", "execution": "client",
                "arguments": {"query": "courier send message to another thread"}})]),
            Some("tool_search_output") => {
                let tb = slot.lock().unwrap().clone().expect("B's thread id first");
                Reply::call(
                    Some("mcp__courier"),
                    "send_message",
                    serde_json::json!({"thread": tb, "text": b2, "wait": "confirmed", "timeout_seconds": 60}),
                )
            }
            Some("function_call_output") if last_text.contains("\\\"outcome\\\"") => {
                let id = last_text.split("m_").nth(1).map(|t| format!("m_{}", &t[..16])).unwrap_or_default();
                Reply::call(Some("mcp__courier"), "message_status", serde_json::json!({"id": id}))
            }
            _ => Reply::message("done"),
        }
    });
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    register_mcp(&env);
    let broker = Broker::start_trusted(&env);
    let (ta, tb) = alpha_messages_bravo(&env, &broker, &hold, &tb_slot, "ALPHA tell your peer");

    let seen: Vec<String> = model.requests_for_thread(&tb).iter().flat_map(|r| r.developer_messages_containing(&body)).collect();
    assert!(!seen.is_empty(), "B's model got it: {}", model.dump());
    assert!(seen.iter().all(|w| w.contains(&format!("from=\"thread:{ta}\" verified=\"true\">{body}"))), "{seen:?}");
    assert_eq!(model.requests_for_thread(&tb).last().unwrap().developer_messages_containing(&body).len(), 1, "once");
    let outputs: Vec<String> = model.requests_for_thread(&ta).last().unwrap().tool_outputs().iter().map(|o| o.to_string()).collect();
    let send_out = outputs.iter().find(|o| o.contains("outcome")).unwrap_or_else(|| panic!("send_message output: {outputs:#?}"));
    assert!(send_out.contains("\\\"outcome\\\": \\\"reached\\\"") && send_out.contains("\\\"sender_verified\\\": true"), "{send_out}");
    let status_out = outputs.last().unwrap();
    assert!(status_out.contains("\\\"state\\\": \\\"confirmed\\\""), "message_status: {status_out}");
    let msgs = broker.inspect_json()["messages"].as_array().unwrap().clone();
    assert_eq!(msgs.len(), 1, "{msgs:#?}");
    assert_eq!((msgs[0]["state"].as_str(), msgs[0]["from"].as_str()), (Some("confirmed"), Some(format!("thread:{ta}").as_str())));
}

/// `broker install` copies courier-mcp beside the broker and registers `broker mcp` as Codex's
/// MCP server "courier": Codex lists it, and a session's model reaches Courier's tools through it;
/// `broker uninstall` takes the entry out again. `--no-mcp` registers nothing.
#[test]
fn install_registers_broker_mcp_in_codex() {
    let model = ScriptedModel::start_with(|r| {
        let last = r.input().last().cloned().unwrap_or_default();
        match last["type"].as_str() {
            Some("message") => Reply::raw_items(vec![serde_json::json!({
                "type": "tool_search_call", "call_id": "ts_1", "execution": "client", "arguments": {"query": "courier threads"}})]),
            Some("tool_search_output") => Reply::call(Some("mcp__courier"), "list_threads", serde_json::json!({})),
            _ => Reply::message("done"),
        }
    });
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let prefix = env.root.join("prefix");
    let cli = Broker::cli_only(&env);
    let install = |extra: &[&str]| {
        let mut args =
            vec!["install", "--prefix", prefix.to_str().unwrap(), "--codex-home", env.codex_home.to_str().unwrap(), "--start", "none"];
        args.extend_from_slice(extra);
        cli.run(&args)
    };
    let out = install(&[]);
    let installed = text(&out).0;
    assert!(prefix.join("courier-mcp").is_file(), "{installed}");
    assert!(installed.contains("as Codex's MCP server \"courier\""), "{installed}");
    let listed = run_bounded(env.codex_command().args(["mcp", "list", "--json"]), T);
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap_or_else(|e| panic!("codex mcp list --json: {e}: {listed:?}"));
    let courier = listed.as_array().unwrap().iter().find(|s| s["name"] == "courier").unwrap_or_else(|| panic!("{listed:#}"));
    assert!(courier.to_string().contains(&prefix.join("broker").display().to_string()), "{courier}");

    let _broker = Broker::start_trusted(&env);
    let out = env.exec("list the threads");
    out.assert_success();
    let thread = out.thread_id().unwrap();
    let reply = model.requests_for_thread(&thread).last().unwrap().tool_outputs().iter().map(|o| o.to_string()).collect::<String>();
    assert!(reply.contains(&thread), "the installed broker mcp listed this very thread: {reply}");

    let out = run_bounded(Command::new(prefix.join("broker")).args(["uninstall"]).env_clear().envs(env.env_vars()), T);
    assert!(out.status.success(), "{:?}", text(&out));
    let config = std::fs::read_to_string(env.config_toml_path()).unwrap();
    assert!(!config.contains("mcp_servers"), "{config}");
    let out = install(&["--no-mcp"]);
    assert!(out.status.success(), "{:?}", text(&out));
    assert!(!prefix.join("courier-mcp").exists() && !std::fs::read_to_string(env.config_toml_path()).unwrap().contains("mcp_servers"));
}

/// Sub-agents: `broker threads` shows the child under its parent (parent, children, nickname, the
/// same codex process); `send --thread PARENT --agent NICKNAME` reaches the child, `--cwd` the
/// parent (a sub-agent shares its cwd but is not a candidate); and the child's model messages its
/// parent through MCP (`to: "parent"`), verified as the child.
#[test]
fn subagents_are_listed_and_addressed_by_name() {
    let hold = Hold::new();
    let h = hold.clone();
    let (to_child, to_parent) = (marker("TO_CHILD"), marker("TO_PARENT"));
    let tp = to_parent.clone();
    let model = ScriptedModel::start_with(move |r| {
        let last = r.input().last().cloned().unwrap_or_default();
        if r.is_subagent() {
            return match last["type"].as_str() {
                Some("tool_search_output") => {
                    Reply::call(Some("mcp__courier"), "send_message", serde_json::json!({"to": "parent", "text": tp}))
                }
                Some("function_call_output") => Reply::message("child done"),
                _ => Reply::raw_items(vec![serde_json::json!({
                    "type": "tool_search_call", "call_id": "ts_child", "execution": "client",
                    "arguments": {"query": "courier send message"}})])
                .held(&h),
            };
        }
        parent_of_subagent(r, "CHILD_TASK: tell your parent you are done", 30_000)
    });
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    register_mcp(&env);
    let broker = Broker::start_trusted(&env);
    let proc = env.spawn_exec("spawn a helper");
    let parent = proc.wait_thread_id(T);
    let first_child = model.wait_for(T, "the sub-agent's first request", courier_tests::Request::is_subagent);
    hold.wait_held(1, T);
    let child = first_child.thread_id().unwrap();

    let list = broker.threads_json(false);
    let (p, c) = (find(&list, &parent).expect("parent listed"), find(&list, &child).expect("child listed"));
    assert_eq!(p["children"], serde_json::json!([child]), "{list:#?}");
    assert_eq!((c["parent"].as_str(), c["root"].as_str()), (Some(parent.as_str()), Some(parent.as_str())), "{c}");
    assert_eq!(c["state"], "busy");
    assert_eq!(c["process"]["pid"], p["process"]["pid"], "one codex process runs both");
    assert_eq!(c["process"]["pid"].as_u64(), Some(u64::from(proc.pid())));
    let nickname = c["agent_nickname"].as_str().unwrap_or_else(|| panic!("a nickname: {c}")).to_string();
    let table = broker.run_ok(&["threads"]);
    assert!(table.contains(&format!("↳ {nickname}")), "{table}");

    let id = broker.run_ok(&["send", "--thread", &parent, "--agent", &nickname.to_lowercase(), &to_child]).trim().to_string();
    assert_eq!(broker.message(&id).unwrap()["thread"], child.as_str(), "--agent names the child");
    let out = broker.run(&["send", "--thread", &parent, "--agent", "NoSuchAgent", "x"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).1.contains(&nickname), "lists the sub-agents: {:?}", text(&out));
    let to_cwd = broker.run_ok(&["send", "--cwd", &env.work.display().to_string(), "for the top-level thread"]).trim().to_string();
    assert_eq!(broker.message(&to_cwd).unwrap()["thread"], parent.as_str(), "the sub-agent is no --cwd candidate");

    hold.release();
    proc.wait(T).assert_success();
    let child_saw: usize = model.requests_for_thread(&child).last().unwrap().developer_messages_containing(&to_child).len();
    assert_eq!(child_saw, 1, "{}", model.dump());
    broker.wait_state(&id, "confirmed", Duration::from_secs(10));
    let parent_saw: Vec<String> =
        model.requests_for_thread(&parent).iter().flat_map(|r| r.messages_containing("developer", &to_parent)).collect();
    assert!(!parent_saw.is_empty(), "the parent's model got the child's message: {}", model.dump());
    assert!(parent_saw.iter().all(|m| m.contains(&format!("from=\"thread:{child}\" verified=\"true\""))), "{parent_saw:?}");
}

/// A message for a thread that never appeared does not wait forever: with no `--ttl`, the
/// broker expires it a day after it was queued (`thread_never_appeared`), at its first
/// maintenance pass; a message of the same age whose thread has a rollout stays pending.
#[test]
fn messages_for_threads_that_never_appeared_expire_after_a_day() {
    let env = CodexEnv::with_base_url("http://127.0.0.1:9/v1");
    let cli = Broker::cli_only(&env);
    let ghost = "2b0c2c5e-3c3d-4f7e-9d1a-5b6c7d8e9f00";
    let real = "2b0c2c5e-3c3d-4f7e-9d1a-5b6c7d8e9f01";
    let day = env.codex_home.join("sessions/2026/11/29");
    std::fs::create_dir_all(&day).unwrap();
    std::fs::write(day.join(format!("rollout-2026-11-29T08-03-04-{real}.jsonl")), "{}\n").unwrap();
    let lost = cli.send_future(ghost, "for a thread that never comes", None, None);
    let kept = cli.run_ok(&["send", "--thread", real, "waits for a resume"]).trim().to_string();
    let with_ttl = cli.run_ok(&["send", "--thread", ghost, "--future-thread", "--ttl", "30d", "has its own ttl"]).trim().to_string();
    // Queued 25 hours ago, as far as the queue knows.
    let db = env.state_dir.join("queue.sqlite");
    let aged = Command::new("python3")
        .args(["-c", "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('UPDATE messages SET created_at = created_at - 90000000'); c.commit()"])
        .arg(&db)
        .status()
        .unwrap();
    assert!(aged.success());
    let broker = Broker::start(&env);
    let m = broker.wait_state(&lost, "expired", Duration::from_secs(10));
    assert_eq!(m["reason"], "thread_never_appeared", "{m}");
    assert_eq!(broker.message_state(&kept), "pending");
    assert_eq!(broker.message_state(&with_ttl), "pending");
    assert!(broker.log_text().contains("expired 1 message(s) whose thread never appeared"), "{}", broker.log_text());
}

/// Idle threads of an app-server: `broker threads` says `idle` (no turn open) and names the
/// process kind (`app-server` for `codex app-server --listen`, `tui-daemon` for the TUI's
/// managed daemon) and pid; `send --wait confirmed` to such a thread returns 0 once the wake
/// channel's turn delivered it.
#[test]
fn idle_app_server_threads_are_listed_and_receipts_follow_the_wake() {
    use courier_tests::appserver::{ListeningAppServer, ManagedDaemon, WsAppServer};
    let model = ScriptedModel::start_with(|_| Reply::message("done"));
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let broker = Broker::start_trusted(&env);
    // A thread that ran one user turn and is idle now.
    let idle_thread = |client: &mut WsAppServer, prompt: &str| -> String {
        let thread = client.start_thread(&env.work, T);
        client.run_turn(&thread, prompt, T);
        thread
    };

    let server = ListeningAppServer::start(env.codex_command(), env.root.join("as.sock"), &[], env.root.join("app-server.log"));
    let mut client = server.client(T);
    client.initialize(false, T);
    let thread = idle_thread(&mut client, "APPSERVER hello");

    let daemon = ManagedDaemon::start(&env, T);
    let mut daemon_client = daemon.client(T);
    daemon_client.initialize(false, T);
    let in_daemon = idle_thread(&mut daemon_client, "DAEMON hello");

    let list = courier_tests::util::wait_until(T, "both idle threads listed", || {
        let l = broker.threads_json(false);
        (find(&l, &thread).is_some() && find(&l, &in_daemon).is_some()).then_some(l)
    });
    let a = find(&list, &thread).unwrap();
    assert_eq!((a["state"].as_str(), a["turn_id"].is_null()), (Some("idle"), true), "{a}");
    assert_eq!(a["process"]["kind"], "app-server", "{a}");
    assert_eq!(a["process"]["pid"].as_u64(), Some(u64::from(server.pid())));
    assert_eq!(a["title"], "APPSERVER hello");
    let d = find(&list, &in_daemon).unwrap();
    assert_eq!((d["state"].as_str(), d["process"]["kind"].as_str()), (Some("idle"), Some("tui-daemon")), "{d}");
    assert_ne!(d["process"]["pid"], a["process"]["pid"]);

    let body = marker("WOKEN_RECEIPT");
    let out = broker.run(&["send", "--thread", &thread, "--wait", "confirmed", "--timeout", "30s", "--json", &body]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let v: Value = serde_json::from_str(text(&out).0.trim()).unwrap();
    assert_eq!(
        (v["outcome"].as_str(), v["message"]["state"].as_str(), v["message"]["event"].as_str()),
        (Some("reached"), Some("confirmed"), Some("wake")),
        "{v}"
    );
    assert_eq!(v["thread_status"], "live");
}
