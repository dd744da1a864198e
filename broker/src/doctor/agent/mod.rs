//! Doctor's side of the host-agent table (`install/agent/`): for each [`HostAgent`], the checks
//! that Courier's hooks are registered and trusted as that agent sees them, and that the agent
//! binaries the user runs are trusted. One file a row (`codex.rs`, `claude.rs`, `copilot.rs`).

mod claude;
mod codex;
mod copilot;

use super::{Check, Options};
use crate::config::Config;
use crate::install::{AgentEnv, HostAgent, Manifest};
use std::path::Path;

/// What doctor knows when it checks a row.
pub(super) struct Context<'a> {
    pub(super) opts: &'a Options,
    pub(super) state_dir: &'a Path,
    /// The hook command install registered (the manifest's), or would register: `None` when
    /// neither an install nor a hook-client beside this broker says.
    pub(super) expected_command: Option<&'a str>,
    /// The environment naming the agents' files and commands.
    pub(super) env: &'a AgentEnv,
    /// Courier's config as read (its defaults when it is wrong).
    pub(super) config: &'a Config,
    /// What install put in place, when it ran.
    pub(super) manifest: Option<&'a Manifest>,
    /// The running broker's pid, when one answers.
    pub(super) broker_pid: Option<i32>,
}

impl HostAgent {
    /// This agent's checks, in the order doctor prints them.
    pub(super) fn doctor_checks(self, ctx: &Context) -> Vec<Check> {
        match self {
            HostAgent::Codex => codex::checks(ctx),
            HostAgent::ClaudeCode => claude::checks(ctx),
            HostAgent::Copilot => copilot::checks(ctx),
        }
    }
}
