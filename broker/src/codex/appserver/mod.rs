//! Codex's app-server, as a client: finding the endpoints a verified Codex process itself
//! serves (`endpoint.rs`: its listening Unix sockets, and the managed daemon's), proving the
//! process at the other end is that Codex (`SO_PEERCRED` and its start time), speaking JSON-RPC
//! over WebSocket with a deadline (`ws.rs`), and opening a session (`initialize`). Effort changes
//! use it now; waking idle threads (`turn/start`) will too. Everything here runs on the caller's
//! own thread and connection, never on a hook worker's store lock.

pub mod endpoint;
pub mod ws;

pub use endpoint::Endpoint;
pub use ws::WsClient;

use serde_json::json;
#[cfg(test)]
use std::sync::Mutex;
use std::time::Instant;

/// A session on the first endpoint that proves to be served by the Codex process `codex_pid`
/// (started at `codex_start`) and accepts `initialize`. Nothing but `initialize` has been sent
/// on any endpoint tried.
pub fn open_session(endpoints: &[Endpoint], codex_pid: i32, codex_start: u64, deadline: Instant) -> Result<WsClient, String> {
    let mut why = Vec::new();
    for ep in endpoints {
        let stream = match endpoint::connect_verified(ep, codex_pid, codex_start) {
            Ok(s) => s,
            Err(e) => {
                why.push(e);
                continue;
            }
        };
        let mut ws = match WsClient::handshake(stream, deadline) {
            Ok(ws) => ws,
            Err(e) => {
                why.push(format!("{}: handshake: {e}", ep.path.display()));
                continue;
            }
        };
        let init = ws.call(
            "initialize",
            json!({"clientInfo": {"name": "courier", "title": "Courier broker", "version": env!("CARGO_PKG_VERSION")},
                   "capabilities": {"experimentalApi": true}}),
        );
        match init {
            Ok(r) if r.get("result").is_some() => {}
            Ok(r) => {
                why.push(format!("{}: initialize refused: {}", ep.path.display(), r.get("error").unwrap_or(&r)));
                continue;
            }
            Err(e) => {
                why.push(format!("{}: initialize: {e}", ep.path.display()));
                continue;
            }
        }
        match ws.notify("initialized") {
            Ok(()) => return Ok(ws),
            Err(e) => why.push(format!("{}: initialized: {e}", ep.path.display())),
        }
    }
    Err(why.join("; "))
}

/// Discovery finds every listener of the test process: tests that bind one take turns.
#[cfg(test)]
pub(crate) static LISTENER_TESTS: Mutex<()> = Mutex::new(());
