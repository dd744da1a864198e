//! `broker serve`: owns the socket, runs each hook request through the gate and delivery, and
//! keeps leases and hand-offs moving in the background. One broker per login: an exclusive lock
//! on `broker.lock` in both the runtime directory (the socket's) and the state directory (the
//! queue's). SIGTERM, SIGINT and SIGHUP stop it cleanly: the socket it bound is removed and the
//! stop is logged.
//!
//! Connections: one poll thread (epoll) accepts every connection and reads it without blocking
//! until it holds one complete request frame; only then does a worker thread (a small fixed pool)
//! see it. So idle, slow or hostile connections cost a file descriptor and a small buffer, never a
//! thread, and cannot starve real hook calls. A hand-off does not keep its worker either: once
//! the leased output is written, the connection goes back to the poll thread, which waits (at
//! most until the lease ends) for the client's ack frame; a worker then commits it. So clients
//! that stall after a lease cost no worker, and other threads' hooks keep being served. Limits: [`MAX_PENDING`] unfinished connections in
//! all (the oldest is evicted for a new one), [`MAX_PER_PEER`] per peer process, other uids closed
//! at accept (`SO_PEERCRED`), [`REQUEST_TIMEOUT`] to send a request, [`MAX_BUFFERED`] bytes of
//! request frames in all: unfinished ones, complete ones waiting for a worker, and the ones the
//! workers are handling (the memory allocated for them, not just the bytes received).

use crate::codex::{self, follow::Follower};
use crate::delivery::{self, Offer};
use crate::dirs;
use crate::effort;
use crate::failpoint;
use crate::gate::{self, Gate, GateConfig, HookRequest, Peer, Verified};
use crate::store::Store;
use anyhow::{bail, Context, Result};
use courier_shared::hook::HookEvent;
use courier_shared::wire::{self, AckReply, HookReply, Request, PROTOCOL_VERSION};
use nix::libc;
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::collections::VecDeque;
use std::sync::Condvar;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Unfinished connections (request not yet complete) held at once; a new one evicts the oldest.
pub const MAX_PENDING: usize = 1024;
/// Unfinished connections one peer process may hold; more are closed at accept.
pub const MAX_PER_PEER: usize = 16;
/// How long a connection may take to send its request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Bytes of request frames held in all (allocated for unfinished requests, plus complete frames
/// queued for or held by a worker); past it the connection that would grow it is closed.
pub const MAX_BUFFERED: usize = 64 << 20;
/// Worker threads that verify and answer complete requests.
const WORKERS: usize = 16;
/// Refusals written to the queue database per maintenance pass from the poll thread; the rest are
/// only counted (a flood must not turn into a flood of fsyncs).
const QUEUED_REFUSALS_MAX: usize = 64;
const MAINTENANCE_INTERVAL: Duration = Duration::from_millis(500);
const PRUNE_INTERVAL: Duration = Duration::from_secs(600);

/// Refusal reason codes the connection layer records, besides the gate's
/// [`gate::REASON_CODES`] (README, "Refusal reason codes", lists both).
pub const CONNECTION_REASON_CODES: [&str; 8] = [
    "too_many_connections",
    "request_timeout",
    "frame_too_large",
    "truncated_frame",
    "buffer_limit",
    "bad_request",
    "protocol_version",
    "unexpected_ack",
];

/// Every refusal reason code `broker inspect` can show.
pub fn all_reason_codes() -> Vec<&'static str> {
    gate::REASON_CODES
        .iter()
        .chain(gate::ticket::TICKET_REASON_CODES.iter())
        .chain(CONNECTION_REASON_CODES.iter())
        .copied()
        .collect()
}

pub struct ServeOptions {
    pub runtime_dir: PathBuf,
    pub state_dir: PathBuf,
    pub codex_home: PathBuf,
    pub extra_hook_clients: Vec<PathBuf>,
    /// How long messages in a final state are kept; `None` keeps them forever.
    pub retention: Option<Duration>,
}

#[derive(Default)]
struct Counters {
    hook_calls: AtomicU64,
    refusals: AtomicU64,
    refusals_unrecorded: AtomicU64,
    leases: AtomicU64,
    handed: AtomicU64,
    unacked: AtomicU64,
    /// Unfinished connections in the poll thread, hand-offs waiting for their ack, and requests
    /// in workers.
    connections: AtomicUsize,
    evicted: AtomicU64,
    timed_out: AtomicU64,
    rejected: AtomicU64,
    bad_frames: AtomicU64,
    /// Bytes allocated for unfinished requests (the poll thread's share of [`MAX_BUFFERED`]).
    buffered: AtomicUsize,
    /// Bytes allocated for complete frames queued for a worker or held by one (until it is done
    /// with them): they count against [`MAX_BUFFERED`] like unfinished ones.
    frames_held: AtomicUsize,
}

struct Broker {
    store: Mutex<Store>,
    gate: Gate,
    effort: Arc<effort::Service>,
    counters: Counters,
    started: Instant,
    /// Refusals found by the poll thread, written by the maintenance thread.
    queued_refusals: Mutex<Vec<(&'static str, String, i32)>>,
    /// Follows Codex upgrades; tells the gate which binaries are expected.
    follower: Arc<Follower>,
}

/// The gate's view of Codex trust: digests from the store, expected paths from the follower.
struct TrustView<'a>(&'a Broker);

impl gate::CodexTrust for TrustView<'_> {
    fn is_trusted(&self, sha256: &str) -> bool {
        let store = self.0.store.lock().unwrap_or_else(|e| e.into_inner());
        store.is_trusted_codex(sha256).unwrap_or(false)
    }
    fn is_expected(&self, path: &Path) -> bool {
        // Asked only for a binary the digest cache has not seen; a path trusted by hand counts
        // at once, before the follower's next pass lists it.
        self.0.follower.is_expected(path) || {
            let store = self.0.store.lock().unwrap_or_else(|e| e.into_inner());
            store.is_trusted_codex_path(&path.to_string_lossy()).unwrap_or(false)
        }
    }
    fn known_digest(&self, key: &gate::digest::ExeKey) -> Option<String> {
        let store = self.0.store.lock().unwrap_or_else(|e| e.into_inner());
        store.codex_file_digest(key).ok().flatten()
    }
}

/// Holds the per-login locks for the broker's lifetime.
pub struct InstanceLock {
    _files: Vec<File>,
}

/// One broker per login: an exclusive lock on `broker.lock` in the runtime directory (the socket
/// is there, so a second broker must not take it over even with another state directory) and in
/// the state directory (the queue). A lock dies with its process, so a crash leaves none behind.
pub fn lock_instance(runtime_dir: &Path, state_dir: &Path) -> Result<InstanceLock> {
    let mut files = Vec::new();
    for (dir, what) in [(runtime_dir, "runtime directory"), (state_dir, "state directory")] {
        let path = dir.join("broker.lock");
        if files.len() == 1 && runtime_dir == state_dir {
            break;
        }
        let mut file = OpenOptions::new().create(true).truncate(false).write(true).read(true).open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        if file.try_lock().is_err() {
            let pid = fs::read_to_string(&path).unwrap_or_default();
            bail!(
                "another broker already runs with this {what} {} (pid {}; lock {}); stop it first",
                dir.display(),
                pid.trim(),
                path.display()
            );
        }
        file.set_len(0)?;
        write!(file, "{}", std::process::id())?;
        files.push(file);
    }
    Ok(InstanceLock { _files: files })
}

/// Signals that stop the broker cleanly (socket removed, a line logged).
const STOP_SIGNALS: [nix::sys::signal::Signal; 3] =
    [nix::sys::signal::Signal::SIGTERM, nix::sys::signal::Signal::SIGINT, nix::sys::signal::Signal::SIGHUP];

/// Blocks the stop signals in this thread and every thread it starts from now on; the
/// `signals` thread takes them with `sigwait`. (Children get std's reset mask.)
fn block_stop_signals() -> Result<nix::sys::signal::SigSet> {
    let mut set = nix::sys::signal::SigSet::empty();
    for s in STOP_SIGNALS {
        set.add(s);
    }
    set.thread_block().context("blocking SIGTERM/SIGINT/SIGHUP")?;
    Ok(set)
}

/// The socket file this broker bound, to remove at stop only if it is still that file (never a
/// socket a later broker bound, nor systemd's under socket activation).
struct BoundSocket {
    path: PathBuf,
    id: Option<(u64, u64)>,
    started: Instant,
}

/// Set once the broker serves its socket.
static BOUND: std::sync::OnceLock<BoundSocket> = std::sync::OnceLock::new();

impl BoundSocket {
    fn remove(&self) -> bool {
        let ours = fs::symlink_metadata(&self.path).is_ok_and(|m| Some((m.dev(), m.ino())) == self.id);
        ours && fs::remove_file(&self.path).is_ok()
    }

    /// Removes the socket (if ours) and logs the stop line.
    fn stopped(&self, why: &str) {
        let removed = self.remove();
        crate::log_info!(
            "broker stopped {why}: pid {}, up {} s; {}",
            std::process::id(),
            self.started.elapsed().as_secs(),
            if removed { format!("removed socket {}", self.path.display()) } else { format!("socket {} left to its owner", self.path.display()) }
        );
    }
}

/// After [`serve`] returned an error (logged by the caller): removes the socket it served, if
/// it got that far, and logs the stop.
pub fn stopped_after_error() {
    if let Some(b) = BOUND.get() {
        b.stopped("after an error");
    }
}

/// Binds the socket, replacing a stale one of ours; refuses anything else in its place.
fn bind_socket(path: &Path) -> Result<UnixListener> {
    if let Ok(meta) = fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() || meta.uid() != courier_shared::paths::uid() {
            bail!(
                "{} exists and is not a socket of this user (uid {}, {}); refusing to replace it",
                path.display(),
                meta.uid(),
                if meta.file_type().is_symlink() { "a symlink" } else if meta.file_type().is_socket() { "a socket" } else { "not a socket" }
            );
        }
        // We hold the instance lock, so no live broker owns it.
        fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// The listening socket systemd passed (socket activation: `LISTEN_PID` = us, `LISTEN_FDS` >= 1,
/// first fd 3), or `None` when not activated. A passed fd that is not a listening Unix stream
/// socket is an error: the unit is wrong, and binding our own would leave systemd's unserved.
fn activated_listener(expected: &Path) -> Result<Option<UnixListener>> {
    use nix::sys::socket::{getsockname, getsockopt, sockopt, AddressFamily, SockType, SockaddrLike, UnixAddr};
    use std::os::fd::{BorrowedFd, FromRawFd};
    let ours = std::env::var("LISTEN_PID").ok().and_then(|p| p.parse::<u32>().ok()) == Some(std::process::id());
    let fds = std::env::var("LISTEN_FDS").ok().and_then(|n| n.parse::<i32>().ok()).unwrap_or(0);
    if !ours || fds < 1 {
        return Ok(None);
    }
    const FD: i32 = 3; // SD_LISTEN_FDS_START
    // SAFETY: systemd hands fd 3 to this process; we only inspect it here.
    let fd = unsafe { BorrowedFd::borrow_raw(FD) };
    let sock_type = getsockopt(&fd, sockopt::SockType).context("LISTEN_FDS is set but fd 3 is not a socket")?;
    let listening = getsockopt(&fd, sockopt::AcceptConn).unwrap_or(false);
    let addr: UnixAddr = getsockname(FD).context("fd 3 from systemd is not a Unix socket")?;
    if sock_type != SockType::Stream || !listening || addr.family() != Some(AddressFamily::Unix) {
        bail!("fd 3 from systemd is not a listening Unix stream socket; check courier-broker.socket");
    }
    if addr.path() != Some(expected) {
        crate::log_warn!(
            "systemd passed a socket at {:?} but hook-clients connect to {}; fix ListenStream= or COURIER_RUNTIME_DIR",
            addr.path(),
            expected.display()
        );
    }
    nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC))?;
    // SAFETY: fd 3 is ours from here on and nothing else wraps it.
    Ok(Some(unsafe { UnixListener::from_raw_fd(FD) }))
}

/// Raises the soft open-file limit to the hard one: every unfinished connection holds an fd.
fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

pub fn serve(opts: ServeOptions) -> Result<()> {
    let stop_signals = block_stop_signals()?;
    failpoint::init().map_err(anyhow::Error::msg)?;
    // Reconcile runs under the store lock, on the hook path too: bound what one call reads.
    delivery::set_scan_budget(delivery::SERVE_SCAN_BUDGET);
    dirs::ensure_private_dir(&opts.runtime_dir)?;
    dirs::ensure_private_dir(&opts.state_dir)?;
    let _lock = lock_instance(&opts.runtime_dir, &opts.state_dir)?;
    let secret = dirs::ensure_secret(&opts.runtime_dir)?;
    let mut store = Store::open(&opts.state_dir)?;
    let released = store.release_expired_leases()?;
    let exe = std::env::current_exe().context("locating the broker executable")?;
    let installed_clients = gate::installed_client_ids(&exe, &opts.extra_hook_clients);
    if installed_clients.is_empty() {
        crate::log_warn!("no hook-client found next to {}; every hook call will be refused", exe.display());
    }
    raise_fd_limit();
    let gate = Gate::new(GateConfig { codex_home: opts.codex_home.clone(), installed_clients, secret });
    let own_codex = codex::resolve::codex_on_path(std::env::var_os("PATH").as_deref());
    let follower = Follower::new(&opts.codex_home, &opts.state_dir, own_codex, gate.digests().clone());
    let on_hashed = Arc::clone(&follower);
    gate.digests().on_expected(Box::new(move |path, key, digest| on_hashed.consider_hashed(path, key, digest)));
    let effort = effort::Service::open(&opts.state_dir, &opts.codex_home, courier_shared::paths::config_path())?;
    let broker = Arc::new(Broker {
        store: Mutex::new(store),
        gate,
        effort,
        counters: Counters::default(),
        started: Instant::now(),
        queued_refusals: Mutex::new(Vec::new()),
        follower: Arc::clone(&follower),
    });
    let socket = courier_shared::paths::socket_path(&opts.runtime_dir);
    let (listener, how) = match activated_listener(&socket)? {
        Some(l) => (l, "socket-activated"),
        None => (bind_socket(&socket)?, "bound"),
    };
    let _ = BOUND.set(BoundSocket {
        path: socket.clone(),
        id: (how == "bound").then(|| fs::symlink_metadata(&socket).ok().map(|m| (m.dev(), m.ino()))).flatten(),
        started: Instant::now(),
    });
    let stopper = Arc::clone(&broker);
    std::thread::Builder::new().name("signals".into()).spawn(move || loop {
        if let Ok(sig) = stop_signals.wait() {
            stopper.stop(&format!("on {sig:?}"));
        }
    })?;
    crate::log_info!(
        "broker {} started: pid {} serving {} ({how}; state {}, CODEX_HOME {}); released {released} stale leases",
        env!("CARGO_PKG_VERSION"),
        std::process::id(),
        socket.display(),
        opts.state_dir.display(),
        opts.codex_home.display()
    );

    // Resolve and hash the Codex binaries now (~1 s each for ~300 MB), not inside the first hook
    // call, whose client would give up at its 500 ms deadline; then follow upgrades.
    std::thread::Builder::new().name("codex-follower".into()).spawn(move || follower.run())?;

    let maintenance = Arc::clone(&broker);
    let retention = opts.retention;
    std::thread::Builder::new().name("maintenance".into()).spawn(move || {
        let mut last_prune: Option<Instant> = None;
        loop {
            std::thread::sleep(MAINTENANCE_INTERVAL);
            maintenance.maintain();
            if let Some(keep) = retention.filter(|_| last_prune.is_none_or(|t| t.elapsed() >= PRUNE_INTERVAL)) {
                last_prune = Some(Instant::now());
                maintenance.prune(keep);
            }
        }
    })?;

    let jobs = Arc::new(JobQueue::default());
    let handback = Arc::new(Handback::new()?);
    for i in 0..WORKERS {
        let broker = Arc::clone(&broker);
        let (rx, hb) = (Arc::clone(&jobs), Arc::clone(&handback));
        std::thread::Builder::new().name(format!("worker-{i}")).spawn(move || worker(&broker, &rx, &hb))?;
    }
    Poller::new(listener, Arc::clone(&broker), jobs, handback)?.run()
}

/// Work for a worker thread.
enum Job {
    /// A complete request frame (with its 4-byte length prefix) and its connection.
    Request { stream: UnixStream, frame: Vec<u8> },
    /// A hand-off's ack frame (without its prefix), or `None` when none came before the lease
    /// ended or the client left: commit or release the lease.
    Ack { pending: AwaitAck, frame: Option<Vec<u8>> },
}

/// The longest ack frame body the broker reads.
const MAX_ACK_FRAME: usize = 1024;

/// A hand-off whose client has been sent the leased output and owes its ack.
struct AwaitAck {
    stream: UnixStream,
    token: i64,
    count: usize,
    verified: Box<Verified>,
    /// When the lease ends (`LEASE_MS` after it was taken): no ack by then -> released.
    deadline: Instant,
}

/// Hand-offs the workers give back to the poll thread, which an eventfd wakes.
struct Handback {
    queue: Mutex<Vec<AwaitAck>>,
    wake: std::os::fd::OwnedFd,
}

impl Handback {
    fn new() -> Result<Handback> {
        // SAFETY: eventfd returns a new fd or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("eventfd");
        }
        // SAFETY: fd is a fresh descriptor we own.
        Ok(Handback { queue: Mutex::new(Vec::new()), wake: unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) } })
    }

    fn give(&self, a: AwaitAck) {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).push(a);
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    fn take(&self) -> Vec<AwaitAck> {
        let mut n = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live buffer from our (non-blocking) eventfd.
        unsafe { libc::read(self.wake.as_raw_fd(), n.as_mut_ptr().cast(), n.len()) };
        std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Complete requests waiting for a worker. A condvar wakes exactly one idle worker per job (a
/// shared `Mutex<Receiver>` also wakes the next worker to queue on the mutex: one more context
/// switch per hook call, on the client's critical path).
#[derive(Default)]
struct JobQueue {
    jobs: Mutex<VecDeque<Job>>,
    ready: Condvar,
}

impl JobQueue {
    /// Queues `job`, or gives it back when [`MAX_PENDING`] jobs already wait.
    fn push(&self, job: Job) -> Result<(), Job> {
        let mut q = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= MAX_PENDING {
            return Err(job);
        }
        q.push_back(job);
        drop(q);
        self.ready.notify_one();
        Ok(())
    }

    fn pop(&self) -> Job {
        let mut q = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(job) = q.pop_front() {
                return job;
            }
            q = self.ready.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }
}

fn worker(broker: &Broker, jobs: &JobQueue, handback: &Handback) {
    loop {
        match jobs.pop() {
            Job::Request { stream, frame } => {
                let pending = broker.handle(stream, &frame[4..]);
                let held = frame.capacity();
                drop(frame);
                broker.counters.frames_held.fetch_sub(held, Ordering::SeqCst);
                match pending {
                    // Still one connection, now waiting in the poll thread.
                    Some(a) => handback.give(a),
                    None => {
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

/// Error frame for a request the broker will not serve: a client learns why before the close.
fn error_frame(code: &str, detail: &str) -> Vec<u8> {
    let body = serde_json::json!({"v": PROTOCOL_VERSION, "error": code, "detail": detail}).to_string();
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(body.as_bytes());
    out
}

struct Conn {
    stream: UnixStream,
    pid: i32,
    since: Instant,
    /// Frame bytes so far (length prefix included); grows with what arrives, not what is claimed.
    buf: Vec<u8>,
}

/// The accept-and-read loop (see the module docs).
struct Poller {
    epoll: std::os::fd::OwnedFd,
    listener: UnixListener,
    broker: Arc<Broker>,
    jobs: Arc<JobQueue>,
    handback: Arc<Handback>,
    conns: HashMap<RawFd, Conn>,
    /// Hand-offs waiting for their ack, with the ack bytes read so far.
    acks: HashMap<RawFd, (AwaitAck, Vec<u8>)>,
    per_peer: HashMap<i32, usize>,
    /// Bytes allocated for the `buf`s of `conns` (capacity, not length).
    buffered: usize,
    uid: u32,
}

const LISTENER: u64 = u64::MAX;
const WAKE: u64 = u64::MAX - 1;

impl Poller {
    fn new(listener: UnixListener, broker: Arc<Broker>, jobs: Arc<JobQueue>, handback: Arc<Handback>) -> Result<Poller> {
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

    fn run(mut self) -> Result<()> {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
        let mut last_sweep = Instant::now();
        loop {
            // SAFETY: events has the length we pass.
            let n = unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), events.as_mut_ptr(), events.len() as i32, 100) };
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

    fn accept_some(&mut self) {
        for _ in 0..512 {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
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
            let cred = match nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials) {
                Ok(c) => c,
                Err(_) => continue,
            };
            if cred.uid() != self.uid {
                self.broker.refuse_later("peer_uid", format!("peer uid {} is not broker uid {}", cred.uid(), self.uid), cred.pid());
                continue; // dropped unread
            }
            let pid = cred.pid();
            if self.per_peer.get(&pid).copied().unwrap_or(0) >= MAX_PER_PEER {
                self.broker.counters.rejected.fetch_add(1, Ordering::Relaxed);
                let _ = (&stream).write(&error_frame("too_many_connections", "this process has too many unfinished requests"));
                self.broker.refuse_later("too_many_connections", format!("pid {pid} holds {MAX_PER_PEER} unfinished connections"), pid);
                continue;
            }
            if self.conns.len() >= MAX_PENDING {
                self.evict_oldest();
            }
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let fd = stream.as_raw_fd();
            if self.ctl(libc::EPOLL_CTL_ADD, fd, fd as u64).is_err() {
                continue;
            }
            *self.per_peer.entry(pid).or_default() += 1;
            self.broker.counters.connections.fetch_add(1, Ordering::SeqCst);
            self.conns.insert(fd, Conn { stream, pid, since: Instant::now(), buf: Vec::new() });
        }
    }

    /// Takes a connection out of the poll set (the caller closes or hands it on).
    fn remove(&mut self, fd: RawFd) -> Option<Conn> {
        let conn = self.conns.remove(&fd)?;
        let _ = self.ctl(libc::EPOLL_CTL_DEL, fd, 0);
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

    fn close_with(&mut self, fd: RawFd, code: &'static str, detail: String) {
        if let Some(conn) = self.remove(fd) {
            self.broker.counters.bad_frames.fetch_add(1, Ordering::Relaxed);
            let _ = (&conn.stream).write(&error_frame(code, &detail));
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
            self.close_with(fd, "request_timeout", format!("no complete request within {REQUEST_TIMEOUT:?} ({got} bytes)"));
        }
    }

    fn read_conn(&mut self, fd: RawFd) {
        loop {
            let Some(conn) = self.conns.get_mut(&fd) else { return };
            // Read exactly up to the end of the frame: the header first, then the body.
            let frame_end = if conn.buf.len() < 4 {
                4
            } else {
                let len = u32::from_be_bytes(conn.buf[..4].try_into().unwrap()) as usize;
                if len > wire::MAX_FRAME {
                    let detail = format!("frame of {len} bytes exceeds limit {}", wire::MAX_FRAME);
                    return self.close_with(fd, "frame_too_large", detail);
                }
                4 + len
            };
            let want = frame_end - conn.buf.len();
            if want == 0 {
                let conn = self.remove(fd).expect("present");
                let Conn { stream, buf, .. } = conn;
                if stream.set_nonblocking(false).is_err() {
                    return;
                }
                self.broker.counters.connections.fetch_add(1, Ordering::SeqCst);
                // The frame moves to the job queue's share of the budget, uncopied.
                let held = buf.capacity();
                self.broker.counters.frames_held.fetch_add(held, Ordering::SeqCst);
                if let Err(Job::Request { stream, .. }) = self.jobs.push(Job::Request { stream, frame: buf }) {
                    self.broker.counters.frames_held.fetch_sub(held, Ordering::SeqCst);
                    self.broker.counters.connections.fetch_sub(1, Ordering::SeqCst);
                    self.broker.counters.rejected.fetch_add(1, Ordering::Relaxed);
                    let _ = (&stream).write(&error_frame("overloaded", "all workers busy"));
                }
                return;
            }
            let chunk = want.min(64 * 1024);
            let old = conn.buf.len();
            let cap = conn.buf.capacity();
            if cap < old + chunk {
                // Grow geometrically with what arrives, never past the frame's own end: memory
                // stays within twice the bytes received and within the frame's length.
                let new_cap = (old + chunk).max((cap * 2).min(frame_end));
                if self.buffered + self.broker.counters.frames_held.load(Ordering::SeqCst) + (new_cap - cap) > MAX_BUFFERED {
                    return self.close_with(fd, "buffer_limit", "request frames hold too much memory".into());
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
                    return self.close_with(fd, "truncated_frame", format!("connection closed after {got} bytes of a frame"));
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

impl Broker {
    /// Stops the broker on a signal: waits for any store transaction in flight, removes its
    /// socket (if it bound it) so no hook connects to a dead broker, logs the stop and exits 0.
    /// A lease not yet acked is never handed (its client withdraws the output), as after a crash.
    fn stop(&self, why: &str) -> ! {
        let _store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = BOUND.get() {
            b.stopped(why);
        }
        std::process::exit(0)
    }

    fn maintain(&self) {
        let queued = std::mem::take(&mut *self.queued_refusals.lock().unwrap_or_else(|e| e.into_inner()));
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        for (code, detail, pid) in queued {
            if let Err(e) = store.record_refusal(code, &detail, None, None, Some(i64::from(pid))) {
                crate::log_error!("recording refusal {code}: {e:#}");
            }
        }
        match store.expire_due() {
            Ok(0) => {}
            Ok(n) => crate::log_info!("expired {n} message(s) whose --ttl ran out"),
            Err(e) => crate::log_error!("expiring messages: {e:#}"),
        }
        if let Err(e) = store.release_expired_leases().and_then(|_| delivery::reconcile(&mut store, None)) {
            crate::log_error!("maintenance: {e:#}");
        }
        drop(store);
        self.effort.maintain();
    }

    fn prune(&self, keep: Duration) {
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        match store.prune(keep.as_millis() as i64) {
            Ok(0) => {}
            Ok(n) => crate::log_info!("pruned {n} messages older than {} days", keep.as_secs() / 86_400),
            Err(e) => crate::log_error!("pruning: {e:#}"),
        }
    }

    fn refuse(&self, code: &str, detail: &str, thread: Option<&str>, event: Option<&str>, pid: Option<i32>) {
        self.counters.refusals.fetch_add(1, Ordering::Relaxed);
        crate::log_debug!("refused {code} (pid {pid:?}, thread {thread:?}, event {event:?}): {detail}");
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = store.record_refusal(code, detail, thread, event, pid.map(i64::from)) {
            crate::log_error!("recording refusal {code}: {e:#}");
        }
    }

    /// A refusal seen by the poll thread, which must not wait for the database: recorded by the
    /// next maintenance pass, or only counted when too many are waiting.
    fn refuse_later(&self, code: &'static str, detail: String, pid: i32) {
        self.counters.refusals.fetch_add(1, Ordering::Relaxed);
        let mut q = self.queued_refusals.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() < QUEUED_REFUSALS_MAX {
            q.push((code, detail, pid));
        } else {
            self.counters.refusals_unrecorded.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Serves one request. A hook call that hands messages over returns the hand-off, whose ack
    /// the poll thread waits for.
    fn handle(&self, mut stream: UnixStream, frame: &[u8]) -> Option<AwaitAck> {
        let _ = stream.set_read_timeout(Some(REQUEST_TIMEOUT));
        let _ = stream.set_write_timeout(Some(REQUEST_TIMEOUT));
        let peer = match gate::peer::identify(&stream) {
            Ok(peer) => peer,
            Err(r) => {
                self.refuse(r.code, &r.detail, None, None, None);
                return None;
            }
        };
        let request: Request = match serde_json::from_slice(frame) {
            Ok(req) => req,
            Err(e) => {
                let detail = format!("not a request: {e}");
                let _ = stream.write_all(&error_frame("bad_request", &detail));
                self.counters.bad_frames.fetch_add(1, Ordering::Relaxed);
                self.refuse("bad_request", &detail, None, None, Some(peer.pid));
                return None;
            }
        };
        match request {
            Request::Status { .. } => {
                if peer.uid == courier_shared::paths::uid() {
                    let _ = wire::write_json(&mut stream, &self.status());
                }
            }
            Request::Hook { v, pid, ts_ms, payload, mac } => {
                self.counters.hook_calls.fetch_add(1, Ordering::Relaxed);
                if v != PROTOCOL_VERSION {
                    let _ = wire::write_json(&mut stream, &HookReply { v: PROTOCOL_VERSION, ..Default::default() });
                    self.refuse("protocol_version", &format!("client speaks v{v}"), None, None, Some(peer.pid));
                    return None;
                }
                let request = HookRequest { pid, ts_ms, payload: &payload, mac: &mac };
                return self.hook(stream, &peer, &request);
            }
            Request::Ack { .. } => {
                let _ = stream.write_all(&error_frame("unexpected_ack", "ack without a lease"));
                self.refuse("unexpected_ack", "ack without a lease", None, None, Some(peer.pid))
            }
        }
        None
    }

    fn hook(&self, mut stream: UnixStream, peer: &Peer, request: &HookRequest) -> Option<AwaitAck> {
        let verified = match self.gate.verify(peer, request, &TrustView(self)) {
            Ok(v) => v,
            Err(r) => {
                let _ = wire::write_json(&mut stream, &HookReply { v: PROTOCOL_VERSION, ..Default::default() });
                self.refuse(r.code, &r.detail, r.thread.as_deref(), r.event.as_deref(), Some(peer.pid));
                return None;
            }
        };
        // One ticket per Codex action (gate/ticket.rs, tickets.rs): before anything is claimed.
        let ticket = match crate::tickets::take(&self.store, &verified, peer.pid) {
            Ok(t) => t,
            Err(r) => {
                let _ = wire::write_json(&mut stream, &HookReply { v: PROTOCOL_VERSION, ..Default::default() });
                self.refuse(r.code, &r.detail, r.thread.as_deref(), r.event.as_deref(), Some(peer.pid));
                return None;
            }
        };
        // Effort changes go through the app-server on their own thread; waited for below, bounded.
        let effort = self.effort.on_hook(&verified, request.payload);
        let offer = {
            let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
            // Settle earlier hand-offs first, so inspect and the Stop guard see current states.
            let _ = delivery::reconcile(&mut store, Some(&verified.thread_id));
            let offer = delivery::offer(&mut store, &verified);
            if let (Some(t), Ok(Offer::Lease { token, .. })) = (&ticket, &offer) {
                if let Err(e) = crate::tickets::attach(&mut store, t, *token) {
                    crate::log_error!("recording the hand-off of ticket {}: {e:#}", t.key);
                }
            }
            offer
        };
        let leased_at = Instant::now();
        effort.wait(effort::HOOK_WAIT);
        match offer {
            Ok(Offer::Lease { token, output, count }) => {
                let deadline = leased_at + Duration::from_millis(delivery::LEASE_MS as u64);
                self.hand_over(stream, verified, token, output, count, deadline)
            }
            Ok(Offer::Deferred | Offer::Nothing) => {
                let _ = wire::write_json(&mut stream, &HookReply { v: PROTOCOL_VERSION, ..Default::default() });
                None
            }
            Err(e) => {
                crate::log_error!("offer failed for thread {}: {e:#}", verified.thread_id);
                let _ = wire::write_json(&mut stream, &HookReply { v: PROTOCOL_VERSION, ..Default::default() });
                None
            }
        }
    }

    /// Sends the leased output; the ack is awaited by the poll thread (the returned hand-off),
    /// not by this worker. A reply that cannot be written releases the lease at once.
    fn hand_over(
        &self,
        mut stream: UnixStream,
        verified: Verified,
        token: i64,
        output: String,
        count: usize,
        deadline: Instant,
    ) -> Option<AwaitAck> {
        self.counters.leases.fetch_add(1, Ordering::Relaxed);
        let reply = HookReply { v: PROTOCOL_VERSION, output, lease: Some(token as u64) };
        let written = wire::write_json(&mut stream, &reply).is_ok();
        let pending = AwaitAck { stream, token, count, verified: Box::new(verified), deadline };
        if !written {
            self.finish_hand_over(pending, None);
            return None;
        }
        failpoint::hit("after_reply_before_ack");
        Some(pending)
    }

    /// Commits a hand-off whose client acked lease `token` (`frame` is its ack), or releases it.
    fn finish_hand_over(&self, pending: AwaitAck, frame: Option<&[u8]>) {
        let AwaitAck { mut stream, token, count, verified, .. } = pending;
        let v = &*verified;
        let acked = frame
            .and_then(|f| serde_json::from_slice::<Request>(f).ok())
            .is_some_and(|r| matches!(r, Request::Ack { lease, .. } if lease == token as u64));
        if acked {
            failpoint::hit("after_ack_read");
        }
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        if !acked {
            self.counters.unacked.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = store.release(token, "not_acked") {
                crate::log_error!("releasing lease {token}: {e:#}");
            }
            return;
        }
        let stop_turn = match (v.event, &v.turn_id) {
            (HookEvent::Stop, Some(turn)) => Some((v.thread_id.as_str(), turn.as_str())),
            _ => None,
        };
        let path = v.rollout_path.to_string_lossy();
        // Before the ack: a hand-off must never be on record without the codex it went to.
        if let Err(e) = store.note_codex(token, v.codex_pid, v.codex_starttime) {
            crate::log_error!("recording codex of lease {token}: {e:#}");
        }
        let accepted = store.ack(token, &path, v.rollout_offset, stop_turn).unwrap_or_else(|e| {
            crate::log_error!("ack of lease {token}: {e:#}");
            false
        });
        drop(store);
        if accepted {
            self.counters.handed.fetch_add(count as u64, Ordering::Relaxed);
        }
        let _ = stream.set_write_timeout(Some(REQUEST_TIMEOUT));
        let _ = wire::write_json(&mut stream, &AckReply { v: PROTOCOL_VERSION, accepted });
    }

    fn status(&self) -> serde_json::Value {
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
        })
    }
}

/// Asks a running broker for its status; `None` when none answers.
pub fn query_status(runtime_dir: &Path) -> Option<serde_json::Value> {
    let mut stream = UnixStream::connect(courier_shared::paths::socket_path(runtime_dir)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    wire::write_json(&mut stream, &Request::Status { v: PROTOCOL_VERSION }).ok()?;
    wire::read_json(&mut stream, wire::MAX_FRAME).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code this file records is listed in [`all_reason_codes`].
    #[test]
    fn recorded_codes_are_all_listed() {
        let src = include_str!("server.rs");
        let src = src.split("#[cfg(test)]\nmod tests").next().unwrap();
        let mut found = Vec::new();
        for call in ["refuse_later(\"", "close_with(fd, \"", "self.refuse(\""] {
            for part in src.split(call).skip(1) {
                found.push(part.split('"').next().unwrap().to_string());
            }
        }
        assert!(found.len() >= 9, "{found:?}");
        let all = all_reason_codes();
        for code in &found {
            assert!(all.contains(&code.as_str()), "{code} is recorded but not in CONNECTION_REASON_CODES");
        }
        for code in CONNECTION_REASON_CODES {
            assert!(found.iter().any(|f| f == code), "{code} is listed but never recorded");
        }
    }
}
