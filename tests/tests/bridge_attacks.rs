//! The bridge under attack and under crashes that lose receipts: a producer squatting another's
//! key, one host's producer flooding another host's pending sends out, the bridge killed -9
//! while the queue database is busy. On a real `nats-server -js` with per-user permissions and
//! the real Codex.

mod bridge_rig;

use bridge_rig::*;
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
    let out = run_bounded(&mut send_as(&env_b, &nats, "mallory", "hosta", "victim", &["--thread", &thread, "--key", &key, "--from", "relay", &forged]), T);
    eprintln!("mallory as victim: {:?}", text(&out));
    let out = run_bounded(&mut send_as(&env_b, &nats, "mallory", "hosta", "mallory", &["--thread", &thread, "--key", &key, "--from", "relay", &squat]), T);
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
