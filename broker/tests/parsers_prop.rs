//! Property tests of the parsers of what Codex writes, with model- and user-controlled text
//! inside: hook payloads, rollout lines, Courier's markers and Codex's XML escaping, rollout file
//! names. None may panic, and none may allocate much more than the input it was given. Long run
//! by hand: `PROPTEST_CASES=200000 cargo test -p broker --release --test parsers_prop`.

use broker::codex::hook::HookPayload;
use broker::codex::rollout::{classify_line, thread_id_from_path, xml_unescape, RolloutEvent};
use broker::envelope::{marker_ids, MARKER_PREFIX};
use courier_shared::ids::is_uuid;
use proptest::prelude::*;

use courier_shared::alloc_probe::largest_alloc;

#[global_allocator]
static GLOBAL: courier_shared::alloc_probe::Tracking = courier_shared::alloc_probe::Tracking;

/// JSON-ish text built from the tokens the parsers look for.
fn jsonish() -> impl Strategy<Value = String> {
    let tokens = prop::sample::select(vec![
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "\"",
        "\\",
        "\"type\"",
        "\"payload\"",
        "\"session_meta\"",
        "\"event_msg\"",
        "\"task_started\"",
        "\"task_complete\"",
        "\"turn_aborted\"",
        "\"response_item\"",
        "\"message\"",
        "\"role\"",
        "\"developer\"",
        "\"user\"",
        "\"content\"",
        "\"text\"",
        "\"turn_id\"",
        "\"id\"",
        "\"content_item_kinds\"",
        "\"hooks.additional_context\"",
        "\"internal_chat_message_metadata_passthrough\"",
        "<courier-message id=\\\"",
        "<hook_prompt",
        "&lt;",
        "&amp;",
        "&",
        "null",
        "1",
        "true",
        "\"x\"",
        " ",
        "\u{e9}",
        "\u{1F600}",
    ]);
    prop::collection::vec(tokens, 0..64).prop_map(|t| t.concat())
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&apos;")
}

proptest! {
    #[test]
    fn hook_payloads_parse_or_fail_cleanly(text in jsonish(), raw in ".*") {
        for t in [&text, &raw] {
            if let Ok(p) = serde_json::from_str::<HookPayload>(t) {
                let _ = p.event();
            }
        }
    }

    #[test]
    fn rollout_lines_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..4096), text in jsonish()) {
        let _ = classify_line(&bytes);
        let (_, largest) = largest_alloc(|| classify_line(text.as_bytes()));
        prop_assert!(largest <= 16 * text.len() + 64 * 1024);
    }

    #[test]
    fn hook_context_lines_yield_their_markers(id in "m_[0-9a-f]{16}", body in ".*", turn in "[0-9a-f-]{1,36}") {
        let text = format!("{MARKER_PREFIX}{id}\" from=\"x\">{}</courier-message>", body.replace('"', "'"));
        let line = serde_json::json!({"type": "response_item", "payload": {"type": "message", "role": "developer",
            "content": [{"type": "input_text", "text": text}],
            "internal_chat_message_metadata_passthrough": {"turn_id": turn, "content_item_kinds": ["hooks.additional_context"],
                "content_item_metadata": [{"provenance": {"type": "harness", "hook": true}}]}}})
            .to_string();
        match classify_line(line.as_bytes()) {
            Some(RolloutEvent::HookText { text, .. }) => prop_assert_eq!(marker_ids(&text).next(), Some(id.as_str())),
            other => prop_assert!(false, "{other:?}"),
        }
        // The same text as a Stop prompt, escaped the way Codex escapes it.
        let prompt = format!("<hook_prompt hook_run_id=\"stop:1\">{}</hook_prompt>", escape(&text));
        let line = serde_json::json!({"type": "response_item", "payload": {"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": prompt}],
            "internal_chat_message_metadata_passthrough": {"content_item_metadata": [{"provenance": {"type": "harness", "hook": true}}]}}}).to_string();
        match classify_line(line.as_bytes()) {
            Some(RolloutEvent::HookText { text, .. }) => prop_assert_eq!(marker_ids(&text).next(), Some(id.as_str())),
            other => prop_assert!(false, "{other:?}"),
        }
    }

    #[test]
    fn xml_unescape_inverts_escape_and_never_grows(s in ".*", noise in jsonish()) {
        prop_assert_eq!(xml_unescape(&escape(&s)), s.clone());
        for t in [&s, &noise] {
            prop_assert!(xml_unescape(t).len() <= t.len());
        }
    }

    #[test]
    fn marker_ids_are_quoted_substrings(text in jsonish(), s in ".*") {
        for t in [text, format!("{MARKER_PREFIX}{s}")] {
            for id in marker_ids(&t) {
                prop_assert!(!id.contains('"'));
                let quoted = format!("{MARKER_PREFIX}{id}\"");
                prop_assert!(t.contains(&quoted));
            }
        }
    }

    #[test]
    fn thread_ids_come_only_from_well_formed_names(p in ".*", uuid in "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}") {
        if let Some(id) = thread_id_from_path(&p) {
            prop_assert!(is_uuid(id));
            let suffix = format!("{id}.jsonl");
            prop_assert!(p.ends_with(&suffix));
        }
        let good = format!("/h/sessions/rollout-2026-11-29T08-01-16-{uuid}.jsonl");
        prop_assert_eq!(thread_id_from_path(&good), Some(uuid.as_str()));
    }
}
