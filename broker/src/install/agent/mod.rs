//! The host agents Courier installs into, as one table: each row answers which of the agent's
//! config files install edits (and uninstall restores), how Courier's hooks are registered and
//! trusted there, which of the agent's binaries install trusts, and what uninstall takes back.
//! `broker doctor` checks the same rows (`doctor/agent/`). The plan in `run.rs` walks
//! [`HostAgent::ALL`]; nothing outside a row's own file knows an agent's config format.
//!
//! One row today, [`HostAgent::Codex`] (`agent/codex.rs`). A second host agent (Claude Code) is a
//! variant here and a file beside `codex.rs` answering the same questions; the compiler lists
//! every `match` that must learn it (here, in `doctor/agent/mod.rs`).

mod codex;

use super::carry::{Binaries, Run};
use super::manifest::Manifest;
use super::Report;
use anyhow::Result;
use std::path::{Path, PathBuf};

/// A host agent whose hooks Courier installs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostAgent {
    /// OpenAI Codex CLI: `hooks.json` and `config.toml` under `$CODEX_HOME`.
    Codex,
}

impl HostAgent {
    /// Every host agent, in the order install and doctor visit them.
    pub const ALL: [HostAgent; 1] = [HostAgent::Codex];

    /// The agent's name, as the report and doctor say it.
    pub fn name(self) -> &'static str {
        match self {
            HostAgent::Codex => "Codex",
        }
    }

    /// The agent's config files install edits (uninstall restores them), under its `home`.
    pub fn config_files(self, home: &Path) -> Vec<PathBuf> {
        match self {
            HostAgent::Codex => codex::CodexConfig::at(home).files(),
        }
    }

    /// Courier's hooks registered in the agent's config, and trusted there as the agent does it.
    pub(super) fn register_hooks(self, run: &mut Run, bins: &Binaries) -> Result<()> {
        match self {
            HostAgent::Codex => codex::register_hooks(run, bins),
        }
    }

    /// The agent binary the user runs, trusted (and followed across upgrades). Returns why it
    /// cannot be trusted, with the command that fixes it; the install stands either way.
    pub(super) fn trust_binaries(self, run: &mut Run) -> Result<Option<String>> {
        match self {
            HostAgent::Codex => codex::trust_user_codex(run),
        }
    }

    /// Takes back what install put in the agent's config and trusted of its binaries.
    pub(super) fn uninstall(self, m: &Manifest, state_dir: &Path, report: &mut Report) -> Result<()> {
        match self {
            HostAgent::Codex => codex::uninstall(m, state_dir, report),
        }
    }
}
