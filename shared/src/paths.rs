//! Where Courier keeps its socket, secret, queue and config. hook-client and broker must agree on
//! these paths, so both compute them here, from the environment and `getuid()` only (no user
//! database look-ups: they are slow and can be redirected).

use std::env;

use std::path::{Path, PathBuf};

/// The name Courier's MCP server (`broker mcp`) is registered under in each agent's config
/// (Codex's `config.toml`, Claude Code's `.claude.json`).
pub const MCP_SERVER_NAME: &str = "courier";

pub const SOCKET_NAME: &str = "broker.sock";
pub const SECRET_NAME: &str = "secret";
/// The socket of Claude Code's idle wake (`hook-client --claude-wake`, broker `claude/wake.rs`).
pub const CLAUDE_WAKE_SOCKET_NAME: &str = "claude-wake.sock";

fn env_path(key: &str) -> Option<PathBuf> {
    env::var_os(key).filter(|v| !v.is_empty()).map(PathBuf::from)
}

fn home() -> PathBuf {
    env_path("HOME").unwrap_or_else(|| PathBuf::from("/nonexistent-home"))
}

pub fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// `COURIER_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/courier`, else `/run/user/<uid>/courier` when
/// `/run/user/<uid>` exists, else `~/.local/state/courier/run`. Never a shared directory.
pub fn runtime_dir() -> PathBuf {
    if let Some(p) = env_path("COURIER_RUNTIME_DIR") {
        return p;
    }
    if let Some(p) = env_path("XDG_RUNTIME_DIR") {
        return p.join("courier");
    }
    let run_user = PathBuf::from(format!("/run/user/{}", uid()));
    if run_user.is_dir() {
        return run_user.join("courier");
    }
    home().join(".local/state/courier/run")
}

/// `COURIER_STATE_DIR`, else `$XDG_STATE_HOME/courier`, else `~/.local/state/courier`.
pub fn state_dir() -> PathBuf {
    env_path("COURIER_STATE_DIR")
        .or_else(|| env_path("XDG_STATE_HOME").map(|p| p.join("courier")))
        .unwrap_or_else(|| home().join(".local/state/courier"))
}

/// `COURIER_CONFIG`, else `$XDG_CONFIG_HOME/courier/config.toml`, else `~/.config/courier/config.toml`.
pub fn config_path() -> PathBuf {
    env_path("COURIER_CONFIG")
        .unwrap_or_else(|| env_path("XDG_CONFIG_HOME").unwrap_or_else(|| home().join(".config")).join("courier/config.toml"))
}

/// `CODEX_HOME`, else `~/.codex`.
pub fn codex_home() -> PathBuf {
    env_path("CODEX_HOME").unwrap_or_else(|| home().join(".codex"))
}

pub fn socket_path(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join(SOCKET_NAME)
}

pub fn claude_wake_socket_path(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join(CLAUDE_WAKE_SOCKET_NAME)
}

pub fn secret_path(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join(SECRET_NAME)
}

/// Value of `key` in an environment block as read from `/proc/<pid>/environ` (NUL separated).
pub fn environ_get<'a>(environ: &'a [u8], key: &str) -> Option<&'a [u8]> {
    environ.split(|b| *b == 0).find_map(|entry| {
        let rest = entry.strip_prefix(key.as_bytes())?;
        rest.strip_prefix(b"=")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environ_lookup_matches_whole_keys_only() {
        let env = b"CODEX_THREAD_ID_X=1\0CODEX_THREAD_ID=abc\0PATH=/bin\0";
        assert_eq!(environ_get(env, "CODEX_THREAD_ID"), Some(&b"abc"[..]));
        assert_eq!(environ_get(env, "CODEX"), None);
    }
}
