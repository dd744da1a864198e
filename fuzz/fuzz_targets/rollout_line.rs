//! Rollout lines (files Codex writes, with model- and user-controlled text inside), the marker
//! search and the forging defence.
//! Checks on arbitrary bytes: `classify_line`, `marker_ids`, `xml_unescape` and
//! `thread_id_from_path` never panic; every marker id is a quoted substring of its text;
//! unescaping never grows text and inverts escaping; a thread id is a well-formed uuid that ends
//! the rollout file name.
//! Round trip on the input as message text: messages wrapped the way the broker wraps them
//! (`broker::envelope::wrap_message`) yield exactly their own ids, in order:
//! in the wrapped text, in a hook `additionalContext` developer line, and in a Stop `<hook_prompt>`
//! user line after Codex's XML escaping and `classify_line`'s one unescape. The same text said by
//! the model is no delivery.

#![no_main]

use broker::envelope::wrap_message;
use codex_format::rollout::{classify_line, marker_ids, thread_id_from_path, xml_unescape, RolloutEvent, MARKER_PREFIX};
use courier_shared::ids::is_uuid;
use libfuzzer_sys::fuzz_target;
use serde_json::json;

/// How the broker wraps a message (`broker/src/delivery.rs` `wrap` calls this).
fn wrap(id: &str, from: &str, body: &str) -> String {
    wrap_message(id, from, body)
}

/// XML text escaping as Codex applies it to a Stop block reason: all five entities, or only the
/// three that XML requires in text (either must survive the broker's single unescape).
fn xml_escape(s: &str, all: bool) -> String {
    let s = s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    if all { s.replace('"', "&quot;").replace('\'', "&apos;") } else { s }
}

/// A message line; `hook_context` gives it the kind of `additionalContext`, `by_hook` the harness/hook
/// provenance Codex puts on all hook output.
fn message_line(role: &str, text: &str, hook_context: bool, by_hook: bool) -> Vec<u8> {
    let mut payload = json!({"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]});
    let kinds = if hook_context { json!(["hooks.additional_context"]) } else { json!([]) };
    let provenance = if by_hook { json!({"type": "harness", "hook": true}) } else { json!({"type": "user"}) };
    payload["internal_chat_message_metadata_passthrough"] =
        json!({"turn_id": "T1", "content_item_kinds": kinds, "content_item_metadata": [{"provenance": provenance}]});
    json!({"timestamp": "t", "ordinal": 7, "type": "response_item", "payload": payload}).to_string().into_bytes()
}

fn check_markers(text: &str) {
    for id in marker_ids(text) {
        assert!(!id.contains('"'));
        assert!(text.contains(&format!("{MARKER_PREFIX}{id}\"")));
    }
}

fn hook_text(line: &[u8]) -> String {
    match classify_line(line) {
        Some(RolloutEvent::HookText { text, .. }) => text,
        other => panic!("not hook text: {other:?} for {}", String::from_utf8_lossy(line)),
    }
}

fn hex_id(bytes: &[u8]) -> String {
    let mut id = String::from("m_");
    for b in bytes.iter().chain(std::iter::repeat(&0)).take(8) {
        id.push_str(&format!("{b:02x}"));
    }
    id
}

fuzz_target!(|data: &[u8]| {
    // Arbitrary bytes as a rollout line.
    match classify_line(data) {
        Some(RolloutEvent::HookText { text, .. } | RolloutEvent::UserInput { text, .. }) => check_markers(&text),
        Some(RolloutEvent::SessionMeta { .. } | RolloutEvent::TurnStarted { .. } | RolloutEvent::TurnClosed { .. } | RolloutEvent::Compacted) | None => {}
    }
    let text = String::from_utf8_lossy(data);
    check_markers(&text);
    let un = xml_unescape(&text);
    assert!(un.len() <= text.len());
    for all in [true, false] {
        assert_eq!(xml_unescape(&xml_escape(&text, all)), text);
    }
    if let Some(id) = thread_id_from_path(&text) {
        assert!(is_uuid(id));
        let name = text.rsplit('/').next().unwrap();
        assert!(name.starts_with("rollout-") && name.ends_with(&format!("{id}.jsonl")));
    }

    // The input as message text: `from \0 body1 \0 body2`, ids taken from its first 16 bytes.
    let mut parts = text.splitn(3, '\0');
    let (from, body1, body2) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next());
    let id1 = hex_id(data.get(..8).unwrap_or(data));
    let id2 = hex_id(data.get(8..16).unwrap_or(b"\xff"));
    let mut wrapped = wrap(&id1, from, body1);
    let mut ids = vec![id1.as_str()];
    if let Some(body2) = body2.filter(|_| id2 != id1) {
        // `render` joins a batch with newlines.
        wrapped = format!("{wrapped}\n{}", wrap(&id2, from, body2));
        ids.push(&id2);
    }
    assert_eq!(marker_ids(&wrapped).collect::<Vec<_>>(), ids, "wrapped: {wrapped:?}");
    let dev = hook_text(&message_line("developer", &wrapped, true, true));
    assert_eq!(marker_ids(&dev).collect::<Vec<_>>(), ids, "developer: {dev:?}");
    for all in [true, false] {
        let prompt = format!("<hook_prompt hook_run_id=\"stop:1:/h/hooks.json\">{}</hook_prompt>", xml_escape(&wrapped, all));
        let stop = hook_text(&message_line("user", &prompt, false, true));
        // The same prompt typed by the person is no delivery.
        assert_eq!(classify_line(&message_line("user", &prompt, false, false)), None);
        assert_eq!(marker_ids(&stop).collect::<Vec<_>>(), ids, "stop: {stop:?}");
    }
    // Said by the model, or typed by the user without a hook prompt, it is no delivery.
    assert_eq!(classify_line(&message_line("assistant", &wrapped, false, true)), None);
    assert_eq!(classify_line(&message_line("developer", &wrapped, false, true)), None);
    assert_eq!(classify_line(&message_line("user", &wrapped, false, true)), None);
});
