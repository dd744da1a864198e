//! Running and installing the bridge: `broker bridge` and `broker send --nats` need
//! courier-bridge beside the broker; `broker install --bridge` (login profile and systemd, the
//! installed bridge works, `broker doctor` checks it, uninstall removes it). On a real
//! `nats-server -js`; the rig is the kit's `courier_tests::bridge`.

use std::path::Path;
use std::process::{Command, Stdio};

use courier_tests::bridge::*;
use courier_tests::broker::run_bounded;
use courier_tests::util::{marker, wait_until};
use courier_tests::{Broker, CodexEnv};
use serde_json::Value;

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
    // What the install started from env_a's prefix dies with env_a (`CodexEnv` drop).
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
    // Installing again changes nothing and keeps the running bridge, and the approvers the
    // person added to the table.
    let with_approvers = format!("{config}approvers = [\"alice\"]\n");
    std::fs::write(&env_a.courier_config, &with_approvers).unwrap();
    let again = install(&["--start", "profile"]);
    assert!(again.contains(&format!("runs already (pid {pid})")), "{again}");
    assert_eq!(std::fs::read_to_string(&env_a.courier_config).unwrap(), with_approvers, "install kept [bridge] approvers");

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
