//! Courier's MCP server registered with Claude Code (the Claude Code row's part of `--mcp`, as
//! `install/mcp.rs` is Codex's): `mcpServers.courier` in Claude Code's user config
//! (`claude/mcp_config.rs` says where and what), written by the broker itself, never by running
//! `claude mcp add` (the broker runs no candidate binary). The user's keys, order and indent are
//! kept, a second install changes nothing, an entry of that name install did not write is left
//! alone. Claude rewrites the file while it runs (an interactive claude running during the install
//! writes its own copy back and drops the entry, probed on 2.1.332: doctor reports it), so
//! uninstall usually finds it changed and takes out only Courier's entry; when nobody touched it
//! since, the bytes come back.

use super::AgentEnv;
use crate::claude::{mcp_config, settings};
use crate::install::carry::Run;
use crate::install::files::{read_opt, write_atomic};
use crate::install::manifest::{save_manifest, track_edit, unedit, ClaudeSetup};
use crate::install::Report;
use anyhow::{Context, Result};
use courier_shared::paths::MCP_SERVER_NAME;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Claude Code's user config in `env` (where a link points, as for `settings.json`).
pub(super) fn config_file(env: &AgentEnv) -> Result<PathBuf> {
    let home = env.home.as_deref().filter(|h| !h.as_os_str().is_empty()).context("HOME is not set")?;
    let path = mcp_config::user_config_path(home, env.claude_config_dir.as_deref());
    Ok(std::fs::canonicalize(&path).unwrap_or(path))
}

/// `<broker> mcp` registered as Claude Code's MCP server `courier` (`with_mcp`), or an earlier
/// registration taken out (`--no-mcp`). The edit is listed in the manifest before the write.
pub(super) fn register(run: &mut Run, broker: &Path, with_mcp: bool) -> Result<()> {
    let path = config_file(&run.env)?;
    let setup = run.m.claude.as_mut().expect("the hooks are registered first");
    // `--no-mcp`, or another config file than last time (CLAUDE_CONFIG_DIR changed: one
    // registration, where this environment's claude reads it).
    if !with_mcp || setup.mcp_json.as_ref().is_some_and(|e| e.path != path) {
        take_out(setup, &mut run.report)?;
    }
    if !with_mcp {
        return save_manifest(&run.state_dir, &run.m);
    }
    let current = read_opt(&path)?;
    let before = settings::parse(current.as_deref(), &path)?;
    let existing = mcp_config::registered_command(&before).map(str::to_string);
    let command = broker.to_string_lossy().into_owned();
    if existing.is_some() && existing != setup.mcp_command && existing.as_deref() != Some(command.as_str()) {
        let note =
            format!("note: {} already has an MCP server \"{MCP_SERVER_NAME}\" (not written by install); left as it is", path.display());
        run.report.push(note);
        return Ok(());
    }
    let entry = mcp_config::entry(broker, &courier_shared::paths::runtime_dir());
    setup.mcp_command = Some(command.clone());
    if current.is_some() && mcp_config::is_registered(&before, &entry) {
        return save_manifest(&run.state_dir, &run.m);
    }
    let mut doc = before;
    let servers = doc.as_object_mut().expect("settings::parse gives an object").entry("mcpServers").or_insert_with(|| {
        setup.created_mcp_servers = true;
        json!({})
    });
    let servers = servers.as_object_mut().with_context(|| format!("mcpServers in {} is not an object; fix it first", path.display()))?;
    servers.insert(MCP_SERVER_NAME.to_string(), entry);
    let text = settings::render(&doc, current.as_deref());
    track_edit(&mut setup.mcp_json, &path, current.as_deref(), &text);
    save_manifest(&run.state_dir, &run.m)?;
    write_atomic(&path, text.as_bytes(), 0o600)?;
    let said = format!("registered `{command} mcp` as Claude Code's MCP server \"{MCP_SERVER_NAME}\" in {} (sessions started from now on have it; an interactive claude running now writes its own copy of the file back and drops it: `broker doctor` tells)", path.display());
    run.report.push(said);
    Ok(())
}

/// What [`register`] wrote taken back (bytes restored when nobody changed the file since, else
/// only Courier's entry removed), and forgotten.
pub(super) fn take_out(setup: &mut ClaudeSetup, report: &mut Report) -> Result<()> {
    uninstall(setup, report)?;
    setup.mcp_json = None;
    setup.mcp_command = None;
    setup.created_mcp_servers = false;
    Ok(())
}

/// Uninstall's part: the entry removed while it still runs what install wrote.
pub(super) fn uninstall(setup: &ClaudeSetup, report: &mut Report) -> Result<()> {
    let (Some(edit), Some(ours)) = (&setup.mcp_json, &setup.mcp_command) else { return Ok(()) };
    let strip = |text: &str| -> Result<String> {
        let mut doc = settings::parse(Some(text), &edit.path)?;
        strip_entry(&mut doc, ours, setup.created_mcp_servers);
        Ok(if doc.as_object().is_some_and(|o| o.is_empty()) { String::new() } else { settings::render(&doc, Some(text)) })
    };
    unedit(edit, "MCP server", strip, report)
}

/// Courier's entry taken out of `doc` while it runs `ours`; `mcpServers` too when install made it
/// and it is empty now.
fn strip_entry(doc: &mut Value, ours: &str, created_servers: bool) {
    if mcp_config::registered_command(doc) != Some(ours) {
        return;
    }
    let Some(root) = doc.as_object_mut() else { return };
    if let Some(servers) = root.get_mut("mcpServers").and_then(Value::as_object_mut) {
        servers.remove(MCP_SERVER_NAME);
        if servers.is_empty() && created_servers {
            root.remove("mcpServers");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_courier_s_own_entry_is_stripped() {
        let mut doc = json!({"a": 1, "mcpServers": {"other": {"command": "x"}, "courier": {"command": "/p/broker"}}});
        strip_entry(&mut doc, "/elsewhere/broker", true);
        assert!(doc["mcpServers"].get("courier").is_some(), "an entry that runs another broker stays");
        strip_entry(&mut doc, "/p/broker", true);
        assert_eq!(doc, json!({"a": 1, "mcpServers": {"other": {"command": "x"}}}));
        let mut doc = json!({"mcpServers": {"courier": {"command": "/p/broker"}}});
        strip_entry(&mut doc, "/p/broker", false);
        assert_eq!(doc, json!({"mcpServers": {}}), "a key the user had stays");
        strip_entry(&mut doc, "/p/broker", true);
        let mut doc = json!({"mcpServers": {"courier": {"command": "/p/broker"}}});
        strip_entry(&mut doc, "/p/broker", true);
        assert_eq!(doc, json!({}));
    }
}
