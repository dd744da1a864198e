//! The connection layer: one epoll thread accepts every connection and reads it without blocking
//! until it holds one complete request frame, which it queues for the workers (`workers.rs`);
//! it also waits for hand-offs' acks. Limits: see the `server` module documentation.

use super::workers::{AwaitAck, Handback, Job, JobQueue};
use super::{Broker, MAX_BUFFERED, MAX_PENDING, MAX_PER_PEER, REQUEST_TIMEOUT};
use crate::refusal::RefusalCode;
use anyhow::{Context, Result};
use courier_shared::wire::{self, ErrorFrame, PROTOCOL_VERSION};
use nix::libc;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest ack frame body the broker reads.
pub(super) const MAX_ACK_FRAME: usize = 1024;

/// Error frame for a request the broker will not serve: a client learns why before the close.
pub(super) fn error_frame(code: &str, detail: &str) -> Vec<u8> {
    let body = serde_json::to_string(&ErrorFrame { v: PROTOCOL_VERSION, error: code.into(), detail: detail.into() }).unwrap_or_default();
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(body.as_bytes());
    out
}

pub(super) struct Conn {
    pub(super) stream: UnixStream,
    pub(super) pid: i32,
    /// Its `SO_PEERCRED`, read at accept.
    pub(super) cred: crate::gate::peer::Credentials,
    pub(super) since: Instant,
    /// Frame bytes so far (length prefix included); grows with what arrives, not what is claimed.
    pub(super) buf: Vec<u8>,
    /// In the poll set: its frame was not whole when it was accepted.
    pub(super) polled: bool,
}

/// The next connection on `listener`, non-blocking from the start (`accept4`: no `ioctl` after).
fn accept_nonblocking(listener: &UnixListener) -> std::io::Result<UnixStream> {
    // SAFETY: accept4 on our listening socket with no address buffer; returns a new fd or -1.
    let fd = unsafe {
        libc::accept4(listener.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(unsafe { <UnixStream as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// The accept-and-read loop (see the module docs).
pub(super) struct Poller {
    pub(super) epoll: std::os::fd::OwnedFd,
    pub(super) listener: UnixListener,
    pub(super) broker: Arc<Broker>,
    pub(super) jobs: Arc<JobQueue>,
    pub(super) handback: Arc<Handback>,
    pub(super) conns: HashMap<RawFd, Conn>,
    /// Hand-offs waiting for their ack, with the ack bytes read so far.
    pub(super) acks: HashMap<RawFd, (AwaitAck, Vec<u8>)>,
    pub(super) per_peer: HashMap<i32, usize>,
    /// Bytes allocated for the `buf`s of `conns` (capacity, not length).
    pub(super) buffered: usize,
    pub(super) uid: u32,
}

pub(super) const LISTENER: u64 = u64::MAX;

pub(super) const WAKE: u64 = u64::MAX - 1;

impl Poller {
    pub(super) fn new(listener: UnixListener, broker: Arc<Broker>, jobs: Arc<JobQueue>, handback: Arc<Handback>) -> Result<Poller> {
        listener.set_nonblocking(true)?;
        // SAFETY: epoll_create1 returns a new fd or -1.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("epoll_create1");
        }
        // SAFETY: fd is a fresh descriptor we own.
        let epoll = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let p = Poller {
            epoll,
            listener,
            broker,
            jobs,
            handback,
            conns: HashMap::new(),
            acks: HashMap::new(),
            per_peer: HashMap::new(),
            buffered: 0,
            uid: courier_shared::paths::uid(),
        };
        p.ctl(libc::EPOLL_CTL_ADD, p.listener.as_raw_fd(), LISTENER)?;
        p.ctl(libc::EPOLL_CTL_ADD, p.handback.wake.as_raw_fd(), WAKE)?;
        Ok(p)
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, token: u64) -> std::io::Result<()> {
        let mut ev = libc::epoll_event { events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32, u64: token };
        // SAFETY: valid epoll fd, valid event struct.
        if unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), op, fd, &mut ev) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    pub(super) fn run(mut self) -> Result<()> {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
        let mut last_sweep = Instant::now();
        loop {
            // Deadlines are swept every 100 ms while a connection or an ack is open; with none, the
            // thread sleeps until the next event (an idle broker is woken by nothing of its own).
            let timeout = if self.conns.is_empty() && self.acks.is_empty() { -1 } else { 100 };
            // SAFETY: events has the length we pass.
            let n = unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), events.as_mut_ptr(), events.len() as i32, timeout) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e).context("epoll_wait");
            }
            for ev in &events[..n as usize] {
                let token = ev.u64;
                if token == LISTENER {
                    self.accept_some();
                } else if token == WAKE {
                    for a in self.handback.take() {
                        self.await_ack(a);
                    }
                } else if self.acks.contains_key(&(token as RawFd)) {
                    self.read_ack(token as RawFd);
                } else {
                    self.read_conn(token as RawFd);
                }
            }
            if last_sweep.elapsed() >= Duration::from_millis(100) {
                self.sweep();
                last_sweep = Instant::now();
            }
        }
    }

    /// Accepts what is waiting (a flood is taken in batches: one accept per `epoll_wait` let the
    /// backlog overflow, and honest clients were refused at connect) and reads each at once.
    fn accept_some(&mut self) {
        for _ in 0..512 {
            let stream = match accept_nonblocking(&self.listener) {
                Ok(s) => s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE)) => {
                    // Out of descriptors: give the oldest unfinished connection's to the new one.
                    if !self.evict_oldest() {
                        return;
                    }
                    continue;
                }
                Err(_) => return,
            };
            let cred = match crate::os::peer_cred(&stream) {
                Ok(c) => c,
                Err(_) => continue,
            };
            if cred.uid != self.uid {
                self.broker.refuse_later(RefusalCode::PeerUid, format!("peer uid {} is not broker uid {}", cred.uid, self.uid), cred.pid);
                continue; // dropped unread
            }
            let pid = cred.pid;
            if self.per_peer.get(&pid).copied().unwrap_or(0) >= MAX_PER_PEER {
                self.broker.counters.rejected.fetch_add(1, Ordering::Relaxed);
                let _ = (&stream)
                    .write(&error_frame(RefusalCode::TooManyConnections.as_str(), "this process has too many unfinished requests"));
                self.broker.refuse_later(
                    RefusalCode::TooManyConnections,
                    format!("pid {pid} holds {MAX_PER_PEER} unfinished connections"),
                    pid,
                );
                continue;
            }
            if self.conns.len() >= MAX_PENDING {
                self.evict_oldest();
            }
            let fd = stream.as_raw_fd();
            *self.per_peer.entry(pid).or_default() += 1;
            self.broker.counters.connections.fetch_add(1, Ordering::SeqCst);
            self.conns.insert(fd, Conn { stream, pid, cred, since: Instant::now(), buf: Vec::new(), polled: false });
            // A client writes its frame right after it connects: most are whole by now, and go to
            // a worker without entering the poll set (two `epoll_ctl` and an `epoll_wait` fewer).
            self.read_conn(fd);
            if self.conns.contains_key(&fd) {
                if self.ctl(libc::EPOLL_CTL_ADD, fd, fd as u64).is_err() {
                    self.remove(fd);
                    continue;
                }
                if let Some(conn) = self.conns.get_mut(&fd) {
                    conn.polled = true;
                }
            }
        }
    }

    /// Takes a connection out of the poll set (the caller closes or hands it on).
    fn remove(&mut self, fd: RawFd) -> Option<Conn> {
        let conn = self.conns.remove(&fd)?;
        if conn.polled {
            let _ = self.ctl(libc::EPOLL_CTL_DEL, fd, 0);
        }
        self.buffered -= conn.buf.capacity();
        self.broker.counters.buffered.store(self.buffered, Ordering::Relaxed);
        if let Some(n) = self.per_peer.get_mut(&conn.pid) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&conn.pid);
            }
        }
        self.broker.counters.connections.fetch_sub(1, Ordering::SeqCst);
        Some(conn)
    }

    fn close_with(&mut self, fd: RawFd, code: RefusalCode, detail: String) {
        if let Some(conn) = self.remove(fd) {
            self.broker.counters.bad_frames.fetch_add(1, Ordering::Relaxed);
            let _ = (&conn.stream).write(&error_frame(code.as_str(), &detail));
            self.broker.refuse_later(code, detail, conn.pid);
        }
    }

    fn evict_oldest(&mut self) -> bool {
        let Some(fd) = self.conns.iter().min_by_key(|(_, c)| c.since).map(|(fd, _)| *fd) else { return false };
        self.broker.counters.evicted.fetch_add(1, Ordering::Relaxed);
        if let Some(conn) = self.remove(fd) {
            let _ = (&conn.stream).write(&error_frame("evicted", "too many unfinished connections"));
        }
        true
    }

    /// Waits (in the poll set) for the ack of a hand-off a worker gave back.
    fn await_ack(&mut self, a: AwaitAck) {
        let fd = a.stream.as_raw_fd();
        if a.stream.set_nonblocking(true).is_err() || self.ctl(libc::EPOLL_CTL_ADD, fd, fd as u64).is_err() {
            return self.settle_ack(a, None);
        }
        self.acks.insert(fd, (a, Vec::new()));
    }

    /// Hands a hand-off to a worker to commit (`frame`) or release (`None`) its lease.
    fn settle_ack(&mut self, a: AwaitAck, frame: Option<Vec<u8>>) {
        let _ = a.stream.set_nonblocking(false);
        if self.jobs.push(Job::Ack { pending: a, frame }).is_err() {
            // No room: dropped; the lease runs out and maintenance returns it to pending.
            self.broker.counters.connections.fetch_sub(1, Ordering::SeqCst);
            self.broker.counters.rejected.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn end_ack(&mut self, fd: RawFd, complete: bool) {
        let Some((a, buf)) = self.acks.remove(&fd) else { return };
        let _ = self.ctl(libc::EPOLL_CTL_DEL, fd, 0);
        let frame = complete.then(|| buf[4..].to_vec());
        self.settle_ack(a, frame);
    }

    /// Reads an awaited ack frame without blocking (at most `4 + MAX_ACK_FRAME` bytes).
    fn read_ack(&mut self, fd: RawFd) {
        loop {
            let Some((a, buf)) = self.acks.get_mut(&fd) else { return };
            let end = if buf.len() < 4 {
                4
            } else {
                let len = u32::from_be_bytes(buf[..4].try_into().unwrap()) as usize;
                if len > MAX_ACK_FRAME {
                    return self.end_ack(fd, false);
                }
                4 + len
            };
            if buf.len() == end && end > 4 {
                return self.end_ack(fd, true);
            }
            let old = buf.len();
            buf.resize(end, 0);
            match a.stream.read(&mut buf[old..]) {
                Ok(0) => {
                    buf.truncate(old);
                    return self.end_ack(fd, false);
                }
                Ok(k) => buf.truncate(old + k),
                Err(e) => {
                    buf.truncate(old);
                    match e.kind() {
                        std::io::ErrorKind::WouldBlock => return,
                        std::io::ErrorKind::Interrupted => {}
                        _ => return self.end_ack(fd, false),
                    }
                }
            }
        }
    }

    fn sweep(&mut self) {
        let now = Instant::now();
        let unacked: Vec<RawFd> = self.acks.iter().filter(|(_, (a, _))| now >= a.deadline).map(|(fd, _)| *fd).collect();
        for fd in unacked {
            self.end_ack(fd, false);
        }
        let late: Vec<RawFd> =
            self.conns.iter().filter(|(_, c)| now.duration_since(c.since) > REQUEST_TIMEOUT).map(|(fd, _)| *fd).collect();
        for fd in late {
            self.broker.counters.timed_out.fetch_add(1, Ordering::Relaxed);
            let got = self.conns.get(&fd).map_or(0, |c| c.buf.len());
            self.close_with(fd, RefusalCode::RequestTimeout, format!("no complete request within {REQUEST_TIMEOUT:?} ({got} bytes)"));
        }
    }

    /// A whole frame arrived: the connection goes, blocking again, to a worker (or, all of them
    /// busy and the queue full, gets `overloaded`).
    fn hand_to_worker(&mut self, fd: RawFd) {
        let Some(Conn { stream, buf, cred, .. }) = self.remove(fd) else { return };
        if stream.set_nonblocking(false).is_err() {
            return;
        }
        self.broker.counters.connections.fetch_add(1, Ordering::SeqCst);
        // The frame moves to the job queue's share of the budget, uncopied.
        let held = buf.capacity();
        self.broker.counters.frames_held.fetch_add(held, Ordering::SeqCst);
        if let Err(Job::Request { stream, .. }) = self.jobs.push(Job::Request { stream, frame: buf, cred }) {
            self.broker.counters.frames_held.fetch_sub(held, Ordering::SeqCst);
            self.broker.counters.connections.fetch_sub(1, Ordering::SeqCst);
            self.broker.counters.rejected.fetch_add(1, Ordering::Relaxed);
            let _ = (&stream).write(&error_frame("overloaded", "all workers busy"));
        }
    }

    fn read_conn(&mut self, fd: RawFd) {
        loop {
            let Some(conn) = self.conns.get_mut(&fd) else { return };
            let frame_end = match frame_end(&mut conn.buf) {
                Ok(end) => end,
                Err(detail) => return self.close_with(fd, RefusalCode::FrameTooLarge, detail),
            };
            let want = frame_end - conn.buf.len();
            if want == 0 {
                return self.hand_to_worker(fd);
            }
            let chunk = want.min(64 * 1024);
            let old = conn.buf.len();
            let cap = conn.buf.capacity();
            if cap < old + chunk {
                // Grow geometrically with what arrives, never past the frame's own end: memory
                // stays within twice the bytes received and within the frame's length.
                let new_cap = (old + chunk).max((cap * 2).min(frame_end));
                if self.buffered + self.broker.counters.frames_held.load(Ordering::SeqCst) + (new_cap - cap) > MAX_BUFFERED {
                    return self.close_with(fd, RefusalCode::BufferLimit, "request frames hold too much memory".into());
                }
                conn.buf.reserve_exact(new_cap - old);
                self.buffered += conn.buf.capacity() - cap;
                self.broker.counters.buffered.store(self.buffered, Ordering::Relaxed);
            }
            conn.buf.resize(old + chunk, 0);
            match conn.stream.read(&mut conn.buf[old..]) {
                Ok(0) => {
                    conn.buf.truncate(old);
                    let got = conn.buf.len();
                    if got == 0 {
                        // Connected and left without a word: nothing to record.
                        self.remove(fd);
                        return;
                    }
                    return self.close_with(fd, RefusalCode::TruncatedFrame, format!("connection closed after {got} bytes of a frame"));
                }
                Ok(k) => conn.buf.truncate(old + k),
                Err(e) => {
                    conn.buf.truncate(old);
                    if e.kind() == std::io::ErrorKind::WouldBlock {
                        return;
                    }
                    if e.kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    self.remove(fd);
                    return;
                }
            }
        }
    }
}

/// Where the frame being read ends, so a read takes exactly up to it: the header first, then the
/// body; a producer's JSON line (first byte `{`) ends at its newline (what follows it is dropped).
/// `Err`: the frame announces more than the limit.
fn frame_end(buf: &mut Vec<u8>) -> Result<usize, String> {
    if buf.first() == Some(&b'{') {
        return match buf.iter().position(|b| *b == b'\n') {
            Some(nl) => {
                buf.truncate(nl + 1);
                Ok(nl + 1)
            }
            None if buf.len() >= crate::producer::line::MAX_LINE => {
                Err(format!("request line longer than {} bytes", crate::producer::line::MAX_LINE))
            }
            None => Ok(crate::producer::line::MAX_LINE),
        };
    }
    if buf.len() < 4 {
        return Ok(4);
    }
    let len = u32::from_be_bytes(buf[..4].try_into().unwrap()) as usize;
    if len > wire::MAX_FRAME {
        return Err(format!("frame of {len} bytes exceeds limit {}", wire::MAX_FRAME));
    }
    Ok(4 + len)
}
