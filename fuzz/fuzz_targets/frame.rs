//! Wire frames and broker requests from arbitrary bytes (any local process can write them).
//! Input: 2 bytes of frame limit (0..=65535, so limits are hit often), then the byte stream.
//! Checks: no panic; every frame read is exactly the bytes that followed its prefix and within the
//! limit; no single allocation larger than the input justifies (a lying length prefix is free);
//! every request that parses survives a write/read round trip unchanged.

#![no_main]

use courier_shared::wire::{self, AckReply, HookReply, Request, MAX_FRAME};
use libfuzzer_sys::fuzz_target;

use courier_shared::alloc_probe::largest_alloc;

#[global_allocator]
static GLOBAL: courier_shared::alloc_probe::Tracking = courier_shared::alloc_probe::Tracking;

/// What reading `stream` may cost at most: the bytes that arrived (Vec doubling) plus the
/// 64 KiB first read chunk, plus small change for an error message.
fn budget(stream: &[u8]) -> usize {
    2 * stream.len() + 64 * 1024 + 256
}

/// Reads successive frames as a connection would; returns how many were read.
fn read_all(stream: &[u8], max: usize) -> usize {
    let mut r = stream;
    let mut at = 0;
    let mut n = 0;
    while let Ok(body) = wire::read_frame(&mut r, max) {
        assert!(body.len() <= max, "frame of {} over limit {max}", body.len());
        assert_eq!(&stream[at..at + 4], &(body.len() as u32).to_be_bytes());
        assert_eq!(&body[..], &stream[at + 4..at + 4 + body.len()]);
        at += 4 + body.len();
        assert_eq!(r.len(), stream.len() - at);
        n += 1;
    }
    n
}

fn round_trip<T>(value: &T)
where
    T: serde::Serialize + for<'de> serde::Deserialize<'de> + PartialEq + std::fmt::Debug,
{
    let mut buf = Vec::new();
    wire::write_json(&mut buf, value).expect("a parsed value serializes");
    let back: T = wire::read_json(&mut &buf[..], MAX_FRAME).expect("a written frame reads back");
    assert_eq!(&back, value);
}

fuzz_target!(|data: &[u8]| {
    let Some((max, stream)) = data.split_first_chunk::<2>() else { return };
    let max = u16::from_be_bytes(*max) as usize;
    for max in [max, MAX_FRAME] {
        let (_, largest) = largest_alloc(|| read_all(stream, max));
        assert!(largest <= budget(stream), "allocated {largest} for {} input bytes", stream.len());
        let (req, largest) = largest_alloc(|| wire::read_json::<_, Request>(&mut &stream[..], max));
        // serde_json may build strings a few times the frame's size, never more.
        assert!(largest <= 4 * budget(stream), "allocated {largest} for {} input bytes", stream.len());
        if let Ok(req) = req {
            round_trip(&req);
        }
        if let Ok(reply) = wire::read_json::<_, HookReply>(&mut &stream[..], max) {
            round_trip(&reply);
        }
        if let Ok(reply) = wire::read_json::<_, AckReply>(&mut &stream[..], max) {
            round_trip(&reply);
        }
    }
});
