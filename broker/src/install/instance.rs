//! Whether a broker runs, or should: the instance lock a running broker holds (whether or not it
//! answers) and the stop marker `broker stop` leaves. Read by the login line (`daemon.rs`),
//! `broker stop|start|restart` (`lifecycle.rs`), `doctor` and `status`.

use crate::os;
use crate::person::{self, Act, KeyState, PersonKey};
use anyhow::Result;
use courier_shared::paths;
use std::fs;
use std::path::Path;

/// The file whose presence means "stopped on purpose": the time of the stop (ms) on its first
/// line, the person's signature of the stop on its second (none while no person key is set).
pub const STOP_MARKER: &str = "broker.stopped";

/// A stop on purpose, as `broker stop` records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopMark {
    pub at_ms: i64,
    /// The person's signature of [`Act::Stop`] at `at_ms` (hex).
    pub proof: Option<String>,
}

impl StopMark {
    pub fn act(&self) -> Act<'static> {
        Act::Stop { at_ms: self.at_ms }
    }

    fn parse(text: &str) -> StopMark {
        let mut lines = text.lines().map(str::trim);
        let at_ms = lines.next().and_then(|l| l.parse().ok()).unwrap_or(0);
        StopMark { at_ms, proof: lines.next().filter(|l| !l.is_empty()).map(str::to_string) }
    }

    /// Its time, if it counts under `key` (`person::honour`).
    fn counts(&self, key: &KeyState) -> Option<i64> {
        person::honoured(key, &self.act(), self.proof.as_deref()).then_some(self.at_ms)
    }

    fn text(&self) -> String {
        format!("{}\n{}\n", self.at_ms, self.proof.as_deref().unwrap_or(""))
    }
}

/// When the broker was stopped on purpose (Unix ms), if it is: a mark that counts
/// (`person::honour`: signed by the person key when one is set). A mark anything else wrote is
/// ignored, so the broker starts (fail open: the login line never stalls or stays down for it).
/// Cheap: a small file, the key file, one signature check; no key derivation.
pub fn stopped_on_purpose(state_dir: &Path) -> Option<i64> {
    StopMark::parse(&fs::read_to_string(state_dir.join(STOP_MARKER)).ok()?).counts(&PersonKey::current())
}

/// Removes the stop marker; true if there was one.
pub fn clear_stop(state_dir: &Path) -> Result<bool> {
    super::files::remove_file(&state_dir.join(STOP_MARKER))
}

pub(super) fn mark_stopped(state_dir: &Path, mark: &StopMark) -> Result<()> {
    crate::dirs::ensure_private_dir(state_dir)?;
    super::files::write_atomic(&state_dir.join(STOP_MARKER), mark.text().as_bytes(), 0o600)
}

/// The broker instance of `runtime_dir`: the process holding the instance lock on the directory
/// (`server::lock_instance`; whether or not it answers: hung, stopped, half-started or with its
/// socket gone), if it is ours.
pub fn instance_holder(runtime_dir: &Path) -> Option<i32> {
    use std::os::unix::fs::MetadataExt;
    let dir = fs::metadata(runtime_dir).ok()?;
    holder_of(dir.dev(), dir.ino())
}

/// Another process of ours holding an `flock` on the file `file` is open on (the broker that
/// holds an instance lock this one could not take).
pub fn lock_holder(file: &fs::File) -> Option<i32> {
    use std::os::unix::fs::MetadataExt;
    let m = file.metadata().ok()?;
    holder_of(m.dev(), m.ino())
}

/// The instance lock, named for a person (the lock is on the runtime directory itself).
pub fn lock_name(runtime_dir: &Path) -> String {
    format!("the instance lock of {}", runtime_dir.display())
}

fn holder_of(dev: u64, ino: u64) -> Option<i32> {
    let holders = os::locks::flock_writers_of(os::FileKey { dev, ino }).ok()?;
    let me = std::process::id() as i32;
    holders.into_iter().filter(|&pid| pid != me).find(|&pid| os::read_status(pid).is_ok_and(|s| s.all_uids_are(paths::uid())))
}

/// Says why a stop is on record, for doctor and status.
pub fn describe_stop(at_ms: i64) -> String {
    format!("stopped on purpose by `broker stop` at {}; `broker start` starts it again", crate::inspect::date_time(at_ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::person::{sign, MIN_ITERATIONS};

    #[test]
    fn a_stop_mark_counts_only_signed_once_a_person_key_is_set() {
        let (key, signing) = PersonKey::create("the person's own passphrase", MIN_ITERATIONS).unwrap();
        let key = KeyState::Set(key);
        let signed = StopMark { at_ms: 5, proof: Some(sign(&signing, &Act::Stop { at_ms: 5 })) };
        assert_eq!(StopMark::parse(&signed.text()), signed, "written and read back");
        assert_eq!(signed.counts(&key), Some(5));
        // What another process of the uid can write: no signature, or the signature of another time.
        let unsigned = StopMark::parse("5\n");
        assert_eq!((unsigned.proof.as_deref(), unsigned.counts(&key)), (None, None));
        assert_eq!(StopMark { at_ms: 6, ..signed.clone() }.counts(&key), None);
        // No key yet: a stop by `broker stop` counts as it always did (a mark of the old format too).
        assert_eq!(StopMark::parse("7").counts(&KeyState::None), Some(7));
    }
}
