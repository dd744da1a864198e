//! The broker as a daemon: where it runs, what environment it keeps, what it says at start and
//! stop, what it leaves behind, and that a second broker cannot take over a live one's socket.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

use courier_tests::broker::{assert_log_levelled, broker_bin, run_bounded};
use courier_tests::util::{poll_until, wait_until};
use courier_tests::CodexEnv;
use serde_json::Value;

const T: Duration = Duration::from_secs(20);

fn env() -> CodexEnv {
    courier_tests::standin::world()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// pid of the broker answering for `env`, if any.
fn answering(env: &CodexEnv) -> Option<u32> {
    let out = run_bounded(env.command(broker_bin()).args(["inspect", "--json"]), T);
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    v.pointer("/broker/pid").and_then(Value::as_u64).map(|p| p as u32)
}

/// `broker serve` in the foreground with output to `log`, cwd = the env's work dir.
fn spawn_serve(env: &CodexEnv, log: &Path, extra: &[(&str, &Path)]) -> Child {
    let logf = std::fs::File::create(log).unwrap();
    let mut cmd = env.command(broker_bin());
    cmd.arg("serve").stdout(logf.try_clone().unwrap()).stderr(logf);
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

fn wait_exit(child: &mut Child) -> ExitStatus {
    poll_until(T, || child.try_wait().ok().flatten()).unwrap_or_else(|| {
        let _ = child.kill();
        panic!("broker did not exit within {T:?}")
    })
}

fn signal(pid: u32, sig: &str) {
    assert!(Command::new("kill").args([&format!("-{sig}"), &pid.to_string()]).status().unwrap().success());
}

fn cwd_of(pid: u32) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap()
}

/// `broker serve` moves to `/`, logs a line when it starts and one when it stops, and removes
/// its socket on SIGTERM and on SIGINT (exit 0).
#[test]
fn serve_runs_in_root_logs_start_and_stop_and_removes_its_socket_on_signals() {
    let env = env();
    let socket = env.runtime_dir.join("broker.sock");
    for sig in ["TERM", "INT"] {
        let log = env.root.join(format!("serve-{sig}.log"));
        let mut child = spawn_serve(&env, &log, &[]);
        let pid = wait_until(T, "the broker to answer", || answering(&env));
        assert_eq!(pid, child.id());
        assert_eq!(cwd_of(pid), Path::new("/"), "broker serve keeps its start directory");
        assert!(socket.exists());
        signal(pid, sig);
        let status = wait_exit(&mut child);
        let logged = std::fs::read_to_string(&log).unwrap();
        assert!(status.success(), "SIG{sig}: {status}\n{logged}");
        assert!(!socket.exists(), "SIG{sig} left the socket behind\n{logged}");
        assert!(logged.contains(&format!("info: broker {} started: pid {pid} serving", env!("CARGO_PKG_VERSION"))), "{logged}");
        assert!(logged.contains(&format!("info: broker stopped on SIG{sig}: pid {pid}")) && logged.contains("removed socket"), "{logged}");
        assert_log_levelled(&logged);
    }
}

/// A second `broker serve` for the same runtime directory refuses to start, even pointed at
/// another state directory, and the live broker keeps its socket and keeps answering.
#[test]
fn second_broker_on_the_same_runtime_directory_refuses_even_with_another_state_dir() {
    let env = env();
    let socket = env.runtime_dir.join("broker.sock");
    let mut first = spawn_serve(&env, &env.root.join("first.log"), &[]);
    let pid = wait_until(T, "the first broker to answer", || answering(&env));
    let ino = std::fs::metadata(&socket).unwrap().ino();

    let other_state = env.root.join("other-state");
    let log = env.root.join("second.log");
    let mut second = spawn_serve(&env, &log, &[("COURIER_STATE_DIR", &other_state)]);
    let status = wait_exit(&mut second);
    let logged = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(1), "{logged}");
    assert!(
        logged.contains("error: another broker already runs with this runtime directory") && logged.contains(&format!("pid {pid}")),
        "{logged}"
    );
    assert_log_levelled(&logged);
    assert_eq!(std::fs::metadata(&socket).map(|m| m.ino()).ok(), Some(ino), "the live broker's socket was replaced\n{logged}");
    assert_eq!(answering(&env), Some(pid));
    assert!(first.try_wait().unwrap().is_none());
    let _ = first.kill();
    let _ = first.wait();
}

/// The one-broker lock cannot be renamed away. With the live broker's lock files renamed
/// (`broker.lock` in the runtime and state directories, where earlier brokers kept the lock),
/// a second `broker serve` on the same directories refuses to start; so does one pointed at
/// fresh directories holding a hard link to the live queue. The live broker keeps its socket
/// and keeps answering.
#[test]
fn a_second_broker_refuses_with_the_lock_files_renamed_or_the_queue_linked() {
    let env = env();
    let socket = env.runtime_dir.join("broker.sock");
    let mut first = spawn_serve(&env, &env.root.join("first.log"), &[]);
    let pid = wait_until(T, "the first broker to answer", || answering(&env));
    let ino = std::fs::metadata(&socket).unwrap().ino();
    for dir in [&env.runtime_dir, &env.state_dir] {
        let lock = dir.join("broker.lock");
        if lock.exists() {
            std::fs::rename(&lock, dir.join("broker.lock.moved")).unwrap();
        }
    }
    let (linked_state, linked_runtime) = (env.root.join("linked-state"), env.root.join("linked-runtime"));
    std::fs::create_dir_all(&linked_state).unwrap();
    std::fs::set_permissions(&linked_state, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    std::fs::hard_link(env.state_dir.join("queue.sqlite"), linked_state.join("queue.sqlite")).unwrap();
    let attempts = [
        ("renamed", Vec::new(), "this runtime directory"),
        ("linked", vec![("COURIER_STATE_DIR", linked_state.as_path()), ("COURIER_RUNTIME_DIR", linked_runtime.as_path())], "this queue"),
    ];
    for (name, extra, what) in attempts {
        let log = env.root.join(format!("{name}.log"));
        let mut second = spawn_serve(&env, &log, &extra);
        let status = wait_exit(&mut second);
        let logged = std::fs::read_to_string(&log).unwrap();
        assert_eq!(status.code(), Some(1), "{name}: {logged}");
        assert!(
            logged.contains(&format!("error: another broker already runs with {what}")) && logged.contains(&format!("pid {pid}")),
            "{name}: {logged}"
        );
        assert_eq!(std::fs::metadata(&socket).map(|m| m.ino()).ok(), Some(ino), "{name}: the live broker's socket was replaced\n{logged}");
        assert_eq!(answering(&env), Some(pid), "{name}");
    }
    assert!(first.try_wait().unwrap().is_none());
    let _ = first.kill();
    let _ = first.wait();
}

/// `broker serve --daemonize` (what the login-profile line runs) starts a broker that keeps only
/// the environment it needs and runs in `/`, whatever shell started it; the log file it writes
/// says when it started and stopped.
#[test]
fn daemonized_broker_keeps_only_the_environment_it_needs() {
    let env = env();
    let mut cmd = env.command(broker_bin());
    cmd.args(["serve", "--daemonize"])
        .env("CODEX_TOOL_CALL_ID", "call_123")
        .env("CODEX_THREAD_ID", "01a22697-e084-7cd1-87d6-79211908eea0")
        .env("GITHUB_TOKEN", "ghp_not_for_the_broker")
        .env("COURIER_LOG", "debug")
        .env("LC_ALL", "C.UTF-8")
        .env("XDG_DATA_HOME", env.root.join("xdg-data"));
    let out = run_bounded(&mut cmd, T);
    assert!(out.status.success() && text(&out.stdout).contains("broker started"), "{out:?}");
    let pid = wait_until(T, "the daemonized broker to answer", || answering(&env));
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let names: Vec<String> =
        environ.split(|b| *b == 0).filter(|v| !v.is_empty()).map(|v| text(v).split('=').next().unwrap().to_string()).collect();
    let kept = |n: &str| {
        broker_lib::install::DAEMON_ENV.contains(&n)
            || n == "CODEX_HOME"
            || broker_lib::install::DAEMON_ENV_PREFIXES.iter().any(|p| n.starts_with(p))
    };
    assert!(names.iter().all(|n| kept(n)), "the daemon kept {names:?}");
    for n in ["HOME", "PATH", "CODEX_HOME", "COURIER_STATE_DIR", "COURIER_RUNTIME_DIR", "COURIER_LOG", "LC_ALL", "XDG_DATA_HOME"] {
        assert!(names.iter().any(|k| k == n), "{n} dropped: {names:?}");
    }
    for n in ["CODEX_TOOL_CALL_ID", "CODEX_THREAD_ID", "GITHUB_TOKEN", "SHELL", "MOCK_API_KEY"] {
        assert!(!names.iter().any(|k| k == n), "{n} kept: {names:?}");
    }
    assert_eq!(cwd_of(pid), Path::new("/"));

    signal(pid, "TERM");
    wait_until(T, "the daemon to exit", || (!Path::new(&format!("/proc/{pid}")).exists() || answering(&env).is_none()).then_some(()));
    let log = env.state_dir.join("broker.log");
    let logged = wait_until(T, "the stop line in broker.log", || {
        let l = std::fs::read_to_string(&log).unwrap_or_default();
        l.contains("info: broker stopped on SIGTERM").then_some(l)
    });
    assert!(logged.contains(&format!("started: pid {pid}")), "{logged}");
    assert!(!env.runtime_dir.join("broker.sock").exists(), "{logged}");
    assert_log_levelled(&logged);
}

/// A login shell with the profile block and one without, measured in the same run.
struct Logins {
    with_block: CodexEnv,
    /// A HOME whose profile starts `broker --version` in the background as the block starts
    /// `broker serve --login`: the same executable started the same way, so the ratio measures
    /// only what the broker's state adds.
    reference_home: PathBuf,
}

impl Logins {
    fn new(env: CodexEnv) -> Logins {
        let block = broker_lib::install::profile_block(&broker_bin(), &env.codex_home);
        std::fs::write(env.home.join(".profile"), block).unwrap();
        let reference_home = env.root.join("reference-home");
        std::fs::create_dir_all(&reference_home).unwrap();
        let b = broker_bin().display().to_string();
        std::fs::write(
            reference_home.join(".profile"),
            format!("if [ -x '{b}' ]; then ('{b}' --version </dev/null >/dev/null 2>&1 &); fi\n"),
        )
        .unwrap();
        Logins { with_block: env, reference_home }
    }

    /// One `bash -lc true`, with the block or with the reference profile; its wall time.
    fn login(&self, block: bool) -> Duration {
        let mut cmd = self.with_block.command(Path::new("/bin/bash"));
        cmd.args(["-lc", "true"]);
        if !block {
            cmd.env("HOME", &self.reference_home);
        }
        let start = std::time::Instant::now();
        let out = run_bounded(&mut cmd, T);
        let took = start.elapsed();
        assert!(out.status.success(), "{out:?}");
        took
    }

    /// Median login with the block and with the reference profile, over runs taken in turns so
    /// both see the same load.
    fn medians(&self, runs: usize) -> (Duration, Duration) {
        let (mut with, mut without) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            with.push(self.login(true));
            without.push(self.login(false));
        }
        let median = |v: &mut Vec<Duration>| {
            v.sort();
            v[v.len() / 2]
        };
        (median(&mut with), median(&mut without))
    }

    fn assert_quick(&self, state: &str) {
        // Waiting on the broker at all (a connect, a lock, a timeout) costs far more than a fork;
        // medians of a few tens of milliseconds still swing by half when other tests run beside.
        let (w, reference) = self.medians(9);
        let ratio = w.as_secs_f64() / reference.as_secs_f64().max(1e-6);
        eprintln!("login shell, broker {state}: median {w:?} with the block, {reference:?} with the reference: {ratio:.2}x");
        assert!(ratio <= 3.0, "broker {state}: the login with the block took {ratio:.2}x the reference ({w:?} vs {reference:?})");
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.with_block.state_dir.join("broker.log")).unwrap_or_default()
    }

    fn wait_log(&self, what: &str, needle: &str) -> String {
        wait_until(T, what, || {
            let l = self.log();
            l.contains(needle).then_some(l)
        })
    }
}

fn broker_cmd(env: &CodexEnv, args: &[&str]) -> String {
    let out = run_bounded(env.command(broker_bin()).args(args), T);
    assert!(out.status.success(), "broker {args:?}: {}\n{}", text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

/// A process holding the instance lock (a broker half-started, or exiting) until its stdin
/// closes. `-o`: the lock stays with flock itself (not inherited by `cat`), so flock's exit frees
/// it; `cat` ends when its stdin (ours) closes, even if the test panics first, and holds none of
/// the test run's output.
fn hold_instance_lock(env: &CodexEnv) -> Child {
    let holder = queue_for_instance_lock(env);
    wait_until(T, "flock to hold the lock", || broker_lib::install::instance_holder(&env.runtime_dir).map(|_| ()));
    holder
}

/// `flock -o RUNTIME_DIR cat`, started now: it takes the instance lock (a `flock` on the runtime
/// directory itself) as soon as it is free and keeps it until its stdin closes
/// ([`hold_instance_lock`] says why each part is so).
fn queue_for_instance_lock(env: &CodexEnv) -> Child {
    Command::new("flock")
        .arg("-o")
        .arg(&env.runtime_dir)
        .arg("cat")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

fn gone(pid: u32) -> bool {
    !courier_tests::util::pid_alive(pid)
}

/// The login-profile line never waits on the broker: with the broker missing, hung (SIGSTOP),
/// half-started (its lock held, no socket), its socket removed, or stopped on purpose, a login
/// shell with the block takes at most three times as long as one whose profile starts `broker
/// --version` the same way (medians, same run: a ratio, as the machine's load moves both; the
/// broker's lock wait alone is 3 s). What
/// the line found is in broker.log: a missing broker is started, a hung one reported, not doubled.
#[test]
fn login_line_returns_at_once_whatever_the_broker_state() {
    let logins = Logins::new(env());
    let env = &logins.with_block;

    // Missing: the first login starts one in the background.
    logins.assert_quick("missing");
    let pid = wait_until(T, "the login line's broker to answer", || answering(env));
    let logged = logins.wait_log("the start noted in broker.log", "login: broker started");
    assert!(logged.contains("login: no broker runs"), "{logged}");

    // Hung: it holds its lock and its socket, and answers nothing.
    signal(pid, "STOP");
    logins.assert_quick("hung (SIGSTOP)");
    let logged = logins.wait_log("the hung broker noted in broker.log", "has not answered");
    assert!(logged.contains(&format!("the broker (pid {pid}, stopped by a signal)")), "{logged}");
    assert!(logged.contains("not starting another"), "{logged}");
    signal(pid, "CONT");
    assert_eq!(answering(env), Some(pid), "the hung broker was replaced");

    // Its socket removed under it.
    std::fs::remove_file(env.runtime_dir.join("broker.sock")).unwrap();
    logins.assert_quick("with its socket gone");
    logins.wait_log("the socket-less broker noted", "(socket missing)");
    signal(pid, "TERM");
    wait_until(T, "the broker to exit", || gone(pid).then_some(()));
    // The login children above were waiting on that broker; once it let its lock go they start
    // one, as they should. Let them finish and stop what they started: the next phase needs none.
    wait_until(T, "the earlier login lines to finish", || courier_tests::util::login_children(&broker_bin()).is_empty().then_some(()));
    if let Some(started) = answering(env) {
        signal(started, "TERM");
        wait_until(T, "the broker they started to exit", || gone(started).then_some(()));
    }

    // Half-started: the instance lock is held, no socket yet.
    let mut holder = hold_instance_lock(env);
    let before = logins.log().matches("has not answered").count();
    logins.assert_quick("half-started (lock held, no socket)");
    wait_until(T, "the half-started broker noted", || (logins.log().matches("has not answered").count() > before).then_some(()));
    assert_eq!(answering(env), None, "a second broker started beside the lock holder");
    drop(holder.stdin.take());
    let _ = holder.wait();
    // A login's start still waiting for the lock (it waits up to 3 s; on a loaded machine it may
    // begin late) takes it once the holder is gone and serves, as it should: stop that broker.
    wait_until(T, "the lock to be free", || {
        if let Some(late) = answering(env) {
            signal(late, "TERM");
            wait_until(T, "the late-started broker to exit", || gone(late).then_some(()));
        }
        broker_lib::install::instance_holder(&env.runtime_dir).is_none().then_some(())
    });

    // Stopped on purpose: nothing starts it.
    let pid = {
        logins.login(true);
        wait_until(T, "a broker after the lock was freed", || answering(env))
    };
    let out = broker_cmd(env, &["stop"]);
    assert!(out.contains(&format!("stopped the broker (pid {pid})")), "{out}");
    logins.assert_quick("stopped on purpose");
    // The line forks nothing when stopped: no broker may answer now, nor later.
    assert_eq!(answering(env), None, "a login started the stopped broker");
    assert_log_levelled(&logins.log());
}

/// A login line racing a broker killed with SIGKILL: once the killed broker's lock is free, the
/// line's detached child starts one, within its patience (5 s), and the shell waits for none of
/// it. First as it comes (kill -9, the line at once); then with the kill's tail stretched: a
/// `flock` queued on the lock takes it the moment the killed broker lets go, as an exit that has
/// not finished would hold it, and lets go once the child says it is waiting.
#[test]
fn a_login_line_racing_a_killed_broker_starts_one_once_its_lock_is_free() {
    let logins = Logins::new(env());
    let env = &logins.with_block;
    logins.login(true);
    let pid = wait_until(T, "the login line's broker", || answering(env));

    signal(pid, "KILL");
    logins.login(true);
    let next = wait_until(T, "a broker after kill -9 and an immediate login", || answering(env).filter(|p| *p != pid));

    let mut tail = queue_for_instance_lock(env);
    signal(next, "KILL");
    let holder = tail.id() as i32;
    wait_until(T, "the killed broker's lock to pass to flock", || {
        (broker_lib::install::instance_holder(&env.runtime_dir) == Some(holder)).then_some(())
    });
    let took = logins.login(true);
    // Released whether or not the child says so: a child that gave up starts nothing, below.
    let said = format!("the broker (pid {holder}) holds");
    let waiting = poll_until(T, || logins.log().contains(&said).then_some(()));
    let freed = std::time::Instant::now();
    drop(tail.stdin.take());
    let _ = tail.wait();
    let third = wait_until(T, "a broker once the lock is free", || answering(env).filter(|p| *p != next));
    assert!(freed.elapsed() < Duration::from_secs(5), "started {:?} after the lock was freed", freed.elapsed());
    assert!(took < Duration::from_secs(2), "the login shell took {took:?}");
    assert!(waiting.is_some(), "{}", logins.log());
    let logged = logins.log();
    assert!(logged.contains(&format!("the broker (pid {holder}) has let")), "{logged}");
    assert!(!logged.contains("has not answered"), "{logged}");
    signal(third, "TERM");
}

/// `broker stop` lasts through the login shells of a real Codex session's tool commands (the
/// profile block runs in each, and starts nothing); `broker start` undoes it and `restart`
/// replaces the broker; doctor says it is stopped on purpose, not broken.
#[test]
fn real_codex_stop_lasts_through_codex_login_shells_until_start() {
    let sourced = std::env::temp_dir().join(format!("courier-sourced-{}", std::process::id()));
    let model = courier_tests::ScriptedModel::start_with(courier_tests::model::exec_then_done("echo quick"));
    let env = CodexEnv::new(&model);
    let block = broker_lib::install::profile_block(&broker_bin(), &env.codex_home);
    // The block, and a line that shows the login shell read the profile.
    std::fs::write(env.home.join(".profile"), format!("{block}echo sourced >> '{}'\n", sourced.display())).unwrap();
    let out = broker_cmd(&env, &["start"]);
    assert!(out.contains("broker started"), "{out}");
    let pid = wait_until(T, "the started broker", || answering(&env));
    let out = broker_cmd(&env, &["stop"]);
    assert!(out.contains(&format!("stopped the broker (pid {pid})")) && out.contains("until `broker start`"), "{out}");
    assert!(gone(pid) || answering(&env).is_none());

    env.spawn_exec("please run a command").wait(Duration::from_secs(60)).assert_success();
    let reads = std::fs::read_to_string(&sourced).unwrap_or_default();
    let _ = std::fs::remove_file(&sourced);
    assert!(reads.contains("sourced"), "the tool command's shell did not read the login profile: {}", model.dump());
    assert_eq!(answering(&env), None, "a Codex login shell started the stopped broker");
    let doctor = run_bounded(env.command(broker_bin()).arg("doctor"), T);
    let said = text(&doctor.stdout);
    assert!(said.contains("stopped on purpose by `broker stop` at 20"), "{said}");
    assert!(!said.contains("no broker answers"), "{said}");

    let out = broker_cmd(&env, &["start"]);
    assert!(out.contains("cleared the stop mark") && out.contains("broker started"), "{out}");
    let started = wait_until(T, "the broker after start", || answering(&env));
    let out = broker_cmd(&env, &["restart"]);
    assert!(out.contains(&format!("stopped the broker (pid {started})")) && out.contains("broker started"), "{out}");
    let restarted = wait_until(T, "the broker after restart", || answering(&env));
    assert_ne!(restarted, started);
    signal(restarted, "TERM");
}

/// `broker restart` replaces a hung broker (SIGSTOP: it answers nothing, SIGTERM waits).
#[test]
fn restart_replaces_a_hung_broker() {
    let env = env();
    broker_cmd(&env, &["start"]);
    let pid = wait_until(T, "the broker", || answering(&env));
    signal(pid, "STOP");
    let out = broker_cmd(&env, &["restart"]);
    assert!(out.contains(&format!("stopped the broker (pid {pid})")) && out.contains("broker started"), "{out}");
    let new = wait_until(T, "the new broker", || answering(&env));
    assert_ne!(new, pid);
    signal(new, "TERM");
}

/// CPU time the broker's `maintenance` thread has used so far (schedstat, ns).
fn maintenance_cpu_ns(pid: u32) -> u64 {
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        if std::fs::read_to_string(task.path().join("comm")).unwrap_or_default().trim() == "maintenance" {
            let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap();
            return stat.split_whitespace().next().unwrap().parse().unwrap();
        }
    }
    panic!("broker {pid} has no maintenance thread")
}

/// Wakes the broker's idle passes as `broker send` does after queueing in the database itself
/// (the `nudge` request): an idle maintenance pass otherwise waits for its fallback.
fn nudge(env: &CodexEnv) {
    let socket = courier_shared::paths::socket_path(&env.runtime_dir);
    let reply = broker_lib::producer::line::call(&socket, &serde_json::json!({"op": "nudge"}), Some(T)).unwrap();
    assert_eq!(reply.as_ref().and_then(|r| r.get("ok")), Some(&Value::Bool(true)), "{reply:?}");
}

/// `passes` more maintenance passes (500 ms apart, signalled or not): the passes that looked at the queue and the wake passes that listed threads meanwhile,
/// and the maintenance thread's CPU per pass.
fn over_passes(env: &CodexEnv, pid: u32, passes: u64) -> (u64, u64, f64) {
    let st = |what: &str| wait_until(T, what, || broker_lib::client::query_status(&env.runtime_dir));
    let (s0, cpu0) = (st("status"), maintenance_cpu_ns(pid));
    let s1 = wait_until(T, "maintenance passes", || {
        nudge(env);
        broker_lib::client::query_status(&env.runtime_dir).filter(|s| s.maintenance_passes >= s0.maintenance_passes + passes)
    });
    let cpu = (maintenance_cpu_ns(pid) - cpu0) as f64 / (s1.maintenance_passes - s0.maintenance_passes) as f64;
    (s1.maintenance_looks - s0.maintenance_looks, s1.wake_looks - s0.wake_looks, cpu)
}

/// Any process of the uid may nudge the broker (`{"op":"nudge"}`, what `broker send` sends after
/// queueing in the database itself): a flood of nudges is not a flood of passes. The maintenance
/// pass stays 500 ms apart, so over the flood at most one pass per 500 ms (and the one due).
#[test]
fn a_flood_of_nudges_is_not_a_flood_of_passes() {
    let env = env();
    let broker = courier_tests::Broker::start(&env);
    // Past the first passes: idle, the pass waits for a signal.
    over_passes(&env, broker.pid().unwrap(), 2);
    let st = || wait_until(T, "status", || broker_lib::client::query_status(&env.runtime_dir));
    let (s0, started) = (st(), std::time::Instant::now());
    for _ in 0..400 {
        nudge(&env);
    }
    let (s1, took) = (st(), started.elapsed());
    let passes = s1.maintenance_passes - s0.maintenance_passes;
    let bound = took.as_millis() as u64 / 500 + 2;
    eprintln!("400 nudges in {took:?}: {passes} maintenance passes");
    assert!(passes <= bound, "400 nudges in {took:?} ran {passes} maintenance passes (at most {bound})");
}

/// An idle broker does no queue work: with no message that can still move and nothing committed,
/// its periodic passes skip their statements (counted, and its maintenance thread's CPU per pass
/// is a fraction of what it is while one message waits, measured in the same run). A pending
/// message makes every pass look again; once it is cancelled, the passes stop looking, and the
/// maintenance thread stops waking: over as long as its 8 passes with a message took, it makes
/// at most 2 (its fallback), not 8.
#[test]
fn idle_broker_passes_skip_the_queue_until_something_is_committed() {
    let env = env();
    let broker = courier_tests::Broker::start(&env);
    let pid = broker.pid().unwrap();
    // The first pass checkpoints the schema's creation.
    over_passes(&env, pid, 2);
    // CPU time only grows with load (a preemption, a cold cache), never shrinks: an idle pass's
    // cost is the least of three windows, so another test's load does not make it look busy.
    let quietest = |env: &CodexEnv| {
        let windows = [over_passes(env, pid, 4), over_passes(env, pid, 4), over_passes(env, pid, 4)];
        let looks: (u64, u64) = windows.iter().fold((0, 0), |(l, w), x| (l + x.0, w + x.1));
        (looks.0, looks.1, windows.iter().map(|x| x.2).fold(f64::INFINITY, f64::min))
    };
    let (looks, wakes, idle_cpu) = quietest(&env);
    assert_eq!((looks, wakes), (0, 0), "an empty queue: maintenance and wake passes looked at it");
    let id = broker.send_future(&courier_tests::util::fake_uuid_v7(), "waits for a thread", None, None);
    let live_started = std::time::Instant::now();
    let (looks, _, live_cpu) = over_passes(&env, pid, 8);
    let live_took = live_started.elapsed();
    assert!(looks >= 7, "a pending message: only {looks} of 8 maintenance passes looked at the queue");
    broker.run_ok(&["cancel", &id]);
    over_passes(&env, pid, 2); // the look that finds the cancelled message final
    let (looks, wakes, quiet_cpu) = quietest(&env);
    assert_eq!((looks, wakes), (0, 0), "nothing can move and nothing was committed, yet the passes looked");
    let s0 = wait_until(T, "status", || broker_lib::client::query_status(&env.runtime_dir));
    std::thread::sleep(live_took);
    let s1 = wait_until(T, "status", || broker_lib::client::query_status(&env.runtime_dir));
    let idle_passes = s1.maintenance_passes - s0.maintenance_passes;
    assert!(idle_passes <= 2, "nothing can move, yet {idle_passes} maintenance passes ran in the time 8 took with a message");
    eprintln!("maintenance CPU per pass: idle {idle_cpu:.0} ns, one pending {live_cpu:.0} ns, after the cancel {quiet_cpu:.0} ns");
    assert!(
        idle_cpu.max(quiet_cpu) * 2.0 < live_cpu,
        "an idle pass costs {idle_cpu:.0}/{quiet_cpu:.0} ns, a pass with work {live_cpu:.0} ns"
    );
}

/// A start decided before a `broker stop` does not outlive it: a daemonized `serve` (as a login
/// line or `broker start` spawns it) still waiting for the instance lock when the stop is
/// recorded takes the lock, sees the mark, and exits without serving. Without this, a login line
/// that found a silent lock holder and chose to start could start a broker right after the user
/// stopped it.
#[test]
fn a_start_waiting_for_the_lock_yields_to_a_stop_recorded_meanwhile() {
    let env = env();
    std::fs::create_dir_all(&env.runtime_dir).unwrap();
    let mut holder = hold_instance_lock(&env);
    let log = env.root.join("late-serve.log");
    let mut serve = spawn_serve(&env, &log, &[(broker_lib::install::UNLESS_STOPPED_ENV, Path::new("1"))]);
    // The serve waits (up to 3 s) for the lock; the stop is recorded meanwhile, then the lock goes.
    broker_cmd(&env, &["stop"]);
    drop(holder.stdin.take());
    let _ = holder.wait();
    let status = wait_exit(&mut serve);
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "{status}: {logged}");
    assert!(logged.contains("not serving: `broker stop` came after this start was asked for"), "{logged}");
    assert_eq!(answering(&env), None, "a broker serves after the stop");
}
