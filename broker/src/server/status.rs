//! What `Request::Status` answers: the broker's counters (`broker inspect` shows them).

use super::Broker;
use courier_shared::wire::PROTOCOL_VERSION;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

impl Broker {
    pub(super) fn status(&self) -> serde_json::Value {
        let c = &self.counters;
        serde_json::json!({
            "v": PROTOCOL_VERSION,
            "pid": std::process::id(),
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_ms": self.started.elapsed().as_millis() as u64,
            "hook_calls": c.hook_calls.load(Ordering::Relaxed),
            "refusals": c.refusals.load(Ordering::Relaxed),
            "leases": c.leases.load(Ordering::Relaxed),
            "messages_handed": c.handed.load(Ordering::Relaxed),
            "leases_not_acked": c.unacked.load(Ordering::Relaxed),
            "open_connections": c.connections.load(Ordering::Relaxed),
            "connections_evicted": c.evicted.load(Ordering::Relaxed),
            "connections_timed_out": c.timed_out.load(Ordering::Relaxed),
            "connections_rejected": c.rejected.load(Ordering::Relaxed),
            "bad_frames": c.bad_frames.load(Ordering::Relaxed),
            "buffered_bytes": c.buffered.load(Ordering::Relaxed) + c.frames_held.load(Ordering::Relaxed),
            "refusals_unrecorded": c.refusals_unrecorded.load(Ordering::Relaxed),
            "rollout_bytes_read": self.gate.tracker().total_bytes_read.load(Ordering::Relaxed),
            "parked_waits": self.producer.parked_waits(),
        })
    }
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) hook_calls: AtomicU64,
    pub(super) refusals: AtomicU64,
    pub(super) refusals_unrecorded: AtomicU64,
    pub(super) leases: AtomicU64,
    pub(super) handed: AtomicU64,
    pub(super) unacked: AtomicU64,
    /// Unfinished connections in the poll thread, hand-offs waiting for their ack, and requests
    /// in workers.
    pub(super) connections: AtomicUsize,
    pub(super) evicted: AtomicU64,
    pub(super) timed_out: AtomicU64,
    pub(super) rejected: AtomicU64,
    pub(super) bad_frames: AtomicU64,
    /// Bytes allocated for unfinished requests (the poll thread's share of [`MAX_BUFFERED`]).
    pub(super) buffered: AtomicUsize,
    /// Bytes allocated for complete frames queued for a worker or held by one (until it is done
    /// with them): they count against [`MAX_BUFFERED`] like unfinished ones.
    pub(super) frames_held: AtomicUsize,
}
