//! The bridge under attack and under crashes that lose receipts: a producer squatting another's
//! key, one host's producer flooding another host's pending sends out, the bridge killed -9
//! while the queue database is busy. On a real `nats-server -js` with per-user permissions and
//! the real Codex.

use courier_tests::bridge::*;
use courier_tests::broker::run_bounded;
use courier_tests::util::{marker, poll_until, wait_until};
use courier_tests::{Broker, CodexEnv};
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

/// Producers with rights of their own: `victim` may send to hosta and wait on receipts,
/// `mallory` may only send to hosta, `flooder` only to hostb, `admin` runs the bridges. Each may
/// publish only its own subject `courier.to.HOST.USER`; the old shared subject
/// `courier.send.HOST` is granted too, as a deployment of the shared layout had it (nothing
/// reads it any more).
fn producers_conf() -> String {
    let user = |u: &str, host: &str, wait: bool| {
        let receipts = if wait {
            r#", "$JS.API.CONSUMER.CREATE.COURIER_RECEIPTS", "$JS.API.CONSUMER.MSG.NEXT.COURIER_RECEIPTS.*", "$JS.API.CONSUMER.DELETE.COURIER_RECEIPTS.*""#
        } else {
            ""
        };
        format!(
            r#"{{ user: {u}, password: pw-{u}, permissions: {{
      publish: {{ allow: ["courier.send.{host}", "courier.to.{host}.{u}", "$JS.API.STREAM.INFO.*"{receipts}] }}
      subscribe: {{ allow: ["_INBOX.{u}.>"] }} }} }}"#
        )
    };
    format!(
        "authorization {{ users = [\n  {{ user: admin, password: pw-admin }}\n  {}\n  {}\n  {}\n  {}\n] }}\n",
        user("victim", "hosta", true),
        user("mallory", "hosta", false),
        user("flooder", "hostb", false),
        user("honest", "hostb", false)
    )
}

/// `courier-bridge send` to `host` as NATS user `user`, naming itself `origin`.
fn send_as(b: &CodexEnv, nats: &Nats, user: &str, host: &str, origin: &str, args: &[&str]) -> Command {
    let mut c = b.command(bridge_bin());
    c.args(["send", "--nats", &user_url(nats, user), "--host", host, "--origin", origin, "--inbox-prefix", &format!("_INBOX.{user}")]);
    c.args(args);
    c
}

/// The queued message on host A whose body is `len` bytes from `from`.
fn queued_like(a: &Broker, thread: &str, from: &str, len: usize) -> Option<Value> {
    queued(a, thread).into_iter().find(|m| m["from"] == from && m["bytes"].as_u64() == Some(len as u64))
}

/// A producer allowed only to send to hosta tries to take another producer's key before it:
/// claiming the other's name (`--origin victim`) and, under its own, publishing the same key
/// first. The real producer's message still reaches the model once under its own name, its
/// `--wait handed` returns its own message's receipt, and the squatter's text never appears
/// under the real producer's name.
#[test]
fn a_producer_cannot_squat_another_producers_key() {
    let (model, env_a, hold) = CodexEnv::with_held_turn();
    let env_b = host_b();
    let nats = Nats::start_with(&env_b.root, "127.0.0.1", Some(&producers_conf()));
    let a = Broker::start_trusted(&env_a);
    let bridge = Bridge::start(&env_a, &user_url(&nats, "admin"), "hosta", None);
    let child = spawn_exec(&env_a);
    hold.wait_held(1, T);
    let thread = child.wait_thread_id(T);
    let key = marker("shared-key");
    let (forged, squat, real) = (marker("FORGED-by-mallory"), marker("SQUAT-by-mallory-long"), marker("REAL"));

    // mallory names itself victim, then publishes the victim's key under its own name.
    let out = run_bounded(
        &mut send_as(&env_b, &nats, "mallory", "hosta", "victim", &["--thread", &thread, "--key", &key, "--from", "relay", &forged]),
        T,
    );
    eprintln!("mallory as victim: {:?}", text(&out));
    let out = run_bounded(
        &mut send_as(&env_b, &nats, "mallory", "hosta", "mallory", &["--thread", &thread, "--key", &key, "--from", "relay", &squat]),
        T,
    );
    eprintln!("mallory under its own name: {:?}", text(&out));

    let victim = bg(send_as(
        &env_b,
        &nats,
        "victim",
        "hosta",
        "victim",
        &["--thread", &thread, "--key", &key, "--from", "relay", "--wait", "handed", "--timeout", "60s", "--json", &real],
    ));
    let arrived = poll_until(Duration::from_secs(20), || queued_like(&a, &thread, "nats:victim/relay", real.len()));
    hold.release();
    child.wait(T).assert_success();
    let (out, _) = victim.join();
    let (stdout, stderr) = text(&out);
    eprintln!("victim: {stdout} {stderr}\nbridge: {}", bridge.log_text());
    assert!(arrived.is_some(), "the real producer's message was queued on A: {:?}", queued(&a, &thread));
    assert_eq!(out.status.code(), Some(0), "{stdout} {stderr}");
    let receipt: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap_or(Value::Null);
    let mine = queued_like(&a, &thread, "nats:victim/relay", real.len()).unwrap();
    assert_eq!(receipt["id"], mine["id"], "the receipt is the real producer's own message's: {receipt}");
    assert_eq!(model.count_messages_containing("developer", &real), 1, "{}", model.dump());
    assert_eq!(model.count_messages_containing("developer", &forged), 0, "nobody sends under another's name: {}", model.dump());
    for m in queued(&a, &thread) {
        if m["from"].as_str().is_some_and(|f| f.starts_with("nats:victim/")) {
            assert_eq!(m["id"], mine["id"], "only the real producer's message carries its name: {m}");
        }
    }
}

/// Whether a thread of process `pid` is blocked reading a socket (read, recvfrom, recvmsg): the
/// bridge waits on the broker's answer that way; its NATS connection is read through epoll.
fn reading_a_socket(pid: u32) -> bool {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten();
    tasks.into_iter().any(|t| {
        let call = std::fs::read_to_string(t.path().join("syscall")).unwrap_or_default();
        let mut f = call.split_whitespace();
        let (Some(nr), Some(fd)) = (f.next(), f.next()) else { return false };
        let Ok(fd) = i64::from_str_radix(fd.trim_start_matches("0x"), 16) else { return false };
        ["0", "45", "47"].contains(&nr)
            && std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
    })
}

/// The queue database write-locked, a send published, the bridge killed -9 once it took the
/// message (its local `send` waits on the lock), the lock released (the broker queues the
/// message) and the bridge started again: the message is delivered once and its receipts reach
/// the producer at once, from the bridge's own record, not only when NATS redelivers the
/// request (here after a 60 s ack wait, longer than the producer waits).
#[test]
fn bridge_killed_while_the_queue_is_locked_still_sends_receipts() {
    let (model, env_a, hold) = CodexEnv::with_held_turn();
    let env_b = host_b();
    let nats = Nats::start(&env_b.root);
    let a = Broker::start_trusted(&env_a);
    let long_ack = ["--ack-wait", "60s"];
    let mut first = Bridge::start_in(&env_a, None, &nats.url(), "hosta", None, &long_ack);
    let child = spawn_exec(&env_a);
    hold.wait_held(1, T);
    let thread = child.wait_thread_id(T);

    let lock = WriteLock::hold(&env_a.state_dir.join("queue.sqlite"));
    let body = marker("LOCKED");
    let send = bg(producer(&env_b, &nats.url(), "send", &["--thread", &thread, "--wait", "confirmed", "--timeout", "25s", &body]));
    wait_until(T, "the bridge to wait on the broker's answer", || reading_a_socket(first.child.id()).then_some(()));
    assert_eq!(consumer_check(&env_b, &nats.url())["ack_pending"], 1, "the bridge took the send and did not ack it");
    let _ = first.child.kill();
    let _ = first.child.wait();
    drop(lock);
    wait_until(T, "the broker to queue the message", || queued(&a, &thread).into_iter().next());
    let bridge = Bridge::start_in(&env_a, None, &nats.url(), "hosta", None, &long_ack);
    hold.release();
    child.wait(T).assert_success();
    let (out, _) = send.join();
    assert_eq!(out.status.code(), Some(0), "{:?}\nfirst bridge: {}\nbridge: {}", text(&out), first.log_text(), bridge.log_text());
    assert_eq!(model.count_messages_containing("developer", &body), 1, "{}", model.dump());
    let q = queued(&a, &thread);
    assert_eq!(q.len(), 1, "{q:?}");
    assert_eq!(q[0]["state"], "confirmed");
}

/// Publishes `n` sends of 60 KB (not JSON: their host's bridge refuses them) as `user` to
/// `subject`: how many the stream took, the first refusal, and the time it took.
fn flood(nats: &Nats, user: &str, subject: &str, n: usize) -> (usize, Option<String>, Duration) {
    let mut c = RawNats::connect(nats, Some(user));
    let big = vec![b'x'; 60_000];
    let t0 = std::time::Instant::now();
    let (mut taken, mut refusal) = (0, None);
    for _ in 0..n {
        let r = c.request(subject, &[], &big).unwrap_or_else(|e| panic!("{user} may publish {subject}: {e}"));
        match r.json()["error"]["description"].as_str() {
            None => taken += 1,
            Some(e) => {
                refusal.get_or_insert(e.to_string());
            }
        }
    }
    (taken, refusal, t0.elapsed())
}

/// Host A's bridge down, a producer's send waiting for it; a producer allowed only to send to
/// host B floods B (a small stream: 2 MiB, 25 sends per producer, so it runs in seconds): B's
/// stream refuses the flood once the flooder has 25 waiting, and refuses everyone once full,
/// but drops nothing: A's send and B's earlier honest send are both delivered.
#[test]
fn one_hosts_flood_never_evicts_another_hosts_sends() {
    let (env_a, env_hb, env_p) = (host_b(), host_b(), host_b());
    let nats = Nats::start_with(&env_p.root, "127.0.0.1", Some(&producers_conf()));
    let (a, b) = (Broker::start(&env_a), Broker::start(&env_hb));
    let admin = user_url(&nats, "admin");
    let small = ["--max-bytes", "2MiB", "--max-per-producer", "25"];
    drop(Bridge::start(&env_a, &admin, "hosta", None));
    drop(Bridge::start_in(&env_hb, None, &admin, "hostb", None, &small));
    let thread = "01a22654-3b31-76f3-a48c-b65aa7d0db80";
    let (for_a, for_b) = (marker("FOR-HOSTA"), marker("FOR-HOSTB"));
    let out = run_bounded(&mut send_as(&env_p, &nats, "victim", "hosta", "victim", &["--thread", thread, "--future-thread", &for_a]), T);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let out = run_bounded(&mut send_as(&env_p, &nats, "honest", "hostb", "honest", &["--thread", thread, "--future-thread", &for_b]), T);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));

    let (taken, refusal, took) = flood(&nats, "flooder", "courier.to.hostb.flooder", 200);
    eprintln!("figure: flood of 200 x 60 KB on host B: {taken} taken, the rest refused ({refusal:?}) in {took:?}");
    assert_eq!(taken, 25, "{refusal:?}");
    assert!(refusal.as_deref().is_some_and(|r| r.contains("maximum messages per subject")), "{refusal:?}");
    // Another producer of B fills what is left; then B is full for everyone.
    let (more, full, _) = flood(&nats, "honest", "courier.to.hostb.honest", 20);
    assert!(more < 20 && full.as_deref().is_some_and(|r| r.contains("maximum bytes")), "{more} {full:?}");
    // The flooder can reach no other host's stream.
    let mut c = RawNats::connect(&nats, Some("flooder"));
    let denied = c.request("courier.to.hosta.flooder", &[], b"{}").err().unwrap_or_default();
    assert!(denied.contains("Permissions Violation"), "{denied}");

    let t0 = std::time::Instant::now();
    let bridge_a = Bridge::start(&env_a, &admin, "hosta", None);
    let got = wait_until(T, "host A's send delivered after the flood", || {
        queued(&a, thread).into_iter().find(|m| m["bytes"].as_u64() == Some(for_a.len() as u64))
    });
    eprintln!("figure: host A's bridge back -> its send queued: {:?}", t0.elapsed());
    assert!(got["from"].as_str().is_some_and(|f| f.starts_with("nats:victim/")), "{got}");
    let _bridge_b = Bridge::start_in(&env_hb, None, &admin, "hostb", None, &small);
    wait_until(T, "host B's honest send delivered too", || {
        queued(&b, thread)
            .into_iter()
            .find(|m| m["bytes"].as_u64() == Some(for_b.len() as u64) && m["from"].as_str().is_some_and(|f| f.starts_with("nats:honest/")))
    });
    assert_eq!(queued(&a, thread).len(), 1, "{}", bridge_a.log_text());
}

/// A deployment of the shared layout: stream `COURIER` (`courier.send.>`) with hosts A's and B's
/// durable consumers and a send waiting for each, published as the old producer did (key in
/// `Nats-Msg-Id`, name in `Courier-Origin`). A's bridge of this version drains A's send once
/// (origin and key as published, its receipt on `courier.receipt.hosta` where the old producer
/// waits), deletes A's old consumer and leaves B's; new sends come through A's own stream; a
/// restart doubles nothing.
#[test]
fn the_shared_stream_is_drained_once_then_left() {
    let (env_a, env_p) = (host_b(), host_b());
    let nats = Nats::start(&env_p.root);
    let a = Broker::start(&env_a);
    let mut op = RawNats::connect(&nats, None);
    let r = op.js(
        "STREAM.CREATE.COURIER",
        &serde_json::json!({"name": "COURIER", "subjects": ["courier.send.>"], "retention": "limits", "storage": "file",
            "max_bytes": 1 << 30, "max_msg_size": 65536, "discard": "old", "max_consumers": -1, "max_msgs": -1, "max_age": 0, "num_replicas": 1}),
    );
    assert!(r["error"].is_null(), "{r}");
    for h in ["hosta", "hostb"] {
        let durable = format!("courier-bridge-{h}");
        let r = op.js(
            &format!("CONSUMER.DURABLE.CREATE.COURIER.{durable}"),
            &serde_json::json!({"stream_name": "COURIER", "config": {"durable_name": durable, "filter_subject": format!("courier.send.{h}"),
                "ack_policy": "explicit", "deliver_policy": "all", "ack_wait": 2_000_000_000u64, "max_deliver": -1}}),
        );
        assert!(r["error"].is_null(), "{r}");
    }
    let thread = "01a22654-3b31-76f3-a48c-b65aa7d0db81";
    let old = marker("OLD-LAYOUT");
    for h in ["hosta", "hostb"] {
        let body = serde_json::json!({"thread": thread, "text": old, "future_thread": true, "from": "ci", "key": format!("old-key-{h}")});
        let key = format!("old-key-{h}");
        let r =
            op.request(&format!("courier.send.{h}"), &[("Nats-Msg-Id", &key), ("Courier-Origin", "oldhost")], body.to_string().as_bytes());
        assert!(r.as_ref().is_ok_and(|r| r.json()["error"].is_null()), "{:?}", r.map(|r| r.json()));
    }

    let bridge = Bridge::start(&env_a, &nats.url(), "hosta", None);
    let m = wait_until(T, "the old layout's send drained into A", || queued(&a, thread).into_iter().next());
    assert_eq!((m["from"].as_str(), m["key"].as_str()), (Some("nats:oldhost/ci"), Some("old-key-hosta")), "{m}");
    wait_until(T, "A's old consumer deleted", || {
        op.js("CONSUMER.INFO.COURIER.courier-bridge-hosta", &serde_json::json!({}))["error"]["code"].as_u64().filter(|c| *c == 404)
    });
    let b_left = op.js("CONSUMER.INFO.COURIER.courier-bridge-hostb", &serde_json::json!({}));
    assert_eq!(b_left["num_pending"], 1, "B's send still waits for B: {b_left}");
    let receipts = op.js("STREAM.INFO.COURIER_RECEIPTS", &serde_json::json!({"subjects_filter": "courier.receipt.hosta"}));
    assert!(receipts["state"]["subjects"]["courier.receipt.hosta"].as_u64() >= Some(1), "the old producer's receipt: {receipts}");
    // The bridge logs the drain after the consumer's deletion returns: its line may still be on
    // its way through the log pipe.
    if poll_until(T, || bridge.log_text().contains("drained 1 send(s)").then_some(())).is_none() {
        panic!("the drain is not logged: {}", bridge.log_text());
    }

    let new = marker("NEW-LAYOUT");
    let out = run_bounded(&mut producer(&env_p, &nats.url(), "send", &["--thread", thread, "--future-thread", &new]), T);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    wait_until(T, "the new send queued", || (queued(&a, thread).len() == 2).then_some(()));
    drop(bridge);
    let _again = Bridge::start(&env_a, &nats.url(), "hosta", None);
    let c = wait_until(T, "the restarted bridge settled", || {
        let c = consumer_check(&env_p, &nats.url());
        (c["pending"] == 0 && c["ack_pending"] == 0).then_some(c)
    });
    assert_eq!(queued(&a, thread).len(), 2, "nothing doubled: {c}");
}
