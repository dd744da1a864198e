//! The gate's view of Codex trust in `broker serve`, shared by every check that asks it (hooks,
//! tool-command senders, approval answers, the wake channel's owner proof).

use super::Broker;
use crate::gate;
use std::path::Path;

/// The gate's view of Codex trust: digests from the store, expected paths from the follower.
pub(super) struct TrustView<'a>(pub(super) &'a Broker);

impl gate::CodexTrust for TrustView<'_> {
    fn is_trusted(&self, sha256: &str) -> bool {
        let store = crate::store::lock(&self.0.store);
        store.is_trusted_codex(sha256).unwrap_or(false)
    }
    fn is_expected(&self, path: &Path, size: u64) -> bool {
        // Asked only for a binary the digest cache has not seen; a path trusted by hand counts
        // at once, before the follower's next pass lists it.
        self.0.follower.is_expected(path, size)
            || size <= crate::exe::digest::MAX_HASH_BYTES && {
                let store = crate::store::lock(&self.0.store);
                store.is_trusted_codex_path(&path.to_string_lossy()).unwrap_or(false)
            }
    }
    fn known_digest(&self, key: &crate::exe::ExeKey) -> Option<String> {
        let store = crate::store::lock(&self.0.store);
        store.codex_file_digest(key).ok().flatten()
    }
}
