//! Waking a thread when the store commits something it waits for, instead of polling: the wake
//! channel waits for messages made pending, the Claude Code confirmation thread for hand-offs.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Counts commits of one kind and wakes whoever waits for the next one: the commits of a
/// connection that made messages pending ([`super::Store::pending_signal`]), the hand-offs of the
/// process ([`HANDED`]).
#[derive(Default)]
pub struct CommitSignal {
    count: Mutex<u64>,
    changed: Condvar,
}

/// Signalled by every hand-off this process commits, on any connection and through any channel:
/// what the Claude Code confirmation thread waits on while no hand-off is open
/// (`claude/serve.rs`), so an idle broker reads nothing for it.
pub static HANDED: CommitSignal = CommitSignal::new();

impl CommitSignal {
    pub const fn new() -> CommitSignal {
        CommitSignal { count: Mutex::new(0), changed: Condvar::new() }
    }

    pub(super) fn bump(&self, n: usize) {
        if n > 0 {
            *self.count.lock().unwrap_or_else(|e| e.into_inner()) += n as u64;
            self.changed.notify_all();
        }
    }

    /// The count so far.
    pub fn count(&self) -> u64 {
        *self.count.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until the count is no longer `seen`, or `timeout` has passed.
    pub fn wait_past(&self, seen: u64, timeout: Duration) {
        let guard = self.count.lock().unwrap_or_else(|e| e.into_inner());
        let _ = self.changed.wait_timeout_while(guard, timeout, |c| *c == seen);
    }

    /// Waits, with no bound, until the count is no longer `seen`.
    pub fn wait_for_next(&self, seen: u64) {
        let guard = self.count.lock().unwrap_or_else(|e| e.into_inner());
        drop(self.changed.wait_while(guard, |c| *c == seen).unwrap_or_else(|e| e.into_inner()));
    }
}
