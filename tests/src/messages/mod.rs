//! `ScriptedMessages`: a scripted Anthropic Messages API on `127.0.0.1:0`, the model Claude Code
//! talks to in the tests (`ANTHROPIC_BASE_URL`).
//!
//! `POST /v1/messages` (Claude Code sends `?beta=true`) is answered from a script of [`Turn`]s:
//! an SSE stream when the request asks for one, else one JSON message. Every request is recorded
//! before it is answered ([`MessagesRequest`]) and can be awaited without sleeping; anything else
//! (another path, a GET) is answered 404 and listed in [`ScriptedMessages::other_requests`], so a
//! test can assert Claude Code made no other call. The HTTP side is the Responses provider's
//! (`crate::model::http`).
//!
//! Files: `turn.rs` (turns and their SSE stream), `request.rs` (recorded requests).

use std::collections::VecDeque;
use std::net::TcpStream;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::model::http::{write_response, AcceptLoop, RawRequest};
use crate::util::wait_on;

mod request;
mod turn;

pub use request::{content_text, MessagesRequest};
pub use turn::Turn;

type Script = Box<dyn FnMut(&MessagesRequest) -> Turn + Send>;

struct Shared {
    state: Mutex<State>,
    cond: Condvar,
    script: Mutex<Script>,
    ids: AtomicU64,
}

#[derive(Default)]
struct State {
    requests: Vec<MessagesRequest>,
    /// Requests that were not `POST /v1/messages` with a JSON body: (method, path).
    other: Vec<(String, String)>,
}

/// The scripted Messages API. Dropping it stops accepting connections.
pub struct ScriptedMessages {
    shared: Arc<Shared>,
    server: AcceptLoop,
}

impl ScriptedMessages {
    /// Script every turn with a closure that sees the recorded request.
    pub fn start_with(script: impl FnMut(&MessagesRequest) -> Turn + Send + 'static) -> ScriptedMessages {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cond: Condvar::new(),
            script: Mutex::new(Box::new(script)),
            ids: AtomicU64::new(0),
        });
        let s2 = shared.clone();
        let server = AcceptLoop::start("scripted-messages", move |w, req| handle(w, req, &s2));
        ScriptedMessages { shared, server }
    }

    /// Answer the streamed requests from a queue, in order, then `fallback`. A request that is
    /// not streamed (a side query) gets `fallback` and takes nothing from the queue.
    pub fn start_queue(turns: Vec<Turn>, fallback: Turn) -> ScriptedMessages {
        let mut q: VecDeque<Turn> = turns.into();
        ScriptedMessages::start_with(move |r| match r.is_stream() {
            true => q.pop_front().unwrap_or_else(|| fallback.clone()),
            false => fallback.clone(),
        })
    }

    /// `http://127.0.0.1:PORT`, for `ANTHROPIC_BASE_URL` (Claude Code appends `/v1/messages`).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    /// Every `/v1/messages` request so far, in arrival order.
    pub fn requests(&self) -> Vec<MessagesRequest> {
        self.shared.state.lock().unwrap().requests.clone()
    }

    /// Requests that were not Messages API calls (method, path).
    pub fn other_requests(&self) -> Vec<(String, String)> {
        self.shared.state.lock().unwrap().other.clone()
    }

    /// Wait for the first request (past or future) satisfying `pred`.
    pub fn wait_for(&self, timeout: Duration, what: &str, pred: impl Fn(&MessagesRequest) -> bool) -> MessagesRequest {
        wait_on(&self.shared.state, &self.shared.cond, timeout, |st| st.requests.iter().find(|r| pred(r)).cloned()).unwrap_or_else(|g| {
            let summary: Vec<String> = g.requests.iter().map(MessagesRequest::summary).collect();
            panic!("timed out after {timeout:?} waiting for {what}; requests so far:\n  {}", summary.join("\n  "))
        })
    }

    /// All request summaries, one per line (for assertion messages).
    pub fn dump(&self) -> String {
        self.requests().iter().map(MessagesRequest::summary).collect::<Vec<_>>().join("\n")
    }
}

/// Record a Messages API call, ask the script for its turn and send it; anything else is a 404.
fn handle(w: &mut TcpStream, req: RawRequest, shared: &Shared) -> std::io::Result<()> {
    let body: Option<Value> = serde_json::from_slice(&req.body).ok();
    let body = match body {
        Some(b) if req.method == "POST" && req.path_only() == "/v1/messages" && b.get("messages").is_some() => b,
        _ => {
            shared.state.lock().unwrap().other.push((req.method, req.path));
            shared.cond.notify_all();
            let msg = json!({"type": "error", "error": {"type": "not_found_error", "message": "scripted: unsupported"}});
            return write_response(w, 404, "application/json", msg.to_string().as_bytes());
        }
    };
    let mut request =
        MessagesRequest { index: 0, path: req.path, headers: req.headers, body, reply: String::new(), received_at: Instant::now() };
    let turn = {
        let mut script = shared.script.lock().unwrap();
        // A panicking script must not poison the server for the rest of the test.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (script)(&request)))
            .unwrap_or_else(|_| Turn::text("scripted: the script panicked"))
    };
    request.reply = turn.describe();
    let model = request.body.get("model").and_then(Value::as_str).unwrap_or("claude-scripted").to_string();
    let stream = request.is_stream();
    {
        let mut st = shared.state.lock().unwrap();
        request.index = st.requests.len();
        st.requests.push(request);
    }
    shared.cond.notify_all();
    let rendered = turn.render(&model, &shared.ids);
    match stream {
        true => write_response(w, 200, "text/event-stream", rendered.sse.as_bytes()),
        false => write_response(w, 200, "application/json", rendered.json.as_bytes()),
    }
}
