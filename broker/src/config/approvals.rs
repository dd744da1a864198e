//! The `[approvals]` section of the Courier config file: how `broker approve|deny` waits for
//! Codex (the answering itself is `server/approvals.rs`).
//!
//! ```toml
//! [approvals]
//! ack_timeout_ms = 10000   # after sending an answer, how long to wait for Codex's ack
//! ```

use anyhow::{bail, Result};
use serde::Deserialize;
use std::time::Duration;

/// `[approvals]` of Courier's config file.
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ApprovalsConfig {
    /// After an answer is written to the app-server, how long to wait for its
    /// `serverRequest/resolved` before the outcome is `unknown` (never retried).
    #[serde(default = "default_ack_timeout_ms")]
    pub ack_timeout_ms: u64,
}

fn default_ack_timeout_ms() -> u64 {
    10_000
}

impl Default for ApprovalsConfig {
    fn default() -> Self {
        ApprovalsConfig { ack_timeout_ms: default_ack_timeout_ms() }
    }
}

impl ApprovalsConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        if !(1..=60_000).contains(&self.ack_timeout_ms) {
            bail!("[approvals] ack_timeout_ms must be 1 to 60000");
        }
        Ok(())
    }

    pub fn ack_timeout(&self) -> Duration {
        Duration::from_millis(self.ack_timeout_ms)
    }
}
