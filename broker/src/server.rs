//! `broker serve`: owns the socket, accepts hook connections (one thread each, bounded), runs each
//! request through the gate and delivery, and keeps leases and hand-offs moving in the
//! background. One broker per login: an exclusive lock on `COURIER_STATE_DIR/broker.lock`.

use crate::delivery::{self, Offer};
use crate::dirs;
use crate::effort;
use crate::gate::{self, Gate, GateConfig, HookRequest, Peer, Verified};
use crate::store::Store;
use anyhow::{bail, Context, Result};
use courier_shared::hook::HookEvent;
use courier_shared::wire::{self, AckReply, HookReply, Request, PROTOCOL_VERSION};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Connections served at once; more are closed at once (the client fails open).
const MAX_CONNECTIONS: usize = 256;
/// How long a connection may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
const MAINTENANCE_INTERVAL: Duration = Duration::from_millis(500);

pub struct ServeOptions {
    pub runtime_dir: PathBuf,
    pub state_dir: PathBuf,
    pub codex_home: PathBuf,
    pub extra_hook_clients: Vec<PathBuf>,
}

#[derive(Default)]
struct Counters {
    hook_calls: AtomicU64,
    refusals: AtomicU64,
    leases: AtomicU64,
    handed: AtomicU64,
    unacked: AtomicU64,
    connections: AtomicUsize,
}

struct Broker {
    store: Mutex<Store>,
    gate: Gate,
    effort: Arc<effort::Service>,
    counters: Counters,
    started: Instant,
}

/// Holds the per-login lock for the broker's lifetime.
pub struct InstanceLock {
    _file: File,
}

pub fn lock_instance(state_dir: &Path) -> Result<InstanceLock> {
    let path = state_dir.join("broker.lock");
    let mut file = OpenOptions::new().create(true).truncate(false).write(true).read(true).open(&path)?;
    if file.try_lock().is_err() {
        let pid = fs::read_to_string(&path).unwrap_or_default();
        bail!("another broker already runs for this login (pid {}; lock {})", pid.trim(), path.display());
    }
    file.set_len(0)?;
    write!(file, "{}", std::process::id())?;
    Ok(InstanceLock { _file: file })
}

/// Binds the socket, replacing a stale one of ours; refuses anything else in its place.
fn bind_socket(path: &Path) -> Result<UnixListener> {
    if let Ok(meta) = fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() || meta.uid() != courier_shared::paths::uid() {
            bail!("{} exists and is not a socket of this user; refusing to replace it", path.display());
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

pub fn serve(opts: ServeOptions) -> Result<()> {
    dirs::ensure_private_dir(&opts.runtime_dir)?;
    dirs::ensure_private_dir(&opts.state_dir)?;
    let _lock = lock_instance(&opts.state_dir)?;
    let secret = dirs::ensure_secret(&opts.runtime_dir)?;
    let mut store = Store::open(&opts.state_dir)?;
    let released = store.release_expired_leases()?;
    let exe = std::env::current_exe().context("locating the broker executable")?;
    let installed_clients = gate::installed_client_ids(&exe, &opts.extra_hook_clients);
    if installed_clients.is_empty() {
        crate::log_warn!("no hook-client found next to {}; every hook call will be refused", exe.display());
    }
    let gate = Gate::new(GateConfig { codex_home: opts.codex_home.clone(), installed_clients, secret });
    let effort = effort::Service::open(&opts.state_dir, &opts.codex_home, courier_shared::paths::config_path())?;
    let broker = Arc::new(Broker { store: Mutex::new(store), gate, effort, counters: Counters::default(), started: Instant::now() });
    let socket = courier_shared::paths::socket_path(&opts.runtime_dir);
    let (listener, how) = match activated_listener(&socket)? {
        Some(l) => (l, "socket-activated"),
        None => (bind_socket(&socket)?, "bound"),
    };
    crate::log_info!(
        "pid {} serving {} ({how}; state {}, CODEX_HOME {}); released {released} stale leases",
        std::process::id(),
        socket.display(),
        opts.state_dir.display(),
        opts.codex_home.display()
    );

    // Hash the trusted Codex binaries now (~1 s each for ~300 MB), not inside the first hook call,
    // whose client would give up at its 500 ms deadline.
    let trusted_paths: Vec<PathBuf> = {
        let store = broker.store.lock().unwrap_or_else(|e| e.into_inner());
        store.trusted_codex()?.into_iter().map(|(_, path, _)| PathBuf::from(path)).collect()
    };
    let warm = Arc::clone(&broker);
    std::thread::Builder::new().name("digest-warmup".into()).spawn(move || {
        for path in trusted_paths {
            if let Ok(file) = File::open(&path) {
                let _ = warm.gate.digests().of_file(file);
            }
        }
    })?;

    let maintenance = Arc::clone(&broker);
    std::thread::Builder::new().name("maintenance".into()).spawn(move || loop {
        std::thread::sleep(MAINTENANCE_INTERVAL);
        maintenance.maintain();
    })?;

    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let active = broker.counters.connections.fetch_add(1, Ordering::SeqCst);
        if active >= MAX_CONNECTIONS {
            broker.counters.connections.fetch_sub(1, Ordering::SeqCst);
            continue; // dropped: the client fails open
        }
        let broker = Arc::clone(&broker);
        let spawned = std::thread::Builder::new().name("conn".into()).spawn(move || {
            broker.handle(stream);
            broker.counters.connections.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            crate::log_error!("could not start a connection thread");
        }
    }
    Ok(())
}

impl Broker {
    fn maintain(&self) {
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = store.release_expired_leases().and_then(|_| delivery::reconcile(&mut store, None)) {
            crate::log_error!("maintenance: {e:#}");
        }
        drop(store);
        self.effort.maintain();
    }

    fn refuse(&self, code: &str, detail: &str, thread: Option<&str>, event: Option<&str>, pid: Option<i32>) {
        self.counters.refusals.fetch_add(1, Ordering::Relaxed);
        crate::log_debug!("refused {code} (pid {pid:?}, thread {thread:?}, event {event:?}): {detail}");
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = store.record_refusal(code, detail, thread, event, pid.map(i64::from)) {
            crate::log_error!("recording refusal {code}: {e:#}");
        }
    }

    fn handle(&self, mut stream: UnixStream) {
        let _ = stream.set_read_timeout(Some(REQUEST_TIMEOUT));
        let _ = stream.set_write_timeout(Some(REQUEST_TIMEOUT));
        let peer = match gate::peer::identify(&stream) {
            Ok(peer) => peer,
            Err(r) => return self.refuse(r.code, &r.detail, None, None, None),
        };
        let request: Request = match wire::read_json(&mut stream, wire::MAX_FRAME) {
            Ok(req) => req,
            Err(e) => return self.refuse("bad_frame", &e.to_string(), None, None, Some(peer.pid)),
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
                    return self.refuse("protocol_version", &format!("client speaks v{v}"), None, None, Some(peer.pid));
                }
                let request = HookRequest { pid, ts_ms, payload: &payload, mac: &mac };
                self.hook(&mut stream, &peer, &request);
            }
            Request::Ack { .. } => self.refuse("unexpected_ack", "ack without a lease", None, None, Some(peer.pid)),
        }
    }

    fn hook(&self, stream: &mut UnixStream, peer: &Peer, request: &HookRequest) {
        let is_trusted = |digest: &str| {
            let store = self.store.lock().unwrap_or_else(|e| e.into_inner());
            store.is_trusted_codex(digest).unwrap_or(false)
        };
        let verified = match self.gate.verify(peer, request, &is_trusted) {
            Ok(v) => v,
            Err(r) => {
                let _ = wire::write_json(stream, &HookReply { v: PROTOCOL_VERSION, ..Default::default() });
                return self.refuse(r.code, &r.detail, r.thread.as_deref(), r.event.as_deref(), Some(peer.pid));
            }
        };
        // Effort changes go through the app-server on their own thread; waited for below, bounded.
        let effort = self.effort.on_hook(&verified, request.payload);
        let offer = {
            let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
            // Settle earlier hand-offs first, so inspect and the Stop guard see current states.
            let _ = delivery::reconcile(&mut store, Some(&verified.thread_id));
            delivery::offer(&mut store, &verified)
        };
        effort.wait(effort::HOOK_WAIT);
        match offer {
            Ok(Offer::Lease { token, output, count }) => self.hand_over(stream, &verified, token, output, count),
            Ok(Offer::Deferred(reason)) => {
                let _ = wire::write_json(stream, &HookReply { v: PROTOCOL_VERSION, ..Default::default() });
                let _ = reason; // visible in inspect as the message staying pending; see README
            }
            Ok(Offer::Nothing) => {
                let _ = wire::write_json(stream, &HookReply { v: PROTOCOL_VERSION, ..Default::default() });
            }
            Err(e) => {
                crate::log_error!("offer failed for thread {}: {e:#}", verified.thread_id);
                let _ = wire::write_json(stream, &HookReply { v: PROTOCOL_VERSION, ..Default::default() });
            }
        }
    }

    /// Sends the leased output and waits for the ack; without a matching ack the lease is released.
    fn hand_over(&self, stream: &mut UnixStream, v: &Verified, token: i64, output: String, count: usize) {
        self.counters.leases.fetch_add(1, Ordering::Relaxed);
        let reply = HookReply { v: PROTOCOL_VERSION, output, lease: Some(token as u64) };
        let _ = stream.set_read_timeout(Some(Duration::from_millis(delivery::LEASE_MS as u64)));
        let acked = wire::write_json(stream, &reply)
            .and_then(|()| wire::read_json::<_, Request>(stream, 1024))
            .ok()
            .is_some_and(|r| matches!(r, Request::Ack { lease, .. } if lease == token as u64));
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
        let accepted = store.ack(token, &path, v.rollout_offset, stop_turn).unwrap_or_else(|e| {
            crate::log_error!("ack of lease {token}: {e:#}");
            false
        });
        drop(store);
        if accepted {
            self.counters.handed.fetch_add(count as u64, Ordering::Relaxed);
        }
        let _ = wire::write_json(stream, &AckReply { v: PROTOCOL_VERSION, accepted });
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
