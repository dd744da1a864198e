//! Maintenance: every 500 ms, refusals the poll thread queued are recorded, `--ttl`s expire, lapsed
//! leases return to pending, hand-offs are reconciled against their rollouts and effort claims swept,
//! and the WAL is checkpointed on a connection of its own (never inside a hook call's commit:
//! `store/checkpoint.rs`); every 10 minutes old final messages are pruned. Also the clean stop
//! on a signal.
//!
//! The queue's steps (expiry to effort) work only on rows that can still move; when none is and
//! nothing was committed since the last look (`store/watch.rs`), the pass skips them: an idle
//! broker's pass is one `PRAGMA data_version`, not a dozen statements.
//!
//! An idle broker does not even wake for that: when the pass found no row that can move and no
//! refusal to record, nothing gives it work but a row queued or made pending (this process's
//! commits and `broker send`'s nudge signal [`crate::store::QUEUED`], as does a refusal queued
//! by the poll thread) or time (the ticket journal's flush, the prune). So it sleeps until the
//! signal or the nearest of those deadlines, at most [`IDLE_RECHECK`] (a row another process
//! queued without saying so); the first pass after a signal runs as soon as the last one is
//! [`MAINTENANCE_INTERVAL`] old (any process of the uid may nudge: passes stay at most two a
//! second however many signals come).

use super::{listener::BOUND, Broker};
use crate::delivery::{self};
use crate::store::{Checkpointer, Watch, QUEUED, SAFETY_NET_PAGES};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const MAINTENANCE_INTERVAL: Duration = Duration::from_millis(500);
/// While no row can move: a pass at least this often, for rows another process queued without
/// a nudge (an older `broker send`, or a nudge that did not arrive).
const IDLE_RECHECK: Duration = Duration::from_secs(5);
const PRUNE_INTERVAL: Duration = Duration::from_secs(600);

/// Starts the `maintenance` thread; `retention`: how long final messages are kept (`None`: forever).
pub(super) fn spawn(broker: Arc<Broker>, state_dir: &Path, retention: Option<Duration>) -> std::io::Result<()> {
    let checkpointer = match Checkpointer::open(state_dir) {
        Ok(c) => Some(c),
        Err(e) => {
            crate::log_error!("no checkpoint connection ({e:#}); the broker's own commits checkpoint past {SAFETY_NET_PAGES} pages");
            None
        }
    };
    let mut watch = open_watch(state_dir, "maintenance");
    std::thread::Builder::new().name("maintenance".into()).spawn(move || {
        let mut last_prune: Option<Instant> = None;
        let (mut idle, mut seen) = (false, QUEUED.count());
        let mut last_pass = Instant::now();
        loop {
            if idle {
                QUEUED.wait_past(seen, idle_sleep(&broker, retention.map(|_| last_prune)));
            }
            // Never more often than every MAINTENANCE_INTERVAL, signalled or not: any process of
            // the uid may send nudges, and a flood of them must not become a flood of passes.
            std::thread::sleep(MAINTENANCE_INTERVAL.saturating_sub(last_pass.elapsed()));
            last_pass = Instant::now();
            // Read before the pass looks: a row queued during it moves the count, and the next
            // wait returns at once (store/signal.rs).
            seen = QUEUED.count();
            idle = broker.maintain(watch.as_mut());
            if let Some(c) = &checkpointer {
                if let Err(e) = c.passive() {
                    crate::log_error!("checkpointing the queue: {e:#}");
                }
            }
            if let Some(keep) = retention.filter(|_| prune_due_in(last_prune).is_zero()) {
                last_prune = Some(Instant::now());
                broker.prune(keep);
            }
        }
    })?;
    Ok(())
}

/// How long an idle pass may sleep: until the ticket journal's flush or the prune is due, at
/// most [`IDLE_RECHECK`]. `prune`: the last prune, when pruning is on.
fn idle_sleep(broker: &Broker, prune: Option<Option<Instant>>) -> Duration {
    let flush = broker.tickets.lock().unwrap_or_else(|e| e.into_inner()).flush_due_in();
    [Some(IDLE_RECHECK), flush, prune.map(prune_due_in)].into_iter().flatten().min().unwrap_or(IDLE_RECHECK)
}

/// How long until the next prune (zero: due; the first is due at once).
fn prune_due_in(last: Option<Instant>) -> Duration {
    last.map_or(Duration::ZERO, |t| PRUNE_INTERVAL.saturating_sub(t.elapsed()))
}

/// The queue watch of a periodic pass; without one (an error, logged) the pass looks every time.
pub(super) fn open_watch(state_dir: &Path, pass: &str) -> Option<Watch> {
    Watch::open(state_dir)
        .map_err(|e| crate::log_error!("no queue watch for the {pass} pass ({e:#}); it looks at the queue every time"))
        .ok()
}

impl Broker {
    /// Stops the broker on a signal: waits for any store transaction in flight, removes its
    /// socket (if it bound it) so no hook connects to a dead broker, logs the stop and exits 0.
    /// A lease not yet acked is never handed (its client withdraws the output), as after a crash.
    pub(super) fn stop(&self, why: &str) -> ! {
        let mut tickets = self.tickets.lock().unwrap_or_else(|e| e.into_inner());
        let mut store = crate::store::lock(&self.store);
        if let Err(e) = tickets.flush(&mut store) {
            crate::log_error!("moving journaled tickets into the queue database: {e:#} (the next start replays them)");
        }
        if let Some(b) = BOUND.get() {
            b.stopped(why);
        }
        std::process::exit(0)
    }

    /// One pass: the in-memory journals first (tickets, refusals), then the queue's steps unless
    /// `watch` proves no row can move ([`Watch::nothing_live`]). Returns whether it is idle: no
    /// row could move and no refusal was recorded (the next pass may wait for a signal).
    pub(super) fn maintain(&self, watch: Option<&mut Watch>) -> bool {
        self.counters.maintenance_passes.fetch_add(1, Ordering::Relaxed);
        self.tickets.lock().unwrap_or_else(|e| e.into_inner()).maintain(&self.store);
        let recorded = self.record_queued_refusals();
        self.gate.prune();
        let idle = watch.map(|w| w.nothing_live()).transpose().unwrap_or_else(|e| {
            crate::log_error!("maintenance: watching the queue: {e:#}");
            None
        });
        if idle != Some(true) {
            self.counters.maintenance_looks.fetch_add(1, Ordering::Relaxed);
            self.maintain_queue();
        }
        idle == Some(true) && !recorded
    }

    /// Whether there was any refusal to record.
    fn record_queued_refusals(&self) -> bool {
        let queued = std::mem::take(&mut *self.queued_refusals.lock().unwrap_or_else(|e| e.into_inner()));
        if queued.is_empty() {
            return false;
        }
        let mut store = crate::store::lock(&self.store);
        if let Err(e) = store.record_refusals_at_accept(&queued) {
            crate::log_error!("recording {} refusal(s): {e:#}", queued.len());
        }
        true
    }

    /// The steps on rows that can still move: `--ttl`s, lapsed leases, hand-offs, effort claims,
    /// parked waits and threads that never appeared.
    fn maintain_queue(&self) {
        let mut store = crate::store::lock(&self.store);
        match store.expire_due() {
            Ok(0) => {}
            Ok(n) => crate::log_info!("expired {n} message(s) whose --ttl ran out"),
            Err(e) => crate::log_error!("expiring messages: {e:#}"),
        }
        if let Err(e) = store.release_expired_leases() {
            crate::log_error!("maintenance: {e:#}");
        }
        drop(store);
        // Every handed thread's rollout is read here: without the store lock the hooks need.
        if let Err(e) = delivery::reconcile_shared(&self.store, None) {
            crate::log_error!("maintenance: {e:#}");
        }
        self.effort.maintain();
        self.producer.maintain();
    }

    pub(super) fn prune(&self, keep: Duration) {
        let mut store = crate::store::lock(&self.store);
        match store.prune(keep.as_millis() as i64) {
            Ok(0) => {}
            Ok(n) => crate::log_info!("pruned {n} messages older than {} days", keep.as_secs() / 86_400),
            Err(e) => crate::log_error!("pruning: {e:#}"),
        }
    }
}
