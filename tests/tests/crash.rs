//! Crash safety: nothing lost, nothing doubled, whatever dies when.
//!
//! The fault rounds drive the real broker with the real hook-client, whose parent is a stand-in
//! Codex the gate accepts (the kit's `standin`), so hundreds of kill -9 rounds fit in seconds; the
//! stand-in's rollout is the ground truth of what "the model" saw. A few tests use the real Codex.
//!
//! Knobs (long forms by hand): `COURIER_CRASH_ROUNDS` (default 200), `COURIER_CRASH_SEED`.

use broker_lib::client::query_status;
use courier_tests::broker::{hook_command, messages_by_id};
use courier_tests::model::exec_held_then_done;
use courier_tests::rng::Rng;
use courier_tests::rollout::{hook_marker_ids, marker_ids_in};
use courier_tests::standin::{standin_codex, world, HookCall, Standin};
use courier_tests::util::{fake_uuid_v7, marker, poll_until, str_field, wait_until};
use courier_tests::{Broker, CodexEnv, Hold, Reply, ScriptedModel, Serve};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The broker's failpoints (broker/src/failpoint.rs NAMES).
const FAILPOINTS: [&str; 9] = [
    "after_lease_commit",
    "after_reply_before_ack",
    "after_ack_read",
    "before_ack_commit",
    "after_ack_commit",
    "after_release_commit",
    "reconcile_before_settle",
    "reconcile_after_settle",
    "after_note_codex",
];

const FINAL_STATES: [&str; 5] = ["confirmed", "pending", "uncertain", "expired", "cancelled"];

fn rounds() -> usize {
    std::env::var("COURIER_CRASH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(200)
}

/// Waits until the broker answers status or exits (a failpoint can fire before the first answer).
fn wait_up(serve: &mut Serve, env: &CodexEnv) {
    let up = poll_until(Duration::from_secs(15), || {
        if serve.child.try_wait().ok().flatten().is_some() {
            return Some(());
        }
        query_status(&env.runtime_dir).map(|_| ())
    });
    assert!(up.is_some(), "broker neither answered nor exited: {}", std::fs::read_to_string(&serve.log).unwrap_or_default());
}

/// Pid of the hook-client child of `parent`, if one runs.
fn hook_client_child(parent: u32) -> Option<i32> {
    let hc = std::fs::canonicalize(courier_tests::hook_client_bin()).ok()?;
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let ppid: u32 = stat[stat.rfind(')')? + 2..].split_whitespace().nth(1)?.parse().ok()?;
        (ppid == parent && std::fs::read_link(format!("/proc/{pid}/exe")).ok()? == hc).then_some(pid)
    })
}

fn kill9(pid: i32) {
    // SAFETY: plain kill(2).
    unsafe { libc_kill(pid, 9) };
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// Checks the exactly-once invariants over the final inspect, the rollouts and the stand-ins'
/// own record of what each hook call showed. Returns (confirmed, uncertain, other) counts.
fn check_invariants(
    sent: &[(String, String)],
    inspect: &Value,
    rollouts: &HashMap<String, std::path::PathBuf>,
    calls: &[HookCall],
) -> (usize, usize, usize) {
    let by_id = messages_by_id(inspect);
    let listed = courier_tests::broker::messages(inspect);
    let mut seen = HashSet::new();
    for m in &listed {
        assert!(seen.insert(m["id"].as_str().unwrap().to_string()), "message listed twice: {m}");
    }
    // Marker occurrences per rollout.
    let mut in_rollout: HashMap<String, Vec<String>> = HashMap::new();
    for (thread, path) in rollouts {
        for id in hook_marker_ids(path) {
            in_rollout.entry(id).or_default().push(thread.clone());
        }
    }
    // What each hook call showed (exit 0 with output), per id.
    let mut shown: HashMap<String, usize> = HashMap::new();
    for c in calls {
        if let Some(text) = &c.shown {
            for id in marker_ids_in(text) {
                *shown.entry(id).or_default() += 1;
            }
        }
    }
    let (mut confirmed, mut uncertain, mut other) = (0, 0, 0);
    for (id, thread) in sent {
        let m = by_id.get(id).unwrap_or_else(|| panic!("message {id} LOST: not in inspect"));
        let state = m["state"].as_str().unwrap();
        assert!(FINAL_STATES.contains(&state), "{id} left in {state}: {m}");
        let where_ = in_rollout.get(id).cloned().unwrap_or_default();
        assert!(where_.len() <= 1, "{id} DUPLICATED in rollouts: {where_:?}");
        assert!(shown.get(id).copied().unwrap_or(0) <= 1, "{id} shown by {} hook calls", shown[id]);
        assert!(where_.iter().all(|t| t == thread), "{id} reached another thread: {where_:?}");
        match state {
            "confirmed" => {
                assert_eq!(where_.len(), 1, "{id} confirmed but in the rollout {} times", where_.len());
                confirmed += 1;
            }
            "uncertain" => {
                assert!(m["reason"].as_str().is_some_and(|r| !r.is_empty()), "uncertain without reason: {m}");
                assert!(where_.is_empty(), "{id} is uncertain but its marker is in the rollout: {m}");
                uncertain += 1;
            }
            _ => {
                assert!(where_.is_empty(), "{id} is {state} but reached the model: {m}");
                other += 1;
            }
        }
    }
    (confirmed, uncertain, other)
}

/// At least 200 rounds of a concurrent workload (3 stand-in Codex sessions running hook-client, a
/// sender queueing messages) in which the broker is killed -9 at a random moment or dies at a
/// failpoint, then restarted. Afterwards every message is in one final state with a reason, none
/// reached the model twice, a confirmed one is in its rollout exactly once, an uncertain one not
/// at all, and nothing was lost.
#[test]
fn kill9_rounds_lose_nothing_and_double_nothing() {
    let env = world();
    let mut rng = Rng::from_env();
    let mut serve = Serve::start(&env, &[]);
    Broker::cli_only(&env).trust_codex(standin_codex());
    let threads: Vec<String> = (0..3).map(|_| fake_uuid_v7()).collect();
    let standins: Vec<Standin> = threads.iter().map(|t| Standin::start(&env, t, 3, &[])).collect();
    let rollouts: HashMap<String, std::path::PathBuf> = standins.iter().map(|s| (s.thread.clone(), s.rollout.clone())).collect();

    let sent: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let (sent, stop, threads) = (Arc::clone(&sent), Arc::clone(&stop), threads.clone());
        let env_vars = env.env_vars();
        let work = env.work.clone();
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let thread = &threads[(n % 3) as usize];
                let key = format!("k{n}");
                let text = format!("crash message {n}");
                let mut cmd = std::process::Command::new(courier_tests::broker_bin());
                cmd.env_clear().envs(env_vars.clone()).current_dir(&work);
                cmd.args(["send", "--thread", thread, "--key", &key, "--from", "crash", &text]);
                let out = courier_tests::broker::run_bounded(&mut cmd, Duration::from_secs(30));
                assert!(out.status.success(), "send failed: {}", String::from_utf8_lossy(&out.stderr));
                let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
                sent.lock().unwrap().push((id, thread.clone()));
                n += 1;
                std::thread::sleep(Duration::from_millis(25));
            }
        })
    };

    let rounds = rounds();
    let started = Instant::now();
    let mut by_failpoint: HashMap<&str, usize> = HashMap::new();
    let mut random_kills = 0;
    for r in 0..rounds {
        serve.kill9();
        if r % 3 == 0 {
            let fp = FAILPOINTS[(r / 3) % FAILPOINTS.len()];
            serve = Serve::spawn(&env, &[("COURIER_FAILPOINTS", fp)]);
            wait_up(&mut serve, &env);
            // Let it run until the failpoint kills it (bounded: some need a rare path).
            let died = poll_until(Duration::from_millis(1500), || serve.child.try_wait().ok().flatten());
            if died.is_some() {
                *by_failpoint.entry(fp).or_default() += 1;
            }
        } else {
            serve = Serve::spawn(&env, &[]);
            wait_up(&mut serve, &env);
            std::thread::sleep(Duration::from_millis(rng.below(120)));
            random_kills += 1;
        }
    }
    serve.kill9();
    let fault_time = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    sender.join().unwrap();

    // Calm: a healthy broker drains every pending message and settles every hand-off.
    let _serve = Serve::start(&env, &[]);
    let sent = sent.lock().unwrap().clone();
    let mut last = Value::Null;
    let drained = poll_until(Duration::from_secs(60), || {
        last = Broker::cli_only(&env).inspect_json();
        let by_id = messages_by_id(&last);
        sent.iter()
            .all(|(id, _)| by_id.get(id).is_some_and(|m| matches!(m["state"].as_str(), Some("confirmed" | "uncertain"))))
            .then_some(())
    });
    let calls: Vec<HookCall> = standins.into_iter().flat_map(|s| s.finish(Duration::from_secs(60))).collect();
    let final_inspect = Broker::cli_only(&env).inspect_json();
    let log = std::fs::read_to_string(env.root.join("broker.log")).unwrap_or_default();
    assert!(drained.is_some(), "not drained within 60 s: {last:#}");
    let (confirmed, uncertain, other) = check_invariants(&sent, &final_inspect, &rollouts, &calls);

    let worst = calls.iter().map(|c| c.ms).fold(0.0, f64::max);
    let failed_calls = calls.iter().filter(|c| c.rc != 0).count();
    let mut reasons: HashMap<String, usize> = HashMap::new();
    for m in courier_tests::broker::messages(&final_inspect) {
        if m["state"] == "uncertain" {
            *reasons.entry(m["reason"].as_str().unwrap_or("").into()).or_default() += 1;
        }
    }
    let fp_hits = FAILPOINTS.iter().map(|f| (*f, log.matches(&format!("failpoint {f}:")).count())).collect::<Vec<_>>();
    eprintln!(
        "crash rounds: {rounds} ({random_kills} random kill -9, {} failpoint deaths) in {fault_time:?}; \
         messages {}: confirmed {confirmed}, uncertain {uncertain} {reasons:?}, other {other}; lost 0, duplicated 0; \
         hook calls {} (exit != 0: {failed_calls}), worst hook-client latency {worst:.1} ms\nfailpoint hits: {fp_hits:?}",
        by_failpoint.values().sum::<usize>(),
        sent.len(),
        calls.len()
    );
    assert!(rounds < 100 || sent.len() >= 100, "workload too small: {} messages", sent.len());
    assert!(confirmed > 0, "nothing confirmed: the rig is broken");
    // The delivery-path failpoints must actually have fired, or the test proves nothing about them.
    for fp in [
        "after_lease_commit",
        "after_reply_before_ack",
        "after_ack_read",
        "before_ack_commit",
        "after_ack_commit",
        "reconcile_before_settle",
    ] {
        if rounds >= 100 {
            assert!(fp_hits.iter().any(|(f, n)| *f == fp && *n > 0), "failpoint {fp} never fired: {fp_hits:?}");
        }
    }
    assert!(worst < 1500.0, "a hook-client call took {worst} ms under faults");
}

/// hook-client killed -9 after printing a lease but before acking it: the broker sees the
/// connection drop, the lease goes back to `pending`, and the message reaches the model exactly
/// once through a later call. Killed after its ack was accepted (before exiting 0): Codex ignores
/// a killed hook's stdout, so the message never reached the model, and its turn completes without
/// it; but only the rollout says so, a file others can rewrite, so it is `uncertain`
/// (`turn_closed_unseen`) and never offered again: shown by no call.
#[test]
fn hook_client_killed_before_or_after_ack() {
    for point in ["before_ack", "after_ack"] {
        let env = world();
        // Before the ack, the broker also dies right after returning the lease to pending.
        let fp = if point == "before_ack" { "after_release_commit" } else { "" };
        let mut serve = Serve::start(&env, &[("COURIER_FAILPOINTS", fp)]);
        Broker::cli_only(&env).trust_codex(standin_codex());
        let thread = fake_uuid_v7();
        let once = env.root.join("stalled-once");
        let stall = format!("{point}:{}", once.display());
        let standin = Standin::start(&env, &thread, 2, &[("COURIER_HOOK_TEST_STALL", &stall)]);
        let text = marker("KILLED_CLIENT");
        let id = Broker::cli_only(&env).run_ok(&["send", "--thread", &thread, &text]).trim().to_string();
        let hc = wait_until(Duration::from_secs(20), "a stalled hook-client", || {
            once.exists().then(|| hook_client_child(standin.pid)).flatten()
        });
        let state = messages_by_id(&Broker::cli_only(&env).inspect_json())[&id]["state"].as_str().unwrap().to_string();
        assert_eq!(state, if point == "before_ack" { "leased" } else { "handed" }, "{point}");
        kill9(hc);
        if point == "before_ack" {
            let died = poll_until(Duration::from_secs(10), || serve.child.try_wait().ok().flatten());
            assert!(died.is_some(), "broker reached after_release_commit");
            assert_eq!(messages_by_id(&Broker::cli_only(&env).inspect_json())[&id]["state"], "pending", "released before the crash");
            serve = Serve::start(&env, &[]);
        }
        let want = if point == "before_ack" { "confirmed" } else { "uncertain" };
        let m = wait_until(Duration::from_secs(30), &format!("{id} {want}"), || {
            messages_by_id(&Broker::cli_only(&env).inspect_json()).remove(&id).filter(|m| m["state"] == want)
        });
        // Keep the session going a few more turns: a settled message must not come back.
        std::thread::sleep(Duration::from_millis(300));
        let rollout = standin.rollout.clone();
        let calls = standin.finish(Duration::from_secs(30));
        let ro = hook_marker_ids(&rollout);
        let n = ro.iter().filter(|x| **x == id).count();
        let killed = calls.iter().filter(|c| c.rc == -9).count();
        drop(serve);
        eprintln!("{point}: killed calls {killed}, {id} -> {m}, in rollout {n}x, calls {}", calls.len());
        assert_eq!(killed, 1, "{point}: the stalled call was killed");
        // The killed call printed it too, but Codex ignores a killed hook's output.
        let shown = calls.iter().filter(|c| c.rc == 0 && c.shown.as_deref().is_some_and(|s| s.contains(&id))).count();
        if point == "before_ack" {
            assert_eq!(n, 1, "{point}: re-offered and shown exactly once");
            assert!(m["attempts"].as_i64().unwrap_or(0) >= 2, "{point}: leased twice: {m}");
            assert_eq!(shown, 1, "{point}: one call that exited 0 showed it");
        } else {
            assert_eq!(
                (n, shown, m["reason"].as_str(), m["attempts"].as_i64()),
                (0, 0, Some("turn_closed_unseen"), Some(1)),
                "{point}: {m}"
            );
        }
    }
}

/// The stand-in Codex itself killed -9 after a message was handed to its hook (and before its turn
/// closed): reconcile sees the recorded codex process gone and marks the message `uncertain`
/// with reason `codex_exited`, and `broker inspect` says so.
#[test]
fn codex_killed_after_hand_off_is_uncertain_codex_exited() {
    let env = world();
    let _serve = Serve::start(&env, &[]);
    Broker::cli_only(&env).trust_codex(standin_codex());
    let thread = fake_uuid_v7();
    let once = env.root.join("stalled-once");
    let stall = format!("after_ack:{}", once.display());
    let mut standin = Standin::start(&env, &thread, 2, &[("COURIER_HOOK_TEST_STALL", &stall)]);
    let id = Broker::cli_only(&env).run_ok(&["send", "--thread", &thread, "for a codex that dies"]).trim().to_string();
    let hc = wait_until(Duration::from_secs(20), "hook-client stalled after ack", || {
        once.exists().then(|| hook_client_child(standin.pid)).flatten()
    });
    standin.kill();
    kill9(hc);
    let m = wait_until(Duration::from_secs(10), "uncertain codex_exited", || {
        messages_by_id(&Broker::cli_only(&env).inspect_json()).remove(&id).filter(|m| m["state"] == "uncertain")
    });
    assert_eq!(m["reason"], "codex_exited", "{m}");
    let text = Broker::cli_only(&env).run_ok(&["inspect"]);
    assert!(text.contains("codex_exited"), "inspect table says why:\n{text}");
}

// ---- Real Codex ----

const T: Duration = Duration::from_secs(60);

/// Real Codex, broker restarted mid-session (item 9) and killed at a failpoint (a real-Codex
/// crash round): a message queued before the restart is not lost and reaches the model once after
/// it; hooks keep working; a hand-off interrupted by the crash ends in an honest state.
#[test]
fn real_codex_broker_restart_mid_session() {
    let hold = Hold::new();
    let h = hold.clone();
    let model = ScriptedModel::start_with(move |r| {
        let n = r.function_calls().len();
        if n < 2 {
            Reply::exec("echo step").held(&h)
        } else {
            Reply::message("done")
        }
    });
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let mut broker = Broker::start(&env);
    broker.trust_codex(&env.codex);
    let child = env.spawn_exec("run two commands");
    hold.wait_held(1, T);
    let thread = child.wait_thread_id(T);
    // Queue, then crash the broker before any hook could take it; restart it.
    let text = marker("BEFORE_RESTART");
    let id = broker.send_opts(&thread, &text, None, Some("e2e"));
    broker.stop();
    let broker = Broker::start(&env);
    assert_eq!(broker.message_state(&id), "pending", "queued message survives the crash");
    hold.release();
    let out = child.wait(T);
    out.assert_success();
    let m = broker.wait_state(&id, "confirmed", Duration::from_secs(10));
    let n: usize = model.requests().iter().map(|r| r.items_containing(&text)).max().unwrap_or(0);
    assert_eq!(n, 1, "once in the request that carried it: {m}");
    assert!(model.requests_mentioning(&text) >= 1, "the model saw it");
    let ro = env.rollout(&thread);
    assert_eq!(ro.messages("developer").iter().filter(|t| t.contains(&text)).count(), 1);
}

/// Real Codex (`codex exec`) with the broker dying at `after_ack_commit` (ack on record, client
/// never told): hook-client exits non-zero, Codex drops its output and the session completes
/// normally; the turn's `task_complete` without the message says the model never saw it, but the
/// rollout is a file others can rewrite, so it is `uncertain` (`turn_closed_unseen`), never
/// offered again.
#[test]
fn real_codex_crash_round_after_ack_commit() {
    let hold = Hold::new();
    let model = ScriptedModel::start_with(exec_held_then_done("echo hi", &hold));
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let cli = Broker::cli_only(&env);
    cli.trust_codex(&env.codex);
    let mut serve = Serve::start(&env, &[("COURIER_FAILPOINTS", "after_ack_commit")]);
    let child = env.spawn_exec("run a command");
    hold.wait_held(1, T);
    let thread = child.wait_thread_id(T);
    let text = marker("CRASH_AT_ACK");
    let id = cli.send_opts(&thread, &text, None, Some("e2e"));
    hold.release();
    let out = child.wait(T);
    let died = poll_until(Duration::from_secs(5), || serve.child.try_wait().ok().flatten());
    assert!(died.is_some(), "the broker died at the failpoint");
    serve.kill9();
    out.assert_success();
    assert_eq!(out.stdout.trim(), "done");
    let m = cli.wait_state(&id, "uncertain", Duration::from_secs(10));
    assert_eq!((m["reason"].as_str(), m["attempts"].as_i64()), (Some("turn_closed_unseen"), Some(1)), "{m}");
    assert_eq!(model.requests_mentioning(&text), 0, "a failed hook's output never reached the model");
}

/// Real Codex killed -9 mid-turn after a message was handed to its hook (item 3): the hook
/// (hook-client, stalled after its ack was accepted) is still running when Codex dies, so the
/// message never reached the model. It becomes `uncertain` with reason `codex_exited`, is not
/// re-offered, and `broker inspect` says why.
#[test]
fn real_codex_killed_mid_turn_after_hand_off() {
    let hold = Hold::new();
    let model = ScriptedModel::start_with(exec_held_then_done("echo hi", &hold));
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let broker = Broker::start(&env);
    broker.trust_codex(&env.codex);
    let once = env.root.join("stalled-once");
    let mut cmd = env.codex_command();
    cmd.env("COURIER_HOOK_TEST_STALL", format!("after_ack:{}", once.display()));
    cmd.arg("exec").arg("--skip-git-repo-check").arg("run a command");
    let child = courier_tests::ExecChild::spawn(cmd);
    hold.wait_held(1, T);
    let thread = child.wait_thread_id(T);
    let text = marker("CODEX_DIES");
    let id = broker.send_opts(&thread, &text, None, Some("e2e"));
    hold.release();
    let codex_pid = child.pid();
    let hc = wait_until(T, "hook-client stalled after its ack", || once.exists().then(|| hook_client_descendant(codex_pid)).flatten());
    assert_eq!(broker.message_state(&id), "handed");
    kill9(codex_pid as i32);
    kill9(hc);
    let _ = child.wait(Duration::from_secs(10));
    let m = broker.wait_state(&id, "uncertain", Duration::from_secs(10));
    assert_eq!(m["reason"], "codex_exited", "{m}");
    assert!(broker.inspect_text().contains("codex_exited"), "inspect says why");
    let in_rollout = env.rollout_path(&thread).map(|p| hook_marker_ids(&p).len()).unwrap_or(0);
    assert_eq!(in_rollout, 0, "it never reached the model");
    assert_eq!(model.requests_mentioning(&text), 0);
}

/// A hook-client process whose parent or grandparent is `ancestor`.
fn hook_client_descendant(ancestor: u32) -> Option<i32> {
    let hc = std::fs::canonicalize(courier_tests::hook_client_bin()).ok()?;
    let ppid_of = |pid: i32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat[stat.rfind(')')? + 2..].split_whitespace().nth(1)?.parse().ok()
    };
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        if std::fs::read_link(format!("/proc/{pid}/exe")).ok()? != hc {
            return None;
        }
        let p = ppid_of(pid)?;
        (p == ancestor || ppid_of(p as i32) == Some(ancestor)).then_some(pid)
    })
}

/// The wake path's failpoints, in the order the crash test visits them (broker/src/wake.rs).
const WAKE_FAILPOINTS: [&str; 4] = ["wake_after_turn_start", "wake_after_answer", "wake_after_lease", "wake_before_turn_start"];

/// Real Codex, the broker killed (-9, at a failpoint) at each instant of a wake of an idle
/// app-server thread, then started again. What the scripted model received is the truth: the
/// message reaches it at most once. Killed once `turn/start` may have left (written, or
/// answered): `confirmed` from the rollout's user message with its client id, or (written, but
/// Codex dropped the request of a closed connection) `uncertain`; never offered again. Killed before the hand-off was recorded: nothing was sent, so the restarted broker
/// wakes the thread again, once. Killed after the record but before the frame: Codex never got
/// it, but nothing can prove that: `uncertain` with a reason once the wake's time is up, never
/// `pending` again.
#[test]
fn real_codex_wake_crash_never_doubles() {
    for fp in WAKE_FAILPOINTS {
        let model = ScriptedModel::start_with(|_| Reply::message("done"));
        let env = CodexEnv::with_hook_command(&model, &hook_command());
        let cli = Broker::cli_only(&env);
        cli.trust_codex(&env.codex);
        let mut serve = Serve::start(&env, &[("COURIER_FAILPOINTS", fp)]);
        let (_server, mut client, thread) = courier_tests::appserver::idle_thread(&env, T);
        let text = marker("WAKE_CRASH");
        let id = cli.send_opts(&thread, &text, None, Some("e2e"));
        let died = poll_until(Duration::from_secs(20), || serve.child.try_wait().ok().flatten());
        assert!(died.is_some(), "{fp}: the broker died at the failpoint: {}", std::fs::read_to_string(&serve.log).unwrap_or_default());
        let at_crash = cli.message(&id).unwrap_or_default();
        let restarted = Instant::now();
        let _serve = Serve::start(&env, &[]);
        let m = wait_until(Duration::from_secs(60), &format!("{fp}: {id} final"), || {
            cli.message(&id).filter(|m| matches!(m["state"].as_str(), Some("confirmed" | "uncertain")))
        });
        eprintln!("{fp}: at the crash {}, after the restart {m} ({:?})", at_crash["state"], restarted.elapsed());
        // A later turn's hooks (UserPromptSubmit, Stop) must not bring it again.
        client.run_turn(&thread, "next task", T);
        let again = cli.message(&id).unwrap_or_default();
        assert_eq!(again["state"], m["state"], "{fp}: a final state stays: {again}");
        // The rollout is the ground truth of what reached the model.
        let in_rollout = env.rollout(&thread).messages("user").iter().filter(|t| t.contains(&text)).count();
        let state = str_field(&m, "state");
        match (fp, state) {
            // Killed before the hand-off was recorded: nothing left; woken again after the restart.
            ("wake_after_lease", _) => assert_eq!(m["attempts"], 2, "{fp}: offered again: {m}"),
            // Recorded, the frame never written: Codex never got it, but nothing can prove that.
            ("wake_before_turn_start", _) => assert_eq!(state, "uncertain", "{fp}: the hand-off was on record: {m}"),
            // Written, then the broker died: Codex may or may not act on a request whose
            // connection closed. Either way once at most, and never offered again.
            ("wake_after_turn_start", _) => assert_eq!(m["attempts"], 1, "{fp}: never offered again: {m}"),
            // Answered: the turn started with it.
            (_, _) => assert_eq!((state, &m["attempts"]), ("confirmed", &Value::from(1)), "{fp}: {m}"),
        }
        assert_eq!(str_field(&m, "event"), "wake", "{fp}: {m}");
        if state == "confirmed" {
            assert_eq!(in_rollout, 1, "{fp}: confirmed, so in the rollout once");
            model.assert_received_once(&text, T);
        } else {
            assert!(m["reason"].as_str().is_some_and(|r| !r.is_empty()), "{fp}: uncertain with a reason: {m}");
            assert_eq!(
                (in_rollout, model.requests_mentioning(&text)),
                (0, 0),
                "{fp}: uncertain, and it never reached the model\n{}",
                model.dump()
            );
        }
    }
}
