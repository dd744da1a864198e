//! The Claude Code hook endpoint in `broker serve`: `127.0.0.1:<[claude] hook_port>`, one
//! accept thread, one short-lived thread per connection (at most [`MAX_CONNECTIONS`] at once;
//! more are closed unread, which Claude Code treats as a failed hook and carries on). Every
//! request is answered `{}` unless it passed every step; a refusal is recorded for
//! `broker inspect`. Nothing here can stall a session: each connection has [`READ_DEADLINE`] to
//! send its request and the answer is written under the same bound.

use super::deliver::NOTHING;
use super::gate;
use super::gate_trust::StoreTrust;
use super::http;
use super::refusals::Refusals;
use crate::config::Receipts;
use crate::exe::digest::DigestCache;
use crate::refusal::Refusal;
use crate::store::{Store, HANDED};
use anyhow::{Context, Result};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Connections handled at once.
pub const MAX_CONNECTIONS: usize = 16;
/// How long a connection has to send its request; the whole answer is due by twice that.
pub const READ_DEADLINE: Duration = Duration::from_secs(2);
/// How long a hook waits at most for what its proof needs, counted from the connection: the hash
/// of an expected binary (the first hook after an upgrade: 2.1.332's 402 MB take ~0.3 s of CPU,
/// seconds on a loaded machine), and a queued prompt's record in the transcript (`turn.rs`). The
/// answer is still due by twice [`READ_DEADLINE`], within install's 5 s timeout.
pub const HOOK_WAIT: Duration = Duration::from_secs(3);
/// How often the confirmation pass reads the transcripts of open hand-offs (while none is open it
/// waits for the next hand-off: [`confirm_loop`]).
const CONFIRM_EVERY: Duration = Duration::from_millis(500);

/// What every connection thread shares.
struct Endpoint {
    /// Its own connection to the queue (as effort has): pins, trust, tickets and hand-offs.
    store: Mutex<Store>,
    /// Another for refusals, written after their answer: a refusal's write (measured up to
    /// 0.6 s under load) never holds the lock a concurrent connection's answer waits for.
    refusal_store: Mutex<Store>,
    digests: DigestCache,
    /// The followed `claude` commands: what they run now is an expected binary (`follow.rs`).
    followed: Arc<super::follow::Followed>,
    /// Whether a delivery also shows the person a receipt line (`receipts` in the config).
    receipts: Receipts,
    active: AtomicUsize,
    refusals: Refusals,
    /// The turns whose proven Stop was seen: a held wake delivers only after it (`wake.rs`).
    stops: super::wake::Stops,
}

/// Binds the port and starts the accept thread. A port that cannot be bound is logged and
/// leaves Codex's side of the broker running.
pub fn spawn(
    port: u16,
    state_dir: &Path,
    digests: DigestCache,
    followed: Arc<super::follow::Followed>,
    receipts: Receipts,
    stops: super::wake::Stops,
    looks: Arc<AtomicU64>,
) -> Result<SocketAddr> {
    let listener = TcpListener::bind(("127.0.0.1", port)).with_context(|| format!("binding 127.0.0.1:{port} for Claude Code hooks"))?;
    let addr = listener.local_addr()?;
    let endpoint = Arc::new(Endpoint {
        store: Mutex::new(Store::open(state_dir)?),
        refusal_store: Mutex::new(Store::open(state_dir)?),
        digests,
        followed,
        receipts,
        active: AtomicUsize::new(0),
        refusals: Refusals::default(),
        stops,
    });
    let confirming = Arc::clone(&endpoint);
    std::thread::Builder::new().name("claude-confirm".into()).spawn(move || confirm_loop(&confirming.store, &looks))?;
    std::thread::Builder::new().name("claude-hooks".into()).spawn(move || accept_loop(&listener, &endpoint))?;
    Ok(addr)
}

/// The confirmation thread: a pass every [`CONFIRM_EVERY`] while a hand-off is open (its
/// transcript grows and its claude may exit, neither of which commits anything); with none open,
/// it sleeps until the process commits the next hand-off ([`HANDED`]), so an idle broker reads
/// neither the store nor a transcript for it. The count is taken before the pass: a hand-off
/// committed during it ends the wait at once. `looks` counts the passes (`broker inspect`:
/// `claude_confirm_looks`): one a [`CONFIRM_EVERY`] while a hand-off is open, none while none is.
fn confirm_loop(store: &Mutex<Store>, looks: &AtomicU64) {
    loop {
        let seen = HANDED.count();
        looks.fetch_add(1, Ordering::Relaxed);
        let open = super::confirm::reconcile(store, None).map_or_else(
            |e| {
                crate::log_warn!("claude: confirmation pass: {e:#}");
                1 // look again as if one were open: the failure may pass
            },
            |pass| pass.open,
        );
        if open > 0 {
            std::thread::sleep(CONFIRM_EVERY);
        } else {
            HANDED.wait_for_next(seen);
        }
    }
}

fn accept_loop(listener: &TcpListener, endpoint: &Arc<Endpoint>) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        if endpoint.active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            endpoint.active.fetch_sub(1, Ordering::AcqRel);
            // Debug only: a flood of connections must not flood the log either.
            crate::log_debug!("claude hooks: {MAX_CONNECTIONS} connections open, one closed unread");
            continue;
        }
        let ep = Arc::clone(endpoint);
        let spawned = std::thread::Builder::new().name("claude-hook".into()).spawn(move || {
            ep.handle(conn);
            ep.active.fetch_sub(1, Ordering::AcqRel);
        });
        if spawned.is_err() {
            endpoint.active.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Endpoint {
    fn handle(&self, mut conn: TcpStream) {
        let start = Instant::now();
        let (answer, refused) = match self.answer(&mut conn, start + READ_DEADLINE, start + HOOK_WAIT) {
            Ok(answer) => (answer, None),
            Err(refusal) => (NOTHING.to_string(), Some(refusal)),
        };
        if let Err(e) = http::write_answer(&mut conn, &answer, start + 2 * READ_DEADLINE) {
            crate::log_debug!("claude hook: answer not written: {e}");
        }
        // After the answer: claude never waits for a refusal's write.
        if let Some(refusal) = refused {
            self.record(&refusal);
        }
    }

    /// The request's answer, or why it was refused: the request read by `deadline`, what the
    /// proof needs (an expected binary's hash, a queued turn's record) waited for until `wait_until`.
    fn answer(&self, conn: &mut TcpStream, deadline: Instant, wait_until: Instant) -> Result<String, Refusal> {
        let bad = |e: http::BadRequest| Refusal::new(crate::refusal::RefusalCode::ClaudeRequest, e.0);
        let req = http::read_request(conn, deadline).map_err(bad)?;
        let addrs = conn.peer_addr().and_then(|c| Ok((c, conn.local_addr()?)));
        let (client, server) = addrs.map_err(|e| bad(http::BadRequest(e.to_string())))?;
        let trust = StoreTrust(&self.store, &self.followed);
        let proven = gate::verify(&req.event, &req.body, client, server, &self.digests, &trust, wait_until)?;
        super::session::session_owner(&self.store, &proven, wait_until)?;
        {
            let mut store = crate::store::lock(&self.store);
            super::session::turn_ticket(&mut store, &proven)?;
            super::session::note_activity(&mut store, &proven);
        }
        crate::log_debug!(
            "claude hook {} of session {} from pid {}: proven",
            proven.payload.event.as_str(),
            proven.payload.session_id,
            proven.key().pid
        );
        if proven.payload.event == super::Event::Stop && proven.payload.agent_id.is_none() {
            self.stops.note(&proven.payload.session_id, &proven.payload.prompt_id);
        }
        // What the session's earlier hand-offs became, before anything new is handed.
        if let Err(e) = super::confirm::reconcile(&self.store, Some(&proven.payload.session_id)) {
            crate::log_warn!("claude: confirmation of session {}: {e:#}", proven.payload.session_id);
        }
        let offered = super::deliver::offer(&mut crate::store::lock(&self.store), &proven, self.receipts);
        Ok(offered.unwrap_or_else(|e| {
            crate::log_error!("claude: delivery to session {}: {e:#}", proven.payload.session_id);
            NOTHING.to_string()
        }))
    }

    fn record(&self, r: &Refusal) {
        self.refusals.record(&self.refusal_store, r, "claude hook");
    }
}
