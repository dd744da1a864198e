//! The `[effort]` section of the Courier config file (`COURIER_CONFIG`), parsed as part of
//! [`crate::config::Config`] (which also loads it: `EffortConfig::parse`, `load`, and the
//! change-aware `ConfigCache`); this module holds its types and validation.
//!
//! ```toml
//! [effort]
//! allow = ["low", "medium", "high"]   # default: all six levels
//! deadline_ms = 2000                    # how long one app-server exchange may take
//!
//! [effort.policy]                       # off unless enabled
//! enabled = true
//! scope = "turn"                        # how the policy's changes apply
//! [[effort.policy.rules]]
//! tool = "Bash"
//! after_failures = 2                    # consecutive non-zero exits
//! set = "high"
//! [[effort.policy.rules]]
//! tool = "Bash"
//! after_successes = 1
//! set = "medium"
//! ```

use anyhow::{bail, Result};
use serde::Deserialize;

/// A reasoning-effort level, as Codex names them (`--effort`, `turn/settings/update`).
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum EffortLevel {
    None,
    Minimal,
    Low,
    Medium,
    High,
    Xhigh,
}

impl EffortLevel {
    pub const ALL: [EffortLevel; 6] =
        [EffortLevel::None, EffortLevel::Minimal, EffortLevel::Low, EffortLevel::Medium, EffortLevel::High, EffortLevel::Xhigh];

    /// The level as Codex, the queue and the command line spell it.
    pub const fn as_str(self) -> &'static str {
        match self {
            EffortLevel::None => "none",
            EffortLevel::Minimal => "minimal",
            EffortLevel::Low => "low",
            EffortLevel::Medium => "medium",
            EffortLevel::High => "high",
            EffortLevel::Xhigh => "xhigh",
        }
    }

    /// A level by name, or an error that lists them.
    pub fn parse(s: &str) -> Result<EffortLevel> {
        match EffortLevel::ALL.into_iter().find(|l| l.as_str() == s) {
            Some(l) => Ok(l),
            None => bail!("effort {s:?} is not one of {}", names(&EffortLevel::ALL)),
        }
    }
}

impl std::fmt::Display for EffortLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `low, medium, high`.
fn names(levels: &[EffortLevel]) -> String {
    levels.iter().map(|l| l.as_str()).collect::<Vec<_>>().join(", ")
}

/// How an effort change applies: to the thread's current turn (`turn/settings/update`, needs a
/// hook with a turn), or to the thread from now on (`thread/settings/update`).
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum EffortScope {
    #[default]
    Turn,
    Thread,
}

impl EffortScope {
    pub const fn as_str(self) -> &'static str {
        match self {
            EffortScope::Turn => "turn",
            EffortScope::Thread => "thread",
        }
    }

    /// `turn` or `thread`, as `--scope` and the queue's `scope` column spell it.
    pub fn parse(s: &str) -> Result<EffortScope> {
        match s {
            "turn" => Ok(EffortScope::Turn),
            "thread" => Ok(EffortScope::Thread),
            _ => bail!("scope {s:?} is not turn or thread"),
        }
    }
}

#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EffortConfig {
    #[serde(default = "all_levels")]
    pub allow: Vec<EffortLevel>,
    #[serde(default = "default_deadline")]
    pub deadline_ms: u64,
    #[serde(default)]
    pub policy: Policy,
}

#[derive(Deserialize, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    #[serde(default)]
    pub enabled: bool,
    #[serde(default)]
    pub scope: Option<EffortScope>,
    #[serde(default)]
    pub rules: Vec<Rule>,
}

#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Tool name as the hook reports it (`Bash`, `apply_patch`, `mcp__server__tool`).
    pub tool: String,
    #[serde(default)]
    pub after_failures: Option<u32>,
    #[serde(default)]
    pub after_successes: Option<u32>,
    pub set: EffortLevel,
}

fn all_levels() -> Vec<EffortLevel> {
    EffortLevel::ALL.to_vec()
}

fn default_deadline() -> u64 {
    2000
}

impl Default for EffortConfig {
    fn default() -> Self {
        EffortConfig { allow: all_levels(), deadline_ms: default_deadline(), policy: Policy::default() }
    }
}

impl EffortConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        if !(100..=60_000).contains(&self.deadline_ms) {
            bail!("[effort] deadline_ms must be between 100 and 60000");
        }
        for (i, r) in self.policy.rules.iter().enumerate() {
            match (r.after_failures, r.after_successes) {
                (Some(n), None) | (None, Some(n)) if n >= 1 => {}
                _ => bail!("[[effort.policy.rules]] #{}: set exactly one of after_failures / after_successes (>= 1)", i + 1),
            }
            if !self.allow.contains(&r.set) {
                bail!("[[effort.policy.rules]] #{}: set = {:?} is not in [effort] allow", i + 1, r.set);
            }
        }
        Ok(())
    }

    /// A requested level, checked against the allowlist, with an error that says what is allowed.
    pub fn check_level(&self, level: &str) -> Result<EffortLevel> {
        let parsed = EffortLevel::parse(level)?;
        if !self.allow.contains(&parsed) {
            bail!("effort {level:?} is not allowed by the config ([effort] allow = [{}])", names(&self.allow));
        }
        Ok(parsed)
    }

    pub fn policy_scope(&self) -> EffortScope {
        self.policy.scope.unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_allow_all_and_policy_off() {
        let c = EffortConfig::parse("[other]\nx = 1\n").unwrap();
        assert_eq!(c.allow.len(), 6);
        assert!(!c.policy.enabled);
    }

    #[test]
    fn allowlist_refuses_with_a_clear_error() {
        let c = EffortConfig::parse("[effort]\nallow = [\"low\", \"medium\"]\n").unwrap();
        assert!(c.check_level("low").is_ok());
        let e = c.check_level("xhigh").unwrap_err().to_string();
        assert!(e.contains("not allowed") && e.contains("low, medium"), "{e}");
        assert!(c.check_level("turbo").unwrap_err().to_string().contains("not one of"));
    }

    #[test]
    fn bad_configs_are_rejected() {
        for bad in [
            "[effort]\nallow = [\"turbo\"]\n",
            "[effort]\nalow = []\n",
            "[effort.policy]\nenabled = true\n[[effort.policy.rules]]\ntool = \"Bash\"\nset = \"high\"\n",
            "[effort]\nallow = [\"low\"]\n[[effort.policy.rules]]\ntool = \"Bash\"\nafter_failures = 1\nset = \"high\"\n",
            "[effort.policy]\nscope = \"forever\"\n",
        ] {
            assert!(EffortConfig::parse(bad).is_err(), "{bad}");
        }
    }
}
