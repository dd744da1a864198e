//! OpenAI chat completions on the wire, as GitHub Copilot CLI calls it through its BYOK provider
//! setting (`COPILOT_PROVIDER_BASE_URL`): `POST /v1/chat/completions` with `stream: true` is
//! answered with `chat.completion.chunk` events (the assistant's `content`, or `tool_calls`
//! deltas, the arguments split across two chunks as the real API streams them), a usage chunk
//! when `stream_options.include_usage` asks for one, then `data: [DONE]`. A request that is not
//! streamed gets one `chat.completion`. The scripting is the Responses provider's ([`Reply`],
//! [`super::Hold`]): [`Reply::exec`] becomes Copilot's `bash` tool call, [`Reply::call`] any
//! function call, [`Reply::message`] the assistant's text.
//!
//! A request that offers no `bash` tool (Copilot's side queries, such as a session title) is
//! recorded like any and answered from the script too: a script tells them apart with
//! [`Request::offers_tool`].

use std::net::TcpStream;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use serde_json::{json, Value};

use super::reply::{next_id, Body, Item};
use super::{Reply, Request, MAX_HOLD};
use crate::scripted::http::{write_response, RawRequest};
use crate::scripted::{Core, Scripted, Wire};

/// OpenAI's chat completions API, as Copilot CLI calls it.
pub struct Chat;

/// The scripted chat completions provider. Dropping it stops accepting connections.
pub type ScriptedChat = Scripted<Chat>;

/// The `bash` call's fixed arguments beside `command` (what Copilot's tool schema asks for:
/// a synchronous run, waited for up to 30 s).
fn bash_arguments(cmd: &str) -> Value {
    json!({"command": cmd, "description": "scripted command", "mode": "sync", "initial_wait": 30})
}

impl Scripted<Chat> {
    /// `http://127.0.0.1:PORT/v1`, for `COPILOT_PROVIDER_BASE_URL`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr())
    }

    /// Answer the conversation's requests (those offering `bash`) from a queue, then `fallback`;
    /// side queries get `fallback` and take nothing from the queue.
    pub fn start_queue(replies: Vec<Reply>, fallback: Reply) -> ScriptedChat {
        ScriptedChat::start_with(crate::scripted::queue(replies, fallback, |r: &Request| r.offers_tool("bash")))
    }

    /// Requests of the conversation (those offering `bash`), in arrival order.
    pub fn conversation(&self) -> Vec<Request> {
        self.requests().into_iter().filter(|r| r.offers_tool("bash")).collect()
    }
}

impl Request {
    /// The chat messages of a chat completions request (`messages`).
    pub fn chat_messages(&self) -> &[Value] {
        self.body.get("messages").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Whether the request offers a function tool named `name`.
    pub fn offers_tool(&self, name: &str) -> bool {
        self.body
            .get("tools")
            .and_then(Value::as_array)
            .is_some_and(|ts| ts.iter().any(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(name)))
    }

    /// The text of every `tool` message (a tool call's result as the model gets it), in order.
    pub fn tool_results(&self) -> Vec<String> {
        self.chat_messages().iter().filter(|m| m.get("role").and_then(Value::as_str) == Some("tool")).map(chat_text).collect()
    }

    /// How many chat messages (any role) hold `needle` in their text.
    pub fn chat_messages_containing(&self, needle: &str) -> usize {
        self.chat_messages().iter().filter(|m| chat_text(m).contains(needle)).count()
    }

    /// Number of assistant messages: the conversation's step.
    pub fn assistant_turns(&self) -> usize {
        self.chat_messages().iter().filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant")).count()
    }
}

/// A chat message's text: its `content` string, or its text parts joined by newlines.
pub fn chat_text(m: &Value) -> String {
    match m.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n"),
        _ => String::new(),
    }
}

impl Wire for Chat {
    type Request = Request;
    type Answer = Reply;
    const NAME: &'static str = "scripted-chat";

    fn serve(w: &mut TcpStream, req: RawRequest, core: &Core<Chat>) -> std::io::Result<()> {
        let path_only = req.path_only().to_string();
        let body: Option<Value> = serde_json::from_slice(&req.body).ok();
        let body = match body {
            Some(b) if req.method == "POST" && path_only.ends_with("/chat/completions") && b.get("messages").is_some() => b,
            _ => {
                core.note_other(req.method, req.path);
                return write_response(w, 404, "application/json", br#"{"error":{"message":"scripted: unsupported"}}"#);
            }
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
        let model = request.body.get("model").and_then(Value::as_str).unwrap_or("scripted").to_string();
        let stream = request.body.get("stream").and_then(Value::as_bool) == Some(true);
        let usage_chunk = request.body.pointer("/stream_options/include_usage").and_then(Value::as_bool) == Some(true);
        // Recorded before a held reply parks, so a test sees the request while Copilot waits.
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
            Body::Items(items) => {
                let (message, finish) = assistant_message(items, &core.ids);
                let id = next_id(&core.ids, "chatcmpl");
                match stream {
                    true => write_response(w, 200, "text/event-stream", sse(&id, &model, &message, finish, usage_chunk).as_bytes()),
                    false => {
                        let b = json!({"id": id, "object": "chat.completion", "created": 0, "model": model,
                            "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage()});
                        write_response(w, 200, "application/json", b.to_string().as_bytes())
                    }
                }
            }
        };
        if res.is_ok() {
            core.note_answered();
        }
        res
    }
}

fn usage() -> Value {
    json!({"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110})
}

/// The assistant message a reply's items make, and its `finish_reason`.
fn assistant_message(items: &[Item], ids: &AtomicU64) -> (Value, &'static str) {
    let mut text = Vec::new();
    let mut calls = Vec::new();
    for item in items {
        let (name, arguments) = match item {
            Item::Message(t) => {
                text.push(t.clone());
                continue;
            }
            Item::Exec { cmd, .. } => ("bash".to_string(), bash_arguments(cmd)),
            Item::Call { name, arguments, .. } => (name.clone(), arguments.clone()),
            Item::Raw(v) => panic!("a raw Responses item has no chat completions form: {v}"),
        };
        calls.push(json!({"id": next_id(ids, "call"), "type": "function",
            "function": {"name": name, "arguments": arguments.to_string()}}));
    }
    let content = if text.is_empty() { Value::Null } else { Value::String(text.join("\n")) };
    let finish = if calls.is_empty() { "stop" } else { "tool_calls" };
    let mut message = json!({"role": "assistant", "content": content});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    (message, finish)
}

/// The SSE body of one streamed answer: a role chunk, the content, each tool call in two
/// argument deltas, the finish, the usage chunk when asked for, `[DONE]`.
fn sse(id: &str, model: &str, message: &Value, finish: &str, usage_chunk: bool) -> String {
    let chunk = |choices: Value| json!({"id": id, "object": "chat.completion.chunk", "created": 0, "model": model, "choices": choices});
    let delta = |d: Value, finish: Option<&str>| chunk(json!([{"index": 0, "delta": d, "finish_reason": finish}]));
    let mut events = vec![delta(json!({"role": "assistant", "content": ""}), None)];
    if let Some(t) = message.get("content").and_then(Value::as_str) {
        events.push(delta(json!({"content": t}), None));
    }
    for (i, call) in message.get("tool_calls").and_then(Value::as_array).into_iter().flatten().enumerate() {
        let args = call.pointer("/function/arguments").and_then(Value::as_str).unwrap_or("{}");
        let cut = (0..=args.len() / 2).rev().find(|&n| args.is_char_boundary(n)).unwrap_or(0);
        events.push(delta(
            json!({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                "function": {"name": call.pointer("/function/name"), "arguments": &args[..cut]}}]}),
            None,
        ));
        events.push(delta(json!({"tool_calls": [{"index": i, "function": {"arguments": &args[cut..]}}]}), None));
    }
    events.push(delta(json!({}), Some(finish)));
    if usage_chunk {
        let mut u = chunk(json!([]));
        u["usage"] = usage();
        events.push(u);
    }
    let mut out: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    out.push_str("data: [DONE]\n\n");
    out
}
