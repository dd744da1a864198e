//! Starting the broker at login: systemd user units (socket activation) or a login-profile
//! block running `broker serve --login`, and stopping a running broker.

use super::{
    daemon::stop_broker_running,
    files::{read_opt, remove_file, write_atomic},
    hooks::shell_quote,
    journal::{journal, Change},
    manifest::{ProfileEdit, StartSetup},
    systemd::{baked_env, render_units, run_bounded, systemctl_user, systemctl_user_ok, unit_dir, user_manager_runs},
    Report, SERVICE_UNIT, SOCKET_UNIT,
};
use anyhow::{bail, Context, Result};
use courier_shared::paths;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

// Starting the broker at login

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StartMode {
    /// systemd user units when `systemctl --user` works, else the login profile.
    Auto,
    Systemd,
    Profile,
    None,
}

impl StartMode {
    pub fn parse(s: &str) -> Result<StartMode> {
        Ok(match s {
            "auto" => StartMode::Auto,
            "systemd" => StartMode::Systemd,
            "profile" => StartMode::Profile,
            "none" => StartMode::None,
            _ => bail!("--start {s:?}: use auto, systemd, profile or none"),
        })
    }
}

/// The lines appended to login profiles: start the broker unless one runs. No login shell, a
/// Codex tool command's included, waits on it: the shell does not even wait for the broker
/// binary to load (`( ... & )`: a subshell that backgrounds it and exits at once, no job
/// notice), and `serve --login` detaches again, checks, starts and notes what it found in
/// broker.log, whatever state the broker is in.
pub fn profile_block(broker: &Path, codex_home: &Path) -> String {
    let env: Vec<String> = baked_env(codex_home).iter().map(|(k, v)| format!("{k}={}", shell_quote(v))).collect();
    let b = shell_quote(&broker.to_string_lossy());
    format!("{PROFILE_BEGIN}\nif [ -x {b} ]; then ({} {b} serve --login </dev/null >/dev/null 2>&1 &); fi\n{PROFILE_END}\n", env.join(" "))
}

pub(super) fn profile_files() -> Vec<PathBuf> {
    let home = PathBuf::from(std::env::var_os("HOME").unwrap_or_default());
    // ~/.profile always (sh, dash, and bash without its own files). A login bash reads only the
    // first of .bash_profile/.bash_login/.profile, and zsh only .zprofile: add to those that exist.
    let mut v = vec![home.join(".profile")];
    if let Some(bash) = [".bash_profile", ".bash_login"].iter().map(|f| home.join(f)).find(|p| p.is_file()) {
        v.push(bash);
    }
    if home.join(".zprofile").is_file() {
        v.push(home.join(".zprofile"));
    }
    v
}

pub(super) fn add_profile_block(path: &Path, block: &str, old: Option<&ProfileEdit>) -> Result<ProfileEdit> {
    let current = read_opt(path)?;
    let mut text = current.clone().unwrap_or_default();
    if let Some(old) = old {
        if old.inserted.ends_with(block) && text.contains(&old.inserted) {
            return Ok(old.clone()); // already there, unchanged
        }
        text = text.replacen(&old.inserted, "", 1);
    }
    let sep = if text.is_empty() || text.ends_with('\n') { "" } else { "\n" };
    let inserted = format!("{sep}{block}");
    text.push_str(&inserted);
    write_atomic(path, text.as_bytes(), 0o644)?;
    let created = old.map_or(current.is_none(), |o| o.created);
    Ok(ProfileEdit { path: path.to_path_buf(), inserted, created })
}

/// Puts `block` (the start line of `what`: the broker, the bridge) in every login profile, over
/// the edits `old` made; edits for profile files no longer chosen are undone.
pub(super) fn place_profile_block(block: &str, old: &[ProfileEdit], what: &str, report: &mut Report) -> Result<Vec<ProfileEdit>> {
    let mut files = Vec::new();
    for path in profile_files() {
        let prev = old.iter().find(|e| e.path == path);
        let edit = add_profile_block(&path, block, prev)?;
        if prev != Some(&edit) {
            report.push(format!("added the {what} start line to {}", path.display()));
        }
        files.push(edit);
    }
    for e in old.iter().filter(|e| !files.iter().any(|f| f.path == e.path)) {
        remove_profile_block(e)?;
    }
    Ok(files)
}

pub(super) fn remove_profile_block(edit: &ProfileEdit) -> Result<bool> {
    let Some(text) = read_opt(&edit.path)? else { return Ok(false) };
    if !text.contains(&edit.inserted) {
        return Ok(false);
    }
    let rest = text.replacen(&edit.inserted, "", 1);
    if rest.is_empty() && edit.created {
        remove_file(&edit.path)?;
    } else {
        write_atomic(&edit.path, rest.as_bytes(), 0o644)?;
    }
    Ok(true)
}

pub(super) fn setup_systemd(
    broker: &Path,
    codex_home: &Path,
    replaced: bool,
    no_enable: bool,
    previous: &StartSetup,
    report: &mut Report,
) -> Result<StartSetup> {
    if let StartSetup::Profile { .. } = previous {
        teardown_start(previous, broker, report)?;
    }
    let dir = unit_dir();
    let (sock, svc) = render_units(broker, codex_home);
    let fresh = [SOCKET_UNIT, SERVICE_UNIT].iter().all(|u| fs::symlink_metadata(dir.join(u)).is_err());
    let mut units = Vec::new();
    let mut changed = false;
    for (name, text) in [(SOCKET_UNIT, sock), (SERVICE_UNIT, svc)] {
        let p = dir.join(name);
        if read_opt(&p)?.as_deref() != Some(text.as_str()) {
            write_atomic(&p, text.as_bytes(), 0o644)?;
            changed = true;
        }
        units.push(p);
    }
    crate::failpoint::hit("install_after_units");
    if no_enable {
        report.push(format!(
            "wrote {SOCKET_UNIT} and {SERVICE_UNIT} to {}; enable them with: systemctl --user daemon-reload && systemctl --user enable --now {SOCKET_UNIT} {SERVICE_UNIT}",
            dir.display()
        ));
        return Ok(StartSetup::Systemd { units });
    }
    let ok = systemctl_user_ok;
    if changed {
        ok(&["daemon-reload"])?;
    }
    // A broker started by hand holds the socket path; the socket unit replaces it.
    ok(&["enable", "--now", SOCKET_UNIT, SERVICE_UNIT])?;
    if fresh {
        journal(Change::Enabled);
    }
    if changed || replaced {
        ok(&["try-restart", SERVICE_UNIT])?;
    }
    report.push(format!("systemd user units {SOCKET_UNIT} and {SERVICE_UNIT} enabled and started ({})", dir.display()));
    Ok(StartSetup::Systemd { units })
}

pub(super) fn setup_profile(
    broker: &Path,
    codex_home: &Path,
    replaced: bool,
    previous: &StartSetup,
    report: &mut Report,
) -> Result<StartSetup> {
    let old: Vec<ProfileEdit> = match previous {
        StartSetup::Profile { files } => files.clone(),
        StartSetup::Systemd { .. } => {
            teardown_start(previous, broker, report)?;
            Vec::new()
        }
        StartSetup::None => Vec::new(),
    };
    let files = place_profile_block(&profile_block(broker, codex_home), &old, "broker", report)?;
    if replaced {
        if let Some(pid) = stop_broker_running(broker)? {
            journal(Change::Stopped { exe: broker.to_path_buf(), codex_home: codex_home.to_path_buf() });
            report.push(format!("stopped the previous broker (pid {pid}) to run the new binaries"));
        }
    }
    let mut cmd = Command::new(broker);
    cmd.args(["serve", "--daemonize"]).envs(baked_env(codex_home));
    let out = run_bounded(cmd, Duration::from_secs(30)).context("running broker serve --daemonize")?;
    if !out.status.success() {
        bail!("{} serve --daemonize failed: {}", broker.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if said.starts_with("broker started") {
        journal(Change::Started(broker.to_path_buf()));
    }
    report.push(said);
    Ok(StartSetup::Profile { files })
}

pub(super) fn teardown_start(start: &StartSetup, broker: &Path, report: &mut Report) -> Result<()> {
    match start {
        StartSetup::None => {}
        StartSetup::Systemd { units } => remove_units(units, report)?,
        StartSetup::Profile { files } => {
            for f in files {
                if remove_profile_block(f)? {
                    report.push(format!("removed the broker start line from {}", f.path.display()));
                }
            }
            if let Some(pid) = stop_broker_running(broker)? {
                journal(Change::Stopped { exe: broker.to_path_buf(), codex_home: paths::codex_home() });
                report.push(format!("stopped the broker (pid {pid})"));
            }
        }
    }
    Ok(())
}

/// Disables (when a user manager answers) and removes Courier's unit files.
pub(super) fn remove_units(units: &[PathBuf], report: &mut Report) -> Result<()> {
    let present: Vec<&PathBuf> = units.iter().filter(|u| fs::symlink_metadata(u).is_ok()).collect();
    if present.is_empty() {
        return Ok(());
    }
    let manager = user_manager_runs();
    let names: Vec<String> = present.iter().filter_map(|u| u.file_name()).map(|n| n.to_string_lossy().into_owned()).collect();
    let mut args = vec!["disable", "--now"];
    args.extend(names.iter().map(String::as_str));
    let broker_units = names.iter().any(|n| n == SOCKET_UNIT || n == SERVICE_UNIT);
    if manager && systemctl_user(&args).is_some_and(|o| o.status.success()) && broker_units {
        journal(Change::Disabled);
    }
    for u in &present {
        if remove_file(u)? {
            report.push(format!("removed {}", u.display()));
        }
    }
    if manager {
        let _ = systemctl_user(&["daemon-reload"]);
    }
    Ok(())
}

const PROFILE_BEGIN: &str = "# >>> courier broker (added by `broker install`; `broker uninstall` removes it) >>>";

const PROFILE_END: &str = "# <<< courier broker <<<";
