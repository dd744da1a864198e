//! Rollout records as codex-cli 0.171.0 writes them (fields in its order; see
//! codex-format/testdata/rollout-0.171.0-*.jsonl), for [`super::Stepped::write`].

use serde_json::{json, Value};

pub fn task_started(turn: &str) -> (&'static str, Value) {
    ("event_msg", json!({"type": "task_started", "turn_id": turn, "started_at": 1796112975, "model_context_window": 258400}))
}
pub fn task_complete(turn: &str) -> (&'static str, Value) {
    ("event_msg", json!({"type": "task_complete", "turn_id": turn, "last_agent_message": "done"}))
}
pub fn turn_context(turn: &str) -> (&'static str, Value) {
    ("turn_context", json!({"turn_id": turn, "root_turn_id": turn, "cwd": "/", "model": "gpt-5.5"}))
}
pub fn user_message(turn: &str, text: &str) -> (&'static str, Value) {
    (
        "response_item",
        json!({"type": "message", "id": "msg_u", "role": "user",
        "content": [{"type": "input_text", "text": text}],
        "internal_chat_message_metadata_passthrough": {"turn_id": turn}}),
    )
}
pub fn function_call(call: &str, turn: &str, cmd: &str) -> (&'static str, Value) {
    let args = json!({"cmd": cmd, "yield_time_ms": 2000}).to_string();
    (
        "response_item",
        json!({"type": "function_call", "id": format!("fc_{call}"), "name": "exec_command",
        "arguments": args, "call_id": call, "internal_chat_message_metadata_passthrough": {"turn_id": turn}}),
    )
}
pub fn token_usage(thread: &str, turn: &str) -> (&'static str, Value) {
    (
        "token_usage_record",
        json!({"thread_id": thread, "turn_id": turn, "session_id": thread, "root_turn_id": turn,
        "response_id": "resp_1", "usage": {"input_tokens": 10, "output_tokens": 5}}),
    )
}
pub fn exec_completed(thread: &str, turn: &str, call: &str) -> (&'static str, Value) {
    (
        "event_msg",
        json!({"type": "item_completed", "thread_id": thread, "turn_id": turn,
        "item": {"type": "CommandExecution", "id": call, "process_id": "7010", "command": ["/bin/bash", "-lc", "true"],
                 "aggregated_output": "", "exit_code": 0}}),
    )
}
pub fn function_call_output(call: &str) -> (&'static str, Value) {
    (
        "response_item",
        json!({"type": "function_call_output", "id": format!("fco_{call}"), "call_id": call,
        "output": "Process exited with code 0"}),
    )
}
pub fn assistant_message(turn: &str, text: &str) -> (&'static str, Value) {
    (
        "response_item",
        json!({"type": "message", "id": "msg_a", "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
        "internal_chat_message_metadata_passthrough": {"turn_id": turn}}),
    )
}
