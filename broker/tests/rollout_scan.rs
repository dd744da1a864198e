//! The confirmation scan (`delivery::reconcile`) against a rollout with one huge line:
//! streamed past with bounded memory, and a line still being written is not read
//! again from its start on every pass. Its own test binary, so the tracking allocator and the
//! process's read counter (`/proc/self/io` `rchar`) see only this test.

use broker::delivery::reconcile;
use broker::os::ProcessKey;
use broker::store::{Channel, HandOff, Store};
use codex_format::hook::HookEvent;
use std::io::Write;
use std::time::Instant;

#[global_allocator]
static GLOBAL: courier_shared::alloc_probe::Tracking = courier_shared::alloc_probe::Tracking;

const T: &courier_shared::ids::ThreadId = &courier_shared::ids::ThreadId::from_static("01a22652-96c4-7652-bf64-6f7bc9883ce2");
const MIB: u64 = 1 << 20;

/// Bytes this process has read with read(2)/pread(2) so far.
fn rchar() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap();
    io.lines().find_map(|l| l.strip_prefix("rchar: ")).unwrap().trim().parse().unwrap()
}

fn hook_context(text: &str) -> String {
    serde_json::json!({"timestamp": "t", "type": "response_item", "payload": {"type": "message", "role": "developer",
        "content": [{"type": "input_text", "text": text}],
        "internal_chat_message_metadata_passthrough": {"turn_id": "T1", "content_item_kinds": ["hooks.additional_context"],
            "content_item_metadata": [{"provenance": {"type": "harness", "hook": true}}]}}})
    .to_string()
        + "\n"
}

#[test]
fn a_100_mib_line_is_streamed_past_and_a_partial_line_is_not_reread() {
    let dir = std::env::temp_dir().join(format!("courier-scan-big-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut store = Store::open(&dir).unwrap();
    let path = dir.join(format!("rollout-2026-11-29T08-01-16-{T}.jsonl"));
    let mut w = std::fs::OpenOptions::new().create(true).append(true).open(&path).unwrap();
    w.write_all(format!(r#"{{"type":"session_meta","payload":{{"id":"{T}"}}}}"#).as_bytes()).unwrap();
    w.write_all(b"\n").unwrap();
    store.enqueue(T, "hello", Some("test"), None, None).unwrap();
    let lease = store.lease(T, Channel::Hook(HookEvent::PostToolUse), Some("T1"), 60_000, 8192).unwrap().unwrap();
    let offset = std::fs::metadata(&path).unwrap().len();
    let me = ProcessKey::of(std::process::id() as i32).unwrap();
    assert!(store.hand_off(lease.token, &HandOff::at(path.to_str().unwrap(), offset, me)).unwrap());

    // 100 MiB of one tool output line, not finished yet.
    w.write_all(br#"{"timestamp":"t","type":"response_item","payload":{"type":"function_call_output","output":""#).unwrap();
    let block = vec![b'y'; MIB as usize];
    for _ in 0..100 {
        w.write_all(&block).unwrap();
    }
    let read0 = rchar();
    let t0 = Instant::now();
    let (r, largest) = courier_shared::alloc_probe::largest_alloc(|| reconcile(&mut store, None));
    let took = t0.elapsed();
    r.unwrap();
    let read = rchar() - read0;
    eprintln!("first scan of a 100 MiB partial line: read {} MiB in {took:?}, largest allocation {} KiB", read / MIB, largest / 1024);
    assert!(largest < 2 * MIB as usize, "one allocation of {largest} bytes");
    assert!(read >= 100 * MIB, "the scan read the line ({read} bytes)");

    // Nothing new: nothing read again (a few KiB of SQLite pages at most).
    for _ in 0..3 {
        let read0 = rchar();
        reconcile(&mut store, None).unwrap();
        let again = rchar() - read0;
        assert!(again < 256 * 1024, "the partial line was read again: {again} bytes");
    }
    // A little more of the same line: only that is read.
    w.write_all(&block[..1000]).unwrap();
    let read0 = rchar();
    reconcile(&mut store, None).unwrap();
    assert!(rchar() - read0 < 256 * 1024);
    assert_eq!(store.messages(Some(T)).unwrap()[0].state, "handed");

    // The line ends; the hook message after it confirms the delivery.
    w.write_all(b"\"}}\n").unwrap();
    let m = &lease.messages[0];
    w.write_all(hook_context(&m.wrapped()).as_bytes()).unwrap();
    let read0 = rchar();
    let (r, largest) = courier_shared::alloc_probe::largest_alloc(|| reconcile(&mut store, None));
    r.unwrap();
    assert!(rchar() - read0 < 256 * 1024);
    assert!(largest < 2 * MIB as usize, "one allocation of {largest} bytes");
    let after = &store.messages(Some(T)).unwrap()[0];
    assert_eq!(after.state, "confirmed", "{after:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
