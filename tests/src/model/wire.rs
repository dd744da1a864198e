//! The Responses API on the wire: which requests are scripted (`POST .../responses` with an
//! `input`), `GET .../models` answered with an empty list, held replies, and a reply written as an
//! SSE stream or an HTTP error.

use std::net::TcpStream;
use std::time::Instant;

use serde_json::{json, Value};

use super::reply::{sse_stream, Body};
use super::{Reply, Request, MAX_HOLD};
use crate::scripted::http::{write_response, RawRequest};
use crate::scripted::{Core, Recorded, Wire};

/// OpenAI's Responses API, as Codex calls it.
pub struct Responses;

impl Recorded for Request {
    fn set_index(&mut self, index: usize) {
        self.index = index;
    }

    fn summary(&self) -> String {
        Request::summary(self)
    }
}

impl Wire for Responses {
    type Request = Request;
    type Answer = Reply;
    const NAME: &'static str = "scripted-model";

    fn serve(w: &mut TcpStream, req: RawRequest, core: &Core<Responses>) -> std::io::Result<()> {
        let path_only = req.path_only().to_string();
        if req.method == "GET" {
            core.note_other(req.method, req.path);
            if path_only.ends_with("/models") {
                let body = json!({"object": "list", "data": [], "models": []}).to_string();
                return write_response(w, 200, "application/json", body.as_bytes());
            }
            return write_response(w, 404, "application/json", br#"{"error":"not found"}"#);
        }
        let Some(body) = scripted_body(&req, &path_only, core) else {
            core.note_other(req.method, req.path);
            let msg = br#"{"error":{"message":"mock: unsupported","type":"invalid_request_error"}}"#;
            return write_response(w, 400, "application/json", msg);
        };
        let mut request = Request {
            index: 0,
            method: req.method,
            path: req.path,
            headers: req.headers,
            body,
            reply: String::new(),
            received_at: Instant::now(),
        };
        let reply = core.script(&request, || Reply::http_error(500, "script panicked"));
        request.reply = reply.describe();
        // Recorded before a held reply parks, so a test sees the request while Codex waits.
        core.record(request);
        if let Some(h) = &reply.hold {
            if !h.park() {
                core.note_error(format!("reply held longer than {MAX_HOLD:?}; sent anyway"));
            }
        }
        let res = match &reply.body {
            Body::HttpError(status, message) => {
                let b = json!({"error": {"message": message, "type": "server_error"}}).to_string();
                write_response(w, *status, "application/json", b.as_bytes())
            }
            Body::Items(items) => write_response(w, 200, "text/event-stream", sse_stream(items, &core.ids).as_bytes()),
        };
        if res.is_ok() {
            core.note_answered();
        }
        res
    }
}

/// The JSON body of a scriptable request (`POST .../responses` with an `input`), else `None`
/// (a compressed body is noted as a protocol error too).
fn scripted_body(req: &RawRequest, path_only: &str, core: &Core<Responses>) -> Option<Value> {
    let enc = req.header("content-encoding").map(str::to_ascii_lowercase);
    let parsed: Option<Value> = match enc.as_deref() {
        None | Some("identity") => serde_json::from_slice(&req.body).ok(),
        Some(other) => {
            core.note_error(format!("compressed request body ({other}) not supported"));
            None
        }
    };
    parsed.filter(|b| req.method == "POST" && path_only.ends_with("/responses") && b.get("input").is_some())
}
