//! `broker uninstall [--purge]`: takes back exactly what the manifest says install added.

use super::{
    agent::HostAgent,
    daemon::DAEMON_LOG,
    files::remove_file,
    manifest::{load_manifest, manifest_path, Manifest, StartSetup},
    start::{remove_units, teardown_start},
    Report, MANIFEST_NAME,
};
use crate::client;
use anyhow::{bail, Context, Result};
use courier_shared::paths;
use std::fs;
use std::path::Path;

// uninstall

/// Courier's files in the state directory (queue, ticket journal, log, lock, manifest) and the
/// runtime directory (socket, secret, lock): what `--purge` removes, and nothing else.
pub(super) fn state_files() -> Vec<String> {
    let db = crate::store::DB_NAME;
    vec![
        db.into(),
        format!("{db}-wal"),
        format!("{db}-shm"),
        crate::store::TICKET_JOURNAL_NAME.into(),
        DAEMON_LOG.into(),
        format!("{DAEMON_LOG}.1"),
        "broker.lock".into(),
        super::instance::STOP_MARKER.into(),
        MANIFEST_NAME.into(),
    ]
}
pub(super) fn runtime_files() -> Vec<String> {
    vec![paths::SOCKET_NAME.into(), paths::SECRET_NAME.into(), "broker.lock".into()]
}

/// Removes Courier's `files` (and its leftover temporary files) from `dir`, then `dir` itself
/// if nothing else is in it. Never removes a file it does not know.
pub(super) fn purge_dir(dir: &Path, known: &[String]) -> Result<Vec<String>> {
    let Ok(rd) = fs::read_dir(dir) else { return Ok(Vec::new()) };
    let mut others = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let temp = (name.starts_with(".secret.") || name.starts_with(".install-manifest.json.courier-"))
            && e.file_type().is_ok_and(|t| t.is_file());
        if known.contains(&name) || temp {
            fs::remove_file(e.path()).with_context(|| format!("removing {}", e.path().display()))?;
        } else {
            others.push(name);
        }
    }
    if others.is_empty() {
        fs::remove_dir(dir).with_context(|| format!("removing {}", dir.display()))?;
        Ok(vec![format!("removed {}", dir.display())])
    } else {
        others.sort();
        Ok(vec![format!("removed Courier's files from {}; kept the directory, which also holds {}", dir.display(), others.join(", "))])
    }
}

/// `broker uninstall [--purge]`: removes what the manifest lists (also what a failed or
/// interrupted install left); `purge` also removes the state and runtime directories' files.
pub fn uninstall(purge: bool) -> Result<Report> {
    let state_dir = paths::state_dir();
    let runtime_dir = paths::runtime_dir();
    let manifest = load_manifest(&state_dir)?;
    if manifest.is_none() && !purge {
        bail!(
            "nothing to uninstall: no install manifest at {} (`broker uninstall --purge` removes the state directory anyway)",
            manifest_path(&state_dir).display()
        );
    }
    if purge {
        // The queue is open in a running broker: removing it under that broker would lose it
        // silently. A broker install started is stopped below; any other must be stopped first.
        if let Some(st) = client::query_status(&runtime_dir) {
            let pid = st.pid;
            let exe = crate::os::exe_path(pid as i32).unwrap_or_default();
            let ours = manifest.as_ref().is_some_and(|m| {
                m.start != StartSetup::None
                    && exe.to_string_lossy().trim_end_matches(" (deleted)") == m.prefix.join("broker").to_string_lossy()
            });
            if !ours {
                bail!("a broker (pid {pid}, {}) still runs for this login and holds the queue open; stop it, then run `broker uninstall --purge` again", exe.display());
            }
        }
    }
    let mut report = Report::new();
    // Asked before the broker stops and the trust goes: afterwards nothing can prove them.
    let open_sessions = manifest.as_ref().map(|_| open_sessions()).unwrap_or_default();
    if let Some(m) = &manifest {
        uninstall_manifest(m, &state_dir, &mut report)?;
    }
    if !open_sessions.is_empty() {
        report.push(format!(
            "note: {} agent session(s) open now loaded Courier's hooks when they started and keep running them: until each \
             is restarted, its hooks fail (Codex shows \"Hook failed - hook exited with code 127\"; nothing else breaks). \
             Open now:",
            open_sessions.len()
        ));
        report.extend(open_sessions.iter().map(|s| format!("  {s}")));
    }
    if purge {
        if let Some(st) = client::query_status(&runtime_dir) {
            bail!("the broker (pid {}) is still running; stop it, then run `broker uninstall --purge` again", st.pid);
        }
        report.extend(purge_dir(&runtime_dir, &runtime_files())?);
        let mut known = state_files();
        if let Some(b) = manifest.as_ref().and_then(|m| m.bridge.as_ref()) {
            known.extend(super::bridge::state_files(&b.host));
        }
        report.extend(purge_dir(&state_dir, &known)?);
        report.push("Courier is uninstalled; its queue, secret, socket, log and lock are removed".into());
    } else {
        report.push(format!(
            "Courier is uninstalled; kept its state directory {} (the message queue and log; `broker uninstall --purge` removes it)",
            state_dir.display()
        ));
    }
    Ok(report)
}

/// The live sessions of every host (one line per agent process: its program and pid, its threads
/// or sessions and their cwd), as `broker threads` finds them.
fn open_sessions() -> Vec<String> {
    use crate::producer::threads::Host;
    let Ok(threads) = crate::producer::cli::fetch_threads(false, 0) else { return Vec::new() };
    let mut by_pid: std::collections::BTreeMap<i32, (Host, Vec<String>)> = Default::default();
    for t in threads.iter().filter(|t| t.parent.is_none()) {
        let Some(p) = &t.process else { continue };
        let cwd = t.cwd.as_deref().map(|c| format!(" in {}", crate::terminal::escape(c))).unwrap_or_default();
        by_pid.entry(p.pid).or_insert_with(|| (t.host, Vec::new())).1.push(format!("{}{cwd}", t.id));
    }
    let line = |pid: i32, host: Host, ids: Vec<String>| match host {
        Host::Codex => format!("codex pid {pid}: thread {}", ids.join(", thread ")),
        Host::ClaudeCode => format!("claude pid {pid}: session {}", ids.join(", session ")),
        Host::Copilot => format!("copilot pid {pid}: session {}", ids.join(", session ")),
    };
    by_pid.into_iter().map(|(pid, (host, ids))| line(pid, host, ids)).collect()
}

/// Courier's config directory (`~/.config/courier`), when taking install's config edits back left
/// it empty: install created it for the file it wrote there. Only a directory named for Courier
/// (never the one a `COURIER_CONFIG` elsewhere names), and only when empty.
fn remove_empty_config_dir(report: &mut Report) {
    let config = paths::config_path();
    let Some(dir) = config.parent().filter(|d| d.file_name().is_some_and(|n| n == "courier")) else { return };
    if fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none()) && fs::remove_dir(dir).is_ok() {
        report.push(format!("removed {} (empty)", dir.display()));
    }
}

pub(super) fn uninstall_manifest(m: &Manifest, state_dir: &Path, report: &mut Report) -> Result<()> {
    let broker = m.prefix.join("broker");
    // The bridge first: it is a client of the broker.
    super::bridge::uninstall(m, state_dir, report)?;
    teardown_start(&m.start, &broker, report)?;
    // Unit files written by an install whose systemd step failed are not in `start`.
    remove_units(&m.unit_files, report)?;

    for agent in HostAgent::ALL {
        agent.uninstall(m, state_dir, report)?;
    }
    remove_empty_config_dir(report);
    for b in &m.binaries {
        if remove_file(b)? {
            report.push(format!("removed {}", b.display()));
        }
    }
    if m.created_prefix && fs::remove_dir(&m.prefix).is_ok() {
        report.push(format!("removed {}", m.prefix.display()));
    }
    remove_file(&manifest_path(state_dir))?;
    Ok(())
}
