//! What an install run carries from step to step: the plan (`run.rs`) and each host agent's row
//! (`agent/`) work on the same [`Run`], and the rows get the [`Binaries`] step 1 put in place and
//! the [`AgentEnv`] that names their files.

use super::manifest::Manifest;
use super::{InstallOptions, Report};
use std::ffi::OsString;
use std::path::PathBuf;

/// What one install run carries from step to step (and to each host agent's row).
pub(super) struct Run<'a> {
    pub(super) opts: &'a InstallOptions,
    pub(super) state_dir: PathBuf,
    /// The environment naming the agents' files (Codex's home as install was given it).
    pub(super) env: AgentEnv,
    pub(super) m: Manifest,
    pub(super) report: Report,
}

/// The binaries in place (step 1).
pub(super) struct Binaries {
    pub(super) broker: PathBuf,
    pub(super) client: PathBuf,
    /// A binary the broker runs was replaced: a running broker must restart.
    pub(super) replaced: bool,
    pub(super) with_mcp: bool,
    pub(super) with_bridge: bool,
}

/// The environment that names the agents' files and commands, read once from the process (or
/// given by a test): rows never read the process environment themselves.
#[derive(Debug, Clone)]
pub struct AgentEnv {
    /// `HOME`.
    pub home: Option<PathBuf>,
    /// Codex's home: `--codex-home`, else `$CODEX_HOME`, else `~/.codex`.
    pub codex_home: PathBuf,
    /// `CLAUDE_CONFIG_DIR` (Claude Code's config directory when set).
    pub claude_config_dir: Option<OsString>,
    /// Courier's own config file (`COURIER_CONFIG`, else the XDG default).
    pub courier_config: PathBuf,
    /// `PATH`, where the agents' commands are looked up.
    pub path_var: Option<OsString>,
    /// `COPILOT_HOME` (GitHub Copilot CLI's state directory when set; else `~/.copilot`).
    pub copilot_home: Option<OsString>,
}

impl AgentEnv {
    /// This process's environment, with Codex's home as given.
    pub fn from_process(codex_home: PathBuf) -> AgentEnv {
        AgentEnv {
            home: std::env::var_os("HOME").map(PathBuf::from),
            codex_home,
            claude_config_dir: std::env::var_os("CLAUDE_CONFIG_DIR"),
            courier_config: courier_shared::paths::config_path(),
            path_var: std::env::var_os("PATH"),
            copilot_home: std::env::var_os("COPILOT_HOME").filter(|v| !v.is_empty()),
        }
    }
}
