//! What the scripted Messages API answers ([`Turn`]) and how it goes out: the SSE events of the
//! Anthropic Messages API in the order Claude Code parses them (`message_start`, `ping`, per
//! content block `content_block_start` / `content_block_delta` / `content_block_stop`,
//! `message_delta` with the stop reason, `message_stop`), or one JSON message when the request
//! did not ask for a stream.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Value};

/// One content block of a scripted assistant turn.
#[derive(Clone, Debug)]
enum Block {
    Text(String),
    ToolUse { name: String, input: Value },
}

/// What the model answers to one request: an assistant turn of text and `tool_use` blocks.
#[derive(Clone, Debug)]
pub struct Turn {
    blocks: Vec<Block>,
}

/// A turn rendered both ways a request may ask for.
pub(super) struct Rendered {
    pub sse: String,
    pub json: String,
}

impl Turn {
    /// A final text answer (stop reason `end_turn`).
    pub fn text(text: &str) -> Turn {
        Turn { blocks: vec![Block::Text(text.to_string())] }
    }

    /// One `Bash` tool call running `command` (stop reason `tool_use`).
    pub fn bash(command: &str) -> Turn {
        Turn::tool_use("Bash", json!({ "command": command, "description": "scripted command" }))
    }

    /// One call of any tool, `input` as the model would write it.
    pub fn tool_use(name: &str, input: Value) -> Turn {
        Turn { blocks: vec![Block::ToolUse { name: name.to_string(), input }] }
    }

    /// This turn's blocks followed by `other`'s (e.g. some text, then a tool call).
    pub fn and(mut self, other: Turn) -> Turn {
        self.blocks.extend(other.blocks);
        self
    }

    fn stop_reason(&self) -> &'static str {
        if self.blocks.iter().any(|b| matches!(b, Block::ToolUse { .. })) {
            "tool_use"
        } else {
            "end_turn"
        }
    }

    /// Short description for logs and panics.
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self
            .blocks
            .iter()
            .map(|b| match b {
                Block::Text(t) => format!("text({t})"),
                Block::ToolUse { name, input } => format!("{name}({input})"),
            })
            .collect();
        parts.join(" + ")
    }

    /// The turn as an SSE stream and as a plain JSON message, with fresh ids from `ids`.
    pub(super) fn render(&self, model: &str, ids: &AtomicU64) -> Rendered {
        let next = |prefix: &str| format!("{prefix}_{:04}", ids.fetch_add(1, Ordering::SeqCst) + 1);
        let blocks: Vec<Value> = self
            .blocks
            .iter()
            .map(|b| match b {
                Block::Text(t) => json!({"type": "text", "text": t}),
                Block::ToolUse { name, input } => json!({"type": "tool_use", "id": next("toolu"), "name": name, "input": input}),
            })
            .collect();
        let usage = json!({"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0});
        let message = json!({"id": next("msg"), "type": "message", "role": "assistant", "model": model,
            "content": blocks, "stop_reason": self.stop_reason(), "stop_sequence": null, "usage": usage});
        Rendered { sse: sse_events(&message).join(""), json: message.to_string() }
    }
}

/// The stream of one complete assistant `message`: every block opened empty, filled by one delta
/// (`text_delta`, or `input_json_delta` with the whole input), closed.
fn sse_events(message: &Value) -> Vec<String> {
    let mut start = message.clone();
    start["content"] = json!([]);
    start["stop_reason"] = Value::Null;
    let mut events = vec![json!({"type": "message_start", "message": start}), json!({"type": "ping"})];
    let blocks = message["content"].as_array().cloned().unwrap_or_default();
    for (index, block) in blocks.iter().enumerate() {
        let (empty, delta) = match block["type"].as_str() {
            Some("tool_use") => (
                json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}),
                json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
            ),
            _ => (json!({"type": "text", "text": ""}), json!({"type": "text_delta", "text": block["text"]})),
        };
        events.push(json!({"type": "content_block_start", "index": index, "content_block": empty}));
        events.push(json!({"type": "content_block_delta", "index": index, "delta": delta}));
        events.push(json!({"type": "content_block_stop", "index": index}));
    }
    events.push(json!({"type": "message_delta", "delta": {"stop_reason": message["stop_reason"], "stop_sequence": null},
        "usage": {"output_tokens": 5}}));
    events.push(json!({"type": "message_stop"}));
    events.into_iter().map(|ev| format!("event: {}\ndata: {ev}\n\n", ev["type"].as_str().unwrap_or("?"))).collect()
}
