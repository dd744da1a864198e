//! Hook payloads as Codex writes them to the hook's stdin, and the outputs Courier answers with.
//! Checks: parsing arbitrary bytes never panics; event names map back and forth; for every registered event
//! and any text (the input itself, and each string field of a parsed payload), `delivery_output` is
//! one line of JSON that hands exactly that text to the model in the field Codex reads.

#![no_main]

use codex_format::hook::{delivery_output, HookEvent, HookPayload};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// `delivery_output` for `event` hands exactly `text` to the model, with and without a notice
/// line for the person (`systemMessage`, here `text` too).
fn check_output(event: HookEvent, text: &str) {
    check_output_with(event, text, None);
    check_output_with(event, text, Some(text));
}

fn check_output_with(event: HookEvent, text: &str, notice: Option<&str>) {
    let out = delivery_output(event, text, notice);
    // Codex reads the hook's stdout as one JSON document; control characters must be escaped.
    assert!(!out.contains('\n') && !out.contains('\r'), "raw newline in {out:?}");
    let mut v: Value = serde_json::from_str(&out).expect("delivery output is JSON");
    let shown = v.as_object_mut().and_then(|o| o.remove("systemMessage"));
    assert_eq!(shown.as_ref().and_then(Value::as_str), notice, "the notice, exactly, and only when given");
    match event {
        HookEvent::Stop => {
            assert_eq!(v.as_object().map(|o| o.len()), Some(2));
            assert_eq!(v["decision"], "block");
            assert_eq!(v["reason"].as_str(), Some(text));
        }
        _ => {
            assert_eq!(v.as_object().map(|o| o.len()), Some(1));
            let h = &v["hookSpecificOutput"];
            assert_eq!(h["hookEventName"].as_str(), Some(event.as_str()));
            assert_eq!(h["additionalContext"].as_str(), Some(text));
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = serde_json::from_slice::<HookPayload>(data) {
        let event = p.event();
        assert!(event == HookEvent::Other || event.as_str() == p.hook_event_name);
        assert_eq!(HookEvent::parse(event.as_str()), event);
        let fields = [&p.session_id, &p.transcript_path, &p.turn_id, &p.agent_id, &p.agent_transcript_path, &p.tool_name];
        check_output(event, &p.hook_event_name);
        for text in fields.into_iter().flatten() {
            check_output(event, text);
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        // Every event `broker install` registers (the hook-client sees no other).
        for event in HookEvent::REGISTERED {
            assert_eq!(HookEvent::parse(event.as_str()), event);
            check_output(event, text);
        }
    }
});
