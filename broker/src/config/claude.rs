//! The `[claude]` section of the Courier config file: whether the broker serves Claude Code's
//! HTTP hooks, and on which loopback port (`broker/src/claude/`, docs/claude-code.md).
//!
//! ```toml
//! [claude]
//! hook_port = 47120   # 127.0.0.1:47120/hook/<Event>; absent: Claude Code is off
//! ```

use anyhow::{bail, Result};
use serde::Deserialize;

/// `[claude]` of Courier's config file.
#[derive(Deserialize, Debug, Clone, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClaudeConfig {
    /// The loopback port the broker serves Claude Code's hooks on; `None`: Claude Code is off.
    #[serde(default)]
    pub hook_port: Option<u16>,
}

impl ClaudeConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.hook_port == Some(0) {
            bail!("[claude] hook_port must be a fixed port (1-65535): install writes it into Claude Code's settings.json");
        }
        Ok(())
    }
}
