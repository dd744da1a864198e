//! systemd user units: rendering them (socket activation) and asking `systemctl --user`.

use courier_shared::paths;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd` with a deadline; `None` if it could not start or did not finish in time.
pub(super) fn run_bounded(mut cmd: Command, timeout: Duration) -> Option<std::process::Output> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().ok()?;
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return child.wait_with_output().ok(),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

pub fn systemctl_user(args: &[&str]) -> Option<std::process::Output> {
    let mut c = Command::new("systemctl");
    c.arg("--user").args(args);
    run_bounded(c, Duration::from_secs(20))
}

/// `systemctl --user ARGS`, which must succeed: its stderr is the error otherwise.
pub fn systemctl_user_ok(args: &[&str]) -> anyhow::Result<()> {
    match systemctl_user(args) {
        Some(o) if o.status.success() => Ok(()),
        Some(o) => anyhow::bail!("systemctl --user {} failed: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim()),
        None => anyhow::bail!("systemctl --user {} did not finish", args.join(" ")),
    }
}

/// A systemd user manager answers.
pub fn user_manager_runs() -> bool {
    user_manager_answer().is_ok()
}

/// Whether a systemd user manager answers, and if not what `systemctl --user` said.
pub fn user_manager_answer() -> Result<(), String> {
    match systemctl_user(&["show-environment"]) {
        Some(o) if o.status.success() => Ok(()),
        Some(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
        None => Err("systemctl did not run or did not finish".into()),
    }
}

pub fn unit_dir() -> PathBuf {
    std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".config"))
        .join("systemd/user")
}

/// A value for a unit file line: `%` escaped; quoted when it has blanks or quotes.
pub(super) fn unit_quote(s: &str, dollar: bool) -> String {
    let mut v = s.replace('%', "%%");
    if dollar {
        v = v.replace('$', "$$");
    }
    if v.contains([' ', '\t', '"', '\'', '\\']) {
        format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""))
    } else {
        v
    }
}

/// Environment the broker must see to agree with the hook-clients Codex runs: the CODEX_HOME
/// installed into, plus any COURIER_* directory override set at install time.
pub(super) fn baked_env(codex_home: &Path) -> Vec<(String, String)> {
    let mut v = vec![("CODEX_HOME".to_string(), codex_home.to_string_lossy().into_owned())];
    for k in ["COURIER_RUNTIME_DIR", "COURIER_STATE_DIR", "COURIER_CONFIG"] {
        if let Some(val) = std::env::var_os(k).filter(|v| !v.is_empty()) {
            v.push((k.into(), val.to_string_lossy().into_owned()));
        }
    }
    v
}

/// The two unit files, rendered.
pub fn render_units(broker: &Path, codex_home: &Path) -> (String, String) {
    let socket = paths::socket_path(&paths::runtime_dir());
    let listen = match std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        Some(xdg) if std::env::var_os("COURIER_RUNTIME_DIR").is_none() => match socket.strip_prefix(&xdg) {
            Ok(rest) => format!("%t/{}", rest.to_string_lossy().replace('%', "%%")),
            Err(_) => socket.to_string_lossy().replace('%', "%%"),
        },
        _ => socket.to_string_lossy().replace('%', "%%"),
    };
    let env: Vec<String> =
        baked_env(codex_home).iter().map(|(k, v)| format!("Environment={}", unit_quote(&format!("{k}={v}"), false))).collect();
    let sock = SOCKET_TEMPLATE.replace("@LISTEN@", &listen);
    let svc = SERVICE_TEMPLATE.replace("@BROKER@", &unit_quote(&broker.to_string_lossy(), true)).replace("@ENVIRONMENT@", &env.join("\n"));
    (sock, svc)
}

const SOCKET_TEMPLATE: &str = include_str!("../../../install/systemd/courier-broker.socket");

const SERVICE_TEMPLATE: &str = include_str!("../../../install/systemd/courier-broker.service");
