//! The JSON-lines wire of the producers' socket requests, for both sides: its limits, error
//! replies, writing a line, and one client call (the request format is in `proto.rs`).

use anyhow::{Context, Result};
pub use courier_shared::wire::{ErrorCode, ErrorReply};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Longest request line.
pub const MAX_LINE: usize = 256 * 1024;
/// Longest reply line a client reads (a `threads` reply can be long).
pub const MAX_REPLY: usize = 16 << 20;

/// An error reply.
pub fn error(code: ErrorCode, message: &str) -> Value {
    serde_json::to_value(ErrorReply::new(code, message)).unwrap_or_default()
}

/// Writes `value` as one line and flushes.
pub fn write_line(w: &mut impl Write, value: &impl serde::Serialize) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line)?;
    w.flush()
}

/// Sends one request to the broker at `socket` and reads its reply line. `Ok(None)`: no broker
/// listens there. `Err`: the connection failed after connecting (the broker stopped mid-request).
/// `timeout` bounds the reply (none: a wait that takes as long as it takes).
pub fn call(socket: &Path, request: &impl serde::Serialize, timeout: Option<Duration>) -> Result<Option<Value>> {
    let mut stream = match UnixStream::connect(socket) {
        Ok(s) => s,
        Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused) => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("connecting to {}", socket.display())),
    };
    stream.set_read_timeout(timeout)?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    write_line(&mut stream, request).context("writing the request")?;
    let mut line = Vec::new();
    BufReader::new(stream.take(MAX_REPLY as u64)).read_until(b'\n', &mut line).context("reading the reply")?;
    if line.last() != Some(&b'\n') {
        anyhow::bail!("the broker closed the connection without a reply");
    }
    Ok(Some(serde_json::from_slice(&line).context("the broker's reply is not JSON")?))
}
