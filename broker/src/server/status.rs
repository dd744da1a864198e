//! What `Request::Status` answers: the broker's counters (`broker inspect` shows them).

use super::Broker;
use courier_shared::wire::{StatusReply, PROTOCOL_VERSION};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

impl Broker {
    pub(super) fn status(&self) -> StatusReply {
        let c = &self.counters;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatusReply {
            v: PROTOCOL_VERSION,
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").into(),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            hook_calls: n(&c.hook_calls),
            refusals: n(&c.refusals),
            leases: n(&c.leases),
            messages_handed: n(&c.handed),
            leases_not_acked: n(&c.unacked),
            open_connections: c.connections.load(Ordering::Relaxed) as u64,
            connections_evicted: n(&c.evicted),
            connections_timed_out: n(&c.timed_out),
            connections_rejected: n(&c.rejected),
            bad_frames: n(&c.bad_frames),
            buffered_bytes: (c.buffered.load(Ordering::Relaxed) + c.frames_held.load(Ordering::Relaxed)) as u64,
            refusals_unrecorded: n(&c.refusals_unrecorded),
            rollout_bytes_read: n(&self.gate.tracker().total_bytes_read),
            parked_waits: self.producer.parked_waits() as u64,
            digests_queued: self.gate.digests().queued() as u64,
            maintenance_passes: n(&c.maintenance_passes),
            maintenance_looks: n(&c.maintenance_looks),
            wake_looks: n(&c.wake_looks),
            claude_confirm_looks: n(&c.claude_confirm_looks),
            other: Default::default(),
        }
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
    pub(super) maintenance_passes: AtomicU64,
    /// Maintenance passes that ran the queue's steps (`maintenance.rs`).
    pub(super) maintenance_looks: AtomicU64,
    /// Wake passes that listed the threads to wake (`mod.rs`, `spawn_wake`).
    pub(super) wake_looks: AtomicU64,
    /// Passes of Claude Code's confirmation thread (`claude/serve.rs`), which counts them here.
    pub(super) claude_confirm_looks: std::sync::Arc<AtomicU64>,
}
