//! The gate's view of Claude Code trust (also the sender check's, `gate/session_sender.rs`): a
//! digest trusted in the store, or a file the digest cache has not seen that is expected (a
//! trusted binary's path, or what a followed `claude` runs now: `follow.rs`).

use super::follow::Followed;
use crate::exe::ClaudeTrust;
use crate::exe::ExeKey;
use crate::store::Store;
use std::path::Path;
use std::sync::Mutex;

/// The gate's view of Claude Code trust, from the store and the followed commands (also the
/// sender check's, `gate/session_sender.rs`).
pub(crate) struct StoreTrust<'a>(pub(crate) &'a Mutex<Store>, pub(crate) &'a Followed);

impl ClaudeTrust for StoreTrust<'_> {
    fn is_trusted(&self, sha256: &str) -> bool {
        crate::store::lock(self.0).is_trusted_claude(sha256).unwrap_or(false)
    }
    /// Asked only for a binary the digest cache has not seen: a trusted binary's path, or what a
    /// followed `claude` runs now (the first hook after an upgrade: `follow.rs`).
    fn is_expected(&self, path: &Path, size: u64) -> bool {
        if size > crate::exe::digest::MAX_HASH_BYTES {
            return false;
        }
        let (trusted_path, commands) = {
            let store = crate::store::lock(self.0);
            let shown = path.to_string_lossy();
            (store.trusted_claude().map(|all| all.iter().any(|t| t.path == shown)).unwrap_or(false), self.1.commands(&store))
        };
        // Resolved with the store unlocked: concurrent hooks never wait for a resolution.
        trusted_path || Followed::runs(&commands, path).is_some()
    }
    fn known_digest(&self, key: &ExeKey) -> Option<String> {
        crate::store::lock(self.0).codex_file_digest(key).ok().flatten()
    }
}
