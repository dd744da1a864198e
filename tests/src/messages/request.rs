//! [`MessagesRequest`]: one recorded `POST /v1/messages` request and what tests ask of it.

use std::time::Instant;

use serde_json::Value;

/// One recorded `POST /v1/messages` request (the JSON body as Claude Code sent it).
#[derive(Clone, Debug)]
pub struct MessagesRequest {
    /// 0-based order of arrival among `/v1/messages` requests.
    pub index: usize,
    /// With its query string (Claude Code sends `?beta=true`).
    pub path: String,
    /// Header names lowercased, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body: Value,
    /// What the script answered.
    pub reply: String,
    pub received_at: Instant,
}

impl MessagesRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_str())
    }

    /// True when the request asked for an SSE stream.
    pub fn is_stream(&self) -> bool {
        self.body.get("stream").and_then(Value::as_bool) == Some(true)
    }

    pub fn messages(&self) -> &[Value] {
        self.body.get("messages").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Texts of the messages with this `role` (`user`, `assistant`, `system`): one string per
    /// message, its text blocks (or its string content) joined by newlines.
    pub fn texts(&self, role: &str) -> Vec<String> {
        self.messages().iter().filter(|m| m.get("role").and_then(Value::as_str) == Some(role)).map(content_text).collect()
    }

    /// The `tool_result` blocks of the user messages, in order.
    pub fn tool_results(&self) -> Vec<&Value> {
        self.blocks_of_type("tool_result")
    }

    /// The `tool_use` blocks of the assistant messages, in order.
    pub fn tool_uses(&self) -> Vec<&Value> {
        self.blocks_of_type("tool_use")
    }

    /// The text of the `tool_result` answering `tool_use_id`, if the request holds one.
    pub fn tool_result_text(&self, tool_use_id: &str) -> Option<String> {
        self.tool_results().into_iter().find(|b| b.get("tool_use_id").and_then(Value::as_str) == Some(tool_use_id)).map(content_text)
    }

    /// True when `needle` appears anywhere in the body.
    pub fn body_contains(&self, needle: &str) -> bool {
        self.body.to_string().contains(needle)
    }

    fn blocks_of_type(&self, kind: &str) -> Vec<&Value> {
        self.messages()
            .iter()
            .filter_map(|m| m.get("content").and_then(Value::as_array))
            .flatten()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some(kind))
            .collect()
    }

    /// One-line summary for diagnostics.
    pub fn summary(&self) -> String {
        let last = self.messages().last().and_then(|m| m.get("role")).and_then(Value::as_str).unwrap_or("");
        format!(
            "#{} {} stream={} messages={} last={last} tool_results={} -> {}",
            self.index,
            self.path,
            self.is_stream(),
            self.messages().len(),
            self.tool_results().len(),
            self.reply
        )
    }
}

/// The text of a message or block: its string `content`, or its `text` blocks (a `tool_result`'s
/// nested ones included) joined by newlines.
pub fn content_text(v: &Value) -> String {
    match v.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|p| match p.get("type").and_then(Value::as_str) {
                Some("text") => p.get("text").and_then(Value::as_str).unwrap_or("").to_string(),
                Some("tool_result") => content_text(p),
                _ => String::new(),
            })
            .filter(|t| !t.is_empty())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}
