//! Undoing a failed install run from its journal, newest change first; or keeping a successful
//! run's changes.

use super::{
    daemon::stop_broker_running,
    files::{remove_file, write_atomic},
    journal::Change,
    systemd::{baked_env, run_bounded, systemctl_user, unit_dir, user_manager_runs},
    SERVICE_UNIT, SOCKET_UNIT,
};
use anyhow::{Context, Result};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The result of undoing an install run: what was undone, and what could not be.
pub(super) struct Undone {
    pub(super) done: Vec<String>,
    pub(super) failed: Vec<String>,
}

/// Undoes `changes` (newest first). The manifest is restored last, and only when everything
/// else was undone: otherwise it keeps listing what is left, for `broker uninstall`.
pub(super) fn undo(changes: Vec<Change>, manifest: &Path) -> Undone {
    let mut u = Undone { done: Vec::new(), failed: Vec::new() };
    let mut restart = Vec::new();
    let mut manifest_change = None;
    let mut units_changed = false;
    for c in changes.into_iter().rev() {
        let r: Result<Option<String>> = match c {
            Change::File { ref path, .. } if path == manifest => {
                manifest_change = Some(c);
                continue;
            }
            Change::File { path, before } => {
                units_changed |= path.parent() == Some(unit_dir().as_path());
                match before {
                    Some((b, mode)) => restore_bytes(&path, &b, mode).map(|()| Some(format!("restored {}", path.display()))),
                    None => remove_file(&path).map(|gone| gone.then(|| format!("removed {}", path.display()))),
                }
            }
            Change::Binary { path, backup: Some(b) } => fs::rename(&b, &path)
                .with_context(|| format!("putting back {}", path.display()))
                .map(|()| Some(format!("put back the previous {}", path.display()))),
            Change::Binary { path, backup: None } => remove_file(&path).map(|gone| gone.then(|| format!("removed {}", path.display()))),
            Change::Dir(d) => match fs::remove_dir(&d) {
                Ok(()) => Ok(Some(format!("removed {}", d.display()))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e).with_context(|| format!("removing {}", d.display())),
            },
            Change::Enabled => match systemctl_user(&["disable", "--now", SOCKET_UNIT, SERVICE_UNIT]) {
                Some(o) if o.status.success() => Ok(Some(format!("disabled {SOCKET_UNIT} and {SERVICE_UNIT}"))),
                _ => Err(anyhow::anyhow!("systemctl --user disable --now {SOCKET_UNIT} {SERVICE_UNIT} failed")),
            },
            Change::Disabled => match systemctl_user(&["enable", "--now", SOCKET_UNIT, SERVICE_UNIT]) {
                Some(o) if o.status.success() => Ok(Some(format!("enabled {SOCKET_UNIT} and {SERVICE_UNIT} again"))),
                _ => Err(anyhow::anyhow!("systemctl --user enable --now {SOCKET_UNIT} {SERVICE_UNIT} failed")),
            },
            Change::Started(exe) => {
                stop_broker_running(&exe).map(|pid| pid.map(|p| format!("stopped the broker it had started (pid {p})")))
            }
            Change::Stopped { exe, codex_home } => {
                restart.push((exe, codex_home));
                continue;
            }
        };
        match r {
            Ok(Some(line)) => u.done.push(line),
            Ok(None) => {}
            Err(e) => u.failed.push(format!("{e:#}")),
        }
    }
    if units_changed && user_manager_runs() {
        let _ = systemctl_user(&["daemon-reload"]);
    }
    for (exe, codex_home) in restart {
        let mut cmd = Command::new(&exe);
        cmd.args(["serve", "--daemonize"]).envs(baked_env(&codex_home));
        match run_bounded(cmd, Duration::from_secs(30)) {
            Some(o) if o.status.success() => {
                u.done.push(format!("started the previous broker again ({})", String::from_utf8_lossy(&o.stdout).trim()))
            }
            _ => u.failed.push(format!("could not start the previous broker again: run {} serve --daemonize", exe.display())),
        }
    }
    if let Some(Change::File { path, before }) = manifest_change {
        if u.failed.is_empty() {
            let r = match before {
                Some((b, mode)) => restore_bytes(&path, &b, mode),
                None => remove_file(&path).map(|_| ()),
            };
            if let Err(e) = r {
                u.failed.push(format!("{e:#}"));
            }
        }
    }
    u
}

pub(super) fn restore_bytes(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    write_atomic(path, bytes, mode)?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).with_context(|| format!("restoring the mode of {}", path.display()))
}

/// A successful run keeps its changes: only the backups of replaced binaries go.
pub(super) fn commit(changes: Vec<Change>) {
    for c in changes {
        if let Change::Binary { backup: Some(b), .. } = c {
            let _ = fs::remove_file(b);
        }
    }
}
