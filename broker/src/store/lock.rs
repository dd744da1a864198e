//! The broker's store connection is shared behind one mutex by the hook workers, maintenance,
//! wake, effort, the follower and the producer service. [`lock`] is the one way to take it: a
//! hold long enough to make hook clients wait (over [`SLOW_HOLD`]) is logged with where it was
//! taken, when, and how long the taker itself had waited, so a stall names its holder (a long wait
//! is logged at debug: the stall's victims).

use super::Store;
use std::ops::{Deref, DerefMut};
use std::panic::Location;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A hold this long is logged (warn): a hook's whole deadline is 500 ms.
pub const SLOW_HOLD: Duration = Duration::from_millis(50);

/// The store, held; released on drop.
pub struct Locked<'a> {
    guard: MutexGuard<'a, Store>,
    at: &'static Location<'static>,
    taken: Instant,
    waited: Duration,
}

/// Takes the store (a poisoned lock is taken anyway: every change is its own transaction).
#[track_caller]
pub fn lock(store: &Mutex<Store>) -> Locked<'_> {
    let at = Location::caller();
    let asked = Instant::now();
    let guard = store.lock().unwrap_or_else(|e| e.into_inner());
    let taken = Instant::now();
    Locked { guard, at, taken, waited: taken - asked }
}

impl Deref for Locked<'_> {
    type Target = Store;
    fn deref(&self) -> &Store {
        &self.guard
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Store {
        &mut self.guard
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        let held = self.taken.elapsed();
        if self.waited > SLOW_HOLD {
            crate::log_debug!("store lock waited for {} ms at {}:{}", self.waited.as_millis(), self.at.file(), self.at.line());
        }
        if held > SLOW_HOLD {
            let since = super::now_ms() - held.as_millis() as i64;
            crate::log_warn!(
                "store lock held {} ms by {}:{} (taken at {since} ms since the epoch, after waiting {} ms); hooks wait meanwhile",
                held.as_millis(),
                self.at.file(),
                self.at.line(),
                self.waited.as_millis()
            );
        }
    }
}
