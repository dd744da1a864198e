//! Courier's MCP server registered with Claude Code (the Claude Code row's part of `--mcp`, as
//! `install/mcp.rs` is Codex's): `mcpServers.courier` in Claude Code's user config
//! (`claude/mcp_config.rs` says where and what), edited as `mcp_json.rs` edits every agent's
//! JSON MCP config. Claude rewrites the file while it runs (an interactive claude running during
//! the install writes its own copy back and drops the entry, probed on 2.1.332: doctor reports
//! it), so uninstall usually finds it changed and takes out only Courier's entry; when nobody
//! touched it since, the bytes come back.

use super::mcp_json::{self, McpSetup, Step};
use super::AgentEnv;
use crate::claude::mcp_config;
use crate::install::carry::Run;
use crate::install::files::write_atomic;
use crate::install::manifest::{save_manifest, ClaudeSetup};
use crate::install::Report;
use anyhow::{Context, Result};
use courier_shared::paths::MCP_SERVER_NAME;
use std::path::{Path, PathBuf};

/// Claude Code's user config in `env` (where a link points, as for `settings.json`).
pub(super) fn config_file(env: &AgentEnv) -> Result<PathBuf> {
    let home = env.home.as_deref().filter(|h| !h.as_os_str().is_empty()).context("HOME is not set")?;
    let path = mcp_config::user_config_path(home, env.claude_config_dir.as_deref());
    Ok(std::fs::canonicalize(&path).unwrap_or(path))
}

fn mcp(setup: &mut ClaudeSetup) -> McpSetup<'_> {
    McpSetup { edit: &mut setup.mcp_json, command: &mut setup.mcp_command, created_servers: &mut setup.created_mcp_servers }
}

/// `<broker> mcp` registered as Claude Code's MCP server `courier` (`with_mcp`), or an earlier
/// registration taken out (`--no-mcp`). The edit is listed in the manifest before the write.
pub(super) fn register(run: &mut Run, broker: &Path, with_mcp: bool) -> Result<()> {
    let path = config_file(&run.env)?;
    let setup = run.m.claude.as_mut().expect("the hooks are registered first");
    // `--no-mcp`, or another config file than last time (CLAUDE_CONFIG_DIR changed: one
    // registration, where this environment's claude reads it).
    if !with_mcp || setup.mcp_json.as_ref().is_some_and(|e| e.path != path) {
        mcp_json::take_out(mcp(setup), &mut run.report)?;
    }
    if !with_mcp {
        return save_manifest(&run.state_dir, &run.m);
    }
    let entry = mcp_config::entry(broker, &courier_shared::paths::runtime_dir());
    let command = broker.to_string_lossy().into_owned();
    match mcp_json::plan(&path, entry, &command, mcp(setup))? {
        Step::Foreign(note) => run.report.push(note),
        Step::Unchanged => save_manifest(&run.state_dir, &run.m)?,
        Step::Write(text) => {
            save_manifest(&run.state_dir, &run.m)?;
            write_atomic(&path, text.as_bytes(), 0o600)?;
            let said = format!("registered `{command} mcp` as Claude Code's MCP server \"{MCP_SERVER_NAME}\" in {} (sessions started from now on have it; an interactive claude running now writes its own copy of the file back and drops it: `broker doctor` tells)", path.display());
            run.report.push(said);
        }
    }
    Ok(())
}

/// Uninstall's part: the entry removed while it still runs what install wrote.
pub(super) fn uninstall(setup: &ClaudeSetup, report: &mut Report) -> Result<()> {
    mcp_json::uninstall(setup.mcp_json.as_ref(), setup.mcp_command.as_deref(), setup.created_mcp_servers, report)
}
