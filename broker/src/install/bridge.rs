//! `broker install --bridge --nats URL --host NAME [--creds FILE]`: this host's NATS bridge
//! (docs/many-hosts.md), started at login beside the broker, the same two ways: a systemd
//! user unit `courier-bridge.service`, or a block in the login profiles. Where to connect goes
//! into the `[bridge]` table of Courier's config (0600), which `courier-bridge serve` reads when
//! given no `--nats` and `broker doctor` checks, so neither the unit nor the profile line
//! carries a URL or a secret. `broker uninstall` takes all of it back.

use super::{
    daemon::terminate_if_exe,
    files::{read_opt, write_atomic},
    manifest::{save_manifest, track_edit, unedit, BridgeSetup, Manifest, StartSetup},
    start::{place_profile_block, remove_profile_block, StartMode},
    systemd::{baked_env, systemctl_user_ok, unit_dir, unit_quote},
    Report,
};
use crate::install::hooks::shell_quote;
use anyhow::{bail, Context, Result};
use courier_shared::paths;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const BRIDGE_UNIT: &str = "courier-bridge.service";
pub const BRIDGE_BIN: &str = "courier-bridge";

/// What `--bridge` asked for.
#[derive(Debug, Clone)]
pub struct BridgeOptions {
    pub nats: String,
    pub host: String,
    /// An absolute path to a `.creds` file.
    pub creds: Option<PathBuf>,
}

impl BridgeOptions {
    pub fn check(&self) -> Result<()> {
        crate::config::check_bridge_host(&self.host).context("--host")?;
        if self.nats.trim().is_empty() {
            bail!("--nats: a NATS URL (nats://, tls://)");
        }
        if let Some(c) = &self.creds {
            if !c.is_absolute() || !c.is_file() {
                bail!("--creds {}: not a readable file", c.display());
            }
        }
        Ok(())
    }
}

/// Writes `[bridge]` into Courier's config (format-preserving; the manifest lists the edit
/// before the file is written).
pub(super) fn write_config(m: &mut Manifest, state_dir: &Path, o: &BridgeOptions, report: &mut Report) -> Result<()> {
    let path = paths::config_path();
    let current = read_opt(&path)?;
    let mut doc: toml_edit::DocumentMut =
        current.as_deref().unwrap_or("").parse().with_context(|| format!("{} is not valid TOML; fix it first", path.display()))?;
    let mut t = toml_edit::Table::new();
    t.insert("nats", toml_edit::value(o.nats.as_str()));
    t.insert("host", toml_edit::value(o.host.as_str()));
    if let Some(c) = &o.creds {
        t.insert("creds", toml_edit::value(c.to_string_lossy().as_ref()));
    }
    // Who may answer approvals is the person's setting, which install never names: kept.
    if let Some(approvers) = doc.get("bridge").and_then(|b| b.get("approvers")).cloned() {
        t.insert("approvers", approvers);
    }
    doc.insert("bridge", toml_edit::Item::Table(t));
    let new = doc.to_string();
    // Checked as the broker and the bridge will read it.
    crate::config::parse(&new).with_context(|| format!("the [bridge] table for {}", path.display()))?;
    let setup = m.bridge.get_or_insert_with(Default::default);
    setup.nats = o.nats.clone();
    setup.host = o.host.clone();
    setup.creds = o.creds.clone();
    if current.as_deref() != Some(new.as_str()) {
        track_edit(&mut setup.config, &path, current.as_deref(), &new);
        save_manifest(state_dir, m)?;
        write_atomic(&path, new.as_bytes(), 0o600)?;
        report.push(format!("wrote the [bridge] table (host {}) to {}", o.host, path.display()));
    }
    Ok(())
}

/// The `[bridge]` table install wrote taken out of `text` (only while it names the same host and URL).
fn strip_config(text: &str, b: &BridgeSetup) -> Result<String> {
    let mut doc: toml_edit::DocumentMut = text.parse().context("Courier's config.toml is not valid TOML")?;
    let ours = doc.get("bridge").and_then(|i| i.as_table_like()).is_some_and(|t| {
        t.get("host").and_then(|v| v.as_str()) == Some(b.host.as_str()) && t.get("nats").and_then(|v| v.as_str()) == Some(b.nats.as_str())
    });
    if ours {
        doc.remove("bridge");
    }
    Ok(doc.to_string())
}

/// The unit file, rendered (the broker's environment, so both agree on the directories).
pub fn render_unit(broker: &Path, codex_home: &Path) -> String {
    let env: Vec<String> =
        baked_env(codex_home).iter().map(|(k, v)| format!("Environment={}", unit_quote(&format!("{k}={v}"), false))).collect();
    UNIT_TEMPLATE.replace("@BROKER@", &unit_quote(&broker.to_string_lossy(), true)).replace("@ENVIRONMENT@", &env.join("\n"))
}

/// The bridge's log when the profile line starts it.
fn log_path(state_dir: &Path, host: &str) -> PathBuf {
    state_dir.join(format!("bridge-{host}.log"))
}

/// The bridge's files in the state directory (its record, lock and log): what `uninstall
/// --purge` removes besides the broker's.
pub(super) fn state_files(host: &str) -> Vec<String> {
    let db = format!("bridge-{host}.sqlite");
    vec![format!("{db}-wal"), format!("{db}-shm"), db, format!("bridge-{host}.lock"), format!("bridge-{host}.log")]
}

/// The lines appended to login profiles: start the bridge in the background (a second login's
/// start finds the first one's lock and exits).
pub fn profile_block(broker: &Path, codex_home: &Path, log: &Path) -> String {
    let env: Vec<String> = baked_env(codex_home).iter().map(|(k, v)| format!("{k}={}", shell_quote(v))).collect();
    let b = shell_quote(&broker.to_string_lossy());
    let l = shell_quote(&log.to_string_lossy());
    format!("{PROFILE_BEGIN}\nif [ -x {b} ]; then {} nohup {b} bridge >>{l} 2>&1 </dev/null & fi\n{PROFILE_END}\n", env.join(" "))
}

/// The pid of the courier-bridge `exe` serving `host` now (its lock file names it).
fn running_pid(state_dir: &Path, host: &str, exe: &Path) -> Option<i32> {
    let pid: i32 = fs::read_to_string(state_dir.join(format!("bridge-{host}.lock"))).ok()?.trim().parse().ok()?;
    let link = crate::os::exe_path(pid).ok()?;
    let link = link.to_string_lossy();
    let exe = exe.to_string_lossy();
    (link == exe || link == format!("{exe} (deleted)")).then_some(pid)
}

/// Stops the bridge `exe` runs for `host`, if one does. Its pid, when it stopped one.
fn stop_running(state_dir: &Path, host: &str, exe: &Path) -> Result<Option<i32>> {
    let Some(pid) = running_pid(state_dir, host, exe) else { return Ok(None) };
    if !terminate_if_exe(pid, exe) {
        return Ok(None);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if !crate::os::exists(pid) {
            return Ok(Some(pid));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("courier-bridge pid {pid} did not exit within 10 s of SIGTERM");
}

/// Starts `broker bridge` in the background now (as the profile line would at the next login)
/// and waits until it holds its lock.
fn start_now(broker: &Path, codex_home: &Path, state_dir: &Path, host: &str, exe: &Path) -> Result<i32> {
    let log = log_path(state_dir, host);
    let out = fs::OpenOptions::new().create(true).append(true).open(&log).with_context(|| format!("opening {}", log.display()))?;
    let mut cmd = Command::new(broker);
    cmd.arg("bridge").envs(baked_env(codex_home)).stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out);
    // Its own process group: not stopped with the terminal install ran in.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().with_context(|| format!("starting {} bridge", broker.display()))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(pid) = running_pid(state_dir, host, exe) {
            return Ok(pid);
        }
        if let Ok(Some(st)) = child.try_wait() {
            let tail = fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(5).collect();
            bail!("{} bridge exited ({st}): {}", broker.display(), tail.into_iter().rev().collect::<Vec<_>>().join(" | "));
        }
        if Instant::now() > deadline {
            bail!("{} bridge did not take its lock within 10 s (see {})", broker.display(), log.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Arranges the bridge's start at login (`mode` as resolved for the broker) and starts it now.
#[allow(clippy::too_many_arguments)]
pub(super) fn setup_start(
    m: &mut Manifest,
    state_dir: &Path,
    mode: StartMode,
    broker: &Path,
    codex_home: &Path,
    replaced: bool,
    no_enable: bool,
    report: &mut Report,
) -> Result<()> {
    let setup = m.bridge.clone().unwrap_or_default();
    let exe = m.prefix.join(BRIDGE_BIN);
    let unit = unit_dir().join(BRIDGE_UNIT);
    // Leaving the other way first (a re-install that switched between systemd and profile).
    match (&setup.start, mode) {
        (StartSetup::Profile { .. }, StartMode::Profile) | (StartSetup::Systemd { .. }, StartMode::Systemd) => {}
        (previous, _) => teardown_start(previous, state_dir, &setup.host, &exe, report)?,
    }
    let start = match mode {
        StartMode::Systemd => {
            if !m.unit_files.contains(&unit) {
                m.unit_files.push(unit.clone());
                save_manifest(state_dir, m)?;
            }
            let text = render_unit(broker, codex_home);
            let changed = read_opt(&unit)?.as_deref() != Some(text.as_str());
            if changed {
                write_atomic(&unit, text.as_bytes(), 0o644)?;
            }
            if no_enable {
                report.push(format!(
                    "wrote {BRIDGE_UNIT} to {}; enable it with: systemctl --user enable --now {BRIDGE_UNIT}",
                    unit_dir().display()
                ));
            } else {
                let ok = systemctl_user_ok;
                if changed {
                    ok(&["daemon-reload"])?;
                }
                ok(&["enable", "--now", BRIDGE_UNIT])?;
                if changed || replaced {
                    ok(&["try-restart", BRIDGE_UNIT])?;
                }
                report.push(format!("systemd user unit {BRIDGE_UNIT} enabled and started (host {})", setup.host));
            }
            StartSetup::Systemd { units: vec![unit] }
        }
        StartMode::Profile => {
            let old = match &setup.start {
                StartSetup::Profile { files } => files.clone(),
                _ => Vec::new(),
            };
            let block = profile_block(broker, codex_home, &log_path(state_dir, &setup.host));
            let files = place_profile_block(&block, &old, "bridge", report)?;
            // Recorded before the start: uninstall must find what it would stop.
            m.bridge.get_or_insert_with(Default::default).start = StartSetup::Profile { files: files.clone() };
            save_manifest(state_dir, m)?;
            if replaced {
                if let Some(pid) = stop_running(state_dir, &setup.host, &exe)? {
                    report.push(format!("stopped the previous bridge (pid {pid}) to run the new binaries"));
                }
            }
            match running_pid(state_dir, &setup.host, &exe) {
                Some(pid) => report.push(format!("the bridge of host {} runs already (pid {pid})", setup.host)),
                None => {
                    let pid = start_now(broker, codex_home, state_dir, &setup.host, &exe)?;
                    report.push(format!(
                        "bridge of host {} started (pid {pid}, log {})",
                        setup.host,
                        log_path(state_dir, &setup.host).display()
                    ));
                }
            }
            StartSetup::Profile { files }
        }
        StartMode::None | StartMode::Auto => StartSetup::None,
    };
    m.bridge.get_or_insert_with(Default::default).start = start;
    save_manifest(state_dir, m)
}

fn teardown_start(start: &StartSetup, state_dir: &Path, host: &str, exe: &Path, report: &mut Report) -> Result<()> {
    match start {
        StartSetup::None => {}
        StartSetup::Systemd { units } => super::start::remove_units(units, report)?,
        StartSetup::Profile { files } => {
            for f in files {
                if remove_profile_block(f)? {
                    report.push(format!("removed the bridge start line from {}", f.path.display()));
                }
            }
            if let Some(pid) = stop_running(state_dir, host, exe)? {
                report.push(format!("stopped the bridge of host {host} (pid {pid})"));
            }
        }
    }
    Ok(())
}

/// `broker uninstall`: the bridge's start (unit or profile block, and the bridge the profile
/// line runs), then its `[bridge]` table.
pub(super) fn uninstall(m: &Manifest, state_dir: &Path, report: &mut Report) -> Result<()> {
    let Some(b) = &m.bridge else { return Ok(()) };
    teardown_start(&b.start, state_dir, &b.host, &m.prefix.join(BRIDGE_BIN), report)?;
    if let Some(edit) = &b.config {
        unedit(edit, "[bridge] table", |text| strip_config(text, b), report)?;
    }
    Ok(())
}

const UNIT_TEMPLATE: &str = include_str!("../../../install/systemd/courier-bridge.service");

const PROFILE_BEGIN: &str = "# >>> courier bridge (added by `broker install --bridge`; `broker uninstall` removes it) >>>";

const PROFILE_END: &str = "# <<< courier bridge <<<";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_strip_takes_only_our_table() {
        let b = BridgeSetup { nats: "nats://h:4222".into(), host: "a".into(), ..Default::default() };
        let text = "log_level = \"info\"\n\n[bridge]\nnats = \"nats://h:4222\"\nhost = \"a\"\n";
        assert_eq!(strip_config(text, &b).unwrap().trim(), "log_level = \"info\"");
        let other = "[bridge]\nnats = \"nats://h:4222\"\nhost = \"b\"\n";
        assert_eq!(strip_config(other, &b).unwrap(), other, "a table someone changed since stays");
    }

    #[test]
    fn profile_line_runs_the_bridge_in_the_background() {
        let block = profile_block(Path::new("/opt/c b/broker"), Path::new("/h/.codex"), Path::new("/s/bridge-a.log"));
        assert!(block.contains("nohup '/opt/c b/broker' bridge >>/s/bridge-a.log 2>&1 </dev/null & fi"), "{block}");
        assert!(block.starts_with(PROFILE_BEGIN) && block.trim_end().ends_with(PROFILE_END));
    }
}
