//! `[mcp_servers.courier]` in Codex's `config.toml`: `broker mcp` registered as an MCP server
//! (`broker install --no-mcp` leaves it out), edited format-preserving like the trust entries.

use super::{manifest::Manifest, Report};
use anyhow::Result;
use courier_shared::paths::MCP_SERVER_NAME;
use std::path::Path;

/// Codex's per-server setting of when to ask the person before a tool call.
const APPROVAL_MODE: &str = "default_tools_approval_mode";

fn command_of(doc: &toml_edit::DocumentMut) -> Option<String> {
    doc.get("mcp_servers")?.get(MCP_SERVER_NAME)?.get("command")?.as_str().map(str::to_string)
}

/// Registers `<broker> mcp`, with the runtime directory baked in (Codex passes an MCP server only
/// a few of its own variables); with `allow_tools`, Codex calls its tools without asking the
/// person (Codex's `default_tools_approval_mode = "approve"`; without it the entry is written
/// without, so the setting follows the last install). An entry of that name install did not
/// write is left alone.
pub(super) fn add_mcp(
    doc: &mut toml_edit::DocumentMut,
    broker: &Path,
    allow_tools: bool,
    m: &mut Manifest,
    report: &mut Report,
) -> Result<()> {
    let command = broker.to_string_lossy().into_owned();
    let existing = command_of(doc);
    if existing.is_some() && existing != m.mcp_command && existing.as_deref() != Some(command.as_str()) {
        report.push(format!("note: config.toml already has [mcp_servers.{MCP_SERVER_NAME}] (not written by install); left as it is"));
        return Ok(());
    }
    let mut made = false;
    let servers = super::config_toml::ensure_table(doc.as_table_mut(), "mcp_servers", &mut made)?;
    let mut env = toml_edit::InlineTable::new();
    env.insert("COURIER_RUNTIME_DIR", courier_shared::paths::runtime_dir().to_string_lossy().as_ref().into());
    let mut args = toml_edit::Array::new();
    args.push("mcp");
    let mut t = toml_edit::Table::new();
    t.insert("command", toml_edit::value(command.as_str()));
    t.insert("args", toml_edit::value(args));
    t.insert("env", toml_edit::value(env));
    if allow_tools {
        t.insert(APPROVAL_MODE, toml_edit::value("approve"));
    }
    let same = servers.get(MCP_SERVER_NAME).map(|i| i.to_string()) == Some(toml_edit::Item::Table(t.clone()).to_string());
    if !same {
        servers.insert(MCP_SERVER_NAME, toml_edit::Item::Table(t));
        let unasked = if allow_tools { "; Codex calls them without asking the person" } else { "" };
        report.push(format!(
            "registered `{command} mcp` as Codex's MCP server \"{MCP_SERVER_NAME}\" (send_message, list_threads, message_status){unasked}"
        ));
    }
    if made {
        m.created_mcp_servers = true;
    }
    m.mcp_command = Some(command);
    Ok(())
}

/// Structural inverse of [`add_mcp`]: removes the entry only while it still runs what install
/// wrote.
pub fn remove_mcp(doc: &mut toml_edit::DocumentMut, m: &Manifest) {
    let Some(ours) = &m.mcp_command else { return };
    if command_of(doc).as_ref() != Some(ours) {
        return;
    }
    let root = doc.as_table_mut();
    if let Some(servers) = root.get_mut("mcp_servers").and_then(|i| i.as_table_like_mut()) {
        servers.remove(MCP_SERVER_NAME);
        if servers.is_empty() && m.created_mcp_servers {
            root.remove("mcp_servers");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_once_keeps_foreign_entries_and_removes_only_its_own() {
        let mut m = Manifest::default();
        let mut report = Report::new();
        let text = "model = \"gpt-5.5\" # mine\n\n[mcp_servers.other]\ncommand = \"x\"\n";
        let mut doc: toml_edit::DocumentMut = text.parse().unwrap();
        add_mcp(&mut doc, Path::new("/p/broker"), false, &mut m, &mut report).unwrap();
        let once = doc.to_string();
        assert!(once.starts_with(text), "the user's text stays as it was: {once}");
        assert!(once.contains("[mcp_servers.courier]\ncommand = \"/p/broker\"\nargs = [\"mcp\"]"), "{once}");
        assert_eq!(report.len(), 1);
        add_mcp(&mut doc, Path::new("/p/broker"), false, &mut m, &mut report).unwrap();
        assert_eq!(doc.to_string(), once, "idempotent");
        assert_eq!(report.len(), 1, "nothing new to say");
        remove_mcp(&mut doc, &m);
        assert_eq!(doc.to_string().trim_end(), text.trim_end(), "only ours removed");

        // An entry the user wrote is never touched.
        let mut doc: toml_edit::DocumentMut = "[mcp_servers.courier]\ncommand = \"/elsewhere/broker\"\n".parse().unwrap();
        let mut m = Manifest::default();
        add_mcp(&mut doc, Path::new("/p/broker"), false, &mut m, &mut report).unwrap();
        assert_eq!(command_of(&doc).as_deref(), Some("/elsewhere/broker"));
        assert!(report.last().unwrap().contains("left as it is"));
        remove_mcp(&mut doc, &m);
        assert_eq!(command_of(&doc).as_deref(), Some("/elsewhere/broker"));
    }

    /// `--allow-courier-tools` writes Codex's approval mode into Courier's entry; an install
    /// without it takes it out again; uninstall leaves the file as it was.
    #[test]
    fn allowing_courier_tools_is_one_line_of_its_own_entry() {
        let text = "model = \"gpt-5.5\"\n";
        let mut doc: toml_edit::DocumentMut = text.parse().unwrap();
        let (mut m, mut report) = (Manifest::default(), Report::new());
        add_mcp(&mut doc, Path::new("/p/broker"), true, &mut m, &mut report).unwrap();
        let allowed = doc.to_string();
        assert!(allowed.contains("[mcp_servers.courier]") && allowed.contains("default_tools_approval_mode = \"approve\""), "{allowed}");
        assert!(report.last().unwrap().contains("without asking the person"), "{report:?}");
        add_mcp(&mut doc, Path::new("/p/broker"), false, &mut m, &mut report).unwrap();
        assert!(!doc.to_string().contains(APPROVAL_MODE), "{doc}");
        add_mcp(&mut doc, Path::new("/p/broker"), true, &mut m, &mut report).unwrap();
        assert_eq!(doc.to_string(), allowed);
        // (The file itself comes back byte for byte from install's snapshot when nobody edited it.)
        remove_mcp(&mut doc, &m);
        assert_eq!(doc.to_string().trim_end(), text.trim_end());
    }
}
