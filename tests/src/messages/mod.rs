//! `ScriptedMessages`: a scripted Anthropic Messages API on `127.0.0.1:0`, the model Claude Code
//! talks to in the tests (`ANTHROPIC_BASE_URL`).
//!
//! `POST /v1/messages` (Claude Code sends `?beta=true`) is answered from a script of [`Turn`]s:
//! an SSE stream when the request asks for one, else one JSON message. Every request is recorded
//! before it is answered ([`MessagesRequest`]) and can be awaited without sleeping; anything else
//! (another path, a GET) is answered 404 and listed in `other_requests`, so a test can assert
//! Claude Code made no other call. The server, recorder and waits are the shared core's
//! (`crate::scripted`, the same as the Responses provider's).
//!
//! Files: `turn.rs` (turns and their SSE stream), `request.rs` (recorded requests); this file is
//! the wire side.

use std::net::TcpStream;
use std::time::Instant;

use serde_json::{json, Value};

use crate::scripted::http::{write_response, RawRequest};
use crate::scripted::{self, Core, Recorded, Scripted, Wire};

mod request;
mod turn;

pub use request::{content_text, MessagesRequest};
pub use turn::Turn;

/// Anthropic's Messages API, as Claude Code calls it.
pub struct Messages;

/// The scripted Messages API: the shared core ([`Scripted`]) speaking [`Messages`]. Dropping it
/// stops accepting connections.
pub type ScriptedMessages = Scripted<Messages>;

impl Scripted<Messages> {
    /// Answer the streamed requests from a queue, in order, then `fallback`. A request that is
    /// not streamed (a side query) gets `fallback` and takes nothing from the queue.
    pub fn start_queue(turns: Vec<Turn>, fallback: Turn) -> ScriptedMessages {
        ScriptedMessages::start_with(scripted::queue(turns, fallback, MessagesRequest::is_stream))
    }

    /// `http://127.0.0.1:PORT`, for `ANTHROPIC_BASE_URL` (Claude Code appends `/v1/messages`).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr())
    }
}

impl Recorded for MessagesRequest {
    fn set_index(&mut self, index: usize) {
        self.index = index;
    }

    fn summary(&self) -> String {
        MessagesRequest::summary(self)
    }
}

impl Wire for Messages {
    type Request = MessagesRequest;
    type Answer = Turn;
    const NAME: &'static str = "scripted-messages";

    /// Record a Messages API call, ask the script for its turn and send it; anything else is a 404.
    fn serve(w: &mut TcpStream, req: RawRequest, core: &Core<Messages>) -> std::io::Result<()> {
        let body: Option<Value> = serde_json::from_slice(&req.body).ok();
        let body = match body {
            Some(b) if req.method == "POST" && req.path_only() == "/v1/messages" && b.get("messages").is_some() => b,
            _ => {
                core.note_other(req.method, req.path);
                let msg = json!({"type": "error", "error": {"type": "not_found_error", "message": "scripted: unsupported"}});
                return write_response(w, 404, "application/json", msg.to_string().as_bytes());
            }
        };
        let mut request =
            MessagesRequest { index: 0, path: req.path, headers: req.headers, body, reply: String::new(), received_at: Instant::now() };
        let turn = core.script(&request, || Turn::text("scripted: the script panicked"));
        request.reply = turn.describe();
        let model = request.body.get("model").and_then(Value::as_str).unwrap_or("claude-scripted").to_string();
        let stream = request.is_stream();
        core.record(request);
        let rendered = turn.render(&model, &core.ids);
        let res = match stream {
            true => write_response(w, 200, "text/event-stream", rendered.sse.as_bytes()),
            false => write_response(w, 200, "application/json", rendered.json.as_bytes()),
        };
        if res.is_ok() {
            core.note_answered();
        }
        res
    }
}
