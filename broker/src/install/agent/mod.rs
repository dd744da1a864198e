//! The host agents Courier installs into, as one table: each row answers whether install wants
//! it this run ([`Wanted`]), which config files install edits (and uninstall restores), how
//! Courier's hooks are registered and trusted there, which of the agent's binaries install
//! trusts, and what uninstall takes back. `broker doctor` checks the same rows (`doctor/agent/`).
//! The plan in `run.rs` and uninstall walk [`HostAgent::ALL`]; nothing outside a row's own file
//! knows an agent's config format.
//!
//! Rows read the environment only through [`AgentEnv`], given to them, so a test can hand a row
//! a sandboxed home without touching the process's environment. A new row is a variant here and
//! a file beside `codex.rs` answering the same questions; the compiler lists every `match` that
//! must learn it (here, in `doctor/agent/mod.rs`). Rows: `codex.rs`, `claude.rs` (with
//! `claude_mcp.rs`), `copilot.rs`; `mcp_json.rs` is the MCP entry in a JSON config, Claude Code's
//! and Copilot's.

mod claude;
mod claude_mcp;
mod codex;
mod copilot;
mod mcp_json;

pub use super::carry::AgentEnv;
use super::carry::{Binaries, Run};
use super::manifest::Manifest;
use super::Report;
use anyhow::Result;
use std::path::{Path, PathBuf};

pub use claude::ClaudeChoice;

/// A host agent whose hooks Courier installs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostAgent {
    /// OpenAI Codex CLI: `hooks.json` and `config.toml` under `$CODEX_HOME`.
    Codex,
    /// Claude Code: HTTP hooks in its `settings.json`, the port they post to in Courier's config.
    ClaudeCode,
    /// GitHub Copilot CLI: command hooks in `<Copilot home>/hooks/courier.json`.
    Copilot,
}

/// Whether this install run puts a row's hooks in place, from the options, Courier's config,
/// what the agent's commands are and what the manifest says an earlier install did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    /// Registered (again: a re-install updates it) and its binaries trusted.
    Install,
    /// Not registered; what an earlier install put in is taken out.
    TakeOut,
}

/// What registering a row's hooks asks of the rest of the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registered {
    /// Nothing more: a running broker serves the hooks as they are.
    AsServed,
    /// A running broker must restart to serve them (the hooks' port changed).
    RestartBroker,
}

impl HostAgent {
    /// Every host agent, in the order install and doctor visit them.
    pub const ALL: [HostAgent; 3] = [HostAgent::Codex, HostAgent::ClaudeCode, HostAgent::Copilot];

    /// The agent's name, as the report and doctor say it.
    pub fn name(self) -> &'static str {
        match self {
            HostAgent::Codex => "Codex",
            HostAgent::ClaudeCode => "Claude Code",
            HostAgent::Copilot => "GitHub Copilot CLI",
        }
    }

    /// The config files install edits for this agent (uninstall restores them), as `env` names them.
    pub fn config_files(self, env: &AgentEnv) -> Result<Vec<PathBuf>> {
        match self {
            HostAgent::Codex => Ok(codex::CodexConfig::at(&env.codex_home).files()),
            HostAgent::ClaudeCode => claude::config_files(env),
            HostAgent::Copilot => copilot::config_files(env),
        }
    }

    /// Whether this run installs the row or takes an earlier install of it out.
    pub(super) fn wanted(self, run: &Run) -> Result<Wanted> {
        match self {
            // Codex is what Courier is for: always.
            HostAgent::Codex => Ok(Wanted::Install),
            HostAgent::ClaudeCode => claude::wanted(run),
            HostAgent::Copilot => copilot::wanted(run),
        }
    }

    /// Courier's hooks registered in the agent's config, and trusted there as the agent does it.
    pub(super) fn register_hooks(self, run: &mut Run, bins: &Binaries) -> Result<Registered> {
        match self {
            HostAgent::Codex => codex::register_hooks(run, bins).map(|()| Registered::AsServed),
            HostAgent::ClaudeCode => {
                let registered = claude::register_hooks(run, &bins.client)?;
                claude_mcp::register(run, &bins.broker, bins.with_mcp)?;
                Ok(registered)
            }
            HostAgent::Copilot => {
                copilot::register_hooks(run, &bins.client)?;
                copilot::register_mcp(run, &bins.broker, bins.with_mcp)?;
                Ok(Registered::AsServed)
            }
        }
    }

    /// The agent binary the user runs, trusted (and followed across upgrades). Returns why it
    /// cannot be trusted, with the command that fixes it; the install stands either way.
    pub(super) fn trust_binaries(self, run: &mut Run) -> Result<Option<String>> {
        match self {
            HostAgent::Codex => codex::trust_user_codex(run),
            HostAgent::ClaudeCode => claude::trust_binaries(run).map(|()| None),
            HostAgent::Copilot => copilot::trust_binaries(run),
        }
    }

    /// What an earlier install of this row put in, taken out now that it is not wanted
    /// ([`Wanted::TakeOut`]), and forgotten by the manifest.
    pub(super) fn take_out(self, run: &mut Run) -> Result<()> {
        match self {
            // Never [`Wanted::TakeOut`]: uninstall is the way out of Codex.
            HostAgent::Codex => Ok(()),
            HostAgent::ClaudeCode => claude::take_out(run),
            HostAgent::Copilot => copilot::take_out(run),
        }
    }

    /// Takes back what install put in the agent's config and trusted of its binaries.
    pub(super) fn uninstall(self, m: &Manifest, state_dir: &Path, report: &mut Report) -> Result<()> {
        match self {
            HostAgent::Codex => codex::uninstall(m, state_dir, report),
            HostAgent::ClaudeCode => claude::uninstall(m, state_dir, report),
            HostAgent::Copilot => copilot::uninstall(m, report),
        }
    }
}
