//! The Claude Code hook endpoint in `broker serve`: `127.0.0.1:<[claude] hook_port>`, one
//! accept thread, one short-lived thread per connection (at most [`MAX_CONNECTIONS`] at once;
//! more are closed unread, which Claude Code treats as a failed hook and carries on). Every
//! request is answered `{}` unless it passed every step; a refusal is recorded for
//! `broker inspect`. Nothing here can stall a session: each connection has [`READ_DEADLINE`] to
//! send its request and the answer is written under the same bound.

use super::deliver::NOTHING;
use super::gate::{self, ClaudeTrust};
use super::http;
use crate::config::Receipts;
use crate::exe::digest::DigestCache;
use crate::exe::ExeKey;
use crate::gate::Refusal;
use crate::store::Store;
use anyhow::{Context, Result};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Connections handled at once.
pub const MAX_CONNECTIONS: usize = 16;
/// How long a connection has to send its request; the whole answer is due by twice that.
pub const READ_DEADLINE: Duration = Duration::from_secs(2);
/// Refusals written to the queue per second at most; more are logged only (a flood of forged
/// connections must not become a flood of database writes).
const REFUSALS_PER_SECOND: usize = 16;
/// How often the confirmation pass reads the transcripts of open hand-offs.
const CONFIRM_EVERY: Duration = Duration::from_millis(500);

/// What every connection thread shares.
struct Endpoint {
    /// Its own connection to the queue (as effort has): pins, trust and refusals.
    store: Mutex<Store>,
    digests: DigestCache,
    /// Whether a delivery also shows the person a receipt line (`receipts` in the config).
    receipts: Receipts,
    active: AtomicUsize,
    /// The current one-second window of recorded refusals: its start and count.
    recorded: Mutex<(Instant, usize)>,
}

/// Binds the port and starts the accept thread. A port that cannot be bound is logged and
/// leaves Codex's side of the broker running.
pub fn spawn(port: u16, state_dir: &Path, digests: DigestCache, receipts: Receipts) -> Result<SocketAddr> {
    let listener = TcpListener::bind(("127.0.0.1", port)).with_context(|| format!("binding 127.0.0.1:{port} for Claude Code hooks"))?;
    let addr = listener.local_addr()?;
    let store = Store::open(state_dir)?;
    let endpoint = Arc::new(Endpoint {
        store: Mutex::new(store),
        digests,
        receipts,
        active: AtomicUsize::new(0),
        recorded: Mutex::new((Instant::now(), 0)),
    });
    let confirming = Arc::clone(&endpoint);
    std::thread::Builder::new().name("claude-confirm".into()).spawn(move || loop {
        if let Err(e) = super::confirm::reconcile(&confirming.store, None) {
            crate::log_warn!("claude: confirmation pass: {e:#}");
        }
        std::thread::sleep(CONFIRM_EVERY);
    })?;
    std::thread::Builder::new().name("claude-hooks".into()).spawn(move || accept_loop(&listener, &endpoint))?;
    Ok(addr)
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
        let (answer, refused) = match self.answer(&mut conn, start + READ_DEADLINE) {
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

    /// The request's answer, or why it was refused.
    fn answer(&self, conn: &mut TcpStream, deadline: Instant) -> Result<String, Refusal> {
        let bad = |e: http::BadRequest| Refusal::new(crate::refusal::RefusalCode::ClaudeRequest, e.0);
        let req = http::read_request(conn, deadline).map_err(bad)?;
        let addrs = conn.peer_addr().and_then(|c| Ok((c, conn.local_addr()?)));
        let (client, server) = addrs.map_err(|e| bad(http::BadRequest(e.to_string())))?;
        let proven = gate::verify(&req.event, &req.body, client, server, &self.digests, &StoreTrust(&self.store), deadline)?;
        {
            let mut store = crate::store::lock(&self.store);
            super::session::session_owner(&mut store, &proven)?;
            super::session::turn_ticket(&mut store, &proven)?;
            super::session::note_activity(&mut store, &proven);
        }
        crate::log_debug!(
            "claude hook {} of session {} from pid {}: proven",
            proven.payload.event.as_str(),
            proven.payload.session_id,
            proven.key().pid
        );
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
        {
            let mut window = self.recorded.lock().unwrap_or_else(|e| e.into_inner());
            if window.0.elapsed() >= Duration::from_secs(1) {
                *window = (Instant::now(), 0);
            }
            window.1 += 1;
            if window.1 > REFUSALS_PER_SECOND {
                crate::log_debug!("claude hook refused (not recorded: over {REFUSALS_PER_SECOND}/s): {} {}", r.code, r.detail);
                return;
            }
        }
        crate::log_info!("claude hook refused: {} {}", r.code, r.detail);
        let mut store = crate::store::lock(&self.store);
        if let Err(e) = store.record_refusal(r.code, &r.detail, r.thread.as_deref(), r.event.as_deref(), None) {
            crate::log_warn!("claude hook: refusal not recorded: {e:#}");
        }
    }
}

/// The gate's view of Claude Code trust, from the store (also the sender check's, `gate/claude_sender.rs`).
pub(crate) struct StoreTrust<'a>(pub(crate) &'a Mutex<Store>);

impl ClaudeTrust for StoreTrust<'_> {
    fn is_trusted(&self, sha256: &str) -> bool {
        crate::store::lock(self.0).is_trusted_claude(sha256).unwrap_or(false)
    }
    fn is_expected(&self, path: &Path, size: u64) -> bool {
        size <= crate::exe::digest::MAX_HASH_BYTES && {
            let store = crate::store::lock(self.0);
            let path = path.to_string_lossy();
            store.trusted_claude().map(|all| all.iter().any(|t| t.path == path)).unwrap_or(false)
        }
    }
    fn known_digest(&self, key: &ExeKey) -> Option<String> {
        crate::store::lock(self.0).codex_file_digest(key).ok().flatten()
    }
}
