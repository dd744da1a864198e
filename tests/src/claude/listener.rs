//! A loopback listener standing in for the broker's hook port: it answers every hook with `{}`
//! and records what came.

use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::scripted::http::{write_response, AcceptLoop};
use crate::util::str_field;

/// What a [`hook_listener`] saw: (request path, `hook_event_name`) per request.
pub type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// A loopback listener answering every hook with `{}` and recording it; its port is
/// `server.addr.port()`, and it stops on drop.
pub fn hook_listener() -> (AcceptLoop, Seen) {
    let seen: Seen = Default::default();
    let log = seen.clone();
    let server = AcceptLoop::start("claude-hook", move |w, req| {
        let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        log.lock().unwrap().push((req.path_only().to_string(), str_field(&body, "hook_event_name").to_string()));
        write_response(w, 200, "application/json", b"{}")
    });
    (server, seen)
}
