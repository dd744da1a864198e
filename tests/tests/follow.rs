//! What the broker's Codex follower and digest lanes do with files a model-run command can plant
//! under `$CODEX_HOME/packages/app-server-daemon/releases/` (CODEX_HOME is writable to sandboxed
//! tool commands when it lies under /tmp, as here): nothing there is executed or trusted for being
//! there, a flood of such files costs honest hooks nothing, and a 1 TiB one is never read.
//!
//! A followed `codex` command stands in for the user's own (`broker trust-codex` with it on
//! PATH): a directory holding a python3 copy with unique bytes, "upgraded" by renaming a new copy
//! over it, as an installer does. Its being followed proves the follower is alive and has passed
//! over whatever was planted before.
//!
//! Knobs: `COURIER_FLOOD_SECS` (default 4), `COURIER_FLOOD_AT_ONCE` (forgers at once, default 24).

use broker_lib::client::query_status;
use courier_tests::standin::{standin_codex, world, HookCall, Standin};
use courier_tests::util::{fake_uuid_v7, wait_until};
use courier_tests::{hook_client_bin, Broker, CodexEnv, Serve};
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// These tests measure the broker's CPU and latencies: they take turns.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn releases(env: &CodexEnv) -> PathBuf {
    env.codex_home.join("packages/app-server-daemon/releases")
}

fn executable(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A python3 copy with `tag` appended: a whole ELF that answers `--version` ("Python 3.x.y").
fn python_copy(tag: &str) -> Vec<u8> {
    let mut b = std::fs::read(std::fs::canonicalize("/usr/bin/python3").unwrap()).unwrap();
    b.extend_from_slice(format!("\ncourier-follow-test {tag} {}\n", fake_uuid_v7()).as_bytes());
    b
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    courier_shared::auth::hex(&Sha256::digest(bytes))
}

/// The user's own `codex`: `<root>/user-bin/codex`, trusted and followed by `broker trust-codex`.
fn follow_user_codex(env: &CodexEnv) -> PathBuf {
    let command = env.root.join("user-bin/codex");
    executable(&command, &python_copy("v0"));
    let out = courier_tests::broker::run_bounded(
        env.command(courier_tests::broker::broker_bin()).arg("trust-codex").env("PATH", command.parent().unwrap()),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "trust-codex: {out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("following"), "{out:?}");
    command
}

/// Upgrades the followed command in place and waits (bounded) until the broker trusts the new
/// binary as `followed`; returns how long that took.
fn upgrade_and_wait(env: &CodexEnv, command: &Path, tag: &str, within: Duration) -> Duration {
    let bytes = python_copy(tag);
    let digest = sha256(&bytes);
    let next = command.with_file_name(".codex.new");
    executable(&next, &bytes);
    let start = Instant::now();
    std::fs::rename(&next, command).unwrap();
    wait_until(within, &format!("the broker to follow the upgrade to {tag}"), || {
        trusted(env).iter().any(|t| t["sha256"] == digest.as_str() && t["how"] == "followed").then_some(())
    });
    start.elapsed()
}

fn trusted(env: &CodexEnv) -> Vec<Value> {
    Broker::cli_only(env).inspect_json()["trusted_codex"].as_array().cloned().unwrap_or_default()
}

/// CPU seconds the process has used (utime + stime).
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0 // USER_HZ, 100 on Linux
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// Planted under `releases/`: a script that says it is Codex (and leaves a mark if run), a
/// python3 copy that answers `--version`, a directory link and a file link out of `releases/`.
/// The broker runs none of them and trusts none of them, while it still follows the user's own
/// `codex`. (Before: all of them ran with no sandbox and became `trusted_codex`, `followed`.)
#[test]
fn planted_release_binaries_are_never_run_nor_trusted() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let env = world();
    let serve = Serve::start(&env, &[]);
    let command = follow_user_codex(&env);
    let rel = releases(&env);
    let ran = env.root.join("planted-script-ran");
    let script = format!("#!/bin/sh\ntouch {}\necho codex-cli 0.171.0\n", ran.display());
    executable(&rel.join("0.171.0-x86_64-unknown-linux-musl/bin/codex"), script.as_bytes());
    let python = python_copy("planted");
    executable(&rel.join("0.172.0/bin/codex"), &python);
    let outside = env.root.join("outside");
    let (linked_dir, linked_file) = (python_copy("linked-dir"), python_copy("linked-file"));
    executable(&outside.join("dir/bin/codex"), &linked_dir);
    executable(&outside.join("file"), &linked_file);
    std::os::unix::fs::symlink(outside.join("dir"), rel.join("0.173.0")).unwrap();
    std::fs::create_dir_all(rel.join("0.174.0/bin")).unwrap();
    std::os::unix::fs::symlink(outside.join("file"), rel.join("0.174.0/bin/codex")).unwrap();

    // Two upgrades after the plants, each followed: the pass that saw the plants is over.
    upgrade_and_wait(&env, &command, "v1", Duration::from_secs(20));
    upgrade_and_wait(&env, &command, "v2", Duration::from_secs(20));

    assert!(!ran.exists(), "the broker executed a planted release binary");
    let all = trusted(&env);
    let planted = [sha256(script.as_bytes()), sha256(&python), sha256(&linked_dir), sha256(&linked_file)];
    for t in &all {
        let path = t["path"].as_str().unwrap_or("");
        assert!(!planted.iter().any(|d| t["sha256"] == d.as_str()), "a planted binary is trusted: {t}");
        assert!(!path.starts_with(rel.to_str().unwrap()) && !path.starts_with(outside.to_str().unwrap()), "{t}");
    }
    let log = std::fs::read_to_string(&serve.log).unwrap_or_default();
    assert!(!log.contains("does not answer --version"), "a candidate was run:\n{log}");
}

/// `truncate -s 1T releases/huge/bin/codex`: the broker never reads it (its CPU stays idle) and
/// keeps following the user's upgrades. (Before: the follower hashed it at 99% of a core and
/// followed nothing more.)
#[test]
fn a_one_tib_sparse_release_is_never_read() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let env = world();
    let serve = Serve::start(&env, &[]);
    let command = follow_user_codex(&env);
    let huge = releases(&env).join("huge/bin/codex");
    executable(&huge, b"");
    std::fs::OpenOptions::new().write(true).open(&huge).unwrap().set_len(1 << 40).unwrap();
    let cpu_before = cpu_secs(serve.pid());
    // Two upgrades: the first may be followed in the same pass that meets the 1 TiB file.
    let took = upgrade_and_wait(&env, &command, "after-huge", Duration::from_secs(15))
        + upgrade_and_wait(&env, &command, "after-huge-2", Duration::from_secs(15));
    // The passes that saw the 1 TiB file are over; the broker should now be idle.
    let (t0, c0) = (Instant::now(), cpu_secs(serve.pid()));
    std::thread::sleep(Duration::from_secs(2));
    let busy = (cpu_secs(serve.pid()) - c0) / t0.elapsed().as_secs_f64();
    eprintln!(
        "1 TiB release: upgrades followed in {took:?}; broker CPU {:.2}s since the plant, then {:.0}% of a core",
        c0 - cpu_before,
        busy * 100.0
    );
    assert!(busy < 0.25, "the broker is busy ({:.0}% of a core) with the 1 TiB file", busy * 100.0);
}

/// Forgers under `releases/` for a few seconds, each a fresh bash copy running hook-client as a
/// hook of its own: half of them the size of the trusted binary (as a byte copy of it would be),
/// so they reach the expected lane. The stand-in's honest hooks are all answered in time, and the
/// broker's fds stay bounded and come back down. (Before, every file under `releases/` was
/// "expected": hashed at normal priority with no queue cap while a worker waited 450 ms for
/// each; honest hooks went unanswered and the queued files' fds piled up.)
#[test]
fn a_release_flood_costs_honest_hooks_nothing() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let knob = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let (secs, at_once) = (knob("COURIER_FLOOD_SECS", 4), knob("COURIER_FLOOD_AT_ONCE", 24) as usize);
    let env = world();
    let serve = Serve::start(&env, &[]);
    Broker::cli_only(&env).trust_codex(standin_codex());
    let thread = fake_uuid_v7();
    // The honest client waits 2 s, not 500 ms: on a loaded 2-core machine scheduling alone can
    // pass 500 ms; what is measured is whether the broker answers honest hooks during the flood.
    let standin = Standin::start(&env, &thread, 4, &[("COURIER_DEBUG", "1"), ("COURIER_HOOK_DEADLINE_MS", "2000")]);
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    std::thread::sleep(Duration::from_millis(1000)); // calm: the stand-in's first calls settle
    let base_fds = fd_count(serve.pid());

    let bash = std::fs::read(std::fs::canonicalize("/bin/bash").unwrap()).unwrap();
    let trusted_size = std::fs::metadata(standin_codex()).unwrap().len();
    let payload_file = env.root.join("forged-payload.json");
    let t = fake_uuid_v7();
    let payload = serde_json::json!({"session_id": t, "turn_id": "x", "hook_event_name": "PostToolUse",
        "transcript_path": env.codex_home.join(format!("sessions/rollout-2026-11-29T08-01-16-{t}.jsonl"))});
    std::fs::write(&payload_file, payload.to_string()).unwrap();
    // Each forger calls several times: a file still queued makes every call of an expected one wait.
    let script = format!("for i in 1 2 3 4 5 6; do {} < {}; done; true", hook_client_bin().display(), payload_file.display());
    let (attack_from, until) = (now(), Instant::now() + Duration::from_secs(secs));
    let (mut running, mut forged, mut max_fds, mut max_queued): (Vec<std::process::Child>, usize, usize, Option<u64>) =
        (Vec::new(), 0, base_fds, Some(0));
    let mut sample = |max_fds: &mut usize| {
        *max_fds = (*max_fds).max(fd_count(serve.pid()));
        // A broker without the counter cannot show its queue is bounded.
        let queued = query_status(&env.runtime_dir).map(|s| s.digests_queued);
        max_queued = max_queued.zip(queued).map(|(a, b)| a.max(b));
    };
    while Instant::now() < until {
        let exe = releases(&env).join(format!("forger-{forged}/bin/codex"));
        executable(&exe, &bash);
        let size = if forged % 2 == 0 { trusted_size.max(bash.len() as u64) } else { 64 << 20 };
        std::fs::OpenOptions::new().write(true).open(&exe).unwrap().set_len(size).unwrap();
        if running.len() >= at_once {
            let _ = running.remove(0).wait();
        }
        running.push(env.command(&exe).args(["-c", &script]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap());
        forged += 1;
        sample(&mut max_fds);
    }
    for mut c in running {
        let _ = c.wait();
        sample(&mut max_fds);
    }
    let attack_to = now();
    let calls = standin.finish(Duration::from_secs(30));
    let attacked: Vec<&HookCall> = calls.iter().filter(|c| c.t >= attack_from && c.t <= attack_to).collect();
    let answered = attacked.iter().filter(|c| c.rc == 0 && c.err.is_empty()).count();
    let worst = attacked.iter().map(|c| c.ms).fold(0.0, f64::max);
    // What the forgers left queued drains: every fd they cost comes back.
    let settled = courier_tests::util::poll_until(Duration::from_secs(30), || (fd_count(serve.pid()) <= base_fds + 4).then_some(()));
    let after = fd_count(serve.pid());
    eprintln!(
        "release flood: {forged} forgers over {secs}s ({at_once} at once): honest hooks answered {answered} of {} (worst {worst:.1} ms); \
         broker fds {base_fds} calm, {max_fds} max, {after} after; digests queued at most {max_queued:?}",
        attacked.len()
    );
    assert!(attacked.len() >= 5, "too few honest calls during the flood: {}", attacked.len());
    assert_eq!(answered, attacked.len(), "honest hooks unanswered during the flood (worst {worst:.1} ms)");
    // Each forger in flight costs a socket, a pidfd and little else; each queued file one fd.
    assert!(max_queued.is_some_and(|q| q <= 20), "digest queue unbounded: {max_queued:?}");
    assert!(max_fds <= base_fds + 3 * at_once + 30, "broker fds grew from {base_fds} to {max_fds}");
    assert!(settled.is_some(), "broker fds did not come back down: {base_fds} calm, {after} after");
}
