//! Hook payloads as Codex writes them to the hook's stdin, and the outputs Courier answers with.
//! Checks: parsing arbitrary bytes never panics; event names map back and forth; for every event
//! and any text (the input itself, and each string field of a parsed payload), `delivery_output` is
//! one line of JSON that hands exactly that text to the model in the field Codex reads.

#![no_main]

use broker::codex::hook::{delivery_output, HookEvent, HookPayload};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const ALL: [HookEvent; 8] = [
    HookEvent::SessionStart,
    HookEvent::UserPromptSubmit,
    HookEvent::PreToolUse,
    HookEvent::PostToolUse,
    HookEvent::Stop,
    HookEvent::SubagentStart,
    HookEvent::SubagentStop,
    HookEvent::Other,
];

fn check_output(event: HookEvent, text: &str) {
    let out = delivery_output(event, text);
    // Codex reads the hook's stdout as one JSON document; control characters must be escaped.
    assert!(!out.contains('\n') && !out.contains('\r'), "raw newline in {out:?}");
    let v: Value = serde_json::from_str(&out).expect("delivery output is JSON");
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
        for event in ALL {
            assert_eq!(HookEvent::parse(event.as_str()), event);
            check_output(event, text);
        }
    }
});
