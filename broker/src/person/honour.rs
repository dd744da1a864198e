//! Whether a record Courier keeps of a person's act counts: a trusted binary's row, the stop
//! mark. Such a record sits in files every process of the uid can write (the state directory,
//! under /tmp a sandboxed command's too), so it counts by the signature it carries, checked
//! each time it is read, never by who wrote it.
//!
//! - A person key is set: only a record carrying the key's signature of exactly its act counts.
//!   An unsigned or wrongly signed one is ignored: a trust row trusts nothing (fail closed), a
//!   stop mark stops nothing (the broker starts: fail open for availability).
//! - No person key yet: nothing can tell the person from any other process of the uid, so an
//!   unsigned record counts as it always did (install's own trust of what it found, a stop by
//!   `broker stop`). This rests on the state directory being written by Courier alone; `broker
//!   person set` signs what counts at that moment, so setting a key loses nothing.
//! - The key file cannot be read or parsed: nothing counts (the person is told by doctor).

use super::{Act, PersonKey};

/// The person key as a record's check sees it.
#[derive(Debug, Clone)]
pub enum KeyState {
    /// No `person.json`: no person key was ever set.
    None,
    Set(PersonKey),
    /// There is a key file but it could not be read: why.
    Unreadable(String),
}

/// Whether a record of `act` carrying `proof` (a hex signature, or none) counts under `key`.
pub fn honoured(key: &KeyState, act: &Act<'_>, proof: Option<&str>) -> bool {
    match (key, proof) {
        (KeyState::None, _) => true,
        (KeyState::Set(key), Some(proof)) => key.verify(act, proof).is_ok(),
        (KeyState::Set(_), None) | (KeyState::Unreadable(_), _) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::person::{sign, TrustedHost, MIN_ITERATIONS};

    #[test]
    fn with_a_key_only_its_signature_of_the_act_counts() {
        let (key, signing) = PersonKey::create("the person's own passphrase", MIN_ITERATIONS).unwrap();
        let (_, theirs) = PersonKey::create("the person's own passphrase", MIN_ITERATIONS).unwrap();
        let act = Act::Trust { host: TrustedHost::Claude, sha256: "ab", path: "/p" };
        let set = KeyState::Set(key);
        assert!(honoured(&set, &act, Some(&sign(&signing, &act))));
        assert!(!honoured(&set, &act, None), "unsigned, with a key set");
        assert!(!honoured(&set, &act, Some(&sign(&theirs, &act))), "another key's signature");
        assert!(!honoured(&set, &act, Some("not hex")));
        assert!(honoured(&KeyState::None, &act, None), "no key yet: as before");
        assert!(!honoured(&KeyState::Unreadable("bad".into()), &act, Some(&sign(&signing, &act))));
    }
}
