//! What install added, and what one run changed: the manifest (written ahead of each step, read
//! by uninstall and doctor) and the run's journal, undone when a step fails.

use super::{
    files::{read_opt, restore, write_atomic},
    Report, MANIFEST_NAME,
};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FileEdit {
    pub path: PathBuf,
    /// The file before Courier touched it; `None` when it did not exist.
    pub original: Option<String>,
    /// What install last wrote. When the file still reads exactly this, uninstall restores
    /// `original` byte-for-byte; otherwise it removes Courier's entries structurally.
    pub written: String,
    /// False once the file was seen changed by someone else between installs: `original` is
    /// then stale and only the structural removal is safe.
    pub snapshot_valid: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProfileEdit {
    pub path: PathBuf,
    /// The exact text appended (block plus any newline put before it).
    pub inserted: String,
    pub created: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum StartSetup {
    #[default]
    None,
    Systemd {
        units: Vec<PathBuf>,
    },
    Profile {
        files: Vec<ProfileEdit>,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Manifest {
    pub version: u32,
    pub prefix: PathBuf,
    pub created_prefix: bool,
    pub binaries: Vec<PathBuf>,
    pub codex_home: PathBuf,
    pub hook_command: String,
    /// Every hook command install ever registered (older prefixes included), for clean-up.
    pub commands: Vec<String>,
    pub hooks_json: Option<FileEdit>,
    pub created_hooks_key: bool,
    pub created_events: Vec<String>,
    pub config_toml: Option<FileEdit>,
    /// `hooks.state` keys and the hash install wrote for each.
    pub trust_entries: Vec<(String, String)>,
    /// "hooks" and/or "hooks.state" when install created those tables.
    pub created_tables: Vec<String>,
    /// Codex digests install added to the trusted set (digest, path).
    pub codex_trusted: Vec<(String, String)>,
    /// `codex` commands install asked the broker to follow across upgrades.
    #[serde(default)]
    pub codex_followed: Vec<String>,
    pub start: StartSetup,
    /// Every systemd unit file install wrote, recorded before writing it: uninstall removes them
    /// even when enabling them failed.
    #[serde(default)]
    pub unit_files: Vec<PathBuf>,
    /// The `command` of the `[mcp_servers.courier]` entry install wrote (`broker mcp`).
    #[serde(default)]
    pub mcp_command: Option<String>,
    /// Install created the `mcp_servers` table.
    #[serde(default)]
    pub created_mcp_servers: bool,
    /// `install --bridge`: the `[bridge]` table and how the bridge starts.
    #[serde(default)]
    pub bridge: Option<BridgeSetup>,
    /// The package directory (one with a `SHA256SUMS`) the binaries came from: `broker install`
    /// run from the installed copy updates from it. `None` after an install from a build tree.
    #[serde(default)]
    pub package: Option<PathBuf>,
    /// That package's `SHA256SUMS` when install copied from it (name -> SHA-256): npm's launcher
    /// compares it with the package's own list to say an upgrade awaits `broker install`, without
    /// hashing a binary on every command.
    #[serde(default)]
    pub package_sums: BTreeMap<String, String>,
    /// Claude Code's hooks, port and trusted binaries (`agent/claude.rs`).
    #[serde(default)]
    pub claude: Option<ClaudeSetup>,
    /// GitHub Copilot CLI's hook file and trusted files (`agent/copilot.rs`).
    #[serde(default)]
    pub copilot: Option<CopilotSetup>,
}

/// What install did for GitHub Copilot CLI (in the manifest; written by `agent/copilot.rs`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct CopilotSetup {
    /// `<Copilot home>/hooks/courier.json`, Courier's own file there.
    pub hooks_file: PathBuf,
    /// Whether install created the `hooks/` directory (uninstall removes it when empty).
    pub created_dir: bool,
    /// What install last wrote there: uninstall removes the file only while it reads exactly this.
    pub written: String,
    /// Copilot files install trusted (role, digest, path).
    pub trusted: Vec<(String, String, String)>,
    /// The edit of Copilot's `mcp-config.json` (the MCP server `courier`).
    #[serde(default)]
    pub mcp_json: Option<FileEdit>,
    /// The broker that MCP server runs, as install wrote it (uninstall removes only that entry).
    #[serde(default)]
    pub mcp_command: Option<String>,
    /// Install created `mcpServers` there.
    #[serde(default)]
    pub created_mcp_servers: bool,
}

pub fn manifest_path(state_dir: &Path) -> PathBuf {
    state_dir.join(MANIFEST_NAME)
}

pub fn load_manifest(state_dir: &Path) -> Result<Option<Manifest>> {
    let path = manifest_path(state_dir);
    match fs::read_to_string(&path) {
        Ok(t) => Ok(Some(serde_json::from_str(&t).with_context(|| format!("parsing {}", path.display()))?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

pub(super) fn save_manifest(state_dir: &Path, m: &Manifest) -> Result<()> {
    let mut text = serde_json::to_string_pretty(m)?;
    text.push('\n');
    let path = manifest_path(state_dir);
    if read_opt(&path)?.as_deref() != Some(text.as_str()) {
        write_atomic(&path, text.as_bytes(), 0o600)?;
    }
    Ok(())
}

/// Records that install is about to write `new` to `edit`'s file whose current text is `current`.
pub(super) fn track_edit(edit: &mut Option<FileEdit>, path: &Path, current: Option<&str>, new: &str) {
    match edit {
        Some(e) => {
            if current != Some(e.written.as_str()) {
                e.snapshot_valid = false; // someone changed it since: the old original is stale
            }
            e.written = new.to_string();
        }
        None => {
            *edit = Some(FileEdit {
                path: path.to_path_buf(),
                original: current.map(str::to_string),
                written: new.to_string(),
                snapshot_valid: true,
            })
        }
    }
}

/// What install did for Claude Code (in the manifest; written by `agent/claude.rs`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct ClaudeSetup {
    /// The edit of Claude Code's `settings.json`.
    pub settings: Option<FileEdit>,
    pub created_hooks_key: bool,
    pub created_events: Vec<String>,
    /// Every hook URL install registered (earlier ports too), for clean-up.
    pub urls: Vec<String>,
    /// The port the hooks post to now.
    pub port: u16,
    /// The edit of Courier's config when install chose the port (`[claude] hook_port`).
    pub config: Option<FileEdit>,
    /// The port install wrote there (uninstall takes out only that value, never the user's).
    #[serde(default)]
    pub written_port: Option<u16>,
    /// Claude Code digests install trusted (digest, path).
    pub trusted: Vec<(String, String)>,
    /// The edit of Claude Code's user config (`.claude.json`: the MCP server `courier`).
    #[serde(default)]
    pub mcp_json: Option<FileEdit>,
    /// The broker that MCP server runs, as install wrote it (uninstall removes only that entry).
    #[serde(default)]
    pub mcp_command: Option<String>,
    /// Install created `mcpServers` there.
    #[serde(default)]
    pub created_mcp_servers: bool,
    /// `--allow-courier-tools`: install added `mcp__courier` to `permissions.allow` in `settings.json`.
    #[serde(default)]
    pub allowed_tools: Option<AllowedTools>,
}

/// The permission rule install added for Courier's MCP tools, and the keys it made for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllowedTools {
    pub created_permissions: bool,
    pub created_allow: bool,
}

/// What install did for the bridge (in the manifest).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct BridgeSetup {
    pub nats: String,
    pub host: String,
    #[serde(default)]
    pub creds: Option<PathBuf>,
    /// The edit of Courier's config.toml (the `[bridge]` table).
    #[serde(default)]
    pub config: Option<FileEdit>,
    /// How the bridge starts at login (units or profile blocks of its own).
    #[serde(default)]
    pub start: StartSetup,
}

/// Puts back one file install edited: byte for byte when nobody changed it since, else with only
/// Courier's entries taken out by `strip` (None when it cannot be parsed).
pub(super) fn unedit(edit: &FileEdit, what: &str, strip: impl Fn(&str) -> Result<String>, report: &mut Report) -> Result<()> {
    let current = read_opt(&edit.path)?;
    let p = edit.path.display();
    if current.as_deref() == Some(edit.written.as_str()) && edit.snapshot_valid {
        restore(&edit.path, edit.original.as_deref())?;
        report.push(match edit.original {
            Some(_) => format!("restored {p}"),
            None => format!("removed {p} (install had created it)"),
        });
    } else if current.is_some() && current == edit.original && edit.snapshot_valid {
        // Listed ahead of a write that never happened (an interrupted install): nothing to undo.
    } else if let Some(text) = current {
        let out = strip(&text)?;
        if out.trim().is_empty() && edit.original.is_none() {
            restore(&edit.path, None)?;
            report.push(format!("removed {p} (install had created it; only Courier's {what} were left)"));
        } else {
            write_atomic(&edit.path, out.as_bytes(), 0o600)?;
            report.push(format!("removed Courier's {what} from {p} (it changed since install)"));
        }
    }
    Ok(())
}
