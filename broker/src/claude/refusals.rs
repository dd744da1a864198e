//! Refusals of the Claude Code endpoint and of the idle wake, recorded for `broker inspect` at a
//! bounded rate: a flood of forged connections must not become a flood of database writes.

use crate::refusal::Refusal;
use crate::store::Store;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Refusals written to the queue per second at most; more are logged only (a flood of forged
/// connections must not become a flood of database writes).
const REFUSALS_PER_SECOND: usize = 16;

/// Refusals written to the queue, at most [`REFUSALS_PER_SECOND`] (the endpoint's and the wake's
/// each): a flood of forged connections must not become a flood of database writes.
pub(crate) struct Refusals(Mutex<(Instant, usize)>);

impl Default for Refusals {
    fn default() -> Refusals {
        Refusals(Mutex::new((Instant::now(), 0)))
    }
}

impl Refusals {
    /// Logs `r` as refused by `what`, and records it for `inspect` unless over the rate.
    pub(crate) fn record(&self, store: &Mutex<Store>, r: &Refusal, what: &str) {
        {
            let mut window = self.0.lock().unwrap_or_else(|e| e.into_inner());
            if window.0.elapsed() >= Duration::from_secs(1) {
                *window = (Instant::now(), 0);
            }
            window.1 += 1;
            if window.1 > REFUSALS_PER_SECOND {
                crate::log_debug!("{what} refused (not recorded: over {REFUSALS_PER_SECOND}/s): {} {}", r.code, r.detail);
                return;
            }
        }
        crate::log_info!("{what} refused: {} {}", r.code, r.detail);
        let mut store = crate::store::lock(store);
        if let Err(e) = store.record_refusal(r.code, &r.detail, r.thread.as_deref(), r.event.as_deref(), None) {
            crate::log_warn!("{what}: refusal not recorded: {e:#}");
        }
    }
}
