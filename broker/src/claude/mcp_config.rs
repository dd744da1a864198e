//! Courier's MCP server in Claude Code's user config: where that file is, what Courier's entry
//! looks like and what is registered now. The merge is install's (`install/agent/claude_mcp.rs`);
//! doctor reads what is registered from here. The file is JSON like `settings.json` and is read
//! and written with the same helpers (`settings::parse`, `settings::render`).
//!
//! Probed on 2.1.332: the user scope of Claude Code's MCP servers is `mcpServers` in
//! `$CLAUDE_CONFIG_DIR/.claude.json` when that variable is set, else `~/.claude.json` (not
//! `~/.claude/.claude.json`); `claude mcp list` shows such a server as `source: "user"`. Claude
//! starts the server as its own child with the session's `CLAUDE_CODE_SESSION_ID` in its
//! environment, and puts only `claudecode/toolUseId` in a `tools/call`'s `_meta`. Claude rewrites
//! the whole file while it runs (first start, usage counters), in its own style (two spaces),
//! keeping keys it does not know.

use courier_shared::paths::MCP_SERVER_NAME;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Claude Code's user config file: `$CLAUDE_CONFIG_DIR/.claude.json`, else `~/.claude.json`.
pub fn user_config_path(home: &Path, claude_config_dir: Option<&std::ffi::OsStr>) -> PathBuf {
    match claude_config_dir.filter(|v| !v.is_empty()) {
        Some(d) => Path::new(d).join(".claude.json"),
        None => home.join(".claude.json"),
    }
}

/// Courier's entry: `<broker> mcp` on stdio, with the runtime directory baked in (as for Codex:
/// the broker's socket is found from it whatever environment claude passes on).
pub fn entry(broker: &Path, runtime_dir: &Path) -> Value {
    json!({
        "type": "stdio",
        "command": broker.to_string_lossy(),
        "args": ["mcp"],
        "env": {"COURIER_RUNTIME_DIR": runtime_dir.to_string_lossy()},
    })
}

/// The command of the server registered under Courier's name in `doc`, if any.
pub fn registered_command(doc: &Value) -> Option<&str> {
    doc.get("mcpServers")?.get(MCP_SERVER_NAME)?.get("command")?.as_str()
}

/// Whether `doc` registers exactly `entry` under Courier's name.
pub fn is_registered(doc: &Value, entry: &Value) -> bool {
    doc.get("mcpServers").and_then(|s| s.get(MCP_SERVER_NAME)) == Some(entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_config_follows_claude_config_dir() {
        let home = Path::new("/home/u");
        assert_eq!(user_config_path(home, None), Path::new("/home/u/.claude.json"));
        assert_eq!(user_config_path(home, Some("".as_ref())), Path::new("/home/u/.claude.json"));
        assert_eq!(user_config_path(home, Some("/cfg/claude".as_ref())), Path::new("/cfg/claude/.claude.json"));
    }

    #[test]
    fn the_entry_runs_broker_mcp_and_is_read_back() {
        let e = entry(Path::new("/p/broker"), Path::new("/run/user/1/courier"));
        assert_eq!(e["args"], json!(["mcp"]));
        let doc = json!({"mcpServers": {"other": {"command": "x"}, (MCP_SERVER_NAME): e.clone()}});
        assert_eq!(registered_command(&doc), Some("/p/broker"));
        assert!(is_registered(&doc, &e));
        assert!(!is_registered(&doc, &entry(Path::new("/q/broker"), Path::new("/run/user/1/courier"))));
        assert_eq!(registered_command(&json!({"mcpServers": {}})), None);
    }
}
