//! Property tests of the wire parsers, which see bytes from any local process: frames and
//! requests. None may panic, and none may allocate much more than the input it was given. (The
//! parsers of what Codex writes, hook payloads and rollout lines, are tested the same way in
//! `broker/tests/parsers_prop.rs`.) Long run by hand: `PROPTEST_CASES=200000 cargo test -p
//! courier-shared --release --test parsers_prop`.

use courier_shared::wire::{self, Request, MAX_FRAME};
use proptest::prelude::*;

use courier_shared::alloc_probe::largest_alloc;

#[global_allocator]
static GLOBAL: courier_shared::alloc_probe::Tracking = courier_shared::alloc_probe::Tracking;

/// Bytes that look like a frame: a length prefix (often a lie) and some body.
fn frame_bytes() -> impl Strategy<Value = Vec<u8>> {
    (any::<u32>(), prop::collection::vec(any::<u8>(), 0..2048), 0u8..3).prop_map(|(len, body, kind)| {
        let len = match kind {
            0 => body.len() as u32,
            1 => len % (MAX_FRAME as u32 + 1), // a plausible lie
            _ => len,
        };
        let mut v = len.to_be_bytes().to_vec();
        v.extend_from_slice(&body);
        v
    })
}

/// JSON-ish text built from the tokens a request or reply is made of.
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
        "\"op\"",
        "\"v\"",
        "\"pid\"",
        "\"ts_ms\"",
        "\"payload\"",
        "\"mac\"",
        "\"lease\"",
        "\"output\"",
        "\"hook\"",
        "\"ack\"",
        "\"context_limit\"",
        "null",
        "1",
        "-1",
        "18446744073709551616",
        "true",
        "\"x\"",
        " ",
        "\u{e9}",
        "\u{1F600}",
    ]);
    prop::collection::vec(tokens, 0..64).prop_map(|t| t.concat())
}

proptest! {
    #[test]
    fn read_frame_never_panics_and_allocates_by_what_arrives(bytes in frame_bytes(), max in 0usize..=MAX_FRAME) {
        let (res, largest) = largest_alloc(|| wire::read_frame(&mut &bytes[..], max));
        // A claimed length is not an allocation: only what arrives is buffered (plus a read chunk).
        prop_assert!(largest <= 2 * bytes.len() + 64 * 1024, "allocated {largest} for {} input bytes", bytes.len());
        if let Ok(body) = res {
            prop_assert!(body.len() <= max);
            prop_assert_eq!(&body[..], &bytes[4..4 + body.len()]);
        }
    }

    #[test]
    fn frames_round_trip(body in prop::collection::vec(any::<u8>(), 0..4096)) {
        let mut buf = Vec::new();
        wire::write_frame(&mut buf, &body).unwrap();
        prop_assert_eq!(wire::read_frame(&mut &buf[..], MAX_FRAME).unwrap(), body);
    }

    #[test]
    fn requests_parse_or_fail_cleanly(bytes in frame_bytes(), text in jsonish()) {
        let _ = wire::read_json::<_, Request>(&mut &bytes[..], MAX_FRAME);
        let _ = serde_json::from_str::<Request>(&text);
        let _ = serde_json::from_str::<wire::HookReply>(&text);
    }

    #[test]
    fn requests_round_trip(pid in any::<u32>(), ts in any::<u64>(), payload in ".*", mac in "[0-9a-f]{0,64}") {
        let req = Request::Hook { v: wire::PROTOCOL_VERSION, pid, ts_ms: ts, payload, mac, context_limit: None, host_event: None };
        let mut buf = Vec::new();
        wire::write_json(&mut buf, &req).unwrap();
        prop_assert_eq!(wire::read_json::<_, Request>(&mut &buf[..], MAX_FRAME).unwrap(), req);
    }
}

/// The allocation bounds above mean something only if the probe really sees allocations.
#[test]
fn alloc_probe_sees_allocations() {
    let (v, largest) = largest_alloc(|| vec![7u8; 100_000]);
    assert_eq!(v.len(), 100_000);
    assert!(largest >= 100_000, "probe saw {largest}");
    let (_, nothing) = largest_alloc(|| 1 + 1);
    assert_eq!(nothing, 0);
}
