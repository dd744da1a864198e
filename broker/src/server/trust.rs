//! The gate's view of Codex trust in `broker serve`, shared by every check that asks it (hooks,
//! tool-command senders, approval answers, the wake channel's owner proof).

use super::Broker;
use crate::exe::CodexTrust;
use std::path::Path;

/// The gate's view of Codex trust: digests from the store, expected paths from the follower.
pub(super) struct TrustView<'a>(pub(super) &'a Broker);

impl CodexTrust for TrustView<'_> {
    fn is_trusted(&self, sha256: &str) -> bool {
        let store = crate::store::lock(&self.0.store);
        store.is_trusted_codex(sha256).unwrap_or(false)
    }
    fn is_expected(&self, path: &Path, size: u64) -> bool {
        // Asked only for a binary the digest cache has not seen; a path trusted by hand counts
        // at once, before the follower's next pass lists it.
        self.0.codex_followed.is_expected(path, size)
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

/// Digests the store answered trusted (a hint, never the decision: see [`HookTrust`]).
#[derive(Default)]
pub(super) struct TrustedBefore(std::sync::Mutex<std::collections::HashSet<String>>);

/// Digests remembered at most (all forgotten when full: the next walk asks the store).
const MAX_TRUSTED_BEFORE: usize = 64;

impl TrustedBefore {
    fn contains(&self, sha256: &str) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).contains(sha256)
    }

    fn note(&self, sha256: &str) {
        let mut set = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if set.len() >= MAX_TRUSTED_BEFORE {
            set.clear();
        }
        set.insert(sha256.to_string());
    }

    pub(super) fn forget(&self, sha256: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(sha256);
    }
}

/// The hook path's view of Codex trust. The walk to codex (gate step 3) takes a digest the store
/// said was trusted before at its word, and remembers the digest it stopped at; the hook's one
/// store read ([`crate::store::Store::hook_work`]) then confirms that digest is trusted NOW, in the
/// same statement that asks what the thread has to do, before any ticket is taken or anything
/// handed. An idle hook makes one read transaction instead of two; trust revoked since it was
/// remembered is refused by that read (and forgotten), as the walk's own question would have.
pub(super) struct HookTrust<'a> {
    view: TrustView<'a>,
    stopped_at: std::cell::RefCell<Option<String>>,
}

impl<'a> HookTrust<'a> {
    pub(super) fn new(broker: &'a Broker) -> HookTrust<'a> {
        HookTrust { view: TrustView(broker), stopped_at: std::cell::RefCell::new(None) }
    }

    /// The digest the walk stopped at, which the hook's store read must confirm.
    pub(super) fn to_confirm(&self) -> Option<String> {
        self.stopped_at.borrow().clone()
    }
}

impl CodexTrust for HookTrust<'_> {
    fn is_trusted(&self, sha256: &str) -> bool {
        let before = &self.view.0.trusted_before;
        let trusted = before.contains(sha256) || {
            let now = self.view.is_trusted(sha256);
            if now {
                before.note(sha256);
            }
            now
        };
        if trusted {
            *self.stopped_at.borrow_mut() = Some(sha256.to_string());
        }
        trusted
    }
    fn is_expected(&self, path: &Path, size: u64) -> bool {
        self.view.is_expected(path, size)
    }
    fn known_digest(&self, key: &crate::exe::ExeKey) -> Option<String> {
        self.view.known_digest(key)
    }
}
