//! doctor's start checks: how the broker starts at login, and what to do when none answers.

use super::Check;
use crate::install::{self, Manifest, StartSetup};
use courier_shared::paths;
use std::path::Path;

/// No broker answers: a hung one (it holds the instance lock) or none at all.
pub(super) fn not_answering(runtime_dir: &Path, m: Option<&Manifest>, state_dir: &Path) -> Check {
    let socket = paths::socket_path(runtime_dir);
    match install::instance_holder(runtime_dir) {
        Some(pid) => Check::fail(
            format!(
                "the broker (pid {pid}) holds the instance lock of {} but does not answer on {}",
                runtime_dir.display(),
                socket.display()
            ),
            format!("`broker restart` replaces it; its log: {}", log_hint(m, state_dir)),
        ),
        None => Check::fail(format!("no broker answers on {}", socket.display()), start_fix(m, state_dir)),
    }
}

fn log_hint(m: Option<&Manifest>, state_dir: &Path) -> String {
    match m.map(|m| &m.start) {
        Some(StartSetup::Systemd { .. }) => format!("journalctl --user -u {}", install::SERVICE_UNIT),
        _ => state_dir.join("broker.log").display().to_string(),
    }
}

fn start_fix(m: Option<&Manifest>, state_dir: &Path) -> String {
    match m.map(|m| &m.start) {
        Some(StartSetup::Systemd { .. }) => format!(
            "systemctl --user start {} {}; if it fails: journalctl --user -u {}",
            install::SOCKET_UNIT,
            install::SERVICE_UNIT,
            install::SERVICE_UNIT
        ),
        Some(StartSetup::Profile { .. }) => format!(
            "{} serve --daemonize (it also runs at each login); if it fails see {}",
            m.map(|m| m.prefix.join("broker").display().to_string()).unwrap_or_else(|| "broker".into()),
            state_dir.join("broker.log").display()
        ),
        _ => "start it: `broker serve` (foreground) or `broker serve --daemonize`; `broker install` starts it at login".into(),
    }
}

pub(super) fn check_start(m: Option<&Manifest>, stopped: Option<i64>) -> Check {
    let Some(m) = m else {
        return Check::warn(
            "not installed with `broker install` (no install manifest): nothing starts the broker at login",
            Some("broker install".into()),
        );
    };
    match &m.start {
        StartSetup::Systemd { .. } | StartSetup::Profile { .. } if stopped.is_some() => Check::warn(
            format!("start at login is off: the broker is {}", install::describe_stop(stopped.unwrap_or(0))),
            Some("broker start".into()),
        ),
        StartSetup::Systemd { units } => {
            let missing: Vec<String> = units.iter().filter(|u| !u.is_file()).map(|u| u.display().to_string()).collect();
            if !missing.is_empty() {
                return Check::fail(format!("systemd unit files missing: {}", missing.join(", ")), "broker install");
            }
            if !install::user_manager_runs() {
                return Check::fail(
                    "systemd user units are installed but no user manager answers (`systemctl --user`)",
                    "log in through a session that starts `systemd --user`, or `broker install --start profile`",
                );
            }
            let state = |verb: &str, unit: &str| {
                install::systemctl_user(&[verb, unit]).map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default()
            };
            let (se, sa) = (state("is-enabled", install::SOCKET_UNIT), state("is-active", install::SOCKET_UNIT));
            let (ve, va) = (state("is-enabled", install::SERVICE_UNIT), state("is-active", install::SERVICE_UNIT));
            let c = if se == "enabled" && sa == "active" && ve == "enabled" {
                Check::ok(format!("systemd: {} {se}/{sa}, {} {ve}/{va}", install::SOCKET_UNIT, install::SERVICE_UNIT))
            } else {
                Check::fail(
                    format!("systemd: {} {se}/{sa}, {} {ve}/{va}", install::SOCKET_UNIT, install::SERVICE_UNIT),
                    format!("systemctl --user enable --now {} {}", install::SOCKET_UNIT, install::SERVICE_UNIT),
                )
            };
            c.detail(format!("logs: journalctl --user -u {}", install::SERVICE_UNIT))
        }
        StartSetup::Profile { files } => {
            let absent: Vec<String> = files
                .iter()
                .filter(|f| !std::fs::read_to_string(&f.path).is_ok_and(|t| t.contains(&f.inserted)))
                .map(|f| f.path.display().to_string())
                .collect();
            if absent.is_empty() {
                Check::ok(format!(
                    "login profile starts the broker ({})",
                    files.iter().map(|f| f.path.display().to_string()).collect::<Vec<_>>().join(", ")
                ))
            } else {
                Check::fail(format!("the broker start line is missing from {}", absent.join(", ")), "broker install --start profile")
            }
        }
        StartSetup::None => Check::warn("installed with --start none: nothing starts the broker at login", Some("broker install".into())),
    }
}
