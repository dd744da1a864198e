//! Many hosts: the NATS JetStream bridge (`courier-bridge`) on a real `nats-server -js` and the
//! real Codex. Each host is a [`CodexEnv`] of its own (home, Codex home, runtime and state
//! directories), so host A's broker, queue and bridge share nothing with host B's producer but
//! the NATS server. Faults: the bridge killed -9 between the local enqueue and the NATS ack, the
//! NATS server killed and restarted mid-stream, the link to NATS cut and restored (the bridge in
//! a network namespace of its own: the test runs as root), a repeated publish, a host whose
//! bridge is down. Attacks on the layout (key squatting, floods, the old shared stream, receipts
//! after a crash on a busy queue) are in `bridge_attacks.rs`.

mod bridge_rig;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bridge_rig::*;
use courier_tests::broker::run_bounded;
use courier_tests::util::{marker, poll_until, wait_until};
use courier_tests::{Broker, CodexEnv};
use serde_json::Value;

/// A producer on host B sends to a live Codex session on host A and blocks on `confirmed`: the
/// message reaches A's model exactly once, shown as `nats:hostb/relay`; a second publish with
/// the same key (the host's queue answers it with the same message) and a later `--wait` on the
/// same key change nothing and answer from the receipts; `threads` lists A's thread from B.
#[test]
fn remote_send_reaches_the_model_once_confirmed() {
    let (model, env_a, hold) = CodexEnv::with_held_turn();
    let env_b = host_b();
    let nats = Nats::start(&env_b.root);
    let a = Broker::start_trusted(&env_a);
    let bridge = Bridge::start(&env_a, &nats.url(), "hosta", None);
    let child = spawn_exec(&env_a);
    hold.wait_held(1, T);
    let thread = child.wait_thread_id(T);

    // B asks A's bridge for its threads (through `broker threads --nats`, which runs
    // courier-bridge next to the broker).
    let mut threads = env_b.command(courier_tests::broker_bin());
    threads.args(["threads", "--nats", &nats.url(), "--host", "hosta", "--json"]);
    let out = run_bounded(&mut threads, T);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "threads: {stdout} {stderr}");
    let listed: Value = serde_json::from_str(&stdout).unwrap();
    assert!(listed["threads"].as_array().unwrap().iter().any(|t| t["id"] == thread.as_str() && t["state"] == "busy"), "{listed}");

    let body = marker("REMOTE");
    let key = marker("key");
    let started = now_ms();
    let send = bg(producer(
        &env_b,
        &nats.url(),
        "send",
        &["--thread", &thread, "--from", "relay", "--key", &key, "--wait", "confirmed", "--timeout", "90s", &body],
    ));
    let m = wait_until(T, "the message to be queued on host A", || queued(&a, &thread).into_iter().next());
    let queued_ms = now_ms() - started;
    assert_eq!(m["from"], "nats:hostb/relay", "the sender is shown as remote: {m}");
    assert_eq!(m["key"], format!("nats:hostb:{key}"), "the key is scoped to its publisher");
    let id = m["id"].as_str().unwrap().to_string();
    // inspect's origin: what the bridge recorded (it records the message just after queueing it).
    wait_until(T, "inspect to show the bridged origin", || (a.message(&id)?["origin"] == "nats:hostb").then_some(()));

    // A second publish of the same key: the host's queue answers it with the same message.
    let dup = run_bounded(&mut producer(&env_b, &nats.url(), "send", &["--thread", &thread, "--key", &key, "--json", &body]), T);
    assert_eq!(dup.status.code(), Some(0), "{:?}", text(&dup));
    let d: Value = serde_json::from_slice(&dup.stdout).unwrap();
    assert!(d["seq"].as_u64() > Some(1), "a publish of its own: {d}");
    wait_until(T, "the second publish answered", || bridge.log_text().contains("was queued before").then_some(()));
    assert_eq!(queued(&a, &thread).len(), 1);

    let released = now_ms();
    hold.release();
    child.wait(T).assert_success();
    let (out, exited) = send.join();
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "send --wait confirmed: {stdout} {stderr}\nbridge: {}", bridge.log_text());
    assert_eq!(stdout.trim(), key, "stdout is the key");
    assert_eq!(model.count_messages_containing("developer", &body), 1, "exactly once: {}", model.dump());
    let m = a.wait_state(&id, "confirmed", T);
    let confirmed_at = m["confirmed_at"].as_i64().unwrap();
    eprintln!(
        "figure: publish -> queued on host A {queued_ms} ms; hold released -> confirmed {} ms; confirmed -> producer exit {} ms",
        confirmed_at - released,
        exited - confirmed_at
    );
    assert!(exited >= confirmed_at, "the producer returned only after the confirmation");

    // The same key again, with --wait: answered from the receipts already out.
    let again = run_bounded(
        &mut producer(
            &env_b,
            &nats.url(),
            "send",
            &["--thread", &thread, "--key", &key, "--wait", "confirmed", "--timeout", "20s", "--json", &body],
        ),
        T,
    );
    let (stdout, stderr) = text(&again);
    assert_eq!(again.status.code(), Some(0), "{stdout} {stderr}");
    let r: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(
        (r["id"].as_str(), r["state"].as_str(), r["outcome"].as_str()),
        (Some(id.as_str()), Some("confirmed"), Some("reached")),
        "{r}"
    );
    assert_eq!(queued(&a, &thread).len(), 1);
    assert_eq!(model.count_messages_containing("developer", &body), 1);

    // A thread A has no rollout for: refused there, exit 2 here, never redelivered.
    let ghost = "01a22654-3b31-76f3-a48c-b65aa7d0db69";
    let out =
        run_bounded(&mut producer(&env_b, &nats.url(), "send", &["--thread", ghost, "--wait", "handed", "--timeout", "30s", "hi"]), T);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stdout} {stderr}");
    assert!(stderr.contains("no_such_thread"), "{stderr}");
    let c = wait_until(T, "the refused request acked", || {
        let c = consumer_check(&env_b, &nats.url());
        (c["ack_pending"] == 0 && c["pending"] == 0).then_some(c)
    });
    assert_eq!(c["redelivered"], 0, "{c}");

    // A local sender calling itself `nats:...` is still `local` in inspect: the origin comes
    // from the bridge's own record, not from the label.
    let forged = a.send_opts(&thread, &marker("FORGED"), None, Some("nats:hostb/relay"));
    assert_eq!(a.message(&forged).unwrap()["origin"], "local");
    let table = a.inspect_text();
    let row = |mid: &str| table.lines().find(|l| l.starts_with(mid)).unwrap_or_else(|| panic!("{mid} in {table}")).to_string();
    assert!(row(&id).contains(" nats:hostb "), "{table}");
    assert!(row(&forged).contains(" local "), "{table}");
    assert!(table.contains("ORIGIN"), "{table}");
}

/// The bridge killed -9 after the local enqueue and before the NATS ack: NATS redelivers the
/// request to the restarted bridge, the local key answers it with the same message, and the
/// model sees it once; the producer's wait (started before the crash) returns 0.
#[test]
fn bridge_killed_between_enqueue_and_ack_delivers_once() {
    let (model, env_a, hold) = CodexEnv::with_held_turn();
    let env_b = host_b();
    let nats = Nats::start(&env_b.root);
    let a = Broker::start_trusted(&env_a);
    let mut crashing = Bridge::start(&env_a, &nats.url(), "hosta", Some("after_enqueue"));
    let child = spawn_exec(&env_a);
    hold.wait_held(1, T);
    let thread = child.wait_thread_id(T);
    let body = marker("CRASH");
    let send = bg(producer(&env_b, &nats.url(), "send", &["--thread", &thread, "--wait", "confirmed", "--timeout", "120s", &body]));
    let st = wait_until(T, "the bridge to kill itself at the failpoint", || crashing.child.try_wait().ok().flatten());
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(9), "killed by SIGKILL: {}", crashing.log_text());
    let first = queued(&a, &thread);
    assert_eq!(first.len(), 1, "queued before the crash: {first:?}");
    let c = consumer_check(&env_b, &nats.url());
    assert_eq!(c["ack_pending"], 1, "never acked: {c}");

    let bridge = Bridge::start(&env_a, &nats.url(), "hosta", None);
    let c = wait_until(T, "the redelivery acked", || {
        let c = consumer_check(&env_b, &nats.url());
        (c["ack_pending"] == 0 && c["redelivered"] == 0 && c["pending"] == 0).then_some(c)
    });
    assert!(bridge.log_text().contains("was queued before"), "it was redelivered and found queued: {} {c}", bridge.log_text());
    assert_eq!(queued(&a, &thread).len(), 1, "still one message");
    hold.release();
    child.wait(T).assert_success();
    let (out, _) = send.join();
    assert_eq!(out.status.code(), Some(0), "{:?}\nbridge: {}", text(&out), bridge.log_text());
    assert_eq!(model.count_messages_containing("developer", &body), 1, "{}", model.dump());
    assert_eq!(queued(&a, &thread)[0]["state"], "confirmed");
}

/// nats-server killed and restarted with its store while a message waits for its receipt and
/// before the next is sent: the bridge and the producer's wait reconnect; both arrive once.
#[test]
fn nats_server_restart_mid_stream_loses_and_doubles_nothing() {
    let (model, env_a, hold) = CodexEnv::with_held_turn();
    let env_b = host_b();
    let mut nats = Nats::start(&env_b.root);
    let a = Broker::start_trusted(&env_a);
    let bridge = Bridge::start(&env_a, &nats.url(), "hosta", None);
    let child = spawn_exec(&env_a);
    hold.wait_held(1, T);
    let thread = child.wait_thread_id(T);
    let (b1, b2) = (marker("BEFORE"), marker("AFTER"));
    let send1 = bg(producer(&env_b, &nats.url(), "send", &["--thread", &thread, "--wait", "confirmed", "--timeout", "120s", &b1]));
    wait_until(T, "the first message queued on A", || queued(&a, &thread).into_iter().next());
    let t0 = Instant::now();
    nats.restart();
    eprintln!("restart: {:?}", t0.elapsed());
    let send2 = bg(producer(&env_b, &nats.url(), "send", &["--thread", &thread, "--wait", "confirmed", "--timeout", "120s", &b2]));
    wait_until(T, "the second message queued on A after the restart", || (queued(&a, &thread).len() == 2).then_some(()));
    eprintln!("second queued: {:?}", t0.elapsed());
    hold.release();
    child.wait(T).assert_success();
    for (send, body) in [(send1, &b1), (send2, &b2)] {
        let (out, _) = send.join();
        eprintln!("joined: {:?} {}", t0.elapsed(), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{body}: {:?}\nbridge: {}", text(&out), bridge.log_text());
        assert_eq!(model.count_messages_containing("developer", body), 1, "{}", model.dump());
    }
    let q = queued(&a, &thread);
    assert_eq!(q.len(), 2);
    assert!(q.iter().all(|m| m["state"] == "confirmed"), "{q:?}");
}

/// A host whose bridge is down: the producer's wait times out with exit 3 (nothing was lost: the
/// request waits in the stream); when the bridge starts, the message is delivered once, and a
/// retry with the same key waits for its receipt (0).
#[test]
fn host_with_bridge_down_times_out_with_3_then_delivers_once() {
    let (model, env_a, hold) = CodexEnv::with_held_turn();
    let env_b = host_b();
    let nats = Nats::start(&env_b.root);
    let a = Broker::start_trusted(&env_a);
    // The bridge ran once (stream and consumer exist), then stopped.
    drop(Bridge::start(&env_a, &nats.url(), "hosta", None));
    let child = spawn_exec(&env_a);
    hold.wait_held(1, T);
    let thread = child.wait_thread_id(T);
    let body = marker("LATER");
    let key = marker("key");
    let t0 = Instant::now();
    let out = run_bounded(
        &mut producer(&env_b, &nats.url(), "send", &["--thread", &thread, "--key", &key, "--wait", "confirmed", "--timeout", "3s", &body]),
        T,
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stdout} {stderr}");
    assert!(t0.elapsed() >= Duration::from_secs(3));
    assert!(stderr.contains("no receipt"), "{stderr}");
    assert!(queued(&a, &thread).is_empty(), "nothing reached A without its bridge");

    let retry =
        bg(producer(&env_b, &nats.url(), "send", &["--thread", &thread, "--key", &key, "--wait", "confirmed", "--timeout", "90s", &body]));
    let bridge = Bridge::start(&env_a, &nats.url(), "hosta", None);
    wait_until(T, "the message queued once the bridge is back", || queued(&a, &thread).into_iter().next());
    hold.release();
    child.wait(T).assert_success();
    let (out, _) = retry.join();
    assert_eq!(out.status.code(), Some(0), "{:?}\nbridge: {}", text(&out), bridge.log_text());
    assert_eq!(model.count_messages_containing("developer", &body), 1, "{}", model.dump());
    assert_eq!(queued(&a, &thread).len(), 1);
}

/// The figure: many producers' messages across hosts (B publishes, A's bridge queues them in A's
/// broker), messages per second from the first publish until A's queue holds them all, and the
/// receipts: every one has its `pending` receipt back on B.
#[test]
fn throughput_across_hosts() {
    let env_a = host_b();
    let env_b = host_b();
    let nats = Nats::start(&env_b.root);
    let a = Broker::start(&env_a);
    let _bridge = Bridge::start(&env_a, &nats.url(), "hosta", None);
    let thread = "01a22654-3b31-76f3-a48c-b65aa7d0db70";
    let n = 200;
    // One producer process per message costs a process start and a NATS connect; the body is
    // given on the command line, 8 at once.
    let t0 = Instant::now();
    let mut batch = Vec::new();
    for i in 0..n {
        let mut c = producer(
            &env_b,
            &nats.url(),
            "send",
            &["--thread", thread, "--future-thread", "--key", &format!("tp-{i}"), &format!("message {i}")],
        );
        c.stdout(Stdio::null()).stderr(Stdio::piped());
        batch.push(c.spawn().unwrap());
        if batch.len() == 8 {
            for mut c in batch.drain(..) {
                assert!(c.wait().unwrap().success());
            }
        }
    }
    for mut c in batch.drain(..) {
        assert!(c.wait().unwrap().success());
    }
    let published = t0.elapsed();
    wait_until(T, "every message queued on A", || (queued(&a, thread).len() == n).then_some(()));
    let all = t0.elapsed();
    eprintln!(
        "figure: {n} messages across hosts: published in {:.2} s, all queued on host A after {:.2} s = {:.0} messages/s",
        published.as_secs_f64(),
        all.as_secs_f64(),
        n as f64 / all.as_secs_f64()
    );
    let c = wait_until(T, "every request acked", || {
        let c = consumer_check(&env_a, &nats.url());
        (c["ack_pending"] == 0 && c["pending"] == 0).then_some(c)
    });
    assert_eq!(c["redelivered"], 0, "{c}");
    assert_eq!(c["receipts_open"], n, "each one is tracked for receipts: {c}");

    // `broker doctor` checks the configured bridge: connection and consumer lag.
    std::fs::write(&env_a.courier_config, format!("[bridge]\nnats = \"{}\"\nhost = \"hosta\"\n", nats.url())).unwrap();
    let out = run_bounded(env_a.command(courier_tests::broker_bin()).arg("doctor"), T);
    let (stdout, stderr) = text(&out);
    assert!(
        stdout.contains("NATS bridge of host hosta: connected (nats-server 2.") && stdout.contains("0 waiting, 0 unacked"),
        "{stdout} {stderr}"
    );
    std::fs::write(&env_a.courier_config, "[bridge]\nnats = \"nats://127.0.0.1:9\"\nhost = \"hosta\"\n").unwrap();
    let out = run_bounded(env_a.command(courier_tests::broker_bin()).arg("doctor"), T);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "an unreachable NATS fails doctor: {stdout} {stderr}");
    assert!(stdout.contains("NATS bridge of host hosta") && stdout.contains("onnect"), "{stdout}");
}

/// `broker bridge` and `broker send --nats` run the courier-bridge next to the broker; without
/// one there, they say so (exit 1) instead of doing anything else.
#[test]
fn broker_bridge_needs_courier_bridge_next_to_it() {
    let env = host_b();
    let lonely = env.root.join("bin");
    std::fs::create_dir_all(&lonely).unwrap();
    std::fs::copy(courier_tests::broker_bin(), lonely.join("broker")).unwrap();
    for args in [
        &["bridge", "--nats", "nats://127.0.0.1:9", "--host", "a"][..],
        &["send", "--nats", "nats://127.0.0.1:9", "--host", "a", "--thread", "x", "hi"],
    ] {
        let out = run_bounded(env.command(lonely.join("broker")).args(args), T);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stdout} {stderr}");
        assert!(stderr.contains("courier-bridge") && stderr.contains("separate binary"), "{stderr}");
    }
    // With it there: `broker bridge --help` is courier-bridge's.
    let out = run_bounded(env.command(courier_tests::broker_bin()).args(["bridge", "--help"]), T);
    assert!(text(&out).0.contains("courier-bridge serve"), "{:?}", text(&out));
}

/// The link between host A and the NATS host cut and restored: host A's bridge runs in a
/// network namespace of its own whose only way to nats-server is a veth pair (A's broker,
/// hook-client and Codex stay in the root namespace: the bridge reaches the broker by its unix
/// socket, a filesystem path). While the link is down a producer publishes two messages for A:
/// they wait in the stream, nothing reaches A, and the server drops the silent bridge (1 s
/// pings). The link comes back: the bridge reconnects and both arrive exactly once, confirmed,
/// and the producer's `--wait confirmed` returns 0.
#[test]
fn link_cut_and_restored_messages_wait_then_arrive_once() {
    let (model, env_a, hold) = CodexEnv::with_held_turn();
    let env_b = host_b();
    let ns = NetNs::create();
    let nats = Nats::start_with(&env_b.root, &ns.root_ip, Some("ping_interval: \"1s\"\nping_max: 2\n"));
    let a = Broker::start_trusted(&env_a);
    let bridge = Bridge::start_in(&env_a, Some(&ns), &nats.url(), "hosta", None, &[]);
    let bridge_conn = "courier-bridge hosta".to_string();
    wait_until(T, "the bridge connected over the veth link", || nats.client_names().contains(&bridge_conn).then_some(()));
    let child = spawn_exec(&env_a);
    hold.wait_held(1, T);
    let thread = child.wait_thread_id(T);

    ns.cut();
    let (b1, b2) = (marker("CUT1"), marker("CUT2"));
    let send1 = bg(producer(&env_b, &nats.url(), "send", &["--thread", &thread, "--wait", "confirmed", "--timeout", "150s", &b1]));
    let out = run_bounded(&mut producer(&env_b, &nats.url(), "send", &["--thread", &thread, &b2]), T);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    // Both wait in the stream, unacked or not yet pulled; the server gives up on the bridge.
    let c = wait_until(T, "both sends in the stream", || {
        let c = consumer_check(&env_b, &nats.url());
        (c["pending"].as_u64()? + c["ack_pending"].as_u64()? == 2).then_some(c)
    });
    let t_cut = Instant::now();
    let dropped = poll_until(T, || (!nats.client_names().contains(&bridge_conn)).then_some(()));
    assert!(dropped.is_some(), "nats-server still lists the cut-off bridge: {}", nats.log_text());
    eprintln!("cut: the server dropped the bridge after {:?}", t_cut.elapsed());
    assert!(queued(&a, &thread).is_empty(), "nothing crossed the cut link: {c}");

    let t0 = Instant::now();
    ns.restore();
    wait_until(Duration::from_secs(120), "both messages queued on A after the link came back", || {
        (queued(&a, &thread).len() == 2).then_some(())
    });
    let back = t0.elapsed();
    eprintln!("figure: link restored -> both messages queued on host A: {back:?}");
    hold.release();
    child.wait(T).assert_success();
    let (out, _) = send1.join();
    assert_eq!(out.status.code(), Some(0), "{:?}\nbridge: {}", text(&out), bridge.log_text());
    for body in [&b1, &b2] {
        assert_eq!(model.count_messages_containing("developer", body), 1, "exactly once: {}", model.dump());
    }
    let q = queued(&a, &thread);
    assert_eq!(q.len(), 2, "{q:?}");
    assert!(q.iter().all(|m| m["state"] == "confirmed" && m["origin"] == "nats:hostb"), "{q:?}");
    let c = wait_until(T, "both requests acked", || {
        let c = consumer_check(&env_b, &nats.url());
        (c["ack_pending"] == 0 && c["pending"] == 0).then_some(c)
    });
    assert_eq!(c["redelivered"], 0, "{c}");
    let log = bridge.log_text();
    assert!(log.matches("NATS: connected").count() >= 2 && log.contains("NATS: disconnected"), "the bridge reconnected: {log}");
    drop(bridge);
    drop(ns);
}

/// Least privilege, on a server that enforces the layout of docs/many-hosts.md: host A's bridge with only
/// its own rights (logged in with an NKey `courier-bridge nkey` made) delivers a producer's message to A's real Codex session once, confirmed
/// (thread list too); host B's credentials cannot consume A's sends, forge A's receipts, answer
/// A's thread requests or read anyone's inboxes (tried with the protocol and by running a
/// bridge for A with B's credentials: nothing reaches A until A's own bridge runs); a producer
/// allowed only to publish sends for A can send, but cannot wait on, subscribe to or open a
/// consumer on receipts, nor ask for A's threads.
#[test]
fn least_privilege_accounts_hold() {
    let (model, env_a, hold) = CodexEnv::with_held_turn();
    let env_b = host_b();
    let env_c = host_b();
    // hosta's NKey, made by `courier-bridge nkey` (the seed stays in A's file).
    let seed = env_a.root.join("hosta.nk");
    let out = run_bounded(env_a.command(bridge_bin()).arg("nkey").arg(&seed), T);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let public = text(&out).0.trim().to_string();
    assert!(public.starts_with('U') && std::fs::read_to_string(&seed).unwrap().starts_with("SU"), "{public}");
    let again = run_bounded(env_a.command(bridge_bin()).arg("nkey").arg(&seed), T);
    assert_eq!(again.status.code(), Some(1), "an existing seed is never overwritten: {:?}", text(&again));
    let nkey = ["--nkey", seed.to_str().unwrap()];
    let nats = Nats::start_with(&env_b.root, "127.0.0.1", Some(&least_privilege_conf(&public)));
    let a = Broker::start_trusted(&env_a);
    // The operator's first run creates the streams and both hosts' consumers.
    drop(Bridge::start(&env_a, &user_url(&nats, "admin"), "hosta", None));
    drop(Bridge::start(&env_c, &user_url(&nats, "admin"), "hostb", None));

    // The protocol: each user may do exactly its part.
    let denied = |user: &str, ops: &[&str], want: &[bool]| {
        let got = nats_verdicts(&nats, user, ops);
        for ((op, v), w) in ops.iter().zip(&got).zip(want) {
            assert_eq!(v.is_some(), *w, "{user}: {op}: {v:?}");
            if let Some(e) = v {
                assert!(e.contains("Permissions Violation"), "{user}: {op}: {e}");
            }
        }
    };
    denied(
        "hostb",
        &[
            "PUB courier.receipt.hostb.producer",
            "SUB courier.threads.hostb",
            "PUB $JS.API.CONSUMER.MSG.NEXT.COURIER_TO_hostb.courier-bridge-hostb",
            "PUB $JS.API.CONSUMER.MSG.NEXT.COURIER_TO_hosta.courier-bridge-hosta",
            "PUB $JS.ACK.COURIER_TO_hosta.courier-bridge-hosta.1.1.1.1.0",
            "PUB courier.receipt.hosta.producer",
            "SUB courier.threads.hosta",
            "SUB courier.to.hosta.*",
            "SUB courier.to.>",
            "SUB _INBOX.>",
            "SUB _INBOX.courier-bridge-hosta.>",
            "PUB $JS.API.CONSUMER.CREATE.COURIER_TO_hosta",
            "PUB courier.to.hosta.hostb",
        ],
        &[false, false, false, true, true, true, true, true, true, true, true, true, true],
    );
    denied(
        "sendonly",
        &[
            "PUB courier.to.hosta.sendonly",
            "PUB courier.to.hosta.producer",
            "PUB courier.to.hostb.sendonly",
            "SUB courier.receipt.hosta.sendonly",
            "SUB courier.receipt.>",
            "PUB $JS.API.CONSUMER.CREATE.COURIER_RECEIPTS",
            "PUB $JS.API.STREAM.INFO.COURIER_RECEIPTS",
            "PUB courier.threads.hosta",
            "SUB _INBOX.>",
            "SUB _INBOX.producer.>",
        ],
        &[false, true, true, true, true, true, true, true, true, true],
    );
    denied(
        "producer",
        &[
            "PUB courier.to.hosta.producer",
            "PUB courier.to.hostb.producer",
            "PUB courier.to.hosta.sendonly",
            "PUB courier.receipt.hosta.producer",
            "PUB $JS.API.CONSUMER.MSG.NEXT.COURIER_TO_hosta.courier-bridge-hosta",
            "SUB _INBOX.>",
        ],
        &[false, true, true, true, true, true],
    );

    let child = spawn_exec(&env_a);
    hold.wait_held(1, T);
    let thread = child.wait_thread_id(T);
    let as_user = |user: &str, cmd: &str, args: &[&str]| {
        let mut c = producer(&env_b, &user_url(&nats, user), cmd, args);
        c.args(["--inbox-prefix", &format!("_INBOX.{user}")]);
        if cmd == "send" {
            c.args(["--origin", user]);
        }
        c
    };

    // A bridge for hosta run with hostb's credentials: it never gets A's sends.
    let early = marker("EARLY");
    let out = run_bounded(&mut as_user("sendonly", "send", &["--thread", &thread, "--from", "ci", &early]), T);
    assert_eq!(out.status.code(), Some(0), "a publish-only producer can send: {:?}", text(&out));
    // (Its own inboxes: with the default, _INBOX.courier-bridge-hosta, it cannot even look.)
    let impostor =
        Bridge::spawn(&env_c, None, &user_url(&nats, "hostb"), "hosta", None, &["--inbox-prefix", "_INBOX.courier-bridge-hostb"]);
    wait_until(T, "the impostor bridge to be refused", || impostor.log_text().contains("Permissions Violation").then_some(()));
    let c = consumer_check(&env_b, &user_url(&nats, "admin"));
    // The early send and the two empty probes the allowed `PUB courier.to.hosta.USER` above left
    // (A's bridge refuses those: not JSON) all still wait for A.
    assert_eq!((c["pending"].as_u64(), c["ack_pending"].as_u64()), (Some(3), Some(0)), "the sends still wait for A: {c}");
    assert!(Broker::cli_only(&env_c).inspect_json()["messages"].as_array().unwrap().is_empty(), "nothing queued by the impostor");
    drop(impostor);
    let out = run_bounded(&mut producer(&env_b, &user_url(&nats, "hostb"), "check", &[]), T);
    assert_eq!(out.status.code(), Some(1), "hostb cannot look at A's consumer: {:?}", text(&out));

    // A's own bridge, with only A's rights: the early send, a producer's send with --wait, threads.
    let bridge = Bridge::start_in(&env_a, None, &nats.url(), "hosta", None, &nkey);
    // ... and `broker doctor`'s check, with A's rights too.
    let out = run_bounded(&mut producer(&env_a, &nats.url(), "check", &nkey), T);
    assert_eq!(out.status.code(), Some(0), "A may look at its own consumer: {:?}", text(&out));
    wait_until(T, "the early send queued on A", || queued(&a, &thread).into_iter().next());
    let out = run_bounded(&mut as_user("producer", "threads", &["--json"]), T);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "threads: {stdout} {stderr}\nbridge: {}", bridge.log_text());
    assert!(stdout.contains(&thread), "{stdout}");
    let body = marker("PRIV");
    let send = bg(as_user("producer", "send", &["--thread", &thread, "--from", "relay", "--wait", "confirmed", "--timeout", "90s", &body]));
    wait_until(T, "the producer's message queued on A", || (queued(&a, &thread).len() == 2).then_some(()));

    // The publish-only producer cannot wait (and publishes nothing then); its threads request
    // was refused above (`PUB courier.threads.hosta`).
    let nowait = marker("NOWAIT");
    let out = run_bounded(&mut as_user("sendonly", "send", &["--thread", &thread, "--wait", "confirmed", "--timeout", "10s", &nowait]), T);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout} {stderr}");
    assert!(stderr.contains("$JS.API.STREAM.INFO.COURIER_RECEIPTS"), "{stderr}");

    hold.release();
    child.wait(T).assert_success();
    let (out, _) = send.join();
    assert_eq!(out.status.code(), Some(0), "{:?}\nbridge: {}", text(&out), bridge.log_text());
    for b in [&early, &body] {
        assert_eq!(model.count_messages_containing("developer", b), 1, "{}", model.dump());
    }
    assert_eq!(model.count_messages_containing("developer", &nowait), 0);
    let q = queued(&a, &thread);
    assert_eq!(q.len(), 2, "{q:?}");
    assert!(!bridge.log_text().contains("Permissions Violation"), "A's bridge needed no more rights: {}", bridge.log_text());
}

/// A CA and a server certificate for 127.0.0.1 signed by it, made with openssl in `dir`:
/// (ca.pem, server.pem, server.key).
fn make_tls(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let run = |args: &[&str]| {
        let out = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl (apt-get install openssl)");
        assert!(out.status.success(), "openssl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=courier test CA",
    ]);
    run(&["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"]);
    std::fs::write(dir.join("ext.cnf"), "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n").unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
    (dir.join("ca.pem"), dir.join("server.pem"), dir.join("server.key"))
}

/// TLS with a private CA (a certificate the test makes): the bridge and a producer given
/// `--tls-ca` connect over `tls://` and the message is queued on A; a producer that does not
/// trust the CA fails (1) and publishes nothing, with `tls://` or `nats://` alike.
#[test]
fn tls_with_a_private_ca() {
    let env_a = host_b();
    let env_b = host_b();
    let (ca, cert, key) = make_tls(&env_b.root.join("tls"));
    let conf = format!("tls {{ cert_file: \"{}\", key_file: \"{}\", timeout: 5 }}\n", cert.display(), key.display());
    let nats = Nats::start_with(&env_b.root, "127.0.0.1", Some(&conf));
    let tls_url = format!("tls://127.0.0.1:{}", nats.port);
    let a = Broker::start(&env_a);
    let ca_arg = ca.to_str().unwrap();
    let bridge = Bridge::start_in(&env_a, None, &tls_url, "hosta", None, &["--tls-ca", ca_arg]);
    let thread = "01a22654-3b31-76f3-a48c-b65aa7d0db71";
    let body = marker("TLS");
    let out = run_bounded(&mut producer(&env_b, &tls_url, "send", &["--thread", thread, "--future-thread", "--tls-ca", ca_arg, &body]), T);
    assert_eq!(out.status.code(), Some(0), "{:?}\nbridge: {}", text(&out), bridge.log_text());
    wait_until(T, "the message queued on A over TLS", || queued(&a, thread).into_iter().find(|m| m["origin"] == "nats:hostb"));

    // Without the CA: refused, also for a nats:// URL (the server requires TLS, so the client
    // upgrades, and verifies the server as for tls://).
    for url in [tls_url.as_str(), nats.url().as_str()] {
        let out = run_bounded(&mut producer(&env_b, url, "send", &["--thread", thread, "--future-thread", &marker("NOTLS")]), T);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{url}: {stdout} {stderr}");
        assert!(stdout.is_empty() && stderr.contains("connecting to NATS"), "{url}: {stderr}");
    }
    assert_eq!(queued(&a, thread).len(), 1, "only the trusted send arrived");
}

/// Kills, on drop, every process whose executable lies under `root` (the brokers and bridges
/// an install in the test's private prefix started: they outlive their starter).
struct KillUnder(PathBuf);

impl KillUnder {
    fn pids(&self) -> Vec<i32> {
        let mut out = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else { continue };
            if std::fs::read_link(e.path().join("exe")).is_ok_and(|x| x.starts_with(&self.0)) {
                out.push(pid);
            }
        }
        out
    }
}

impl Drop for KillUnder {
    fn drop(&mut self) {
        for pid in self.pids() {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    }
}

/// The pid in host `host`'s bridge lock file, if that process runs `exe`.
fn bridge_pid(env: &CodexEnv, host: &str, exe: &Path) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(env.state_dir.join(format!("bridge-{host}.lock"))).ok()?.trim().parse().ok()?;
    (std::fs::read_link(format!("/proc/{pid}/exe")).ok()? == exe).then_some(pid)
}

/// `broker install --bridge`, login-profile way: courier-bridge is installed beside the broker,
/// the `[bridge]` table written, the profile gets the bridge's start line and the bridge runs
/// now (from the config alone: a producer's send is queued on this host, and `broker doctor`
/// checks it); `broker uninstall` stops it and takes the line, the table and the binary back.
/// The systemd way: `systemd-analyze verify` accepts the three units, and the bridge unit's
/// own ExecStart and environment run a bridge that works; uninstall removes the unit.
#[test]
fn install_bridge_starts_it_at_login_and_uninstall_removes_it() {
    let env_a = host_b();
    let env_b = host_b();
    let _kill = KillUnder(env_a.root.clone());
    let nats = Nats::start(&env_b.root);
    let prefix = env_a.root.join("prefix");
    let installed_bridge = prefix.join("courier-bridge");
    let install = |extra: &[&str]| {
        let mut c = env_a.command(courier_tests::broker_bin());
        c.args(["install", "--prefix", prefix.to_str().unwrap(), "--codex-home", env_a.codex_home.to_str().unwrap(), "--no-mcp"]);
        c.args(extra).args(["--bridge", "--nats", &nats.url(), "--host", "hosta"]);
        let out = run_bounded(&mut c, T);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(0), "install {extra:?}: {stdout} {stderr}");
        stdout
    };
    let uninstall = |args: &[&str]| {
        let out = run_bounded(env_a.command(prefix.join("broker")).arg("uninstall").args(args), T);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(0), "uninstall: {stdout} {stderr}");
        stdout
    };
    let a = Broker::cli_only(&env_a);
    let sends_arrive = |thread: &str| {
        // The bridge creates its host's stream and consumer once it has connected.
        wait_until(T, "the installed bridge's stream and consumer", || {
            let out = run_bounded(&mut producer(&env_b, &nats.url(), "check", &[]), T);
            serde_json::from_slice::<Value>(&out.stdout).ok().filter(|c| c["ok"] == true)
        });
        let body = marker("INSTALLED");
        let out = run_bounded(&mut producer(&env_b, &nats.url(), "send", &["--thread", thread, "--future-thread", &body]), T);
        assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
        wait_until(T, "the send queued by the installed bridge", || {
            queued(&a, thread).into_iter().find(|m| m["origin"] == "nats:hostb" && m["bytes"].as_u64() == Some(body.len() as u64))
        });
    };

    // Bad requests: a usage error (2) or a clear refusal (1), and nothing installed.
    for (args, code, says) in [
        (&["--bridge", "--nats", "nats://127.0.0.1:9"][..], 2, "--bridge needs --nats URL and --host NAME"),
        (&["--host", "hosta"][..], 2, "go with --bridge"),
        (&["--bridge", "--nats", "nats://127.0.0.1:9", "--host", "a.b"][..], 1, "host name \"a.b\""),
        (&["--bridge", "--nats", "nats://127.0.0.1:9", "--host", "a", "--creds", "/nonexistent.creds"][..], 1, "not a readable file"),
    ] {
        let mut c = env_a.command(courier_tests::broker_bin());
        c.args(["install", "--prefix", prefix.to_str().unwrap(), "--codex-home", env_a.codex_home.to_str().unwrap(), "--no-mcp"])
            .args(args);
        let out = run_bounded(&mut c, T);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stdout} {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!installed_bridge.exists() && !env_a.courier_config.exists(), "{args:?}: nothing left in place");
    }

    // The login profile.
    let said = install(&["--start", "profile"]);
    assert!(said.contains("bridge of host hosta started"), "{said}");
    assert!(installed_bridge.is_file());
    let config = std::fs::read_to_string(&env_a.courier_config).unwrap();
    assert!(config.contains("[bridge]") && config.contains(&nats.url()) && config.contains("host = \"hosta\""), "{config}");
    let profile = std::fs::read_to_string(env_a.home.join(".profile")).unwrap();
    assert!(profile.contains(&format!("nohup {} bridge", prefix.join("broker").display())), "{profile}");
    let pid = bridge_pid(&env_a, "hosta", &installed_bridge).expect("the installed bridge runs");
    sends_arrive("01a22654-3b31-76f3-a48c-b65aa7d0db72");
    let out = run_bounded(env_a.command(prefix.join("broker")).arg("doctor"), T);
    assert!(text(&out).0.contains("NATS bridge of host hosta: connected"), "{:?}", text(&out));
    // Installing again changes nothing and keeps the running bridge.
    let again = install(&["--start", "profile"]);
    assert!(again.contains(&format!("runs already (pid {pid})")), "{again}");

    let said = uninstall(&[]);
    assert!(said.contains(&format!("stopped the bridge of host hosta (pid {pid})")), "{said}");
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "the bridge exited");
    assert!(!installed_bridge.exists());
    assert!(!env_a.courier_config.exists(), "install created the config; uninstall removed it");
    assert!(!std::fs::read_to_string(env_a.home.join(".profile")).unwrap_or_default().contains("courier"), "the profile is clean");

    // systemd user units, written without a user manager.
    let said = install(&["--start", "systemd", "--no-enable"]);
    let unit_dir = env_a.home.join(".config/systemd/user");
    let unit = unit_dir.join("courier-bridge.service");
    let text_unit = std::fs::read_to_string(&unit).unwrap_or_else(|e| panic!("{e}: {said}"));
    assert!(text_unit.contains(&format!("ExecStart={} bridge", prefix.join("broker").display())), "{text_unit}");
    assert!(!text_unit.contains(&nats.url()), "no URL in the unit: the config holds it");
    let analyze =
        ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"].into_iter().find(|p| Path::new(p).is_file()).expect("systemd-analyze");
    let xdg = env_a.root.join("xdg-run");
    std::fs::create_dir_all(&xdg).unwrap();
    std::fs::set_permissions(&xdg, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let v = run_bounded(
        Command::new(analyze)
            .args(["verify", "--user"])
            .args(["courier-broker.socket", "courier-broker.service", "courier-bridge.service"].map(|u| unit_dir.join(u)))
            .env("XDG_RUNTIME_DIR", &xdg)
            .env("HOME", &env_a.home),
        T,
    );
    assert!(v.status.success() && v.stdout.is_empty() && v.stderr.is_empty(), "systemd-analyze verify: {:?}", text(&v));
    // The unit's own command line and environment, as systemd would run it.
    let exec = text_unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).unwrap();
    let mut words = exec.split(' ');
    let mut cmd = Command::new(words.next().unwrap());
    cmd.args(words).env_clear().env("PATH", "/usr/bin:/bin").env("HOME", &env_a.home).stdin(Stdio::null());
    for kv in text_unit.lines().filter_map(|l| l.strip_prefix("Environment=")) {
        let (k, v) = kv.split_once('=').unwrap();
        cmd.env(k, v);
    }
    let log = env_a.root.join("unit-bridge.log");
    let f = std::fs::File::create(&log).unwrap();
    cmd.stdout(f.try_clone().unwrap()).stderr(f);
    let mut child = cmd.spawn().unwrap();
    wait_until(T, "the unit's bridge to run", || bridge_pid(&env_a, "hosta", &installed_bridge));
    sends_arrive("01a22654-3b31-76f3-a48c-b65aa7d0db73");
    let _ = child.kill();
    let _ = child.wait();
    let said = uninstall(&["--purge"]);
    assert!(!unit.exists(), "{said}");
    assert!(!installed_bridge.exists() && !env_a.courier_config.exists(), "{said}");
    let left: Vec<String> = std::fs::read_dir(&env_a.state_dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("bridge-"))
        .collect();
    assert!(left.is_empty(), "--purge removes the bridge's record, lock and log too: {left:?} {said}");
    assert!(std::fs::read_to_string(&log).unwrap().contains("ready:"));
}
