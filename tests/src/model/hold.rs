//! [`Hold`]: a gate a held reply waits behind, so a test can act while Codex waits for the model.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::MAX_HOLD;

/// A gate a held reply waits behind. Cloning shares the gate. Once released it stays open.
#[derive(Clone, Debug, Default)]
pub struct Hold(Arc<(Mutex<HoldState>, Condvar)>);

#[derive(Debug, Default)]
struct HoldState {
    released: bool,
    waiting: usize,
    passed: usize,
}

impl Hold {
    pub fn new() -> Hold {
        Hold::default()
    }

    /// Let every reply held on this gate (now and later) go out.
    pub fn release(&self) {
        let (m, c) = &*self.0;
        m.lock().unwrap().released = true;
        c.notify_all();
    }

    pub fn is_released(&self) -> bool {
        self.0 .0.lock().unwrap().released
    }

    /// Wait until at least `n` replies are parked on this gate (bounded).
    pub fn wait_held(&self, n: usize, timeout: Duration) {
        let (m, c) = &*self.0;
        let deadline = Instant::now() + timeout;
        let mut g = m.lock().unwrap();
        while g.waiting < n {
            let now = Instant::now();
            if now >= deadline {
                panic!("timed out after {timeout:?}: {} of {n} replies held", g.waiting);
            }
            g = c.wait_timeout(g, deadline - now).unwrap().0;
        }
    }

    /// How many held replies have gone out after a release.
    pub fn passed(&self) -> usize {
        self.0 .0.lock().unwrap().passed
    }

    /// Waits here until released (bounded by `MAX_HOLD`): what a held reply does, and what a
    /// Messages script calls to hold its answer. False when the bound ran out first.
    pub fn park(&self) -> bool {
        let (m, c) = &*self.0;
        let deadline = Instant::now() + MAX_HOLD;
        let mut g = m.lock().unwrap();
        g.waiting += 1;
        c.notify_all();
        while !g.released {
            let now = Instant::now();
            if now >= deadline {
                g.waiting -= 1;
                return false;
            }
            g = c.wait_timeout(g, deadline - now).unwrap().0;
        }
        g.waiting -= 1;
        g.passed += 1;
        c.notify_all();
        true
    }
}
