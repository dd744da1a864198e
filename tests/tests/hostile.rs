//! Hostile input, fail-open and hostile filesystems. Legitimate hook calls come from
//! the stand-in Codex (the kit's `standin`) running the real hook-client with `COURIER_DEBUG=1`, so a
//! call the broker did not answer shows up as a fail-open message on its stderr.
//!
//! Knobs: `COURIER_FLOOD_CONNECTIONS` (default 10000), `COURIER_FLOOD_SECS` (default 4).

use broker_lib::client::query_status;
use courier_shared::wire;
use courier_tests::broker::{hook_command, messages_by_id, refusals, run_bounded, run_hook_client};
use courier_tests::rollout::hook_marker_ids;
use courier_tests::standin::{records, standin_codex, world, HookCall, Standin, Stepped};
use courier_tests::util::{fake_uuid_v7, fake_uuid_v7_minted_ago, wait_until};
use courier_tests::{hook_client_bin, Broker, CodexEnv, ScriptedModel, Serve};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NOBODY: u32 = 65534;

fn env_num(k: &str, d: u64) -> u64 {
    std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d)
}

fn chown(p: &Path, uid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(uid)).unwrap_or_else(|e| panic!("chown {}: {e}", p.display()));
}

fn set_mode(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn refusal_codes(env: &CodexEnv) -> Vec<String> {
    refusals(&Broker::cli_only(env).inspect_json()).iter().filter_map(|r| r["reason"].as_str().map(String::from)).collect()
}

/// A fresh connection to the broker, with a read timeout.
fn conn(sock: &Path) -> UnixStream {
    let s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// The broker's one reply frame (an error frame or a hook reply), as JSON.
fn read_reply(s: &mut UnixStream) -> std::io::Result<Value> {
    wire::read_json(s, wire::MAX_FRAME)
}

fn proc_status(pid: u32, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines().find_map(|l| l.strip_prefix(key).map(|v| v.trim().trim_end_matches(" kB").trim().parse().unwrap_or(0))).unwrap_or(0)
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// Oversized, truncated, malformed, wrong-version, ack-without-lease and silent connections each
/// get a clear error code (an error frame where the connection still stands, and a refusal in
/// `broker inspect`), while the stand-in's hook calls are all answered and deliver.
#[test]
fn malformed_frames_get_error_codes_and_hooks_keep_working() {
    let env = world();
    let serve = Serve::start(&env, &[]);
    let sock = env.runtime_dir.join("broker.sock");
    Broker::cli_only(&env).trust_codex(standin_codex());
    let thread = fake_uuid_v7();
    let standin = Standin::start(&env, &thread, 2, &[("COURIER_DEBUG", "1")]);

    // Oversized: a length prefix of 4 GiB is refused before any allocation.
    let mut s = conn(&sock);
    s.write_all(&u32::MAX.to_be_bytes()).unwrap();
    assert_eq!(read_reply(&mut s).unwrap()["error"], "frame_too_large");
    // Just over the limit, with a body trickling in.
    let mut s = conn(&sock);
    s.write_all(&((4u32 << 20) + 1).to_be_bytes()).unwrap();
    assert_eq!(read_reply(&mut s).unwrap()["error"], "frame_too_large");
    // Malformed JSON.
    let mut s = conn(&sock);
    wire::write_frame(&mut s, b"{\"op\":\"hook\",\"v\":1,").unwrap();
    assert_eq!(read_reply(&mut s).unwrap()["error"], "bad_request");
    // Valid JSON, not a request.
    let mut s = conn(&sock);
    wire::write_frame(&mut s, b"[1,2,3]").unwrap();
    assert_eq!(read_reply(&mut s).unwrap()["error"], "bad_request");
    // Wrong protocol version: an empty reply in the broker's version.
    let mut s = conn(&sock);
    wire::write_frame(&mut s, br#"{"op":"hook","v":99,"pid":1,"ts_ms":0,"payload":"{}","mac":"00"}"#).unwrap();
    let r = read_reply(&mut s).unwrap();
    assert_eq!((r["v"].as_u64(), r["output"].as_str()), (Some(1), Some("")), "{r}");
    // An ack with no lease.
    let mut s = conn(&sock);
    wire::write_frame(&mut s, br#"{"op":"ack","v":1,"lease":7}"#).unwrap();
    assert_eq!(read_reply(&mut s).unwrap()["error"], "unexpected_ack");
    // Truncated: a header for 100 bytes, 10 sent, then the write side closed.
    let mut s = conn(&sock);
    s.write_all(&100u32.to_be_bytes()).unwrap();
    s.write_all(b"{\"op\":\"hoo").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    // Connects and says nothing: closed at the request timeout with an error frame.
    let started = Instant::now();
    let mut silent = conn(&sock);
    assert_eq!(read_reply(&mut silent).unwrap()["error"], "request_timeout");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(1900) && waited < Duration::from_secs(4), "timeout after {waited:?}");

    let id = Broker::cli_only(&env).run_ok(&["send", "--thread", &thread, "still delivered"]).trim().to_string();
    wait_until(Duration::from_secs(20), "delivery after the garbage", || {
        (messages_by_id(&Broker::cli_only(&env).inspect_json())[&id]["state"] == "confirmed").then_some(())
    });
    let codes = wait_until(Duration::from_secs(5), "refusals recorded", || {
        let c = refusal_codes(&env);
        ["frame_too_large", "bad_request", "protocol_version", "unexpected_ack", "truncated_frame", "request_timeout"]
            .iter()
            .all(|k| c.iter().any(|x| x == k))
            .then_some(c)
    });
    let calls = standin.finish(Duration::from_secs(30));
    let failed: Vec<_> = calls.iter().filter(|c| c.rc != 0 || !c.err.is_empty()).collect();
    assert!(failed.is_empty(), "legitimate calls failed: {failed:?}");
    eprintln!("refusal codes seen: {codes:?}; {} legitimate calls all answered", calls.len());
    drop(serve);
}

const FLOOD_SCRIPT: &str = r#"
import os, socket, sys, time, ctypes
path, procs, per, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
r, w = os.pipe()
for i in range(procs):
    if os.fork() == 0:
        ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG: SIGKILL
        os.close(r)
        opened = refused = 0
        end = time.monotonic() + secs
        conns = []
        while True:
            for s in conns: s.close()
            conns = []
            for j in range(per):
                s = socket.socket(socket.AF_UNIX); s.setblocking(False)
                try:
                    s.connect(path); conns.append(s); opened += 1
                except OSError:
                    s.close(); refused += 1
            if time.monotonic() + 2.0 > end: break
            time.sleep(2.0)
        while time.monotonic() < end: time.sleep(0.05)
        os.write(w, b"%d %d\n" % (opened, refused))
        os._exit(0)
os.close(w)
opened = refused = 0
f = os.fdopen(r, "rb")
for line in f:
    a, b = line.split(); opened += int(a); refused += int(b)
print(opened, refused, flush=True)
"#;

/// 10,000 idle connections (from 100 processes, renewed every 2 s) while a stand-in Codex makes
/// hook calls: the broker's file descriptors, threads and memory stay bounded, every legitimate
/// call is answered, the flood slows them by a bounded factor over the calm calls of the same run,
/// and each message sent during it goes to the first call that asks after it was queued.
///
/// Nothing here is an absolute time: on a loaded 2-core CI machine a hook call's wall time
/// measures the machine. The stand-in's hook-client gets the longest deadline, so a call that
/// fails open is one the broker closed or never answered (starvation), not a slow machine.
#[test]
fn ten_thousand_idle_connections_do_not_starve_hooks() {
    let _alone = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    let total = env_num("COURIER_FLOOD_CONNECTIONS", 10_000);
    let secs = env_num("COURIER_FLOOD_SECS", 4);
    let procs = 100u64.min(total);
    let env = world();
    let serve = Serve::start(&env, &[]);
    let bpid = serve.pid();
    let sock = env.runtime_dir.join("broker.sock");
    Broker::cli_only(&env).trust_codex(standin_codex());
    let thread = fake_uuid_v7();
    let standin = Standin::start(&env, &thread, 4, &[("COURIER_DEBUG", "1"), ("COURIER_HOOK_DEADLINE_MS", "30000")]);
    // Calm reference: the same stand-in's calls before the flood (counted by the broker), and as
    // many after it once its connections are gone; the slower of the two is the reference (the
    // machine's load may change while the test runs).
    wait_until(Duration::from_secs(60), "calm hook calls", || {
        query_status(&env.runtime_dir).filter(|st| st.hook_calls >= CALM_CALLS).map(|_| ())
    });
    let base_threads = proc_status(bpid, "Threads:");

    let t0 = now_secs();
    let mut flood = Command::new("/usr/bin/python3")
        .args(["-c", FLOOD_SCRIPT])
        .arg(&sock)
        .args([procs.to_string(), (total / procs).to_string(), secs.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Messages sent during the flood, each with the moment its `send` returned (committed).
    let mut sent: Vec<(String, f64)> = Vec::new();
    let (mut max_fds, mut max_threads, mut max_rss) = (0, 0, 0);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut next_send = Instant::now() + Duration::from_millis(300);
    while Instant::now() < deadline {
        max_fds = max_fds.max(fd_count(bpid));
        max_threads = max_threads.max(proc_status(bpid, "Threads:"));
        max_rss = max_rss.max(proc_status(bpid, "VmRSS:"));
        if Instant::now() >= next_send {
            let id = Broker::cli_only(&env).run_ok(&["send", "--thread", &thread, "during the flood"]).trim().to_string();
            sent.push((id, now_secs()));
            next_send += Duration::from_millis(700);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut line = String::new();
    flood.stdout.take().unwrap().read_to_string(&mut line).unwrap();
    flood.wait().unwrap();
    let t1 = now_secs();
    let st = query_status(&env.runtime_dir).expect("broker alive after the flood");
    // Calm again (the flood's connections gone): as many calls, so the reference brackets it.
    let settled = wait_until(Duration::from_secs(60), "the flood's connections closed", || {
        query_status(&env.runtime_dir).filter(|now| now.open_connections <= 1)
    });
    let t1b = now_secs();
    wait_until(Duration::from_secs(60), "calm hook calls after the flood", || {
        query_status(&env.runtime_dir).filter(|now| now.hook_calls >= settled.hook_calls + CALM_CALLS).map(|_| ())
    });
    let t2 = now_secs();
    for (id, _) in &sent {
        wait_until(Duration::from_secs(30), "delivery of messages sent during the flood", || {
            messages_by_id(&Broker::cli_only(&env).inspect_json()).remove(id).filter(|m| m["state"] == "confirmed")
        });
    }
    let calls = standin.finish(Duration::from_secs(30));
    let (before, after) = (call_ms(calls.iter().filter(|c| c.t < t0)), call_ms(calls.iter().filter(|c| c.t > t1b && c.t < t2)));
    let calm = if pct(&before, 0.5) >= pct(&after, 0.5) { &before } else { &after };
    let during: Vec<&HookCall> = calls.iter().filter(|c| c.t >= t0 && c.t <= t1).collect();
    let flooded = call_ms(during.iter().copied());
    let unanswered: Vec<_> = calls.iter().filter(|c| c.rc != 0 || !c.err.is_empty()).collect();
    eprintln!(
        "flood: {} (connections opened, refused at connect) over {secs}s from {procs} processes; broker max fds {max_fds}, \
         threads {max_threads} (calm {base_threads}), VmRSS {max_rss} kB; status {st:?}; legitimate calls: calm {} \
         (p50 {:.1} ms, p90 {:.1} ms), during the flood {} (p50 {:.1} ms, p90 {:.1} ms, max {:.1} ms), unanswered {}",
        line.trim(),
        calm.len(),
        pct(calm, 0.5),
        pct(calm, 0.9),
        flooded.len(),
        pct(&flooded, 0.5),
        pct(&flooded, 0.9),
        pct(&flooded, 1.0),
        unanswered.len()
    );
    let opened: u64 = line.split_whitespace().next().unwrap().parse().unwrap();
    assert!(opened >= total / 2, "the flood opened only {opened} connections");
    assert!(calm.len() as u64 >= CALM_CALLS / 2 && during.len() >= 10, "too few calls: {} calm, {} during", calm.len(), during.len());
    // Answered: with the longest deadline, a call fails open only if the broker dropped it.
    assert!(unanswered.is_empty(), "legitimate calls unanswered: {unanswered:?}");
    // Not starved: the flood costs a typical call, and the slowest tenth, a bounded factor of the calm ones (spawn
    // included; both measured on this machine, in this run, just before or just after it).
    for q in [0.5, 0.9] {
        let (flood, reference) = (pct(&flooded, q), pct(&before, q).max(pct(&after, q)));
        assert!(flood <= FLOOD_SLOWDOWN * reference, "flood p{q} {flood:.1} ms vs calm {reference:.1} ms");
    }
    // Delivered in order: each message goes to the first call that asked after it was queued.
    for (id, queued) in &sent {
        let carrier = calls.iter().position(|c| c.out.contains(id.as_str()));
        let first_after = calls.iter().position(|c| c.t > *queued);
        assert!(
            carrier.is_some() && carrier <= first_after,
            "{id} (queued at {queued:.3}) carried by call {carrier:?}, the first call after it was {first_after:?}: {:?}",
            &calls[first_after.unwrap_or(0)..carrier.unwrap_or(calls.len()).min(calls.len())]
        );
    }
    assert!(max_fds < 1024 + 128, "broker held {max_fds} fds");
    assert!(max_threads <= base_threads + 2, "broker grew threads: {max_threads} vs {base_threads}");
    assert!(max_rss < 256 * 1024, "broker RSS {max_rss} kB");
    drop(serve);
}

/// Hook calls the stand-in makes before the flood: the calm reference.
const CALM_CALLS: u64 = 40;
/// How much slower than the calm calls the flood may make a typical legitimate call.
const FLOOD_SLOWDOWN: f64 = 10.0;

fn now_secs() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64()
}

/// The wall times of `calls`, sorted.
fn call_ms<'a>(calls: impl Iterator<Item = &'a HookCall>) -> Vec<f64> {
    let mut ms: Vec<f64> = calls.map(|c| c.ms).collect();
    ms.sort_by(f64::total_cmp);
    ms
}

/// The `p` quantile of sorted `ms` (0 when empty).
fn pct(ms: &[f64], p: f64) -> f64 {
    ms.get(((ms.len() as f64 - 1.0) * p) as usize).copied().unwrap_or(0.0)
}

/// Holds the queue database's write lock (`BEGIN IMMEDIATE`) until its stdin closes.
const DB_LOCK_SCRIPT: &str = r#"
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
c.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()
c.execute("ROLLBACK")
"#;

/// Complete frames waiting for a worker count against the documented 64 MiB budget.
/// Every worker is stalled (each frame is a bad request whose refusal waits for the
/// queue database, held locked by another process), then 128 complete 4 MiB frames arrive: once
/// 64 MiB are held, the rest are closed with `buffer_limit`, and the broker's peak RSS grows by
/// about the budget, not by 512 MiB. Released, the broker answers again and holds nothing.
#[test]
fn parked_complete_frames_count_against_the_buffer_budget() {
    let _alone = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    let env = world();
    let serve = Serve::start(&env, &[]);
    let bpid = serve.pid();
    let sock = env.runtime_dir.join("broker.sock");
    let base_hwm = proc_status(bpid, "VmHWM:");
    let mut locker = Command::new("/usr/bin/python3")
        .args(["-c", DB_LOCK_SCRIPT])
        .arg(env.state_dir.join("queue.sqlite"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(locker.stdout.take().unwrap()), &mut line).unwrap();
    assert_eq!(line.trim(), "locked");

    let big = vec![b'x'; 4 << 20]; // a complete frame's body,, the largest allowed, not a request
    let (mut held, mut limited, mut other) = (Vec::new(), 0, Vec::new());
    for _ in 0..128 {
        let mut s = UnixStream::connect(&sock).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        match wire::write_frame(&mut s, &big) {
            Ok(()) => held.push(s),
            Err(_) => match read_reply(&mut s) {
                Ok(v) if v["error"] == "buffer_limit" => limited += 1,
                r => other.push(format!("{r:?}")),
            },
        }
    }
    let hwm = proc_status(bpid, "VmHWM:");
    // A stalled worker gives up on the locked database after its busy timeout (5 s), answers
    // and lets its frame go; on a loaded machine the loop outlasts that. Frames answered so are
    // no longer held: what must stay within the budget is the frames still waiting.
    let answered = held
        .iter()
        .filter(|s| {
            s.set_nonblocking(true).unwrap();
            let mut b = [0u8; 1];
            matches!((&**s).read(&mut b), Ok(n) if n > 0)
        })
        .count();
    drop(locker.stdin.take());
    locker.wait().unwrap();
    let grew_mib = (hwm.saturating_sub(base_hwm)) as f64 / 1024.0;
    eprintln!(
        "128 x 4 MiB frames, workers stalled: {} taken ({answered} answered after the busy timeout), {limited} buffer_limit; peak RSS +{grew_mib:.0} MiB",
        held.len()
    );
    assert!(other.is_empty(), "closed without the buffer_limit error: {other:?}");
    assert!(
        held.len() - answered <= 16 && limited + answered >= 112,
        "{} frames held ({answered} answered), {limited} refused",
        held.len()
    );
    assert!(grew_mib < 64.0 + 32.0, "broker peak RSS grew {grew_mib:.0} MiB (budget 64 MiB)");
    let st = wait_until(Duration::from_secs(60), "the broker answers again", || query_status(&env.runtime_dir));
    let after = wait_until(Duration::from_secs(30), "the held frames are let go", || {
        query_status(&env.runtime_dir).filter(|st| st.buffered_bytes < 4096)
    });
    eprintln!("status after: {st:?}; then {after:?}");
    drop(serve);
}

/// Hook clients that stall after their lease do not hold broker workers.
/// 24 verified calls of 24 threads (more than the 16 workers) take their leases and never ack;
/// meanwhile an honest call of another thread is delivered while every one of those leases is
/// still live, and no slower than a bounded factor of calm calls of the same kind in the same run
/// (before any client stalled, and after their leases ended). The stalled leases end at
/// `LEASE_MS` and their messages go back to `pending`, never handed.
///
/// No absolute time: the honest and calm calls get the longest deadline, so a slow machine does
/// not fail them open. A broker whose workers waited on the stalled clients serves the honest
/// call only once one of them lets go: after a lease ended, and many times slower than calm.
#[test]
fn stalled_clients_after_the_lease_do_not_hold_workers() {
    let _alone = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    const STALLED: usize = 24;
    const CALM: usize = 3;
    let env = world();
    let _serve = Serve::start(&env, &[]);
    Broker::cli_only(&env).trust_codex(standin_codex());
    // Threads: CALM before, STALLED, the honest one, CALM after.
    let threads: Vec<String> = (0..2 * CALM + STALLED + 1).map(|_| fake_uuid_v7()).collect();
    let (calm_before, rest) = threads.split_at(CALM);
    let (stalled_threads, rest) = rest.split_at(STALLED);
    let (honest_thread, calm_after) = (&rest[0], &rest[1..]);
    let out_dir = env.root.join("multi");
    std::fs::create_dir_all(&out_dir).unwrap();
    // One stand-in codex holding every thread (rollout O_APPEND, writer flock, one open turn);
    // each thread's PostToolUse follows its own tool call, completed (gate/ticket.rs). The
    // rollouts exist before the messages are sent: `send` waits for a fresh thread's rollout.
    let turn = "01a22659-8b4d-7ed0-830a-00efbf9cc079";
    let mut codex = Stepped::start(&env, &threads[0]);
    for (i, t) in threads.iter().enumerate() {
        if i > 0 {
            codex.add_thread(t);
        }
        let call = format!("call_{i}");
        codex.write_to(t, records::task_started(turn));
        codex.write_to(t, records::function_call(&call, turn, "true"));
        codex.write_to(t, records::exec_completed(t, turn, &call));
    }
    let send = |t: &String| Broker::cli_only(&env).run_ok(&["send", "--thread", t, &format!("for {t}")]).trim().to_string();
    let index = |t: &String| threads.iter().position(|x| x == t).unwrap();
    let post = |t: &String| json!({"tool_name": "Bash", "tool_input": {"command": "true"}, "tool_response": "", "tool_use_id": format!("call_{}", index(t))});
    let patient = [("COURIER_HOOK_DEADLINE_MS", "30000")];
    // A delivery by an unhurried call, waited for: the calm reference, and the honest call.
    let deliver = |codex: &mut Stepped, t: &String, id: &str| {
        let call = codex.hook_start(t, "PostToolUse", turn, post(t), &patient, None);
        let call = codex.hook_wait(call);
        assert_eq!(call.rc, 0, "{call:?}");
        assert!(call.out.contains(id), "{t} was not delivered {id}: {call:?}");
        call
    };
    let before: Vec<f64> = calm_before.iter().map(|t| deliver(&mut codex, t, &send(t)).ms).collect();
    let ids: Vec<String> = stalled_threads.iter().chain([honest_thread]).map(send).collect();

    for (i, thread) in stalled_threads.iter().enumerate() {
        // Stalled before its ack, its stderr to `stall-<i>.err`.
        let err = out_dir.join(format!("stall-{i}.err"));
        codex.hook_start(thread, "PostToolUse", turn, post(thread), &[("COURIER_HOOK_TEST_STALL", "before_ack")], Some(&err));
    }
    // Stalled clients print their lease and park before the ack. Once 16 do (as many as the
    // broker has workers), the honest call comes.
    let stalled = || -> Vec<usize> {
        (0..STALLED)
            .filter(|i| std::fs::read_to_string(out_dir.join(format!("stall-{i}.err"))).is_ok_and(|e| e.contains("stalled before_ack")))
            .collect()
    };
    wait_until(Duration::from_secs(20), "16 stalled clients to hold their leases", || (stalled().len() >= 16).then_some(()));
    let honest = deliver(&mut codex, honest_thread, &ids[STALLED]);
    // Every stalled client's lease was still live when the honest call returned: leases only
    // end, so a lease seen after it was live during it.
    let live_then = stalled(); // leased before the look below
    let by_id = messages_by_id(&Broker::cli_only(&env).inspect_json());
    for i in &live_then {
        assert_eq!(by_id[&ids[*i]]["state"], "leased", "a stalled lease ended before the honest call was served: {}", by_id[&ids[*i]]);
    }
    // More clients than workers held their leases at once (some may fail open under load).
    wait_until(Duration::from_secs(10), "more stalled clients than workers", || (stalled().len() > 16).then_some(()));

    // The stalled leases end: back to pending, never handed.
    let by_id = wait_until(Duration::from_secs(10), "stalled leases to be released", || {
        let m = messages_by_id(&Broker::cli_only(&env).inspect_json());
        ids[..STALLED].iter().all(|id| m[id]["state"] == "pending").then_some(m)
    });
    // Handed (confirmed once the stand-in's rollout shows it, as Codex's would).
    assert!(matches!(by_id[&ids[STALLED]]["state"].as_str(), Some("handed" | "confirmed")), "{}", by_id[&ids[STALLED]]);
    for id in &ids[..STALLED] {
        // Released by the poll thread's deadline, or by maintenance once the lease ran out.
        let reason = by_id[id]["reason"].as_str().unwrap_or("");
        assert!(matches!(reason, "not_acked" | "lease_expired" | ""), "{}", by_id[id]);
    }
    codex.hook_kill();
    let after: Vec<f64> = calm_after.iter().map(|t| deliver(&mut codex, t, &send(t)).ms).collect();
    // One honest call against the slowest calm one (before and after: the machine's load may
    // change while the test runs), so one scheduling hiccup does not fail it.
    let reference = before.iter().chain(&after).copied().fold(0.0, f64::max);
    eprintln!(
        "{STALLED} clients stalled after their leases ({} when the honest call returned); honest call {:.1} ms; calm calls {before:.1?} before, {after:.1?} after",
        live_then.len(),
        honest.ms
    );
    assert!(honest.ms <= STALL_SLOWDOWN * reference, "the honest call took {:.1} ms, the slowest calm one {reference:.1} ms", honest.ms);
}

/// How much slower than the slowest calm call of the run the honest call may be while the
/// stalled clients hold their leases (hook-client processes still starting compete for the CPU).
const STALL_SLOWDOWN: f64 = 10.0;

/// A PostToolUse payload; the broker never gets far enough to judge it in these cases.
fn payload(env: &CodexEnv) -> String {
    let t = fake_uuid_v7();
    serde_json::json!({"session_id": t, "turn_id": "x", "hook_event_name": "PostToolUse",
        "transcript_path": env.codex_home.join(format!("sessions/rollout-2026-11-29T08-01-16-{t}.jsonl"))})
    .to_string()
}

const DEADLINE_MS: u64 = 300;

/// The flood test and the fail-open timing test measure latencies against bounds: they must
/// not load the 2-core machine for each other, so they take turns (other tests still run alongside).
static TIMING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The deadline counts from hook-client's start, so what a run may take is the deadline, with
/// half of it again for the wake-up at its end on a loaded machine, plus what starting and ending
/// a hook-client costs now: `reference`, a run that finds no socket and fails open at once,
/// measured just before. A client that waited for anything after its deadline (a second connect,
/// a read without a timeout) takes at least twice the deadline.
fn assert_fail_open(what: &str, out: &std::process::Output, took: Duration, reference: Duration) -> Duration {
    eprintln!("fail-open ({what}): {took:?} (reference {reference:?}), stderr {:?}", String::from_utf8_lossy(&out.stderr).trim());
    assert!(out.status.success(), "{what}: exit {}", out.status);
    assert!(out.stdout.is_empty(), "{what}: printed {:?}", String::from_utf8_lossy(&out.stdout));
    let bound = Duration::from_millis(DEADLINE_MS * 3 / 2) + reference * 2;
    assert!(took < bound, "{what}: took {took:?} (deadline {DEADLINE_MS} ms, a run with no socket {reference:?})");
    took
}

/// A hook-client run that finds no socket (an empty runtime directory): its wall time.
fn no_socket_run(env: &CodexEnv, payload: &str, extra: &[(&str, &str)]) -> Duration {
    let empty = courier_shared::scratch::dir_in(&env.root, "no-socket");
    let empty = empty.display().to_string();
    let mut with: Vec<(&str, &str)> = extra.to_vec();
    with.push(("COURIER_RUNTIME_DIR", &empty));
    let (out, took) = run_hook_client(env, payload, &with);
    assert!(out.status.success() && out.stdout.is_empty(), "no socket: {out:?}");
    took
}

/// hook-client with a broker that is SIGSTOPped, one that was killed (stale socket file), and
/// one it may not reach (runs as `nobody`: permission denied): exit 0, no output, within its
/// deadline and what a run with no socket takes. Then a real `codex exec` with the broker stopped completes normally.
#[test]
fn real_codex_hook_client_fails_open_on_stopped_stale_and_forbidden_brokers() {
    let _alone = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    let model = ScriptedModel::start_with(courier_tests::model::exec_then_done("echo hello"));
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let dl = DEADLINE_MS.to_string();
    let extra = [("COURIER_HOOK_DEADLINE_MS", dl.as_str()), ("COURIER_DEBUG", "1")];
    let mut serve = Serve::start(&env, &[]);
    let p = payload(&env);
    let mut worst = Duration::ZERO;

    // SIGSTOP: connect succeeds (the kernel queues it), nothing ever answers.
    let pid = serve.pid() as i32;
    assert!(Command::new("kill").args(["-STOP", &pid.to_string()]).status().unwrap().success());
    for _ in 0..3 {
        let reference = no_socket_run(&env, &p, &extra);
        let (out, took) = run_hook_client(&env, &p, &extra);
        worst = worst.max(assert_fail_open("broker SIGSTOPped", &out, took, reference));
    }
    // A real session with hooks on the stopped broker.
    let mut cmd = env.codex_command();
    cmd.env("COURIER_HOOK_DEADLINE_MS", &dl);
    cmd.arg("exec").arg("--skip-git-repo-check").arg("run a command");
    let started = Instant::now();
    let out = courier_tests::ExecChild::spawn(cmd).wait(Duration::from_secs(60));
    out.assert_success();
    assert_eq!(out.stdout.trim(), "done");
    assert!(!out.stderr.contains(" Failed"), "a hook failed:\n{}", out.stderr);
    eprintln!("codex exec with a stopped broker: {:?}", started.elapsed());
    assert!(Command::new("kill").args(["-CONT", &pid.to_string()]).status().unwrap().success());

    // Killed: the socket file stays behind, nobody listens (ECONNREFUSED).
    serve.kill9();
    assert!(env.runtime_dir.join("broker.sock").exists());
    let reference = no_socket_run(&env, &p, &extra);
    let (out, took) = run_hook_client(&env, &p, &extra);
    worst = worst.max(assert_fail_open("stale socket file", &out, took, reference));

    // Permission denied: the client runs as nobody; the 0700 runtime dir is root's.
    let _serve = Serve::start(&env, &[]);
    let mut cmd = env.command(hook_client_bin());
    cmd.uid(NOBODY).gid(NOBODY).current_dir("/").stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let reference = no_socket_run(&env, &p, &extra);
    let started = Instant::now();
    let mut child = cmd.spawn().unwrap();
    child.stdin.take().unwrap().write_all(p.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let took = started.elapsed();
    assert!(String::from_utf8_lossy(&out.stderr).contains("ermission denied"), "{:?}", out);
    worst = worst.max(assert_fail_open("permission denied", &out, took, reference));
    eprintln!("worst fail-open hook-client latency: {worst:?} (deadline {DEADLINE_MS} ms)");
}

/// `broker serve` refuses, with the reason, to use a runtime or state directory that is a
/// symlink, has group/other permissions or belongs to another user, and to replace a socket path
/// that is a symlink or another user's stale socket.
#[test]
fn broker_refuses_planted_directories_and_sockets() {
    fn refuses(env: &CodexEnv, why: &str, expect: &str) {
        let mut s = Serve::spawn(env, &[]);
        let st = wait_until(Duration::from_secs(15), "broker to refuse", || s.child.try_wait().ok().flatten());
        let log = std::fs::read_to_string(&s.log).unwrap_or_default();
        std::fs::remove_file(&s.log).ok();
        assert!(!st.success(), "{why}: broker started anyway: {log}");
        assert!(log.contains(expect), "{why}: expected {expect:?} in {log:?}");
        s.kill9();
        eprintln!("{why}: {}", log.trim());
    }
    let env = world();
    let run = env.runtime_dir.clone();
    let elsewhere = env.root.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    set_mode(&elsewhere, 0o700);

    std::fs::remove_dir(&run).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &run).unwrap();
    refuses(&env, "runtime dir is a symlink", "is a symlink");
    std::fs::remove_file(&run).unwrap();
    std::fs::create_dir(&run).unwrap();
    set_mode(&run, 0o755);
    refuses(&env, "runtime dir mode 0755", "must be 0700");
    set_mode(&run, 0o700);
    chown(&run, NOBODY);
    refuses(&env, "runtime dir owned by nobody", "owned by uid 65534");
    chown(&run, 0);
    set_mode(&env.state_dir, 0o777);
    refuses(&env, "state dir mode 0777", "must be 0700");
    set_mode(&env.state_dir, 0o700);

    let sock = run.join("broker.sock");
    std::os::unix::fs::symlink(elsewhere.join("x.sock"), &sock).unwrap();
    refuses(&env, "socket path is a symlink", "refusing to replace it");
    std::fs::remove_file(&sock).unwrap();
    drop(UnixListener::bind(&sock).unwrap()); // a stale socket file
    chown(&sock, NOBODY);
    refuses(&env, "stale socket of another uid", "uid 65534");
    // Our own stale socket is replaced.
    chown(&sock, 0);
    let _ok = Serve::start(&env, &[]);
}

/// The client will not talk to a socket it does not own (a listener planted by "another user"),
/// and the broker refuses a client of another uid even when the socket is chmod 0666.
#[test]
fn foreign_sockets_and_foreign_clients_are_refused() {
    let env = world();
    // Planted listener owned by nobody, with a readable secret of ours in place.
    let sock = env.runtime_dir.join("broker.sock");
    std::fs::write(env.runtime_dir.join("secret"), [7u8; 32]).unwrap();
    set_mode(&env.runtime_dir.join("secret"), 0o600);
    let planted = UnixListener::bind(&sock).unwrap();
    planted.set_nonblocking(true).unwrap();
    chown(&sock, NOBODY);
    let (out, took) = run_hook_client(&env, &payload(&env), &[("COURIER_DEBUG", "1")]);
    assert!(out.status.success() && out.stdout.is_empty(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("owned by another user"), "{out:?}");
    assert!(planted.accept().is_err(), "the client connected to a socket it does not own");
    eprintln!("planted socket refused by the client in {took:?}");
    drop(planted);
    std::fs::remove_file(&sock).unwrap();
    std::fs::remove_file(env.runtime_dir.join("secret")).unwrap();

    // A real broker; the door opened wide; a client running as nobody knocks.
    let _serve = Serve::start(&env, &[]);
    set_mode(&env.root, 0o711);
    set_mode(&env.runtime_dir, 0o711);
    set_mode(&sock, 0o666);
    let script = r#"
import socket, sys, json, struct
s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1])
print("connected")
body = json.dumps({"op": "status", "v": 1}).encode()
try:
    s.sendall(struct.pack(">I", len(body)) + body)
    print("closed" if s.recv(100) == b"" else "answered")
except (ConnectionResetError, BrokenPipeError):
    print("closed")
"#;
    let out = run_bounded(
        Command::new("/usr/bin/python3").args(["-c", script]).arg(&sock).uid(NOBODY).gid(NOBODY).current_dir("/"),
        Duration::from_secs(30),
    );
    set_mode(&env.runtime_dir, 0o700);
    set_mode(&env.root, 0o700);
    assert!(out.status.success(), "nobody could not even connect: {out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "connected\nclosed", "connected, then closed unanswered");
    let r = wait_until(Duration::from_secs(5), "peer_uid refusal", || {
        refusals(&Broker::cli_only(&env).inspect_json()).into_iter().find(|r| r["reason"] == "peer_uid")
    });
    assert!(r["detail"].as_str().unwrap().contains("65534"), "{r}");
}

/// State directory on a 4 MiB tmpfs, filled up: `broker send` fails with a clear error, what was
/// queued stays queued and consistent, hooks keep being answered, and after space is freed the
/// queue delivers everything exactly once.
#[test]
fn disk_full_keeps_queue_consistent_and_hooks_answered() {
    let env = world();
    let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs"]).arg(&env.state_dir).status().unwrap();
    assert!(mounted.success(), "mount -t tmpfs failed (this test needs root)");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(env.state_dir.clone());
    let serve = Serve::start(&env, &[]);
    Broker::cli_only(&env).trust_codex(standin_codex());
    // Minted a minute ago: `send` does not wait for a fresh thread's rollout (3 s a send).
    let thread = fake_uuid_v7_minted_ago(Duration::from_secs(60));
    // No stand-in yet: messages queue up.
    let body = "x".repeat(4000);
    let mut queued: Vec<String> = (0..4)
        .map(|i| {
            let key = format!("before{i}");
            Broker::cli_only(&env).run_ok(&["send", "--thread", &thread, "--future-thread", "--key", &key, &body]).trim().to_string()
        })
        .collect();
    let filler = env.state_dir.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let chunk = vec![0u8; 4096];
    while f.write_all(&chunk).is_ok() {}
    drop(f);
    // Sends until one cannot be stored (the WAL may still have room for a few).
    let mut error = None;
    for i in 0..200 {
        let out = Broker::cli_only(&env).run(&["send", "--thread", &thread, "--future-thread", "--key", &format!("full{i}"), &body]);
        if out.status.success() {
            queued.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
        } else {
            error = Some(String::from_utf8_lossy(&out.stderr).into_owned());
            break;
        }
    }
    let error = error.expect("no send failed on a full disk");
    eprintln!("send on a full disk: {}", error.trim());
    assert!(error.contains("full") && error.contains("nothing was queued"), "unclear error: {error}");
    // What was queued is still on record, unchanged, while the disk is full.
    let on_record = messages_by_id(&Broker::cli_only(&env).inspect_json());
    for id in &queued {
        assert_eq!(on_record[id]["state"], "pending", "{id}");
    }
    // Hooks are still answered (exit 0, within the client's deadline: not failed open), with the
    // disk full. The deadline is 2 s, not 500 ms: on a loaded 2-core machine scheduling alone
    // can pass 500 ms; what is checked is that the broker answers, not how fast the machine is.
    let calls_before = query_status(&env.runtime_dir).expect("broker alive").hook_calls;
    let standin = Standin::start(&env, &thread, 2, &[("COURIER_DEBUG", "1"), ("COURIER_HOOK_DEADLINE_MS", "2000")]);
    wait_until(Duration::from_secs(20), "hook calls answered on the full disk", || {
        query_status(&env.runtime_dir).filter(|st| st.hook_calls >= calls_before + 4).map(|_| ())
    });
    std::fs::remove_file(&filler).unwrap();
    for id in &queued {
        wait_until(Duration::from_secs(20), "delivery after space returned", || {
            (messages_by_id(&Broker::cli_only(&env).inspect_json())[id]["state"] == "confirmed").then_some(())
        });
    }
    let rollout = standin.rollout.clone();
    let calls = standin.finish(Duration::from_secs(30));
    let ro = hook_marker_ids(&rollout);
    for id in &queued {
        assert_eq!(ro.iter().filter(|x| *x == id).count(), 1, "{id} once in the rollout");
    }
    let worst = calls.iter().map(|c| c.ms).fold(0.0, f64::max);
    let bad: Vec<_> = calls.iter().filter(|c| c.rc != 0).collect();
    assert!(bad.is_empty(), "hook calls failed: {bad:?}");
    // A call the broker did not answer fails open with a message on stderr (COURIER_DEBUG).
    let unanswered: Vec<_> = calls.iter().filter(|c| !c.err.is_empty()).collect();
    assert!(unanswered.is_empty(), "hook calls not answered by the broker: {unanswered:?}");
    let integrity = Command::new("sqlite3").arg(env.state_dir.join("queue.sqlite")).arg("pragma integrity_check").output();
    if let Ok(o) = integrity {
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "ok");
    }
    eprintln!("disk full: {} queued messages all confirmed once; {} hook calls, worst {worst:.1} ms", queued.len(), calls.len());
    drop(serve);
}

/// Fresh 1 GiB executables named `codex` that run hook-client (any same-uid process can make
/// them) cost honest hooks nothing: the broker never hashes on a worker,
/// unknown files go to one low-priority background thread, one at a time. On the old broker each
/// forged call hashed its 1 GiB inline on a worker and the honest calls timed out.
#[test]
fn fresh_codex_binaries_do_not_slow_honest_hooks() {
    let _alone = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    const FORGERS: usize = 24;
    const AT_ONCE: usize = 8;
    let env = world();
    let serve = Serve::start(&env, &[]);
    Broker::cli_only(&env).trust_codex(standin_codex());
    let thread = fake_uuid_v7();
    let standin = Standin::start(&env, &thread, 4, &[("COURIER_DEBUG", "1")]);
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    // Calm: the honest calls' own latency in this run, the reference for the ratio below.
    let calm_from = now();
    std::thread::sleep(Duration::from_millis(1500));
    let calm_to = now();

    // The attack: a copy of bash grown (sparsely) to 1 GiB, new for every forger, named codex,
    // running hook-client as its child (`; true` keeps bash as the parent).
    let bash = std::fs::canonicalize("/bin/bash").unwrap();
    let payload_file = env.root.join("forged-payload.json");
    std::fs::write(&payload_file, payload(&env)).unwrap();
    let script = format!("{} < {}; true", hook_client_bin().display(), payload_file.display());
    let attack_from = now();
    let mut running: Vec<std::process::Child> = Vec::new();
    for i in 0..FORGERS {
        let dir = env.root.join(format!("forger-{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("codex");
        // Written by a child process: a file this process held open for writing could be
        // inherited by another test thread's fork for a moment, and exec'ing it then fails
        // with ETXTBSY.
        let made = Command::new("/bin/sh")
            .args(["-c", r#"cp "$1" "$2" && truncate -s 1G "$2" && chmod 755 "$2""#, "sh"])
            .arg(&bash)
            .arg(&exe)
            .status()
            .unwrap();
        assert!(made.success(), "making {exe:?}");
        if running.len() >= AT_ONCE {
            let _ = running.remove(0).wait();
        }
        running.push(env.command(&exe).args(["-c", &script]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap());
    }
    for mut c in running {
        let _ = c.wait();
    }
    // Keep measuring while the broker works through what the forgers left it.
    std::thread::sleep(Duration::from_millis(1500));
    let attack_to = now();
    let st = query_status(&env.runtime_dir).map(|s| format!("{s:?}")).unwrap_or_else(|| "not answering".into());
    let calls = standin.finish(Duration::from_secs(30));
    let window = |a: f64, b: f64| -> Vec<&HookCall> { calls.iter().filter(|c| c.t >= a && c.t <= b).collect() };
    let median = |v: &[&HookCall]| {
        let mut ms: Vec<f64> = v.iter().map(|c| c.ms).collect();
        ms.sort_by(f64::total_cmp);
        ms.get(ms.len() / 2).copied().unwrap_or(0.0)
    };
    let (calm, attacked) = (window(calm_from, calm_to), window(attack_from, attack_to));
    let worst = attacked.iter().map(|c| c.ms).fold(0.0, f64::max);
    let unanswered: Vec<_> = attacked.iter().filter(|c| c.rc != 0 || !c.err.is_empty()).collect();
    eprintln!(
        "{FORGERS} fresh 1 GiB codex binaries: honest calls calm {} (median {:.1} ms), under attack {} (median {:.1} ms, max {worst:.1} ms, unanswered {}); broker {st}",
        calm.len(),
        median(&calm),
        attacked.len(),
        median(&attacked),
        unanswered.len()
    );
    assert!(calm.len() >= 3 && attacked.len() >= 5, "too few honest calls: calm {}, attack {}", calm.len(), attacked.len());
    assert!(unanswered.is_empty(), "honest calls unanswered during the attack: {unanswered:?}");
    assert!(worst < 500.0, "an honest call took {worst:.1} ms under attack (deadline 500)");
    // The medians are reported, not asserted: on a loaded 2-core machine the forgers' own
    // processes (and the nice-19 hashing) slow every process a little. What the old broker failed
    // (5 of 13 honest calls past the deadline) is asserted above: none unanswered, none late.
    let codes = refusal_codes(&env);
    assert!(codes.iter().any(|c| c == "untrusted_codex"), "the forgers were refused: {codes:?}");
    drop(serve);
}

/// The broker's open sockets (its listeners, and connections not yet closed).
fn socket_count(pid: u32) -> usize {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return 0 };
    dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok()).filter(|l| l.to_string_lossy().starts_with("socket:")).count()
}

/// A broker serving one stand-in codex of one thread, its turn open: each call is a
/// PostToolUse after a completed tool call of its own.
struct OneThread {
    codex: Stepped,
    serve: Serve,
    env: CodexEnv,
    thread: String,
}

const TURN: &str = "01a22659-8b4d-7ed0-830a-00efbf9cc079";

impl OneThread {
    fn start() -> OneThread {
        let env = world();
        let serve = Serve::start(&env, &[]);
        Broker::cli_only(&env).trust_codex(standin_codex());
        let thread = fake_uuid_v7();
        let mut codex = Stepped::start(&env, &thread);
        codex.write_to(&thread, records::task_started(TURN));
        OneThread { codex, serve, env, thread }
    }

    /// Tool call `i` completes, then its PostToolUse hook runs; waited for.
    fn call(&mut self, i: usize) -> HookCall {
        let (thread, id) = (&self.thread, format!("call_{i}"));
        self.codex.write_to(thread, records::function_call(&id, TURN, "true"));
        self.codex.write_to(thread, records::exec_completed(thread, TURN, &id));
        let post = json!({"tool_name": "Bash", "tool_input": {"command": "true"}, "tool_response": "", "tool_use_id": id});
        let c = self.codex.hook_start(thread, "PostToolUse", TURN, post, &[], None);
        self.codex.hook_wait(c)
    }
}

/// An idle hook call's connection is not closed the instant its answer is written (that raced
/// the client's read of it), but it is closed soon after with no other call to come: an answered
/// connection never waits for the next hook.
#[test]
fn an_answered_connection_is_closed_without_a_next_call() {
    let mut w = OneThread::start();
    let listening = socket_count(w.serve.pid());
    let call = w.call(0);
    assert_eq!((call.rc, call.out.as_str()), (0, ""), "{call:?}");
    // Closed by the worker's linger, not by another call (none comes).
    let pid = w.serve.pid();
    let closed = courier_tests::util::poll_until(Duration::from_secs(10), || (socket_count(pid) <= listening).then_some(()));
    assert!(closed.is_some(), "the answered connection is still open: {} sockets, {listening} before the call", socket_count(pid));
    // After: `inspect` may call the broker, which would close it too.
    let refused = refusals(&Broker::cli_only(&w.env).inspect_json());
    assert!(refused.is_empty(), "the idle call was not verified: {refused:?}");
}

/// Trust taken back while the broker runs (as `broker uninstall` does, straight in the queue
/// database): the next hook of that codex is refused `untrusted_codex` and handed nothing, though
/// the broker's walk to codex remembers the digest as trusted (its one store read confirms it).
#[test]
fn trust_taken_back_refuses_the_next_hook() {
    let mut w = OneThread::start();
    let first = w.call(0);
    assert_eq!((first.rc, first.out.as_str()), (0, ""), "{first:?}");
    assert!(refusals(&Broker::cli_only(&w.env).inspect_json()).is_empty(), "the first call was verified");

    let mut store = broker_lib::store::Store::open(&w.env.state_dir).unwrap();
    for t in store.trusted_codex().unwrap() {
        assert!(store.untrust_codex(&t.sha256).unwrap());
    }
    drop(store);
    let id = Broker::cli_only(&w.env).run_ok(&["send", "--thread", &w.thread, "not for an untrusted codex"]).trim().to_string();
    let second = w.call(1);
    assert_eq!(second.rc, 0, "{second:?}");
    assert!(!second.out.contains(&id), "an untrusted codex was handed {id}: {second:?}");
    let inspect = Broker::cli_only(&w.env).inspect_json();
    let codes: Vec<String> = refusals(&inspect).iter().filter_map(|r| r["reason"].as_str().map(String::from)).collect();
    assert_eq!(codes, ["untrusted_codex"], "{:?}", refusals(&inspect));
    assert_eq!(messages_by_id(&inspect)[&id]["state"], "pending");
}
