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
//!
//! # Rooms
//! - `mod.rs`: [`serve`] wires the broker together and starts its threads;
//! - `listener.rs`: the instance lock, stop signals, the socket (bound or socket-activated);
//! - `poller.rs`: the epoll thread: accepts, reads frames, waits for hand-offs' acks;
//! - `workers.rs`: the job queue, the workers, and the hand-back of hand-offs to the poll thread
//!   (an answered connection closed after the next answer, or `LINGER` later);
//! - `hook.rs`: one request from peer identity through the gate and delivery to the hand-off;
//! - `maintenance.rs`: the periodic pass (refusals, expiry, leases, reconcile, effort) and prune;
//! - `status.rs`: the counters `Request::Status` answers with.
//!
//! The client side of `Request::Status` is `crate::client`: CLI commands import nothing from here.

mod approval_hold;
mod approval_sweep;
mod approvals;
mod hook;
mod inbound;
mod listener;
mod maintenance;
mod poller;
mod status;
mod trust;
mod workers;

pub use listener::{lock_instance, stopped_after_error, InstanceLock};

use crate::codex::{self, effort};
use crate::delivery;
use crate::dirs;
use crate::exe::follow::{Follower, HostFollow, LazyStore};
use crate::failpoint;
use crate::gate::{self, Gate, GateConfig};
use crate::reason::WakeReason;
use crate::refusal::RefusalCode;
use crate::store::{Channel, Store, TicketLog};
use anyhow::{Context, Result};
use listener::{block_stop_signals, raise_fd_limit};
use poller::Poller;
use status::Counters;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use workers::{worker, Handback, JobQueue};

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

pub struct ServeOptions {
    pub runtime_dir: PathBuf,
    pub state_dir: PathBuf,
    pub codex_home: PathBuf,
    pub extra_hook_clients: Vec<PathBuf>,
    /// How long messages in a final state are kept; `None` keeps them forever.
    pub retention: Option<Duration>,
    /// Whether hook deliveries show the person a line in the TUI (read at start).
    pub receipts: crate::config::Receipts,
    /// `[wake]`: how often a thread may be woken.
    pub wake: crate::config::WakeConfig,
    /// `[approvals]`: how answering waits for Codex.
    pub approvals: crate::config::ApprovalsConfig,
    /// `[claude] hook_port`: serve Claude Code's HTTP hooks on this loopback port (`claude/`).
    pub claude_hook_port: Option<u16>,
}

struct Broker {
    store: Mutex<Store>,
    /// Used tickets (store/ticket_log.rs); locked before `store` when both are.
    tickets: Mutex<TicketLog>,
    gate: Gate,
    effort: Arc<effort::Service>,
    counters: Counters,
    started: Instant,
    /// Refusals found by the poll thread, written by the maintenance thread.
    queued_refusals: Mutex<Vec<(RefusalCode, String, i32)>>,
    /// Codex's part of the follower; tells the gate which Codex binaries are expected.
    codex_followed: Arc<codex::follow::Followed>,
    /// The `claude` commands followed: the Claude gate's expected binaries are what they run.
    claude_followed: Arc<crate::claude::follow::Followed>,
    /// Producer requests (JSON lines on the same socket) and parked waits (producer/).
    producer: Arc<crate::producer::proto::Service>,
    receipts: crate::config::Receipts,
    /// How often threads may be woken; the hooks report the turns they see (wake/bound.rs).
    wake_bound: Arc<crate::wake::Bound>,
    /// Pending approvals' threads, and where to answer them (approvals.rs).
    approvals: approvals::Approvals,
    /// Codex digests the store said were trusted: the hook path's walk takes them at their
    /// word, its one store read confirms the one it stopped at (trust.rs, `HookTrust`).
    trusted_before: trust::TrustedBefore,
}

pub fn serve(opts: ServeOptions) -> Result<()> {
    let stop_signals = block_stop_signals()?;
    failpoint::init().map_err(anyhow::Error::msg)?;
    // Reconcile runs on the hook path too: bound what one call reads from a rollout.
    delivery::set_scan_budget(delivery::SERVE_SCAN_BUDGET);
    dirs::ensure_private_dir(&opts.runtime_dir)?;
    dirs::ensure_private_dir(&opts.state_dir)?;
    let _lock = lock_instance(&opts.runtime_dir, &opts.state_dir)?;
    if std::env::var_os(crate::install::UNLESS_STOPPED_ENV).is_some() && crate::install::stopped_on_purpose(&opts.state_dir).is_some() {
        crate::log_info!("not serving: `broker stop` came after this start was asked for (`broker start` starts it)");
        return Ok(());
    }
    let secret = dirs::ensure_secret(&opts.runtime_dir)?;
    // The key that seals verified senders: this process's memory only (envelope/seal.rs).
    crate::envelope::seal::start();
    let recovered = Recovered::open(&opts.state_dir)?;
    let (released, interrupted) = (recovered.released, recovered.interrupted);
    let (broker, follower) = assemble(&opts, recovered, secret)?;
    let socket = courier_shared::paths::socket_path(&opts.runtime_dir);
    let (listener, how) = listener::listen(&socket)?;
    stop_on_signals(stop_signals, &broker)?;
    crate::log_info!(
        "broker {} started: pid {} serving {} ({how}; state {}, CODEX_HOME {}); released {released} stale leases, {interrupted} interrupted wakes",
        env!("CARGO_PKG_VERSION"),
        std::process::id(),
        socket.display(),
        opts.state_dir.display(),
        opts.codex_home.display()
    );
    // Resolve and hash the Codex binaries now (~1 s each for ~300 MB), not inside the first hook
    // call, whose client would give up at its 500 ms deadline; then follow upgrades.
    std::thread::Builder::new().name("follower".into()).spawn(move || follower.run())?;
    spawn_wake(&broker, opts.codex_home.clone(), maintenance::open_watch(&opts.state_dir, "wake"))?;
    if let Some(port) = opts.claude_hook_port {
        // Fail open: a port taken by another program costs Claude Code its deliveries, not Codex.
        let stops = crate::claude::wake::Stops::default();
        let (digests, followed) = (broker.gate.digests().clone(), Arc::clone(&broker.claude_followed));
        let looks = Arc::clone(&broker.counters.claude_confirm_looks);
        match crate::claude::serve::spawn(port, &opts.state_dir, digests, Arc::clone(&followed), opts.receipts, stops.clone(), looks) {
            Ok(addr) => crate::log_info!("serving Claude Code hooks on http://{addr}/hook/<Event>"),
            Err(e) => crate::log_error!("Claude Code hooks not served: {e:#}"),
        }
        let wake_socket = socket.with_file_name(courier_shared::paths::CLAUDE_WAKE_SOCKET_NAME);
        let woken = listener::bind_socket(&wake_socket)
            .and_then(|l| crate::claude::wake::spawn(l, &opts.state_dir, broker.gate.digests().clone(), followed, stops));
        match woken {
            Ok(()) => crate::log_info!("serving Claude Code idle wakes on {}", wake_socket.display()),
            Err(e) => crate::log_error!("Claude Code idle wakes not served: {e:#}"),
        }
    }
    // Copilot CLI's hooks come through the socket above; its hand-offs settle on their own thread.
    crate::copilot::serve::spawn_confirm(&opts.state_dir)?;
    maintenance::spawn(Arc::clone(&broker), &opts.state_dir, opts.retention)?;
    approval_sweep::spawn(Arc::clone(&broker))?;
    serve_connections(broker, listener)
}

/// The queue as a killed broker left it, made consistent before any hook is answered.
struct Recovered {
    store: Store,
    tickets: TicketLog,
    /// Leases whose time ran out (their clients never acked).
    released: usize,
    /// Wake leases a dead pass held.
    interrupted: usize,
}

impl Recovered {
    fn open(state_dir: &std::path::Path) -> Result<Recovered> {
        let mut store = Store::open(state_dir)?;
        store.defer_checkpoints()?; // the maintenance thread checkpoints (store/checkpoint.rs)
        let released = store.release_expired_leases()?;
        // No pass of a dead broker's wake can still run, and none sent anything before its
        // hand-off record: its leases go back at once (wake/mod.rs).
        let interrupted = store.release_leases_of(Channel::Wake, WakeReason::Interrupted)?;
        // An answer a dead broker was sending may or may not have reached Codex: `unknown`,
        // never sent again (store/approvals.rs).
        let answers = store.interrupt_answers()?;
        if answers > 0 {
            crate::log_warn!("{answers} approval answer(s) interrupted by the last broker's death are now unknown");
        }
        // Tickets a killed broker only journaled are in the table before any hook is answered.
        let tickets = TicketLog::open(state_dir, &mut store)?;
        Ok(Recovered { store, tickets, released, interrupted })
    }
}

/// The broker's services around the recovered queue: the gate (with the installed hook clients
/// and the per-login secret), the upgrade follower, effort, the producers' service, approvals.
fn assemble(
    opts: &ServeOptions,
    recovered: Recovered,
    secret: courier_shared::auth::Secret,
) -> Result<(Arc<Broker>, Arc<Follower<Store>>)> {
    let exe = std::env::current_exe().context("locating the broker executable")?;
    let installed_clients = gate::installed_client_ids(&exe, &opts.extra_hook_clients);
    if installed_clients.is_empty() {
        crate::log_warn!("no hook-client found next to {}; every hook call will be refused", exe.display());
    }
    raise_fd_limit();
    let gate = Gate::new(GateConfig { codex_home: opts.codex_home.clone(), installed_clients, secret });
    let own_codex = codex::resolve::codex_on_path(std::env::var_os("PATH").as_deref());
    let own_claude = crate::exe::launcher::on_path(std::env::var_os("PATH").as_deref(), "claude");
    let codex_followed = Arc::new(codex::follow::Followed::new(&opts.codex_home, own_codex, gate.digests().clone()));
    let claude_followed = Arc::new(crate::claude::follow::Followed::new(own_claude));
    let own_copilot = crate::exe::launcher::on_path(std::env::var_os("PATH").as_deref(), "copilot");
    let copilot_followed = Arc::new(crate::copilot::follow::Followed::new(own_copilot));
    let hosts: Vec<Arc<dyn HostFollow<Store>>> = vec![codex_followed.clone(), claude_followed.clone(), copilot_followed];
    let state_dir = opts.state_dir.clone();
    let follower = Follower::new(LazyStore::new(move || Store::open(&state_dir)), hosts);
    let on_hashed = Arc::clone(&follower);
    gate.digests().on_expected(Box::new(move |path, key, digest| on_hashed.consider_hashed(path, key, digest)));
    let effort = effort::Service::open(&opts.state_dir, &opts.codex_home, courier_shared::paths::config_path())?;
    let expects = Arc::clone(&codex_followed);
    let lister = crate::producer::threads::Lister::new(
        opts.codex_home.clone(),
        gate.digests().clone(),
        Box::new(move |p, size| expects.is_expected(p, size)),
        Duration::from_secs(2),
    );
    let producer = crate::producer::proto::Service::start(&opts.state_dir, opts.codex_home.clone(), lister)?;
    let approvals = approvals::Approvals::open(&recovered.store, opts.codex_home.clone(), opts.approvals.clone())?;
    let broker = Arc::new(Broker {
        approvals,
        store: Mutex::new(recovered.store),
        tickets: Mutex::new(recovered.tickets),
        gate,
        effort,
        counters: Counters::default(),
        started: Instant::now(),
        queued_refusals: Mutex::new(Vec::new()),
        codex_followed,
        claude_followed,
        producer,
        receipts: opts.receipts,
        wake_bound: Arc::new(crate::wake::Bound::new(opts.wake.clone())),
        trusted_before: trust::TrustedBefore::default(),
    });
    Ok((broker, follower))
}

/// SIGTERM, SIGINT and SIGHUP stop the broker (blocked in every thread, waited for in one).
fn stop_on_signals(stop_signals: nix::sys::signal::SigSet, broker: &Arc<Broker>) -> Result<()> {
    let stopper = Arc::clone(broker);
    std::thread::Builder::new().name("signals".into()).spawn(move || loop {
        if let Ok(sig) = stop_signals.wait() {
            stopper.stop(&format!("on {sig:?}"));
        }
    })?;
    Ok(())
}

/// Waiting threads: a turn started through the app-server that owns them (wake.rs).
fn spawn_wake(broker: &Arc<Broker>, codex_home: PathBuf, watch: Option<crate::store::Watch>) -> Result<()> {
    let waking = Arc::clone(broker);
    std::thread::Builder::new().name("wake".into()).spawn(move || {
        let waker = crate::wake::Waker::new(Arc::clone(&waking.wake_bound), watch);
        let signal = crate::store::lock(&waking.store).pending_signal();
        waker.run(signal, || {
            let b = &*waking;
            let Some(outcomes) = waker.pass(&b.store, &b.gate, &trust::TrustView(b), &codex_home) else { return true };
            let idle = waker.found_none();
            b.counters.wake_looks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            for (thread, outcome) in outcomes {
                crate::log_debug!("wake {thread}: {outcome:?}");
                // Handed through the app-server: counted with the hooks' hand-offs (`inspect`).
                if let crate::wake::Outcome::Woken { count, .. } = outcome {
                    b.counters.handed.fetch_add(count as u64, std::sync::atomic::Ordering::Relaxed);
                }
            }
            b.producer.changed();
            idle
        })
    })?;
    Ok(())
}

/// The workers and the poller that feeds them connections: runs until the broker stops.
fn serve_connections(broker: Arc<Broker>, listener: std::os::unix::net::UnixListener) -> Result<()> {
    let jobs = Arc::new(JobQueue::default());
    let handback = Arc::new(Handback::new()?);
    for i in 0..WORKERS {
        let broker = Arc::clone(&broker);
        let (rx, hb) = (Arc::clone(&jobs), Arc::clone(&handback));
        std::thread::Builder::new().name(format!("worker-{i}")).spawn(move || worker(&broker, &rx, &hb))?;
    }
    Poller::new(listener, broker, jobs, handback)?.run()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every connection-layer code is recorded somewhere in the server, and only those are.
    #[test]
    fn connection_codes_are_all_recorded() {
        let src = [
            include_str!("mod.rs"),
            include_str!("listener.rs"),
            include_str!("poller.rs"),
            include_str!("workers.rs"),
            include_str!("hook.rs"),
        ]
        .map(|s| s.split("#[cfg(test)]\nmod tests").next().unwrap())
        .concat();
        // Without white space: a call may be broken over lines.
        let src: String = src.chars().filter(|c| !c.is_whitespace()).collect();
        let mut found = Vec::new();
        for call in ["refuse_later(RefusalCode::", "close_with(fd,RefusalCode::", "self.refuse(RefusalCode::"] {
            for part in src.split(call).skip(1) {
                found.push(part.split(|c: char| !c.is_alphanumeric()).next().unwrap().to_string());
            }
        }
        assert!(found.len() >= 9, "{found:?}");
        for c in RefusalCode::ALL.iter().filter(|c| c.step() == "connection") {
            assert!(found.iter().any(|f| format!("{c:?}") == *f), "{c} is listed but never recorded");
        }
        for f in &found {
            let c = RefusalCode::ALL.iter().copied().find(|c| format!("{c:?}") == *f).unwrap();
            assert!(c.step() == "connection" || c == RefusalCode::PeerUid, "{c} is a gate code recorded by the connection layer");
        }
    }
}
