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
    CodexEnv::with_base_url("http://127.0.0.1:9/v1")
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
