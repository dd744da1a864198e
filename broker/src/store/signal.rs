//! Waking a thread when the store commits something it waits for, instead of polling: the wake
//! channel and the maintenance pass wait for rows queued or made pending ([`QUEUED`]), the
//! Claude Code confirmation thread for hand-offs ([`HANDED`]).
//!
//! Every bump comes AFTER its commit returned, and a waiter reads the count BEFORE it looks at
//! the queue ([`CommitSignal::count`], then [`CommitSignal::wait_past`] that count): a commit
//! that lands between the look and the wait has moved the count, so the wait returns at once.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Counts commits of one kind and wakes whoever waits for the next one: the commits of this
/// process that queued rows or made messages pending ([`QUEUED`]), its hand-offs ([`HANDED`]).
#[derive(Default)]
pub struct CommitSignal {
    count: Mutex<u64>,
    changed: Condvar,
}

/// Signalled by every hand-off this process commits, on any connection and through any channel:
/// what the Claude Code confirmation thread waits on while no hand-off is open
/// (`claude/serve.rs`), so an idle broker reads nothing for it.
pub static HANDED: CommitSignal = CommitSignal::new();

/// Signalled by every commit of this process, on any connection, that queues a row (a message,
/// an effort request) or makes messages pending again (a lease released, a hand-off withdrawn or
/// proven unseen); by another process that queued rows directly (`broker send`, `broker effort`:
/// their `nudge` request); and by a refusal the poll thread leaves for the maintenance pass to
/// record. What an idle broker's wake channel and maintenance pass sleep on (`wake/mod.rs`,
/// `server/maintenance.rs`): nothing else gives either something to do, but time.
pub static QUEUED: CommitSignal = CommitSignal::new();

impl CommitSignal {
    pub const fn new() -> CommitSignal {
        CommitSignal { count: Mutex::new(0), changed: Condvar::new() }
    }

    pub(crate) fn bump(&self, n: usize) {
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
