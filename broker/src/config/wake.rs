//! The `[wake]` section of the Courier config file: how often the wake channel may start turns in
//! one thread (the bound itself is `wake/bound.rs`).
//!
//! ```toml
//! [wake]
//! max_per_minute = 6   # wakes of one thread in any 60 s
//! max_in_a_row = 5     # wakes of one thread with no other turn in between
//! ```

use anyhow::{bail, Result};
use serde::Deserialize;

/// `[wake]` of Courier's config file.
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WakeConfig {
    #[serde(default = "default_per_minute")]
    pub max_per_minute: u32,
    #[serde(default = "default_in_a_row")]
    pub max_in_a_row: u32,
}

fn default_per_minute() -> u32 {
    6
}

fn default_in_a_row() -> u32 {
    5
}

impl Default for WakeConfig {
    fn default() -> Self {
        WakeConfig { max_per_minute: default_per_minute(), max_in_a_row: default_in_a_row() }
    }
}

impl WakeConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.max_per_minute == 0 || self.max_in_a_row == 0 {
            bail!("[wake] max_per_minute and max_in_a_row must be at least 1 (to never wake a thread, send with --wake never)");
        }
        Ok(())
    }
}
