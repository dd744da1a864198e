//! What a proof asks about a host's binaries (trusted, expected, already hashed), answered by the
//! server from the store and the upgrade follower: declared here, below the gate and every wing,
//! so a wing's proof (the Codex thread owner, Copilot's trust) and the gate's kernel ask the same
//! way without naming each other.

use super::ExeKey;
use std::path::Path;

/// What the Claude Code gate (`claude/gate.rs`) and the session sender check (`gate/session_sender.rs`)
/// ask about Claude Code binaries, answered from the store.
pub trait ClaudeTrust {
    /// Whether a hex SHA-256 is a trusted Claude Code binary.
    fn is_trusted(&self, sha256: &str) -> bool;
    /// Whether the file at `path` is worth waiting for its hash (a trusted binary's path).
    fn is_expected(&self, path: &Path, size: u64) -> bool;
    /// A digest recorded for a file of exactly this identity (`broker trust-claude`, install).
    fn known_digest(&self, key: &ExeKey) -> Option<String>;
}

/// What the gate asks about Codex binaries. The server answers from the trusted set in the store
/// and the upgrade follower's resolutions; a plain closure over digests serves tests.
pub trait CodexTrust {
    /// Whether a hex SHA-256 is a trusted Codex binary.
    fn is_trusted(&self, sha256: &str) -> bool;
    /// Whether the executable at `path`, `size` bytes, is one the broker expects to be Codex (a
    /// trusted binary's path, what the user's `codex` resolves to, a managed-daemon release copy
    /// the size of a trusted binary): a hook whose ancestor it is waits for its hash instead of
    /// being refused while it is computed.
    fn is_expected(&self, path: &Path, size: u64) -> bool;
    /// A digest recorded for a file of exactly this identity (by a trust command, install or
    /// the follower), so it need not be hashed at all.
    fn known_digest(&self, _key: &ExeKey) -> Option<String> {
        None
    }
    /// The host(s) whose binaries this trusts, as a refusal names them.
    fn host(&self) -> &'static str {
        "Codex"
    }
}

/// A closure over digests (tests, benches): an executable named `codex` is expected (waited
/// for), every other ancestor goes to the background lane, as in the broker.
impl<F: Fn(&str) -> bool> CodexTrust for F {
    fn is_trusted(&self, sha256: &str) -> bool {
        self(sha256)
    }
    fn is_expected(&self, path: &Path, _size: u64) -> bool {
        path.file_name().is_some_and(|n| n == "codex")
    }
}
