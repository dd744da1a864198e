//! In-process benchmarks of the broker's hook path: `cargo bench -p broker --bench hot_path`.
//!
//! std::time only (no criterion: the figures we care about are ratios between variants measured
//! in the same run, interleaved block by block, which a dozen lines do; criterion would add ~40
//! crates to build on a shared 2-core machine). Prints ns/op (median over blocks) and ratios.
//!
//! - `Gate::verify` against the stand-in Codex (`broker::codex::standin`: a copy of python3 with unique
//!   bytes appended, trusted by digest, holding the rollout O_APPEND and the thread-writer flock) whose child (the real
//!   python3, registered as the installed client) is connected to a socket: 1 thread vs 100 threads
//!   held, 1 MB vs 1 GB rollout.
//! - `RolloutTracker::update` on 1 MB vs 1 GB rollouts: steady state (nothing new) and first sight.
//! - Store: `enqueue`, `has_pending`, `lease` + `ack` (SQLite WAL, synchronous=FULL: fsync-bound).
//!
//! Env: `COURIER_BENCH_BIG_MB` (size of the big rollout, default 1024), `COURIER_BENCH_ROUNDS`.

use broker::codex::rollout::{RolloutIdentity, RolloutTracker};
use broker::codex::standin::{self, Standin};
use broker::gate::{self, Gate, GateConfig, HookRequest, Peer};
use broker::store::{Channel, HandOff, Store};
use codex_format::hook::HookEvent;
use courier_shared::auth;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

const SECRET: auth::Secret = [7u8; 32];

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn uuid(n: u64) -> String {
    format!("01a22659-8b33-7382-a4b5-{n:012x}")
}

fn thread_id(n: u64) -> courier_shared::ids::ThreadId {
    courier_shared::ids::ThreadId::parse(&uuid(n)).unwrap()
}

struct Thread {
    id: String,
    turn: String,
    path: PathBuf,
    lock: PathBuf,
}

struct World {
    dir: PathBuf,
    codex_home: PathBuf,
    listener: UnixListener,
    sock: PathBuf,
    next: u64,
}

fn filler_block() -> Vec<u8> {
    let line = format!(
        r#"{{"timestamp":"2026-11-29T08:08:53.000Z","ordinal":5,"type":"response_item","payload":{{"type":"function_call_output","call_id":"call_0001","output":"{}"}}}}"#,
        "y".repeat(900)
    ) + "\n";
    line.repeat((1 << 20) / line.len()).into_bytes()
}

impl World {
    fn new() -> World {
        let dir = std::env::temp_dir().join(format!("courier-hot-path-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let dir = std::fs::canonicalize(&dir).unwrap();
        let codex_home = dir.join("codex-home");
        std::fs::create_dir_all(codex_home.join("sessions/2026/11/29")).unwrap();
        std::fs::create_dir_all(codex_home.join("thread-writer-locks")).unwrap();
        let sock = dir.join("s.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        World { dir, codex_home, listener, sock, next: 1 }
    }

    /// A rollout of about `size` bytes with an open turn at its end.
    fn thread(&mut self, size: u64) -> Thread {
        let id = uuid(self.next);
        let turn = uuid(0xf000_0000 + self.next);
        self.next += 1;
        let path = self.codex_home.join(format!("sessions/2026/11/29/rollout-2026-11-29T08-08-52-{id}.jsonl"));
        let mut f = std::io::BufWriter::new(File::create(&path).unwrap());
        f.write_all(standin::meta_line(&id, &id).as_bytes()).unwrap();
        let block = filler_block();
        let mut left = size;
        while left >= block.len() as u64 {
            f.write_all(&block).unwrap();
            left -= block.len() as u64;
        }
        f.write_all(standin::started(&turn).as_bytes()).unwrap();
        f.flush().unwrap();
        let lock = self.codex_home.join(format!("thread-writer-locks/{id}.lock"));
        Thread { id, turn, path, lock }
    }

    fn gate(&self) -> Gate {
        let m = std::fs::metadata(standin::python()).unwrap();
        Gate::new(GateConfig {
            codex_home: self.codex_home.clone(),
            installed_clients: vec![broker::os::FileKey { dev: m.dev(), ino: m.ino() }],
            secret: SECRET,
        })
    }

    /// A stand-in codex holding `threads`, with one connected child peer.
    fn codex_with_peer(&self, threads: &[&Thread]) -> (Standin, Peer, UnixStream) {
        let mut s = Standin::start(&standin::bins().codex, &[]);
        for t in threads {
            s.cmd(serde_json::json!({"op": "open_rollout", "path": t.path}));
            s.cmd(serde_json::json!({"op": "lock", "path": t.lock}));
        }
        s.spawn_peer(&self.sock);
        let (stream, _) = self.listener.accept().unwrap();
        let peer = gate::identify(&stream).unwrap_or_else(|r| panic!("identify: {r}"));
        (s, peer, stream)
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn payload(t: &Thread) -> String {
    serde_json::json!({
        "session_id": t.id, "turn_id": t.turn, "transcript_path": t.path, "cwd": "/home/dev/probe/work",
        "hook_event_name": "PostToolUse", "model": "gpt-5.1-codex", "permission_mode": "bypassPermissions",
        "tool_name": "Bash", "tool_input": {"command": "echo hello"}, "tool_response": "hello\n", "tool_use_id": "call_0002"
    })
    .to_string()
}

/// One verification setup: a gate, a peer, a signed request.
struct Verify<'a> {
    gate: Gate,
    peer: Peer,
    payload: String,
    digest: &'a str,
    _keep: (Standin, UnixStream),
}

impl Verify<'_> {
    fn block(&self, ops: usize) -> f64 {
        let ts = now_ms();
        let mac = auth::sign(&SECRET, self.peer.pid as u32, ts, self.payload.as_bytes());
        let req = HookRequest { pid: self.peer.pid as u32, ts_ms: ts, payload: &self.payload, mac: &mac };
        let trusted = |d: &str| d == self.digest;
        let t0 = Instant::now();
        for _ in 0..ops {
            if let Err(r) = self.gate.verify(&self.peer, &req, &trusted) {
                let _ = std::process::Command::new("sh").arg("-c").arg("ls -i /tmp/courier-hot-path-*/codex-home/thread-writer-locks | head -5; ps -ef | grep -v grep | grep -E \"codex|peer|socket\" | head").status();
                panic!("verify refused: {r}\n{}", std::fs::read_to_string("/proc/locks").unwrap_or_default());
            }
        }
        t0.elapsed().as_nanos() as f64 / ops as f64
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Runs the variants block by block, interleaved, `rounds` times; returns median ns/op of each.
fn interleaved(rounds: usize, variants: &mut [(&str, &mut dyn FnMut() -> f64)]) -> Vec<f64> {
    let mut got: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for r in 0..rounds {
        let n = variants.len();
        for k in 0..n {
            let i = if r % 2 == 0 { k } else { n - 1 - k };
            got[i].push((variants[i].1)());
        }
    }
    let meds: Vec<f64> = got.into_iter().map(median).collect();
    for (i, (name, _)) in variants.iter().enumerate() {
        println!("  {name:<44} {:>12.0} ns/op   x{:.3} vs first", meds[i], meds[i] / meds[0]);
    }
    meds
}

fn main() {
    // `cargo bench` passes --bench; a filter argument selects sections by substring.
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let on = |s: &str| filter.is_empty() || filter.iter().any(|f| s.contains(f.as_str()) || f.contains(s));
    let rounds: usize = std::env::var("COURIER_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(15);
    let big_mb: u64 = std::env::var("COURIER_BENCH_BIG_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(1024);
    let mut w = World::new();
    let small = w.thread(1 << 20);
    let big = if on("verify") || on("rollout") { Some(w.thread(big_mb << 20)) } else { None };
    println!(
        "hot_path: rounds {rounds}, big rollout {big_mb} MiB, load {}",
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );

    if on("verify") {
        let big = big.as_ref().unwrap();
        let many: Vec<Thread> = (0..100).map(|_| w.thread(64 << 10)).collect();
        let setup = |threads: &[&Thread], t: &Thread| {
            let (s, peer, stream) = w.codex_with_peer(threads);
            let v = Verify { gate: w.gate(), peer, payload: payload(t), digest: &standin::bins().digest, _keep: (s, stream) };
            v.block(3); // first sight of the rollout, digest of the stand-in
            v
        };
        let one = setup(&[&small], &small);
        if on("verify-one") && !on("verify-many") {
            // Profiling aid: only the common case.
            println!("\nGate::verify, codex holds 1 thread");
            interleaved(rounds, &mut [("verify, codex holds 1 thread, 1 MiB rollout", &mut || one.block(200))]);
            return;
        }
        // A second stand-in (it cannot take `small`'s flock): 100 other threads, verify the first.
        let hundred_threads: Vec<&Thread> = many.iter().collect();
        let v100 = setup(&hundred_threads, &many[0]);
        let vbig = setup(&[big], big);
        println!("\nGate::verify (full gate, stand-in codex)");
        interleaved(
            rounds,
            &mut [
                ("verify, codex holds 1 thread, 1 MiB rollout", &mut || one.block(200)),
                ("verify, codex holds 100 threads", &mut || v100.block(200)),
                ("verify, 1 GiB rollout", &mut || vbig.block(200)),
            ],
        );
        drop((one, v100, vbig));
    }

    if on("rollout") {
        let big = big.as_ref().unwrap();
        println!("\nRolloutTracker::update");
        let open = |t: &Thread| {
            let f = File::open(&t.path).unwrap();
            let m = f.metadata().unwrap();
            (f, RolloutIdentity { dev: m.dev(), ino: m.ino(), btime_sec: 0, btime_nsec: 0 }, m.len())
        };
        let (fs, is, ls) = open(&small);
        let (fb, ib, lb) = open(big);
        let tr = RolloutTracker::new();
        let first_small = tr.update(&small.path, &fs, is, ls).unwrap();
        let first_big = tr.update(&big.path, &fb, ib, lb).unwrap();
        println!(
            "  first sight reads {} bytes of the 1 MiB rollout, {} bytes of the {big_mb} MiB one",
            first_small.bytes_read, first_big.bytes_read
        );
        let steady = |p: &Path, f: &File, id: RolloutIdentity, len: u64| {
            let t0 = Instant::now();
            for _ in 0..2000 {
                let s = tr.update(p, f, id, len).unwrap();
                assert_eq!(s.bytes_read, 0);
            }
            t0.elapsed().as_nanos() as f64 / 2000.0
        };
        interleaved(
            rounds,
            &mut [
                ("steady state, 1 MiB", &mut || steady(&small.path, &fs, is, ls)),
                ("steady state, big", &mut || steady(&big.path, &fb, ib, lb)),
            ],
        );
        let first = |p: &Path, f: &File, id: RolloutIdentity, len: u64| {
            let t0 = Instant::now();
            for _ in 0..20 {
                let fresh = RolloutTracker::new();
                fresh.update(p, f, id, len).unwrap();
            }
            t0.elapsed().as_nanos() as f64 / 20.0
        };
        interleaved(
            rounds,
            &mut [
                ("first sight (backward scan), 1 MiB", &mut || first(&small.path, &fs, is, ls)),
                ("first sight (backward scan), big", &mut || first(&big.path, &fb, ib, lb)),
            ],
        );
    }

    if on("store") {
        println!("\nStore (SQLite WAL, synchronous=FULL)");
        let dir = w.dir.join("state");
        std::fs::create_dir_all(&dir).unwrap();
        let mut store = Store::open(&dir).unwrap();
        let t = thread_id(0xabc);
        // Other threads' backlog, so the indexes matter.
        for i in 0..2000 {
            store.enqueue(&thread_id(0x100000 + i % 100), "backlog", None, None, None).unwrap();
        }
        for _ in 0..10 * rounds {
            store.enqueue(&t, "hello from the bench", None, None, None).unwrap();
        }
        let store = std::cell::RefCell::new(store);
        let idle = thread_id(0xdef);
        interleaved(
            rounds,
            &mut [
                ("has_pending (nothing pending)", &mut || {
                    let s = store.borrow();
                    let t0 = Instant::now();
                    for _ in 0..2000 {
                        assert!(!s.has_pending(&idle).unwrap());
                    }
                    t0.elapsed().as_nanos() as f64 / 2000.0
                }),
                ("enqueue", &mut || {
                    let mut s = store.borrow_mut();
                    let t0 = Instant::now();
                    for _ in 0..10 {
                        s.enqueue(&t, "hello from the bench", None, None, None).unwrap();
                    }
                    t0.elapsed().as_nanos() as f64 / 10.0
                }),
                ("lease + ack (one message)", &mut || {
                    let mut s = store.borrow_mut();
                    let t0 = Instant::now();
                    for _ in 0..10 {
                        let l = s
                            .lease(&t, Channel::Hook(HookEvent::PostToolUse), Some("turn"), 3000, 150)
                            .unwrap()
                            .expect("a pending message");
                        let codex = broker::os::ProcessKey { pid: 1, starttime: 2 };
                        let record = HandOff::at("/r", 0, codex);
                        assert!(s.hand_off(l.token, &record).unwrap());
                    }
                    t0.elapsed().as_nanos() as f64 / 10.0
                }),
            ],
        );
    }
}
