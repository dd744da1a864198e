//! The GitHub Copilot CLI row of the host-agent table (docs/copilot-cli.md): when the user has a
//! Copilot home (`$COPILOT_HOME`, else `~/.copilot`) or an earlier install registered it,
//! Courier's command hooks in a file of its own, `<Copilot home>/hooks/courier.json` (Copilot
//! reads every `*.json` there; the user's files are never touched), and the native binary the
//! user's `copilot` runs trusted with the code it unpacks (`copilot/trust.rs`). A user without
//! Copilot sees nothing new. With `--mcp` (the default) `<broker> mcp` is also Copilot's MCP
//! server `courier` in `<Copilot home>/mcp-config.json` (`mcp_json.rs`; the user's servers kept).
//! The file is listed in the manifest ahead of the write; `broker
//! uninstall` removes it while it reads what install wrote (and the `hooks/` directory when
//! install created it and it is empty), so the Copilot home is as before, byte for byte.

use super::mcp_json::{self, McpSetup, Step};
use super::{AgentEnv, Wanted};
use crate::install::carry::Run;
use crate::install::manifest::{save_manifest, CopilotSetup, Manifest};
use crate::install::Report;
use crate::store::Store;
use anyhow::{Context, Result};
use courier_shared::paths::MCP_SERVER_NAME;
use serde_json::json;
use std::path::{Path, PathBuf};

/// The events Courier registers, in the camelCase dialect (the payloads Courier reads).
const EVENTS: [crate::copilot::Event; 3] = crate::copilot::Event::ALL;
/// Copilot's timeout for one hook: hook-client answers within its own 500 ms deadline.
const TIMEOUT_SEC: u64 = 5;
/// Copilot's timeout for the permissionRequest hook: past the longest hold a person's answer may
/// take (`[approvals] hold_secs`), so the broker's bound ends the hold, never Copilot's kill.
const PERMISSION_TIMEOUT_SEC: u64 = crate::config::MAX_HOLD_SECS + 30;

fn copilot_home(env: &AgentEnv) -> Result<PathBuf> {
    match &env.copilot_home {
        Some(h) => Ok(PathBuf::from(h)),
        None => Ok(env.home.as_deref().filter(|h| !h.as_os_str().is_empty()).context("HOME is not set")?.join(".copilot")),
    }
}

fn hooks_file(env: &AgentEnv) -> Result<PathBuf> {
    Ok(copilot_home(env)?.join("hooks").join("courier.json"))
}

/// Copilot's MCP config: `<Copilot home>/mcp-config.json` (what `copilot mcp add` writes, probed
/// on 1.0.102).
fn mcp_file(env: &AgentEnv) -> Result<PathBuf> {
    let path = copilot_home(env)?.join("mcp-config.json");
    Ok(std::fs::canonicalize(&path).unwrap_or(path))
}

pub(super) fn config_files(env: &AgentEnv) -> Result<Vec<PathBuf>> {
    Ok(vec![hooks_file(env)?, mcp_file(env)?])
}

/// When the user has a Copilot home, or an earlier install registered the hooks.
pub(super) fn wanted(run: &Run) -> Result<Wanted> {
    Ok(match copilot_home(&run.env)?.is_dir() || run.m.copilot.is_some() {
        true => Wanted::Install,
        false => Wanted::TakeOut,
    })
}

/// The hook file's text for hook-client at `client`.
fn hooks_text(client: &Path) -> String {
    let quoted = crate::install::shell_quote(&client.to_string_lossy());
    let hooks: serde_json::Map<String, serde_json::Value> = EVENTS
        .iter()
        .map(|e| {
            let cmd = format!("{quoted} --host {} --event {}", crate::copilot::HOST, e.as_str());
            let timeout = match e {
                crate::copilot::Event::PermissionRequest => PERMISSION_TIMEOUT_SEC,
                crate::copilot::Event::PostToolUse | crate::copilot::Event::AgentStop => TIMEOUT_SEC,
            };
            (e.as_str().to_string(), json!([{"type": "command", "bash": cmd, "timeoutSec": timeout}]))
        })
        .collect();
    let mut text = serde_json::to_string_pretty(&json!({"version": 1, "hooks": hooks})).expect("a JSON value");
    text.push('\n');
    text
}

pub(super) fn register_hooks(run: &mut Run, client: &Path) -> Result<()> {
    let file = hooks_file(&run.env)?;
    let dir = file.parent().expect("hooks/courier.json has a parent").to_path_buf();
    let text = hooks_text(client);
    let created_dir = match &run.m.copilot {
        Some(s) => s.created_dir,
        None => !dir.exists(),
    };
    let earlier = run.m.copilot.take().unwrap_or_default();
    // In the manifest before the write: a crash between leaves something uninstall takes out.
    run.m.copilot = Some(CopilotSetup { hooks_file: file.clone(), created_dir, written: text.clone(), ..earlier });
    save_manifest(&run.state_dir, &run.m)?;
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    if std::fs::read_to_string(&file).ok().as_deref() != Some(text.as_str()) {
        crate::install::files::write_atomic(&file, text.as_bytes(), 0o644)?;
        run.report.push(format!("registered Courier's GitHub Copilot CLI hooks in {}", file.display()));
    }
    Ok(())
}

fn mcp(setup: &mut CopilotSetup) -> McpSetup<'_> {
    McpSetup { edit: &mut setup.mcp_json, command: &mut setup.mcp_command, created_servers: &mut setup.created_mcp_servers }
}

/// `<broker> mcp` registered as Copilot's MCP server `courier` in `mcp-config.json` (`with_mcp`),
/// or an earlier registration taken out (`--no-mcp`): a local (stdio) server with every tool, as
/// `copilot mcp add` writes one, told the broker's runtime directory. The edit is listed in the
/// manifest before the write.
pub(super) fn register_mcp(run: &mut Run, broker: &Path, with_mcp: bool) -> Result<()> {
    let path = mcp_file(&run.env)?;
    let setup = run.m.copilot.as_mut().expect("the hooks are registered first");
    if !with_mcp || setup.mcp_json.as_ref().is_some_and(|e| e.path != path) {
        mcp_json::take_out(mcp(setup), &mut run.report)?;
    }
    if !with_mcp {
        return save_manifest(&run.state_dir, &run.m);
    }
    let runtime = courier_shared::paths::runtime_dir();
    let entry = json!({
        "type": "local",
        "command": broker.to_string_lossy(),
        "args": ["mcp"],
        "env": {"COURIER_RUNTIME_DIR": runtime.to_string_lossy()},
        "tools": ["*"],
    });
    let command = broker.to_string_lossy().into_owned();
    match mcp_json::plan(&path, entry, &command, mcp(setup))? {
        Step::Foreign(note) => run.report.push(note),
        Step::Unchanged => save_manifest(&run.state_dir, &run.m)?,
        Step::Write(text) => {
            save_manifest(&run.state_dir, &run.m)?;
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            }
            crate::install::files::write_atomic(&path, text.as_bytes(), 0o600)?;
            let said = format!(
                "registered `{command} mcp` as GitHub Copilot CLI's MCP server \"{MCP_SERVER_NAME}\" in {} (sessions started from now on have it)",
                path.display()
            );
            run.report.push(said);
        }
    }
    Ok(())
}

/// The native binary behind the user's `copilot` (npm's launcher `npm-loader.js` runs the
/// per-platform package's binary), if found.
fn native_behind(env: &AgentEnv) -> Option<PathBuf> {
    crate::copilot::trust::native_behind(&crate::exe::launcher::on_path(env.path_var.as_deref(), "copilot")?)
}

pub(super) fn trust_binaries(run: &mut Run) -> Result<Option<String>> {
    let Some(native) = native_behind(&run.env) else {
        return Ok(Some("no copilot found on PATH: after installing it run `broker install` again, or `broker trust-copilot PATH`".into()));
    };
    let mut store = Store::open(&run.state_dir)?;
    let records = match crate::copilot::trust::trust(&mut store, &native, None, None) {
        Ok(r) => r,
        Err(e) => return Ok(Some(format!("the copilot at {} cannot be trusted yet: {e:#}", native.display()))),
    };
    drop(store);
    let setup = run.m.copilot.as_mut().expect("register_hooks runs first");
    for (r, new) in records {
        if new {
            run.report.push(format!("trusted GitHub Copilot CLI {} {} (sha256:{})", r.role, r.path, r.sha256));
            setup.trusted.push((r.role, r.sha256, r.path));
        }
    }
    save_manifest(&run.state_dir, &run.m).map(|()| None)
}

pub(super) fn take_out(run: &mut Run) -> Result<()> {
    if run.m.copilot.is_some() {
        uninstall(&run.m, &mut run.report)?;
        run.m.copilot = None;
        save_manifest(&run.state_dir, &run.m)?;
    }
    Ok(())
}

/// Removes the hook file while it reads what install wrote (a file the user changed stays, and
/// the report says so), and the `hooks/` directory install created when it is empty.
pub(super) fn uninstall(m: &Manifest, report: &mut Report) -> Result<()> {
    let Some(setup) = &m.copilot else { return Ok(()) };
    mcp_json::uninstall(setup.mcp_json.as_ref(), setup.mcp_command.as_deref(), setup.created_mcp_servers, report)?;
    match std::fs::read_to_string(&setup.hooks_file) {
        Ok(text) if text == setup.written => {
            std::fs::remove_file(&setup.hooks_file).with_context(|| format!("removing {}", setup.hooks_file.display()))?;
            report.push(format!("removed {}", setup.hooks_file.display()));
        }
        Ok(_) => {
            report.push(format!("left {}: changed since install (remove it to unregister Courier's hooks)", setup.hooks_file.display()))
        }
        Err(_) => {}
    }
    if setup.created_dir {
        if let Some(dir) = setup.hooks_file.parent() {
            if std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none()) {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
    Ok(())
}
