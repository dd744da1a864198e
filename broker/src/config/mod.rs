//! Courier's own config file (`COURIER_CONFIG`, default `~/.config/courier/config.toml`). Optional:
//! a missing file means defaults. Every key is documented in docs/configuration.md.
//!
//! Unknown top-level keys are not errors (a newer Courier may add some) but are reported as
//! warnings by `broker serve` and `broker doctor`, so typos do not go unnoticed.

mod approvals;
mod claude;
mod effort;
mod inbound;
mod wake;

use anyhow::{bail, Context, Result};
pub use approvals::{ApprovalsConfig, Hold, MAX_HOLD_SECS};
pub use claude::ClaudeConfig;
pub use effort::{EffortConfig, EffortLevel, EffortScope, Policy, Rule};
pub use inbound::InboundConfig;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;
pub use wake::WakeConfig;

/// Top-level keys this version knows (others only warn). `effort` belongs to the effort feature.
pub const KNOWN_KEYS: [&str; 10] =
    ["hook_clients", "log_level", "retention_days", "receipts", "effort", "wake", "bridge", "approvals", "claude", "inbound"];

/// Days a message in a final state is kept when `retention_days` is not set.
pub const DEFAULT_RETENTION_DAYS: u64 = 30;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Config {
    /// Extra hook-client executables the broker accepts (besides the one beside it), compared by
    /// device+inode at start-up. Absolute paths.
    pub hook_clients: Vec<PathBuf>,
    /// error | warn | info | debug | trace (`COURIER_LOG` overrides).
    pub log_level: Option<String>,
    /// Days to keep messages in a final state (confirmed, uncertain, expired, cancelled, applied,
    /// failed); 0 keeps them forever. Default [`DEFAULT_RETENTION_DAYS`].
    pub retention_days: Option<u64>,
    /// What the person at the Codex or Claude Code TUI sees of a hook delivery: `"line"` (default) or `"off"`.
    pub receipts: Receipts,
    /// `[effort]`: allowed levels, app-server deadline, the optional policy.
    pub effort: EffortConfig,
    /// `[wake]`: how often the wake channel may start turns in one thread (`wake/bound.rs`).
    pub wake: WakeConfig,
    /// `[approvals]`: how answering an approval waits for Codex (`server/approvals.rs`).
    pub approvals: ApprovalsConfig,
    /// `[bridge]`: this host's NATS bridge (`courier-bridge serve`), for `broker doctor` to check.
    pub bridge: Option<BridgeConfig>,
    /// `[claude]`: the loopback port of Claude Code's HTTP hooks (`claude/`); none: Claude Code off.
    pub claude: ClaudeConfig,
    /// `[inbound]`: what a thread with no inbound rule of its own does with a message.
    pub inbound: InboundConfig,
}

/// `receipts`: each hook that delivers also shows the person one line in the Codex TUI (`↳ Hook ·
/// Courier delivered 2 messages from ci-bot (m_..., m_...)`), never sent to the model.
#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Receipts {
    #[default]
    Line,
    Off,
}

/// `[bridge] nats = URL, host = NAME, creds = PATH?, approvers = [USER, ...]?` (docs/many-hosts.md).
#[derive(Debug, Default, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct BridgeConfig {
    pub nats: String,
    pub host: String,
    #[serde(default)]
    pub creds: Option<PathBuf>,
    /// The NATS users whose answers to this host's approvals the bridge takes (none by default;
    /// `courier-bridge serve --approvers` overrides). Each is one subject token.
    #[serde(default)]
    pub approvers: Vec<String>,
}

/// A bridge's host name is one NATS subject token and part of a consumer name: 1 to 64
/// letters, digits, `-`, `_`.
pub fn check_bridge_host(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > 64 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        bail!("host name {name:?}: 1 to 64 letters, digits, '-' or '_' (it is a NATS subject token and a consumer name)");
    }
    Ok(())
}

#[derive(Debug, Default)]
pub struct Loaded {
    pub config: Config,
    /// The file read, if it existed.
    pub path: Option<PathBuf>,
    pub warnings: Vec<String>,
}

/// Reads the config at `courier_shared::paths::config_path()`.
pub fn load() -> Result<Loaded> {
    load_from(&courier_shared::paths::config_path())
}

pub fn load_from(path: &Path) -> Result<Loaded> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Loaded::default()),
        Err(e) => return Err(e).with_context(|| format!("reading config file {}", path.display())),
    };
    let (config, warnings) = parse(&text).with_context(|| format!("config file {}", path.display()))?;
    Ok(Loaded { config, path: Some(path.to_path_buf()), warnings })
}

impl Config {
    pub fn retention(&self) -> Option<std::time::Duration> {
        match self.retention_days.unwrap_or(DEFAULT_RETENTION_DAYS) {
            0 => None,
            days => Some(std::time::Duration::from_secs(days.saturating_mul(86_400))),
        }
    }
}

pub fn parse(text: &str) -> Result<(Config, Vec<String>)> {
    let doc: toml_edit::DocumentMut = text.parse().context("not valid TOML")?;
    let mut warnings = Vec::new();
    for (key, _) in doc.iter() {
        if !KNOWN_KEYS.contains(&key) {
            warnings.push(format!("unknown key {key:?} ignored (known: {})", KNOWN_KEYS.join(", ")));
        }
    }
    let config: Config = toml_edit::de::from_document(doc).map_err(|e| anyhow::anyhow!("{}", e.to_string().trim()))?;
    for p in &config.hook_clients {
        if !p.is_absolute() {
            bail!("hook_clients entry {} is not an absolute path", p.display());
        }
    }
    if let Some(level) = &config.log_level {
        if crate::logging::Level::parse(level).is_none() {
            bail!("log_level = {level:?} is not one of {}", crate::logging::Level::NAMES.join(", "));
        }
    }
    config.effort.validate()?;
    config.wake.validate()?;
    config.approvals.validate()?;
    config.claude.validate()?;
    if let Some(b) = &config.bridge {
        check_bridge_host(&b.host).context("[bridge] host")?;
        for u in &b.approvers {
            check_bridge_host(u).with_context(|| format!("[bridge] approvers: user {u:?}"))?;
        }
    }
    Ok((config, warnings))
}

impl EffortConfig {
    /// The `[effort]` section of a config file's text.
    pub fn parse(text: &str) -> Result<EffortConfig> {
        Ok(parse(text)?.0.effort)
    }

    /// Missing file = defaults; an unreadable or invalid one is an error.
    pub fn load(path: &Path) -> Result<EffortConfig> {
        Ok(load_from(path)?.config.effort)
    }
}

/// mtime and size of the config file (None: missing).
type Stamp = Option<(SystemTime, u64)>;

/// The config as of the file's last change, re-read when its mtime or size moves. An invalid
/// file keeps the policy off and is reported once per change.
pub struct ConfigCache {
    path: PathBuf,
    state: Mutex<Option<(Stamp, EffortConfig)>>,
}

impl ConfigCache {
    pub fn new(path: PathBuf) -> ConfigCache {
        ConfigCache { path, state: Mutex::new(None) }
    }

    pub fn get(&self) -> EffortConfig {
        let stamp = std::fs::metadata(&self.path).ok().and_then(|m| Some((m.modified().ok()?, m.len())));
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((s, c)) = g.as_ref() {
            if *s == stamp {
                return c.clone();
            }
        }
        let c = EffortConfig::load(&self.path).unwrap_or_else(|e| {
            crate::log_warn!("effort config ignored (policy off, every level allowed): {e:#}");
            EffortConfig::default()
        });
        *g = Some((stamp, c.clone()));
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_default() {
        let (c, w) = parse("").unwrap();
        assert!(c.hook_clients.is_empty() && c.log_level.is_none() && w.is_empty());
    }

    /// `[bridge] approvers`: none by default; each one subject token (a dot or wildcard would
    /// widen the answer subject it stands for).
    #[test]
    fn bridge_approvers_are_subject_tokens() {
        let bridge = |extra: &str| parse(&format!("[bridge]\nnats = \"nats://h\"\nhost = \"a\"\n{extra}"));
        assert!(bridge("").unwrap().0.bridge.unwrap().approvers.is_empty());
        assert_eq!(bridge("approvers = [\"alice\", \"bob\"]").unwrap().0.bridge.unwrap().approvers, ["alice", "bob"]);
        for bad in ["a.b", "*", ">", ""] {
            assert!(bridge(&format!("approvers = [{bad:?}]")).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn retention_defaults_to_30_days_and_0_keeps_everything() {
        assert_eq!(parse("").unwrap().0.retention(), Some(std::time::Duration::from_secs(30 * 86_400)));
        assert_eq!(parse("retention_days = 2").unwrap().0.retention(), Some(std::time::Duration::from_secs(2 * 86_400)));
        assert_eq!(parse("retention_days = 0").unwrap().0.retention(), None);
        assert!(parse("retention_days = -1").is_err());
    }

    #[test]
    fn reads_keys_and_warns_on_unknown() {
        let (c, w) =
            parse("# mine\nhook_clients = [\"/opt/courier/hook-client\"]\nlog_level = \"debug\"\nlogg = 1\n[effort]\nallow = [\"low\"]\n")
                .unwrap();
        assert_eq!(c.effort.allow, [crate::config::EffortLevel::Low]);
        assert_eq!(c.hook_clients, [PathBuf::from("/opt/courier/hook-client")]);
        assert_eq!(c.log_level.as_deref(), Some("debug"));
        assert_eq!(c.receipts, Receipts::Line, "on by default");
        assert_eq!(parse("receipts = \"off\"").unwrap().0.receipts, Receipts::Off);
        assert!(parse("receipts = \"loud\"").is_err());
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("\"logg\""), "{w:?}");
    }

    #[test]
    fn rejects_bad_values() {
        assert!(parse("hook_clients = [\"relative/hook-client\"]").unwrap_err().to_string().contains("absolute"));
        assert!(parse("log_level = \"loud\"").unwrap_err().to_string().contains("log_level"));
        assert!(parse("hook_clients = \"/x\"").is_err());
        assert!(parse("not toml [").is_err());
    }

    #[test]
    fn wake_bound_defaults_and_keys() {
        assert_eq!(parse("").unwrap().0.wake, WakeConfig::default());
        let (c, w) = parse("[wake]\nmax_per_minute = 2\nmax_in_a_row = 3\n").unwrap();
        assert_eq!((c.wake.max_per_minute, c.wake.max_in_a_row, w.len()), (2, 3, 0));
        assert!(parse("[wake]\nmax_per_minute = 0\n").unwrap_err().to_string().contains("at least 1"));
        assert!(parse("[wake]\nmax_per_minut = 2\n").is_err(), "unknown keys in [wake] are errors");
        assert_eq!(parse("").unwrap().0.approvals.ack_timeout_ms, 10_000);
        assert_eq!(parse("[approvals]\nack_timeout_ms = 5\n").unwrap().0.approvals.ack_timeout_ms, 5);
        assert!(parse("[approvals]\nack_timeout_ms = 0\n").is_err());
        assert!(parse("[approvals]\nack_timeout = 5\n").is_err(), "unknown keys in [approvals] are errors");
        assert_eq!(parse("").unwrap().0.approvals.hold, Hold::Off, "the hook returns at once by default");
        assert_eq!(parse("[approvals]\nhold = \"exec\"\n").unwrap().0.approvals.hold, Hold::Exec);
        assert!(parse("[approvals]\nhold = \"always\"\n").is_err());
        assert!(parse("[approvals]\nhold_secs = 301\n").is_err());
    }

    #[test]
    fn claude_hook_port_is_off_by_default_and_never_0() {
        assert_eq!(parse("").unwrap().0.claude.hook_port, None);
        let (c, w) = parse("[claude]\nhook_port = 47120\n").unwrap();
        assert_eq!((c.claude.hook_port, w.len()), (Some(47120), 0));
        assert!(parse("[claude]\nhook_port = 0\n").unwrap_err().to_string().contains("hook_port"));
        assert!(parse("[claude]\nhook_port = 70000\n").is_err());
        assert!(parse("[claude]\nhookport = 1\n").is_err(), "unknown keys in [claude] are errors");
    }
}
