//! The workers: a fixed pool of threads that take complete request frames (and hand-offs' acks)
//! from the job queue the poll thread (`poller.rs`) fills, serve them, and give a hand-off that
//! owes its ack back to the poll thread. Limits: see the `server` module documentation.

use super::{Broker, MAX_PENDING};
use crate::gate::Verified;
use anyhow::{Context, Result};
use nix::libc;
use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Work for a worker thread.
pub(super) enum Job {
    /// A complete request frame (with its 4-byte length prefix), its connection and the
    /// connection's `SO_PEERCRED`.
    Request { stream: UnixStream, frame: Vec<u8>, cred: crate::gate::peer::Credentials },
    /// A hand-off's ack frame (without its prefix), or `None` when none came before the lease
    /// ended or the client left: commit or release the lease.
    Ack { pending: AwaitAck, frame: Option<Vec<u8>> },
}

/// A hand-off whose client has been sent the leased output and owes its ack.
pub(super) struct AwaitAck {
    pub(super) stream: UnixStream,
    pub(super) token: crate::store::LeaseToken,
    pub(super) count: usize,
    pub(super) verified: Box<Verified>,
    /// When the lease ends (`LEASE_MS` after it was taken): no ack by then -> released.
    pub(super) deadline: Instant,
}

/// Hand-offs the workers give back to the poll thread, which an eventfd wakes.
pub(super) struct Handback {
    pub(super) queue: Mutex<Vec<AwaitAck>>,
    pub(super) wake: std::os::fd::OwnedFd,
}

impl Handback {
    pub(super) fn new() -> Result<Handback> {
        // SAFETY: eventfd returns a new fd or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("eventfd");
        }
        // SAFETY: fd is a fresh descriptor we own.
        Ok(Handback { queue: Mutex::new(Vec::new()), wake: unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) } })
    }

    pub(super) fn give(&self, a: AwaitAck) {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).push(a);
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    pub(super) fn take(&self) -> Vec<AwaitAck> {
        let mut n = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live buffer from our (non-blocking) eventfd.
        unsafe { libc::read(self.wake.as_raw_fd(), n.as_mut_ptr().cast(), n.len()) };
        std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Complete requests waiting for a worker, and the idle workers. A job wakes exactly one idle
/// worker (a shared `Mutex<Receiver>` also woke the next worker to queue on the mutex: one more
/// context switch per hook call, on the client's critical path), and the one idle the shortest
/// time: its stack and caches are the warmest (a condvar wakes the one that waited longest).
#[derive(Default)]
pub(super) struct JobQueue {
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Parked workers, the most recently idle last.
    idle: Vec<std::thread::Thread>,
}

impl JobQueue {
    /// Queues `job`, or gives it back when [`MAX_PENDING`] jobs already wait.
    pub(super) fn push(&self, job: Job) -> Result<(), Job> {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.jobs.len() >= MAX_PENDING {
            return Err(job);
        }
        q.jobs.push_back(job);
        let worker = q.idle.pop();
        drop(q);
        if let Some(w) = worker {
            w.unpark();
        }
        Ok(())
    }

    /// The next job; parks the calling worker until there is one, or, with a `timeout`, at most
    /// that long (`None`). A worker is listed idle only while it has no job, so a push never
    /// wakes a busy one.
    fn pop(&self, timeout: Option<Duration>) -> Option<Job> {
        let me = std::thread::current();
        let until = timeout.map(|t| Instant::now() + t);
        loop {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(job) = q.jobs.pop_front() {
                q.idle.retain(|t| t.id() != me.id());
                return Some(job);
            }
            let left = match until {
                Some(until) => match until.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => {
                        q.idle.retain(|t| t.id() != me.id());
                        return None;
                    }
                },
                None => None,
            };
            if !q.idle.iter().any(|t| t.id() == me.id()) {
                q.idle.push(me.clone());
            }
            drop(q);
            // An unpark given before this returns at once: no wake-up is lost.
            match left {
                Some(left) => std::thread::park_timeout(left),
                None => std::thread::park(),
            }
        }
    }
}

/// How long an answered connection stays open after its answer ([`Served::Answered`]) when no
/// other job comes first.
const LINGER: Duration = Duration::from_millis(50);

/// What serving one request leaves to do with its connection.
pub(super) enum Served {
    /// Nothing: the connection is closed.
    Closed,
    /// Its answer is written; the client reads it and closes its end. Closing ours at once
    /// raced the client's read for its socket's lock (on 2 vCPUs, a measured 0.06x of
    /// `/bin/true` per idle hook call): the worker closes it after its next answer, or after
    /// [`LINGER`] with nothing to do.
    Answered(UnixStream),
    /// A hand-off whose ack the poll thread awaits.
    AwaitAck(AwaitAck),
}

pub(super) fn worker(broker: &Broker, jobs: &JobQueue, handback: &Handback) {
    // The last answered connection (`Served::Answered`), closed after the next answer.
    let mut answered: Option<UnixStream> = None;
    loop {
        let Some(job) = jobs.pop(answered.as_ref().map(|_| LINGER)) else {
            answered = None;
            continue;
        };
        match job {
            Job::Request { stream, frame, cred } => {
                // A first byte `{` is a producer's JSON line (producer/proto.rs), not a frame.
                let served = if frame.first() == Some(&b'{') {
                    if super::approvals::is_answer(&frame) {
                        broker.answer_approval(stream, &frame);
                    } else if super::inbound::is_owner_op(&frame) {
                        broker.owner_op(stream, &frame);
                    } else {
                        let checks = crate::producer::proto::Checks {
                            sender: &|s, claims| broker.verify_sender(s, claims),
                            unconfined_user: &|s| broker.is_unconfined_user(s),
                            interrupt: &|t| broker.interruptible(t),
                        };
                        broker.producer.serve(stream, &frame, &checks);
                    }
                    Served::Closed
                } else {
                    broker.handle(stream, &frame[4..], &cred)
                };
                let held = frame.capacity();
                drop(frame);
                broker.counters.frames_held.fetch_sub(held, Ordering::SeqCst);
                match served {
                    // Still one connection, now waiting in the poll thread.
                    Served::AwaitAck(a) => handback.give(a),
                    Served::Answered(stream) => {
                        broker.counters.connections.fetch_sub(1, Ordering::SeqCst);
                        answered = Some(stream); // the one before is closed here
                    }
                    Served::Closed => {
                        broker.counters.connections.fetch_sub(1, Ordering::SeqCst);
                    }
                }
            }
            Job::Ack { pending, frame } => {
                broker.finish_hand_over(pending, frame.as_deref());
                broker.counters.connections.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{mpsc, Arc};

    fn wait_idle(jobs: &JobQueue, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while jobs.queue.lock().unwrap().idle.len() != n {
            assert!(Instant::now() < deadline, "{n} workers never all idle");
            std::thread::yield_now();
        }
    }

    /// Jobs pushed one at a time, each finished before the next, all run on the same worker of
    /// four (the one idle the shortest time), and none is lost.
    #[test]
    fn the_most_recently_idle_worker_takes_the_next_job() {
        let jobs = Arc::new(JobQueue::default());
        let (done_tx, done_rx) = mpsc::channel();
        for _ in 0..4 {
            let (jobs, done) = (Arc::clone(&jobs), done_tx.clone());
            std::thread::spawn(move || loop {
                let _job = jobs.pop(None);
                done.send(std::thread::current().id()).unwrap();
            });
        }
        let mut ran = Vec::new();
        for _ in 0..20 {
            wait_idle(&jobs, 4);
            let (a, _b) = UnixStream::pair().unwrap();
            let cred = crate::os::peer_cred(&a).unwrap();
            assert!(jobs.push(Job::Request { stream: a, frame: Vec::new(), cred }).is_ok());
            ran.push(done_rx.recv_timeout(Duration::from_secs(10)).expect("the job ran"));
        }
        assert!(ran.iter().all(|t| *t == ran[0]), "{ran:?}");
    }

    /// A worker holding an answered connection waits for a job at most its timeout, and is no
    /// longer listed idle after it (a push must wake a worker that will take the job); a job that
    /// comes while it waits is taken.
    #[test]
    fn a_timed_wait_for_a_job_ends_without_one_or_takes_one() {
        let jobs = Arc::new(JobQueue::default());
        let t0 = Instant::now();
        assert!(jobs.pop(Some(Duration::from_millis(30))).is_none());
        assert!(t0.elapsed() >= Duration::from_millis(30));
        assert!(jobs.queue.lock().unwrap().idle.is_empty(), "listed idle after its wait ended");
        let waiter = {
            let jobs = Arc::clone(&jobs);
            std::thread::spawn(move || jobs.pop(Some(Duration::from_secs(60))).is_some())
        };
        wait_idle(&jobs, 1);
        let (a, _b) = UnixStream::pair().unwrap();
        let cred = crate::os::peer_cred(&a).unwrap();
        assert!(jobs.push(Job::Request { stream: a, frame: Vec::new(), cred }).is_ok());
        assert!(waiter.join().unwrap(), "the job pushed during the wait was not taken");
    }
}
