//! What the model answers ([`Reply`]) and how a reply goes out: the SSE stream of Responses events.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Value};

use super::Hold;

/// One output item of a scripted reply.
#[derive(Clone, Debug)]
pub(super) enum Item {
    Exec { cmd: String, yield_time_ms: u64 },
    Message(String),
    Call { namespace: Option<String>, name: String, arguments: Value },
    Raw(Value),
}

#[derive(Clone, Debug)]
pub(super) enum Body {
    Items(Vec<Item>),
    /// Answer with this HTTP status and JSON body instead of a stream.
    HttpError(u16, String),
}

/// What the model answers to one request.
#[derive(Clone, Debug)]
pub struct Reply {
    pub(super) body: Body,
    pub(super) hold: Option<Hold>,
}

impl Reply {
    /// One `exec_command` function call running `cmd` (`yield_time_ms` 2000, like the probe mock).
    pub fn exec(cmd: &str) -> Reply {
        Reply::items_of(vec![Item::Exec { cmd: cmd.to_string(), yield_time_ms: 2000 }])
    }

    /// One `exec_command` call with an explicit `yield_time_ms`.
    pub fn exec_with_yield(cmd: &str, yield_time_ms: u64) -> Reply {
        Reply::items_of(vec![Item::Exec { cmd: cmd.to_string(), yield_time_ms }])
    }

    /// A final assistant message.
    pub fn message(text: &str) -> Reply {
        Reply::items_of(vec![Item::Message(text.to_string())])
    }

    /// `multi_agent_v1.spawn_agent {"message": message}` (needs `features.multi_agent`).
    pub fn spawn_agent(message: &str) -> Reply {
        Reply::call(Some("multi_agent_v1"), "spawn_agent", json!({ "message": message }))
    }

    /// `multi_agent_v1.wait_agent {"targets": [...], "timeout_ms": ...}`.
    pub fn wait_agent(targets: &[&str], timeout_ms: u64) -> Reply {
        Reply::call(Some("multi_agent_v1"), "wait_agent", json!({ "targets": targets, "timeout_ms": timeout_ms }))
    }

    /// Any function call; `arguments` is serialised to the JSON string the API sends.
    pub fn call(namespace: Option<&str>, name: &str, arguments: Value) -> Reply {
        Reply::items_of(vec![Item::Call { namespace: namespace.map(str::to_string), name: name.to_string(), arguments }])
    }

    /// Raw output items (sent as given; `id`/`call_id` are filled in when missing).
    pub fn raw_items(items: Vec<Value>) -> Reply {
        Reply::items_of(items.into_iter().map(Item::Raw).collect())
    }

    /// Answer with an HTTP error instead of a stream (Codex has provider retries set to 0).
    pub fn http_error(status: u16, message: &str) -> Reply {
        Reply { body: Body::HttpError(status, message.to_string()), hold: None }
    }

    /// Append the items of `other` to this reply (e.g. a message and a tool call together).
    pub fn and(mut self, other: Reply) -> Reply {
        if let (Body::Items(a), Body::Items(b)) = (&mut self.body, other.body) {
            a.extend(b);
        }
        self
    }

    /// Hold this reply until `hold` is released (the request is recorded at once).
    pub fn held(mut self, hold: &Hold) -> Reply {
        self.hold = Some(hold.clone());
        self
    }

    fn items_of(items: Vec<Item>) -> Reply {
        Reply { body: Body::Items(items), hold: None }
    }

    /// Short description for logs and panics.
    pub fn describe(&self) -> String {
        match &self.body {
            Body::HttpError(s, _) => format!("http {s}"),
            Body::Items(items) => items
                .iter()
                .map(|i| match i {
                    Item::Exec { cmd, .. } => format!("exec_command({cmd})"),
                    Item::Message(t) => format!("message({t})"),
                    Item::Call { namespace, name, .. } => match namespace {
                        Some(ns) => format!("{ns}.{name}"),
                        None => name.clone(),
                    },
                    Item::Raw(v) => format!("raw({})", v.get("type").and_then(Value::as_str).unwrap_or("?")),
                })
                .collect::<Vec<_>>()
                .join(" + "),
        }
    }
}

pub(super) fn next_id(ids: &AtomicU64, prefix: &str) -> String {
    let n = ids.fetch_add(1, Ordering::SeqCst) + 1;
    format!("{prefix}_{n:04}")
}

fn render_item(item: &Item, ids: &AtomicU64) -> Value {
    match item {
        Item::Exec { cmd, yield_time_ms } => {
            let args = json!({ "cmd": cmd, "yield_time_ms": yield_time_ms });
            let call_id = next_id(ids, "call");
            json!({"type": "function_call", "id": next_id(ids, "fc"), "call_id": call_id,
                   "name": "exec_command", "arguments": args.to_string()})
        }
        Item::Message(text) => json!({
            "type": "message", "role": "assistant", "id": next_id(ids, "msg"), "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]
        }),
        Item::Call { namespace, name, arguments } => {
            let call_id = next_id(ids, "call");
            let mut v = json!({"type": "function_call", "id": next_id(ids, "fc"), "call_id": call_id,
                               "name": name, "arguments": arguments.to_string()});
            if let Some(ns) = namespace {
                v["namespace"] = json!(ns);
            }
            v
        }
        Item::Raw(v) => {
            let mut v = v.clone();
            if let Some(obj) = v.as_object_mut() {
                if !obj.contains_key("id") {
                    obj.insert("id".into(), json!(next_id(ids, "item")));
                }
                if obj.get("type").and_then(Value::as_str) == Some("function_call") && !obj.contains_key("call_id") {
                    obj.insert("call_id".into(), json!(next_id(ids, "call")));
                }
            }
            v
        }
    }
}

/// The SSE body for one reply: `response.created`, one `response.output_item.done` per item,
/// `response.completed` with usage (the shapes the real API streams).
pub(super) fn sse_stream(items: &[Item], ids: &AtomicU64) -> String {
    let rid = next_id(ids, "resp");
    let mut events = vec![json!({"type": "response.created", "response": {"id": rid}})];
    for it in items {
        events.push(json!({"type": "response.output_item.done", "item": render_item(it, ids)}));
    }
    events.push(json!({"type": "response.completed", "response": {"id": rid, "usage": {
        "input_tokens": 10, "input_tokens_details": null, "output_tokens": 5,
        "output_tokens_details": null, "total_tokens": 15}}}));
    let mut out = String::new();
    for ev in events {
        out.push_str(&format!("event: {}\ndata: {}\n\n", ev["type"].as_str().unwrap(), ev));
    }
    out
}
