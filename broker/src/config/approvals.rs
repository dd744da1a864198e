//! The `[approvals]` section of the Courier config file: how `broker approve|deny` waits for
//! Codex (the answering itself is `server/approvals.rs`).
//!
//! ```toml
//! [approvals]
//! ack_timeout_ms = 10000   # after sending an answer, how long to wait for Codex's ack
//! hold = "off"             # "exec": hold the PermissionRequest hook of threads no app-server
//!                          # serves (codex exec --approve-for-me), and Copilot CLI's
//!                          # permissionRequest of its shell tool; "all": every thread, every
//!                          # Copilot tool call
//! hold_secs = 60           # how long a hold waits for `broker approve|deny` (1 to 300)
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
    /// Which threads' PermissionRequest hooks wait for a remote answer.
    #[serde(default)]
    pub hold: Hold,
    #[serde(default = "default_hold_secs")]
    pub hold_secs: u64,
}

/// Which threads' PermissionRequest hooks are held for `broker approve|deny`.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Hold {
    /// None: the hook returns at once, the person's prompt appears as usual.
    #[default]
    Off,
    /// Threads no app-server serves (`codex exec --approve-for-me`: only a hook's decision counts);
    /// Copilot CLI's shell (`bash`) calls (`copilot/approval.rs`).
    Exec,
    /// Every thread (the person at the TUI sees the hook's status line, and only Esc, until the
    /// hold ends); every Copilot CLI tool call.
    All,
}

/// The longest hold (hook-client's `MAX_HOLD_MS` matches).
pub const MAX_HOLD_SECS: u64 = 300;

fn default_hold_secs() -> u64 {
    60
}

fn default_ack_timeout_ms() -> u64 {
    10_000
}

impl Default for ApprovalsConfig {
    fn default() -> Self {
        ApprovalsConfig { ack_timeout_ms: default_ack_timeout_ms(), hold: Hold::Off, hold_secs: default_hold_secs() }
    }
}

impl ApprovalsConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        if !(1..=60_000).contains(&self.ack_timeout_ms) {
            bail!("[approvals] ack_timeout_ms must be 1 to 60000");
        }
        if !(1..=MAX_HOLD_SECS).contains(&self.hold_secs) {
            bail!("[approvals] hold_secs must be 1 to {MAX_HOLD_SECS}");
        }
        Ok(())
    }

    pub fn hold_for(&self) -> Duration {
        Duration::from_secs(self.hold_secs)
    }

    pub fn ack_timeout(&self) -> Duration {
        Duration::from_millis(self.ack_timeout_ms)
    }
}
