//! The broker protocol: length-prefixed JSON frames over the per-login Unix socket.
//!
//! A frame is a 4-byte big-endian length followed by that many bytes of JSON. One hook call is:
//! client `Hook` -> broker `HookReply` -> (if the reply leases messages) client `Ack` -> broker
//! `AckReply`. The client prints the reply's output before it acks, and exits 0 only if the ack was
//! accepted: Codex ignores the stdout of a hook that exits non-zero, so an unacknowledged lease
//! can never reach the model.

use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};

pub const PROTOCOL_VERSION: u32 = 1;
/// Largest frame either side accepts. Hook payloads larger than [`MAX_PAYLOAD`] are not forwarded.
pub const MAX_FRAME: usize = 4 << 20;
/// Largest hook payload (stdin) the client forwards; the JSON escaping of a frame can grow it.
pub const MAX_PAYLOAD: usize = 1 << 20;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// A hook payload exactly as Codex wrote it to the client's stdin.
    Hook {
        v: u32,
        /// The client's own pid; must equal the socket peer's pid.
        pid: u32,
        /// Client wall clock, ms since the epoch: bounds replay of a captured request.
        ts_ms: u64,
        payload: String,
        /// Hex HMAC-SHA256 over (pid, ts_ms, payload) under the per-login secret.
        mac: String,
    },
    /// The client has written and flushed the output of lease `lease`.
    Ack { v: u32, lease: u64 },
    /// Liveness and counters, for `broker inspect` and `broker doctor`.
    Status { v: u32 },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct HookReply {
    pub v: u32,
    /// Exact stdout for Codex; empty when there is nothing to deliver or the call was refused.
    pub output: String,
    /// Fencing token of the lease that `output` carries, to be acked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AckReply {
    pub v: u32,
    pub accepted: bool,
}

pub fn write_frame<W: Write>(w: &mut W, body: &[u8]) -> io::Result<()> {
    if body.len() > MAX_FRAME {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "frame too large"));
    }
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
    buf.extend_from_slice(body);
    w.write_all(&buf)
}

pub fn write_json<W: Write, T: Serialize>(w: &mut W, value: &T) -> io::Result<()> {
    let body = serde_json::to_vec(value).map_err(io::Error::other)?;
    write_frame(w, &body)
}

/// Reads one frame. A length over `max` is an error before any allocation; below it, memory
/// grows only with the bytes that actually arrive.
pub fn read_frame<R: Read>(r: &mut R, max: usize) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > max {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("frame of {len} bytes exceeds limit {max}")));
    }
    // Grow with what arrives, not with what the prefix claims: a lying prefix costs nothing.
    let mut body = Vec::with_capacity(len.min(64 * 1024));
    r.take(len as u64).read_to_end(&mut body)?;
    if body.len() != len {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("frame truncated at {} of {len} bytes", body.len())));
    }
    Ok(body)
}

pub fn read_json<R: Read, T: for<'de> Deserialize<'de>>(r: &mut R, max: usize) -> io::Result<T> {
    let body = read_frame(r, max)?;
    serde_json::from_slice(&body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_round_trip() {
        let req = Request::Hook { v: 1, pid: 7, ts_ms: 9, payload: "{\"a\":1}".into(), mac: "00".into() };
        let mut buf = Vec::new();
        write_json(&mut buf, &req).unwrap();
        let back: Request = read_json(&mut &buf[..], MAX_FRAME).unwrap();
        assert_eq!(back, req);
    }

    #[test]
    fn oversized_length_is_rejected_before_allocating() {
        let buf = u32::MAX.to_be_bytes();
        let err = read_frame(&mut &buf[..], MAX_FRAME).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn truncated_frame_is_an_error() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"hello").unwrap();
        buf.truncate(6);
        assert_eq!(read_frame(&mut &buf[..], 100).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }
}
