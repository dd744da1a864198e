//! `broker install` / `uninstall` / `doctor` against the real Codex CLI, in a throwaway HOME whose
//! CODEX_HOME already has the user's own hooks and a commented config.toml. The broker under test
//! is always the *installed* copy in the prefix (its hook-client is matched by inode), started by
//! the install itself through the login-profile fallback (`broker serve --daemonize`; the profile
//! line runs `broker serve --login`).

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use courier_tests::broker::run_bounded;
use courier_tests::codex::set_mode;
use courier_tests::model::exec_held_then_done;
use courier_tests::util::{marker, wait_until};
use courier_tests::{broker_bin, CodexEnv, Hold, ScriptedModel};

use courier_tests::install_rig::{statuses, text, Rig};
use courier_tests::util::{login_children, pid_alive};

const T: Duration = Duration::from_secs(60);
const EVENTS: [&str; 6] = ["sessionStart", "userPromptSubmit", "preToolUse", "postToolUse", "stop", "subagentStart"];

fn exe_of(pid: u32) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default()
}

/// Install into a home with the user's own hooks: Codex trusts Courier's seven handlers and leaves
/// the user's as they were; installing twice changes nothing; a real `codex exec` (no bypass flag)
/// runs the installed hook-client and a `broker send` message is delivered and confirmed; the
/// user's own hook still runs; uninstall restores every file byte-for-byte.
#[test]
fn install_delivers_through_real_codex_and_uninstall_restores_files() {
    let hold = Hold::new();
    let model = ScriptedModel::start_with(exec_held_then_done("echo hello", &hold));
    let rig = Rig::new(CodexEnv::new(&model));
    let env = &rig.env;
    rig.write_user_hooks();
    // A "release" under CODEX_HOME (tool commands can write there): install does not trust it
    // for being there; a real one is a copy of the trusted binary and passes by its digest.
    let daemon = env.codex_home.join("packages/app-server-daemon/releases/9.9.9/bin/codex");
    std::fs::create_dir_all(daemon.parent().unwrap()).unwrap();
    std::fs::write(&daemon, b"\x7fELF stand-in daemon copy").unwrap();

    let files = [env.hooks_json_path(), env.config_toml_path(), rig.profile()];
    let before = rig.snapshot(&files);
    let before_status = statuses(env);
    assert_eq!(before_status.len(), 2, "{before_status:#?}");

    let out = rig.install(&["--start", "profile"]);
    let native = env.codex.canonicalize().unwrap();
    assert!(out.contains(&format!("trusted Codex binary {}", native.display())), "{out}");
    assert!(!out.contains(&format!("trusted Codex binary {}", daemon.display())), "{out}");
    let client = rig.prefix.join("hook-client");
    let client_ino = std::fs::metadata(&client).unwrap().ino();

    // Twice changes nothing, byte for byte (and keeps the hook-client's inode).
    let manifest = env.state_dir.join("install-manifest.json");
    let mut watched = files.to_vec();
    watched.push(manifest.clone());
    let once = rig.snapshot(&watched);
    let again = rig.install(&["--start", "profile"]);
    assert_eq!(rig.snapshot(&watched), once, "second install changed files:\n{again}");
    assert_eq!(std::fs::metadata(&client).unwrap().ino(), client_ino);

    // Codex itself: Courier's handlers trusted, the user's as before.
    let after_status = statuses(env);
    let command = broker_lib::install::hook_command(&client);
    for ev in EVENTS {
        let ours: Vec<_> = after_status
            .iter()
            .filter(|(k, (c, _))| *c == command && k.contains(&format!(":{}:", courier_tests::snake_event(&pascal(ev)))))
            .collect();
        assert_eq!(ours.len(), 1, "{ev}: {after_status:#?}");
        assert_eq!(ours[0].1 .1, "trusted", "{ev}: {after_status:#?}");
    }
    for (key, st) in &before_status {
        assert_eq!(after_status.get(key), Some(st), "user hook {key} changed: {after_status:#?}");
    }

    // The broker install started is the installed binary.
    let pid = rig.wait_running();
    assert_eq!(exe_of(pid), rig.installed_broker());

    // A real session, no bypass flag: the message reaches the next request once and is confirmed.
    let cli = rig.cli();
    let text_msg = marker("INSTALLED");
    let child = env.spawn_exec("please run a command");
    let first = model.wait_for_requests(1, T).remove(0);
    hold.wait_held(1, T);
    let thread = first.thread_id().expect("thread id");
    let id = cli.send_opts(&thread, &text_msg, None, Some("install-test"));
    hold.release();
    let res = child.wait(T);
    res.assert_success();
    let reqs = model.requests();
    assert_eq!(reqs.len(), 2, "{}", model.dump());
    assert_eq!(reqs[1].developer_messages_containing(&text_msg).len(), 1, "{}", model.dump());
    cli.wait_state(&id, "confirmed", Duration::from_secs(10));
    let log = std::fs::read_to_string(&rig.user_hook_log).unwrap_or_default();
    assert!(log.contains("ran"), "the user's own trusted PostToolUse hook must still run");
    // Nothing refused for install reasons (which client, which Codex). A cold digest cache can
    // make the very first call outlast hook-client's deadline (`peer_gone`): not install's doing.
    let refusals = courier_tests::broker::refusals(&cli.inspect_json());
    let install_related = ["client_exe", "untrusted_codex", "no_codex_ancestor", "bad_mac", "foreign_ancestor"];
    assert!(!refusals.iter().any(|r| install_related.contains(&r["reason"].as_str().unwrap_or(""))), "hook calls refused: {refusals:#?}");

    // Uninstall (the installed binary removes itself): everything back as it was.
    let out = rig.run_ok(&rig.installed_broker(), &["uninstall"]);
    assert_eq!(rig.snapshot(&files), before, "uninstall must restore byte-for-byte:\n{out}");
    assert!(!rig.profile().exists() && !rig.prefix.exists() && !manifest.exists(), "{out}");
    wait_until(Duration::from_secs(10), "the installed broker to exit", || (!pid_alive(pid)).then_some(()));
    // Doctor says so in one line, not a failure per check.
    let doctor = rig.run(&broker_bin(), &["doctor"]);
    let said = text(&doctor.stdout);
    assert_eq!(doctor.status.code(), Some(1), "{said}");
    assert!(said.starts_with("FAIL Courier is not installed\n") && said.matches("FAIL").count() == 1, "{said}");
    // The digests install added are no longer trusted.
    let out = rig.run_ok(&broker_bin(), &["trust-codex", &native.display().to_string()]);
    assert!(out.starts_with("trusted "), "{out}");
}

fn pascal(camel: &str) -> String {
    let mut c = camel.chars();
    c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default()
}

/// The fallback start path: the login-profile line starts the installed broker when none runs,
/// and does nothing when one does; with the broker down, hook-client still returns at once.
#[test]
fn profile_line_starts_the_broker_once() {
    let rig = Rig::new(CodexEnv::with_base_url("http://127.0.0.1:9/v1"));
    rig.install(&["--start", "profile"]);
    let profile = std::fs::read_to_string(rig.profile()).unwrap();
    assert!(profile.contains("serve --login"), "{profile}");
    let pid = rig.wait_running();
    let _ = Command::new("kill").arg(pid.to_string()).status();
    wait_until(Duration::from_secs(10), "the broker to stop", || rig.running_pid().is_none().then_some(()));
    // Its socket goes first; the process (and its lock) only once its threads have ended. A login
    // line that finds the lock still held reports the broker, it does not start a second one.
    wait_until(Duration::from_secs(20), "the broker process to exit", || (!pid_alive(pid)).then_some(()));

    // Broker down: hook-client fails open within its deadline.
    let mut hc = rig.command(&rig.prefix.join("hook-client"), &[]);
    hc.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = hc.spawn().unwrap();
    child.stdin.take().unwrap().write_all(br#"{"hook_event_name":"Stop","session_id":"x"}"#).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success() && out.stdout.is_empty());
    assert!(start.elapsed() < Duration::from_millis(1500), "hook-client took {:?} with the broker down", start.elapsed());

    // A login shell sources the profile: the installed broker starts, detached.
    let login = || rig.run_ok(Path::new("/bin/sh"), &["-c", ". \"$HOME/.profile\""]);
    login();
    let pid2 = rig.wait_running();
    assert_ne!(pid2, pid);
    assert_eq!(exe_of(pid2), rig.installed_broker());
    // A second login finds it running and starts no other.
    let out = rig.run_ok(&rig.installed_broker(), &["serve", "--daemonize"]);
    assert!(out.contains("already running"), "{out}");
    login();
    assert_eq!(rig.running_pid(), Some(pid2));
    assert!(pid_alive(pid2));

    rig.run_ok(&rig.installed_broker(), &["uninstall"]);
    wait_until(Duration::from_secs(10), "the broker to exit on uninstall", || (!pid_alive(pid2)).then_some(()));
    assert!(!rig.profile().exists());
}

/// systemd user units: `systemd-analyze verify` accepts what install writes, and the socket
/// activation path works (systemd-socket-activate hands the listener on fd 3; the broker serves
/// it instead of binding its own, so the socket file is the one systemd made).
#[test]
fn systemd_units_verify_and_socket_activation_serves() {
    let rig = Rig::new(CodexEnv::with_base_url("http://127.0.0.1:9/v1"));
    let out = rig.install(&["--start", "systemd", "--no-enable"]);
    let unit_dir = rig.env.home.join(".config/systemd/user");
    let sock_unit = unit_dir.join("courier-broker.socket");
    let svc_unit = unit_dir.join("courier-broker.service");
    let svc = std::fs::read_to_string(&svc_unit).unwrap_or_else(|e| panic!("{e}: {out}"));
    let sock = std::fs::read_to_string(&sock_unit).unwrap();
    assert!(svc.contains(&format!("ExecStart={} serve", rig.installed_broker().display())), "{svc}");
    assert!(svc.contains(&format!("Environment=CODEX_HOME={}", rig.env.codex_home.display())), "{svc}");
    let socket_path = rig.env.runtime_dir.join("broker.sock");
    assert!(sock.contains(&format!("ListenStream={}", socket_path.display())), "{sock}");
    assert!(sock.contains("SocketMode=0600") && sock.contains("DirectoryMode=0700"), "{sock}");

    let analyze = which("systemd-analyze").expect("systemd-analyze is required (apt-get install systemd)");
    let xdg = rig.env.root.join("xdg-run");
    std::fs::create_dir_all(&xdg).unwrap();
    set_mode(&xdg, 0o700);
    let mut cmd = Command::new(&analyze);
    cmd.args(["verify", "--user"]).arg(&sock_unit).arg(&svc_unit).env("XDG_RUNTIME_DIR", &xdg).env("HOME", &rig.env.home);
    let v = run_bounded(&mut cmd, Duration::from_secs(60));
    assert!(
        v.status.success() && v.stderr.is_empty() && v.stdout.is_empty(),
        "systemd-analyze verify:\n{}{}",
        text(&v.stdout),
        text(&v.stderr)
    );

    // Socket activation, with the unit's own ExecStart and environment.
    let activate = which("systemd-socket-activate").expect("systemd-socket-activate is required (apt-get install systemd)");
    let log = rig.env.root.join("activated.log");
    let mut cmd = rig.env.command(&activate);
    cmd.arg("-l").arg(&socket_path);
    for (k, _) in rig.env.env_vars() {
        cmd.arg("-E").arg(k);
    }
    cmd.arg(rig.installed_broker()).arg("serve");
    let logf = std::fs::File::create(&log).unwrap();
    cmd.stdout(logf.try_clone().unwrap()).stderr(logf);
    let mut listener = cmd.spawn().unwrap();
    let sock_ino =
        wait_until(Duration::from_secs(10), "systemd-socket-activate to listen", || std::fs::metadata(&socket_path).ok().map(|m| m.ino()));
    // The first connection starts the broker, which answers it.
    let pid = rig.wait_running();
    assert_eq!(exe_of(pid), rig.installed_broker());
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("socket-activated"), "{logged}");
    assert_eq!(std::fs::metadata(&socket_path).unwrap().ino(), sock_ino, "the broker must serve systemd's socket, not bind a new one");
    let _ = Command::new("kill").arg(pid.to_string()).status();
    let _ = listener.kill();
    let _ = listener.wait();

    rig.run_ok(&rig.installed_broker(), &["uninstall"]);
    assert!(!sock_unit.exists() && !svc_unit.exists());
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var("PATH").ok()?.split(':').map(|d| Path::new(d).join(name)).find(|p| p.is_file())
}

/// `broker doctor` passes on a good install and, on a broken one, reports each problem with its
/// fix and exits non-zero: broker stopped, one Courier hook no longer trusted, runtime directory
/// mode loosened, an untrusted Codex binary.
#[test]
fn doctor_reports_each_problem() {
    let rig = Rig::new(CodexEnv::with_base_url("http://127.0.0.1:9/v1"));
    rig.write_user_hooks();
    rig.install(&["--start", "profile"]);
    let broker = rig.installed_broker();
    let good = rig.run(&broker, &["doctor"]);
    assert!(good.status.success(), "doctor on a good install:\n{}{}", text(&good.stdout), text(&good.stderr));
    let good = text(&good.stdout);
    eprintln!("--- doctor, good install\n{good}");
    assert!(good.contains("for all 7 events, trusted"), "asked Codex itself:\n{good}");
    assert!(!good.contains("FAIL"), "{good}");
    // Counted and dated for a person: "1 trusted Codex binary", "at 2026-...", no Unix ms.
    assert!(good.contains("ok   1 trusted Codex binary\n"), "{good}");
    let dated = good.lines().find(|l| l.contains(" sha256:") && l.contains(" at ")).unwrap_or_else(|| panic!("{good}"));
    let date = dated.rsplit(" at ").next().unwrap();
    assert!(date.len() == 23 && date.ends_with(" UTC") && date.as_bytes()[4] == b'-', "{dated}");

    // Break it. A login line run by Codex's login shells (doctor asked Codex) may still be
    // checking: it would start a broker once the one killed below is gone.
    wait_until(Duration::from_secs(20), "login lines to finish", || login_children(&broker).is_empty().then_some(()));
    let pid = rig.wait_running();
    let _ = Command::new("kill").arg(pid.to_string()).status();
    wait_until(Duration::from_secs(10), "the broker to stop", || rig.running_pid().is_none().then_some(()));
    // Its socket goes first; the process (and its lock) only once its threads have ended.
    wait_until(Duration::from_secs(20), "the broker process to exit", || (!pid_alive(pid)).then_some(()));
    let cfg = std::fs::read_to_string(rig.env.config_toml_path()).unwrap();
    let stop_key = format!("{}:stop:1:0", rig.env.hooks_json_path().display());
    let at = cfg.find(&stop_key).unwrap_or_else(|| panic!("no {stop_key} in\n{cfg}"));
    let hash_at = at + cfg[at..].find("sha256:").unwrap() + 7;
    let mut broken = cfg.clone();
    broken.replace_range(hash_at..hash_at + 4, "0000");
    assert_ne!(broken, cfg);
    std::fs::write(rig.env.config_toml_path(), broken).unwrap();
    set_mode(&rig.env.runtime_dir, 0o755);
    let daemon = rig.env.codex_home.join("packages/app-server-daemon/releases/9.9.9/bin/codex");
    std::fs::create_dir_all(daemon.parent().unwrap()).unwrap();
    std::fs::write(&daemon, b"\x7fELF not trusted").unwrap();

    let bad = rig.run(&broker, &["doctor"]);
    let report = text(&bad.stdout);
    eprintln!("--- doctor, broken install\n{report}");
    assert_eq!(bad.status.code(), Some(1), "{report}{}", text(&bad.stderr));
    assert!(report.contains("FAIL no broker answers"), "{report}");
    assert!(report.contains("serve --daemonize"), "fix for the stopped broker:\n{report}");
    assert!(report.contains("Courier's hook for 1 of 7 events") && report.contains("Stop: modified"), "{report}");
    assert!(report.contains(&format!("chmod 700 {}", rig.env.runtime_dir.display())), "{report}");
    assert!(report.contains(&format!("FAIL Codex binary {} is not trusted", daemon.display())), "{report}");
    assert!(report.contains(&format!("broker trust-codex {}", daemon.display())), "{report}");
    set_mode(&rig.env.runtime_dir, 0o700);
}

/// `install/test.sh` ends with one line `N passed, M failed` summed over every test binary (its
/// summariser, `install/test-summary.sh`, run here on a stand-in cargo): doc-test `0 passed` lines
/// do not hide the rest, a binary that died without a result counts as failed, and the exit
/// status is cargo's.
#[test]
fn test_summary_sums_every_binary_and_keeps_cargos_status() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let test_sh = std::fs::read_to_string(root.join("install/test.sh")).unwrap();
    // One summarised command runs every test binary, then the delivery tests on the oldest Codex.
    let tail = &test_sh[test_sh.find("exec install/test-summary.sh bash -c '").expect("test.sh ends by exec'ing the summariser")..];
    assert!(tail.contains("install/test-binaries.sh 2 --workspace --locked -- \"$@\""), "{test_sh}");
    assert!(tail.contains("COURIER_CODEX_BIN=\"$COURIER_CODEX_BIN_OLDEST\" install/test-binaries.sh 2 --workspace"), "{test_sh}");
    let dir = std::env::temp_dir().join(format!("courier-summary-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fake = dir.join("cargo");
    let script = |code: u8| {
        format!(
            "#!/bin/sh\n\
             echo '     Running unittests src/lib.rs (target/debug/deps/broker-1)' >&2\n\
             echo 'test result: ok. 96 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 2.51s'\n\
             echo '     Running tests/crash.rs (target/debug/deps/crash-2)' >&2\n\
             echo 'running 5 tests'\n\
             echo '     Running tests/delivery.rs (target/debug/deps/delivery-3)' >&2\n\
             echo 'test result: FAILED. 8 passed; 2 failed; 1 ignored; 0 measured; 0 filtered out; finished in 40s'\n\
             echo '   Doc-tests broker' >&2\n\
             echo 'test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s'\n\
             exit {code}\n"
        )
    };
    for (code, ok_script) in [(101u8, false), (0, true)] {
        let body = if ok_script {
            // A binary without libtest output in a run that passed is not a failure.
            "#!/bin/sh\necho '     Running unittests src/lib.rs (x)' >&2\necho 'test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s'\necho '     Running unittests src/main.rs (y)' >&2\necho '   Doc-tests shared' >&2\necho 'test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s'\nexit 0\n".to_string()
        } else {
            script(code)
        };
        std::fs::write(&fake, body).unwrap();
        set_mode(&fake, 0o755);
        let out = run_bounded(Command::new(root.join("install/test-summary.sh")).arg(&fake), Duration::from_secs(30));
        let stdout = text(&out.stdout);
        let last = stdout.lines().last().unwrap_or("");
        assert_eq!(out.status.code(), Some(code as i32), "{stdout}");
        if ok_script {
            assert_eq!(last, "3 passed, 0 failed", "{stdout}");
            assert!(!stdout.contains("no test result"), "{stdout}");
        } else {
            assert_eq!(last, "104 passed, 3 failed", "{stdout}");
            assert!(stdout.contains("no test result from Running tests/crash.rs"), "{stdout}");
            assert!(stdout.contains("test result: FAILED. 8 passed"), "cargo's own output passes through:\n{stdout}");
        }
        assert_eq!(stdout.lines().filter(|l| l.ends_with(" failed") && l.contains(" passed, ")).count(), 1, "{stdout}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `systemctl` that cannot reach a user bus, first on the rig's PATH.
fn no_bus_systemctl(rig: &Rig) {
    let p = rig.path_dir.join("systemctl");
    std::fs::write(&p, "#!/bin/sh\necho 'Failed to connect to bus: No medium found' >&2\nexit 1\n").unwrap();
    set_mode(&p, 0o755);
}

/// Install is one transaction. `--start systemd` where `systemctl --user` cannot reach a bus
/// fails after binaries, hooks, trust and units were written: all of it is undone, and the error
/// says what was undone. Over an earlier profile install, the failed switch to systemd puts the
/// start line and the running broker back. A good install says how to put the prefix on PATH.
#[test]
fn failed_install_undoes_what_it_did_and_says_so() {
    let rig = Rig::new(CodexEnv::with_base_url("http://127.0.0.1:9/v1"));
    let env = &rig.env;
    rig.write_user_hooks();
    no_bus_systemctl(&rig);
    let unit_dir = env.home.join(".config/systemd/user");
    let manifest = env.state_dir.join("install-manifest.json");
    let files = [
        env.hooks_json_path(),
        env.config_toml_path(),
        rig.profile(),
        unit_dir.join("courier-broker.socket"),
        unit_dir.join("courier-broker.service"),
        manifest.clone(),
    ];
    let before = rig.snapshot(&files);
    let args = [
        "install",
        "--prefix",
        &rig.prefix.display().to_string(),
        "--codex-home",
        &env.codex_home.display().to_string(),
        "--start",
        "systemd",
    ]
    .map(String::from);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    let out = rig.run(&broker_bin(), &args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}{err}", text(&out.stdout));
    assert!(err.contains("install failed: systemctl --user daemon-reload failed: Failed to connect to bus"), "{err}");
    for line in [
        format!("removed {}", rig.prefix.join("broker").display()),
        format!("removed {}", rig.prefix.join("hook-client").display()),
        format!("removed {}", rig.prefix.display()),
        format!("restored {}", env.hooks_json_path().display()),
        format!("restored {}", env.config_toml_path().display()),
        format!("removed {}", unit_dir.join("courier-broker.service").display()),
        format!("no longer trusting {}", env.codex.canonicalize().unwrap().display()),
        "nothing of this run is left in place".into(),
    ] {
        assert!(err.contains(&line), "{line:?} not in:\n{err}");
    }
    assert_eq!(rig.snapshot(&files), before, "{err}");
    assert!(!rig.prefix.exists() && !unit_dir.exists(), "{err}");
    let out = rig.run(&broker_bin(), &["uninstall"]);
    assert!(!out.status.success() && text(&out.stderr).contains("nothing to uninstall"), "{out:?}");

    // A working profile install, then a failed switch to systemd: the switch is undone whole.
    let installed = rig.install(&["--start", "profile"]);
    assert!(installed.contains(&format!("note: {} is not on your PATH", rig.prefix.display())), "{installed}");
    assert!(installed.contains(&format!("export PATH=\"{}:$PATH\"", rig.prefix.display())), "{installed}");
    let pid = rig.wait_running();
    let profile_install = rig.snapshot(&files);
    let out = rig.run(&broker_bin(), &args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("restored {}", rig.profile().display())) && err.contains("started the previous broker again"), "{err}");
    assert_eq!(rig.snapshot(&files), profile_install, "{err}");
    let again = rig.wait_running();
    assert_ne!(again, pid, "the switch stopped the profile broker: it must run again");
    assert_eq!(exe_of(again), rig.installed_broker());

    // With the prefix on PATH, no hint.
    let mut c = rig.command(&broker_bin(), &args[..args.len() - 2]);
    c.args(["--start", "profile"]).env("PATH", format!("{}:{}", rig.prefix.display(), rig.path_var()));
    let out = run_bounded(&mut c, Duration::from_secs(120));
    assert!(out.status.success() && !text(&out.stdout).contains("not on your PATH"), "{out:?}");
    rig.run_ok(&rig.installed_broker(), &["uninstall"]);
}

/// An install killed mid-way (kill -9 right after writing the systemd units) leaves a manifest
/// that lists what it had put in place: `broker uninstall` removes all of it, unit files
/// included, says "removed" for the file install had created and "restored" only for the one it
/// restored, and names the state directory it kept. `--purge` then removes the state and runtime
/// directories (queue, secret, socket, log, lock).
#[test]
fn uninstall_removes_what_an_interrupted_install_left_and_purge_removes_the_state() {
    let rig = Rig::new(CodexEnv::with_base_url("http://127.0.0.1:9/v1"));
    let env = &rig.env;
    let unit_dir = env.home.join(".config/systemd/user");
    let units = [unit_dir.join("courier-broker.socket"), unit_dir.join("courier-broker.service")];
    let config_before = std::fs::read(env.config_toml_path()).unwrap();
    assert!(!env.hooks_json_path().exists());

    let prefix = rig.prefix.display().to_string();
    let codex_home = env.codex_home.display().to_string();
    let mut c = rig.command(&broker_bin(), &["install", "--prefix", &prefix, "--codex-home", &codex_home, "--start", "systemd"]);
    c.env("COURIER_FAILPOINTS", "install_after_units");
    let out = run_bounded(&mut c, Duration::from_secs(120));
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&out.status), Some(9), "{out:?}");
    for p in units.iter().chain([&rig.prefix.join("broker"), &env.hooks_json_path(), &env.state_dir.join("install-manifest.json")]) {
        assert!(p.exists(), "{} should be there after the kill", p.display());
    }

    let out = rig.run_ok(&broker_bin(), &["uninstall"]);
    let hooks = env.hooks_json_path().display().to_string();
    assert!(out.contains(&format!("removed {hooks} (install had created it)")) && !out.contains(&format!("restored {hooks}")), "{out}");
    assert!(out.contains(&format!("restored {}", env.config_toml_path().display())), "{out}");
    for u in &units {
        assert!(out.contains(&format!("removed {}", u.display())) && !u.exists(), "{out}");
    }
    assert!(out.contains(&format!("no longer trusting {}", env.codex.canonicalize().unwrap().display())), "{out}");
    assert_eq!(std::fs::read(env.config_toml_path()).unwrap(), config_before, "{out}");
    assert!(!env.hooks_json_path().exists() && !rig.prefix.exists(), "{out}");
    assert_eq!(
        out.lines().last().unwrap(),
        format!(
            "Courier is uninstalled; kept its state directory {} (the message queue and log; `broker uninstall --purge` removes it)",
            env.state_dir.display()
        )
    );
    assert!(env.state_dir.join("queue.sqlite").exists());

    // A broker ran and was killed: secret, stale socket, locks and queue are left. --purge
    // removes them and both directories.
    {
        let _b = courier_tests::Broker::start(env);
    }
    // (The one-broker lock is a flock on the runtime directory itself: no lock file is left.)
    for f in ["broker.sock", "secret"] {
        assert!(env.runtime_dir.join(f).exists(), "{f}");
    }
    let out = rig.run_ok(&broker_bin(), &["uninstall", "--purge"]);
    assert!(!env.runtime_dir.exists() && !env.state_dir.exists(), "{out}");
    assert!(out.contains(&format!("removed {}", env.state_dir.display())), "{out}");
    assert_eq!(out.lines().last().unwrap(), "Courier is uninstalled; its queue, secret, socket, log and lock are removed", "{out}");
}

/// Install says what it chose and why (auto picked the profile start: `systemctl --user` had no
/// bus), and prints the PATH hint only until a login profile adds the prefix. Uninstall with a
/// Codex session open says its hooks now fail until it is restarted, and names that session.
#[test]
fn install_and_uninstall_say_what_they_chose_and_what_it_means() {
    let hold = Hold::new();
    let model = ScriptedModel::start_with(exec_held_then_done("echo hello", &hold));
    let rig = Rig::new(CodexEnv::new(&model));
    no_bus_systemctl(&rig);
    let first = rig.install(&[]);
    assert!(
        first.contains("starting the broker from the login profile, not systemd") && first.contains("Failed to connect to bus"),
        "{first}"
    );
    assert!(first.contains("is not on your PATH"), "{first}");
    // The user adds the line the hint gave; the next install neither repeats it nor the choice.
    let mut f = std::fs::OpenOptions::new().append(true).open(rig.profile()).unwrap();
    writeln!(f, "export PATH=\"{}:$PATH\"", rig.prefix.display()).unwrap();
    let again = rig.install(&[]);
    assert!(!again.contains("PATH") && !again.contains("not systemd"), "{again}");

    // A session open while uninstalling.
    rig.wait_running();
    let child = rig.env.spawn_exec("please run a command");
    hold.wait_held(1, T);
    let thread = model.requests()[0].thread_id().expect("thread id");
    let out = rig.run_ok(&rig.installed_broker(), &["uninstall"]);
    hold.release();
    let _ = child.wait(T);
    assert!(out.contains("hook exited with code 127") && out.contains("until each is restarted"), "{out}");
    let listed = out.lines().find(|l| l.contains(&thread)).unwrap_or_else(|| panic!("the open session is not listed:\n{out}"));
    assert!(listed.trim_start().starts_with("codex pid "), "{listed}");
}

/// Attack: a planted hook-client installed on the next install. The person installed from a
/// package inside the workspace (a project's `node_modules`); a command Codex runs in its
/// workspace-write sandbox replaces the package's `hook-client` and its `SHA256SUMS` line. The
/// person's next `broker install`, run from the installed copy (what a login PATH finds first),
/// must not copy the planted file into the prefix, where Codex runs it unsandboxed as its hook.
#[test]
fn a_hook_client_planted_in_the_package_is_not_installed_by_the_next_install() {
    let model = ScriptedModel::start();
    let rig = Rig::new(CodexEnv::new(&model));
    let env = &rig.env;
    let pkg = env.work.join("node_modules/@courier-codex/courier-linux-x64/vendor/x86_64-unknown-linux-gnu/bin");
    std::fs::create_dir_all(&pkg).unwrap();
    for b in ["broker", "hook-client"] {
        let out = run_bounded(Command::new("objcopy").arg("--strip-debug").arg(broker_bin().with_file_name(b)).arg(pkg.join(b)), T);
        assert!(out.status.success(), "objcopy {b}: {}", text(&out.stderr));
        set_mode(&pkg.join(b), 0o755);
    }
    let sums = run_bounded(Command::new("sha256sum").args(["broker", "hook-client"]).current_dir(&pkg), T);
    std::fs::write(pkg.join("SHA256SUMS"), &sums.stdout).unwrap();
    let args = [
        "install",
        "--prefix",
        &rig.prefix.display().to_string(),
        "--codex-home",
        &env.codex_home.display().to_string(),
        "--start",
        "none",
    ]
    .map(String::from);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    rig.run_ok(&pkg.join("broker"), &args);
    let installed = rig.prefix.join("hook-client");
    let good = std::fs::read(&installed).unwrap();

    // The plant, by a model-run command in Codex's workspace-write sandbox.
    let sandboxed = env.work.join("sandboxed");
    let plant = format!(
        "cd {pkg} && printf '#!/bin/sh\\n# PLANTED\\nexit 0\\n' > hook-client.new && chmod 755 hook-client.new && \
         mv hook-client.new hook-client && sha256sum broker hook-client > SHA256SUMS && \
         grep NoNewPrivs /proc/self/status > {sandboxed} # PLANT",
        pkg = broker_lib::install::shell_quote(&pkg.display().to_string()),
        sandboxed = broker_lib::install::shell_quote(&sandboxed.display().to_string()),
    );
    model.set_script(courier_tests::model::exec_then_done(&plant));
    env.exec_args(&["-c", "sandbox_mode=\"workspace-write\""], "plant", T).assert_success();
    let no_new_privs = std::fs::read_to_string(&sandboxed).unwrap_or_default();
    assert!(no_new_privs.contains('1'), "the plant ran sandboxed: {no_new_privs:?}");
    assert!(std::fs::read_to_string(pkg.join("hook-client")).unwrap().contains("PLANTED"), "the sandbox could write the package");

    // The person's next install, from the installed copy.
    let out = rig.run(&rig.installed_broker(), &args);
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    let now = std::fs::read(&installed).unwrap();
    assert!(now == good, "the planted hook-client was installed ({:?}...):\n{said}", String::from_utf8_lossy(&now[..now.len().min(20)]));
    assert!(out.status.success() && said.contains("lists other binaries than the ones installed"), "{said}");
}

fn repo_file(rel: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)).unwrap()
}

/// The docs say what install registers: docs/install.md names every event `HookEvent::REGISTERED`
/// holds, and no page counts them (or the handlers install trusts) as another number.
#[test]
fn docs_name_and_count_the_events_install_registers() {
    use codex_format::hook::HookEvent;
    const WORDS: [&str; 12] = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"];
    let want = WORDS[HookEvent::REGISTERED.len() - 1];
    let install_md = repo_file("docs/install.md");
    let step = &install_md[install_md.find("2. Registers the installed hook-client").expect("step 2 in docs/install.md")..];
    let step = &step[..step.find("\n3. ").unwrap()];
    for ev in HookEvent::REGISTERED {
        assert!(step.contains(&format!("`{}`", ev.as_str())), "docs/install.md step 2 does not name {}:\n{step}", ev.as_str());
    }
    let mut counted = 0;
    for page in ["README.md", "docs/install.md"] {
        let text = repo_file(page).replace('\n', " ");
        for w in WORDS {
            for phrase in [format!("{w} hook events"), format!("{w} events"), format!("{w} handlers"), format!("{w} trusted handlers")] {
                let n = text.matches(&phrase).count();
                assert!(n == 0 || w == want, "{page} says \"{phrase}\"; install registers {want}");
                counted += n;
            }
        }
    }
    assert!(counted >= 3, "the README and docs/install.md count the events ({want})");
}

/// The README's `broker threads` sample has the columns `broker threads` prints.
#[test]
fn readme_threads_sample_has_the_columns_broker_threads_prints() {
    let readme = repo_file("README.md");
    let sample = &readme[readme.find("$ broker threads\n").expect("a `broker threads` sample in the README") + 17..];
    let header: Vec<&str> = sample.lines().next().unwrap().split_whitespace().collect();
    let one: broker_lib::producer::threads::ThreadInfo = serde_json::from_value(serde_json::json!({
        "id": "01a230dc-dc16-73a1-9c5d-b520dea2f9f9", "state": "busy", "children": [], "rollout": "",
        "pending": 0, "undelivered": 0, "messages": {}
    }))
    .unwrap();
    let table = broker_lib::producer::threads::render_table(&[one], 0);
    let printed: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, printed, "README sample vs `broker threads`:\n{table}");
}

/// The README's Python socket example runs as written on a login without `XDG_RUNTIME_DIR` (an
/// ssh session without a user manager, a container): it asks `broker socket-path` where the
/// socket is, and gets the broker's JSON answer.
#[test]
fn readme_socket_example_runs_without_xdg_runtime_dir() {
    let readme = repo_file("README.md");
    let block = &readme[readme.find("**Socket.**").expect("the README's Socket paragraph")..];
    let code = &block[block.find("```python\n").unwrap() + 10..];
    let code = &code[..code.find("```").unwrap()];
    let env = CodexEnv::with_base_url("http://127.0.0.1:9/v1");
    let _broker = courier_tests::Broker::start(&env);
    let path = format!("{}:/usr/bin:/bin", broker_bin().parent().unwrap().display());
    let mut c = env.command("python3");
    c.arg("-c").arg(code).env("PATH", path).env_remove("XDG_RUNTIME_DIR");
    let out = run_bounded(&mut c, T);
    let said = text(&out.stdout);
    assert!(out.status.success(), "the README's example failed:\n{said}{}", text(&out.stderr));
    let answer: serde_json::Value = serde_json::from_str(said.trim()).unwrap_or_else(|e| panic!("{e}: {said}"));
    assert!(answer.get("ok").is_some(), "the broker's answer: {answer}");
}
