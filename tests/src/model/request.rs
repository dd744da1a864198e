//! [`Request`]: one recorded `POST .../responses` request and what tests ask of it.

use std::time::Instant;

use serde_json::Value;

/// One recorded `POST .../responses` request.
#[derive(Clone, Debug)]
pub struct Request {
    /// 0-based order of arrival among `/responses` requests.
    pub index: usize,
    pub method: String,
    pub path: String,
    /// Header names lowercased, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body: Value,
    /// What the script answered (filled in once the reply is decided).
    pub reply: String,
    pub received_at: Instant,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_str())
    }

    /// The thread this request belongs to: the `thread-id` header Codex sends, else
    /// `client_metadata.thread_id` in the body. (`session-id` names the ROOT thread, which differs
    /// inside sub-agents.)
    pub fn thread_id(&self) -> Option<String> {
        self.header("thread-id")
            .map(str::to_string)
            .or_else(|| self.body.pointer("/client_metadata/thread_id").and_then(Value::as_str).map(str::to_string))
    }

    /// The turn id Codex reports in `client_metadata.turn_id`.
    pub fn turn_id(&self) -> Option<String> {
        self.body.pointer("/client_metadata/turn_id").and_then(Value::as_str).map(str::to_string)
    }

    pub fn input(&self) -> &[Value] {
        self.body.get("input").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Texts of every `message` item with this role (`developer`, `user`, `assistant`), one string
    /// per message (its text parts joined by newlines).
    pub fn messages(&self, role: &str) -> Vec<String> {
        self.input()
            .iter()
            .filter(|it| it.get("type").and_then(Value::as_str) == Some("message"))
            .filter(|it| it.get("role").and_then(Value::as_str) == Some(role))
            .map(item_text)
            .collect()
    }

    pub fn developer_messages(&self) -> Vec<String> {
        self.messages("developer")
    }

    pub fn user_messages(&self) -> Vec<String> {
        self.messages("user")
    }

    /// Messages of `role` whose text contains `needle`.
    pub fn messages_containing(&self, role: &str, needle: &str) -> Vec<String> {
        self.messages(role).into_iter().filter(|t| t.contains(needle)).collect()
    }

    pub fn developer_messages_containing(&self, needle: &str) -> Vec<String> {
        self.messages_containing("developer", needle)
    }

    pub fn user_messages_containing(&self, needle: &str) -> Vec<String> {
        self.messages_containing("user", needle)
    }

    /// Number of input items of any kind whose serialised JSON contains `needle`.
    pub fn items_containing(&self, needle: &str) -> usize {
        self.input().iter().filter(|it| it.to_string().contains(needle)).count()
    }

    /// True when `needle` appears anywhere in the body.
    pub fn body_contains(&self, needle: &str) -> bool {
        self.body.to_string().contains(needle)
    }

    /// Function calls in the input (`type == "function_call"`).
    pub fn function_calls(&self) -> Vec<&Value> {
        self.input().iter().filter(|it| it.get("type").and_then(Value::as_str) == Some("function_call")).collect()
    }

    /// Outputs of tool calls in the input.
    pub fn tool_outputs(&self) -> Vec<&Value> {
        self.input()
            .iter()
            .filter(|it| {
                matches!(
                    it.get("type").and_then(Value::as_str),
                    Some("function_call_output" | "custom_tool_call_output" | "local_shell_call_output")
                )
            })
            .collect()
    }

    /// True for a sub-agent's request: its `thread-id` differs from the root `session-id`.
    pub fn is_subagent(&self) -> bool {
        match (self.header("thread-id"), self.header("session-id")) {
            (Some(t), Some(s)) => t != s,
            _ => false,
        }
    }

    /// When the last input item is the output of a `spawn_agent` call: the spawned agent's id
    /// (`agent_id` in that output), to pass to [`Reply::wait_agent`].
    pub fn spawned_agent(&self) -> Option<String> {
        let last = self.input().last()?;
        if last.get("type").and_then(Value::as_str) != Some("function_call_output") {
            return None;
        }
        let call_id = last.get("call_id")?;
        let call = self.function_calls().into_iter().find(|c| c.get("call_id") == Some(call_id))?;
        if call.get("name").and_then(Value::as_str) != Some("spawn_agent") {
            return None;
        }
        let out = match last.get("output")? {
            Value::String(s) => serde_json::from_str::<Value>(s).unwrap_or(Value::String(s.clone())),
            v => v.clone(),
        };
        out.get("agent_id").and_then(Value::as_str).map(str::to_string)
    }

    /// The `type` (and role, for messages) of the last input item, e.g. `message:user`.
    pub fn last_item_kind(&self) -> String {
        match self.input().last() {
            None => String::new(),
            Some(it) => {
                let t = it.get("type").and_then(Value::as_str).unwrap_or("?");
                match it.get("role").and_then(Value::as_str) {
                    Some(r) => format!("{t}:{r}"),
                    None => t.to_string(),
                }
            }
        }
    }

    /// Names of the tools offered in this request (`name`, or `type` for built-ins/namespaces).
    pub fn tool_names(&self) -> Vec<String> {
        self.body
            .get("tools")
            .and_then(Value::as_array)
            .map(|ts| {
                ts.iter()
                    .filter_map(|t| t.get("name").and_then(Value::as_str).or_else(|| t.get("type").and_then(Value::as_str)))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every `exec_command` call in the input with what its command printed: `(cmd, output)`,
    /// where output is the text after Codex's `Output:` line (`None` while it has no output item).
    pub fn exec_results(&self) -> Vec<(String, Option<String>)> {
        self.function_calls()
            .into_iter()
            .filter(|c| c.get("name").and_then(Value::as_str) == Some("exec_command"))
            .map(|c| {
                let args = c.get("arguments").and_then(Value::as_str).unwrap_or("{}");
                let cmd = serde_json::from_str::<Value>(args)
                    .ok()
                    .and_then(|a| a.get("cmd").and_then(Value::as_str).map(str::to_string))
                    .unwrap_or_default();
                let out = self
                    .tool_outputs()
                    .into_iter()
                    .find(|o| o.get("call_id") == c.get("call_id"))
                    .and_then(|o| o.get("output").and_then(Value::as_str))
                    .map(|t| t.split_once("\nOutput:\n").map_or(t, |(_, rest)| rest).to_string());
                (cmd, out)
            })
            .collect()
    }

    /// One-line summary for diagnostics.
    pub fn summary(&self) -> String {
        format!(
            "#{} thread={} items={} last={} calls={} -> {}",
            self.index,
            self.thread_id().unwrap_or_default(),
            self.input().len(),
            self.last_item_kind(),
            self.function_calls().len(),
            self.reply
        )
    }
}

/// Text of a message item: its `text` content parts joined by newlines.
pub fn item_text(item: &Value) -> String {
    item.get("content")
        .and_then(Value::as_array)
        .map(|cs| cs.iter().filter_map(|c| c.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n"))
        .unwrap_or_default()
}
