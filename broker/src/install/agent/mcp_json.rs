//! Courier's MCP server (`<broker> mcp`, named [`MCP_SERVER_NAME`]) in an agent's JSON MCP config
//! (`mcpServers.<name>`: Claude Code's user config, `claude_mcp.rs`; Copilot CLI's
//! `mcp-config.json`, `copilot.rs`), one way for every such agent: written by the broker itself,
//! never by running the agent's `mcp add` (the broker runs no candidate binary). The user's keys,
//! order and indent are kept, a second install changes nothing, an entry of that name install
//! did not write is left alone; uninstall restores the bytes when nobody touched the file since,
//! else takes out only Courier's entry while it still runs the broker install wrote.

use crate::claude::mcp_config::registered_command;
use crate::claude::settings;
use crate::install::manifest::{track_edit, unedit, FileEdit};
use crate::install::Report;
use anyhow::{Context, Result};
use courier_shared::paths::MCP_SERVER_NAME;
use serde_json::{json, Value};
use std::path::Path;

/// What the manifest holds of one agent's MCP entry (fields of that agent's setup).
pub(super) struct McpSetup<'a> {
    /// The edit of the config file.
    pub edit: &'a mut Option<FileEdit>,
    /// The broker the entry runs, as install wrote it (uninstall removes only that entry).
    pub command: &'a mut Option<String>,
    /// Install created `mcpServers` there.
    pub created_servers: &'a mut bool,
}

/// What registering the entry takes, decided by [`plan`].
pub(super) enum Step {
    /// Nothing to write: the file registers exactly the entry already.
    Unchanged,
    /// An entry of Courier's name that install did not write: left as it is (the note says so).
    Foreign(String),
    /// The file's new text, to write once the manifest (already updated) is saved.
    Write(String),
}

/// Plans `entry`, which runs `command`, under Courier's name in the config at `path`, and notes
/// it in `setup` (but for [`Step::Foreign`]).
pub(super) fn plan(path: &Path, entry: Value, command: &str, setup: McpSetup) -> Result<Step> {
    let current = crate::install::files::read_opt(path)?;
    let before = settings::parse(current.as_deref(), path)?;
    let existing = registered_command(&before).map(str::to_string);
    if existing.is_some() && existing != *setup.command && existing.as_deref() != Some(command) {
        let note =
            format!("note: {} already has an MCP server \"{MCP_SERVER_NAME}\" (not written by install); left as it is", path.display());
        return Ok(Step::Foreign(note));
    }
    *setup.command = Some(command.to_string());
    if current.is_some() && before.get("mcpServers").and_then(|s| s.get(MCP_SERVER_NAME)) == Some(&entry) {
        return Ok(Step::Unchanged);
    }
    let mut doc = before;
    let servers = doc.as_object_mut().expect("settings::parse gives an object").entry("mcpServers").or_insert_with(|| {
        *setup.created_servers = true;
        json!({})
    });
    let servers = servers.as_object_mut().with_context(|| format!("mcpServers in {} is not an object; fix it first", path.display()))?;
    servers.insert(MCP_SERVER_NAME.to_string(), entry);
    let text = settings::render(&doc, current.as_deref());
    track_edit(setup.edit, path, current.as_deref(), &text);
    Ok(Step::Write(text))
}

/// What [`plan`] wrote taken back (uninstall's part), and forgotten.
pub(super) fn take_out(setup: McpSetup, report: &mut Report) -> Result<()> {
    uninstall(setup.edit.as_ref(), setup.command.as_deref(), *setup.created_servers, report)?;
    *setup.edit = None;
    *setup.command = None;
    *setup.created_servers = false;
    Ok(())
}

/// Uninstall's part: the entry removed while it still runs `ours`, what install wrote.
pub(super) fn uninstall(edit: Option<&FileEdit>, ours: Option<&str>, created_servers: bool, report: &mut Report) -> Result<()> {
    let (Some(edit), Some(ours)) = (edit, ours) else { return Ok(()) };
    let strip = |text: &str| -> Result<String> {
        let mut doc = settings::parse(Some(text), &edit.path)?;
        strip_entry(&mut doc, ours, created_servers);
        Ok(if doc.as_object().is_some_and(|o| o.is_empty()) { String::new() } else { settings::render(&doc, Some(text)) })
    };
    unedit(edit, "MCP server", strip, report)
}

/// Courier's entry taken out of `doc` while it runs `ours`; `mcpServers` too when install made it
/// and it is empty now.
fn strip_entry(doc: &mut Value, ours: &str, created_servers: bool) {
    if registered_command(doc) != Some(ours) {
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
