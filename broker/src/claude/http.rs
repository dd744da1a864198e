//! The smallest HTTP/1.1 the hook endpoint needs: one `POST /hook/<Event>` per connection, with a
//! `Content-Length` body, read under one deadline and bounded in size; one JSON answer, then the
//! connection closes. Anything else is a [`BadRequest`] (answered `{}` all the same: a refusal
//! never breaks the session).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

/// Most bytes of request line and headers.
pub const MAX_HEAD: usize = 16 * 1024;
/// Most bytes of a body: a hook payload carries the tool's input and output (Claude Code keeps a
/// Bash output to about 30,000 characters; a Read of a large file can be more).
pub const MAX_BODY: usize = 4 << 20;

/// One hook request as read off the wire.
#[derive(Debug)]
pub struct HookRequest {
    /// The `<Event>` of `/hook/<Event>`.
    pub event: String,
    pub body: Vec<u8>,
}

/// Why a request was not read.
#[derive(Debug)]
pub struct BadRequest(pub String);

/// Reads one request from `conn` by `deadline`.
pub fn read_request(conn: &mut TcpStream, deadline: Instant) -> Result<HookRequest, BadRequest> {
    let mut buf = Vec::with_capacity(4096);
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i;
        }
        if buf.len() >= MAX_HEAD {
            return Err(BadRequest(format!("request head over {MAX_HEAD} bytes")));
        }
        read_some(conn, &mut buf, MAX_HEAD + 4, deadline)?;
    };
    let head = std::str::from_utf8(&buf[..head_end]).map_err(|_| BadRequest("request head is not UTF-8".into()))?;
    let (event, length) = parse_head(head)?;
    if length > MAX_BODY {
        return Err(BadRequest(format!("body of {length} bytes, over {MAX_BODY}")));
    }
    let mut body = buf.split_off(head_end + 4);
    if body.len() > length {
        return Err(BadRequest("more bytes than Content-Length (one request per connection)".into()));
    }
    while body.len() < length {
        read_some(conn, &mut body, length, deadline)?;
    }
    Ok(HookRequest { event, body })
}

/// The event of `POST /hook/<Event> HTTP/1.1` and the `Content-Length`; no other transfer coding.
fn parse_head(head: &str) -> Result<(String, usize), BadRequest> {
    let mut lines = head.split("\r\n");
    let line = lines.next().unwrap_or("");
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next(), parts.next(), parts.next());
    if method != Some("POST") || !matches!(version, Some("HTTP/1.1" | "HTTP/1.0")) || parts.next().is_some() {
        return Err(BadRequest(format!("not a POST request line: {:?}", truncate(line))));
    }
    // A query string is ignored (two registrations of one event may differ only by it).
    let event = target
        .and_then(|t| t.split('?').next())
        .and_then(|t| t.strip_prefix("/hook/"))
        .filter(|e| !e.is_empty() && e.len() <= 64 && e.bytes().all(|b| b.is_ascii_alphanumeric()))
        .ok_or_else(|| BadRequest(format!("not a /hook/<Event> path: {:?}", truncate(target.unwrap_or("")))))?;
    let mut length = None;
    for h in lines {
        let (name, value) = h.split_once(':').ok_or_else(|| BadRequest("a header line without ':'".into()))?;
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(BadRequest("Transfer-Encoding is not accepted".into()));
        }
        if name.eq_ignore_ascii_case("content-length") {
            let n = value.parse::<usize>().map_err(|_| BadRequest(format!("Content-Length {value:?}")))?;
            if length.replace(n).is_some_and(|m| m != n) {
                return Err(BadRequest("two Content-Length headers".into()));
            }
        }
    }
    Ok((event.to_string(), length.ok_or_else(|| BadRequest("no Content-Length".into()))?))
}

/// One read into `buf` (at most up to `cap` bytes in all), before `deadline`.
fn read_some(conn: &mut TcpStream, buf: &mut Vec<u8>, cap: usize, deadline: Instant) -> Result<(), BadRequest> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(BadRequest("no complete request before the deadline".into()));
    }
    conn.set_read_timeout(Some(left)).map_err(|e| BadRequest(e.to_string()))?;
    let mut chunk = [0u8; 16 * 1024];
    let want = chunk.len().min(cap.saturating_sub(buf.len())).max(1);
    match conn.read(&mut chunk[..want]) {
        Ok(0) => Err(BadRequest("the connection closed mid-request".into())),
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
            Err(BadRequest("no complete request before the deadline".into()))
        }
        Err(e) => Err(BadRequest(e.to_string())),
    }
}

/// Writes `200 OK` with the JSON `body`, bounded by `deadline`; the connection closes after.
pub fn write_answer(conn: &mut TcpStream, body: &str, deadline: Instant) -> io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now()).max(std::time::Duration::from_millis(1));
    conn.set_write_timeout(Some(left))?;
    let head = format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    conn.write_all(head.as_bytes())?;
    conn.write_all(body.as_bytes())?;
    conn.flush()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(80) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_event_and_length_and_refuses_the_rest() {
        let ok = parse_head("POST /hook/PostToolUse HTTP/1.1\r\nHost: x\r\ncontent-length: 12").unwrap();
        assert_eq!(ok, ("PostToolUse".to_string(), 12));
        let query = parse_head("POST /hook/Stop?again HTTP/1.1\r\nContent-Length: 2").unwrap();
        assert_eq!(query, ("Stop".to_string(), 2));
        for bad in [
            "GET /hook/Stop HTTP/1.1\r\nContent-Length: 0",
            "POST /other HTTP/1.1\r\nContent-Length: 0",
            "POST /hook/ HTTP/1.1\r\nContent-Length: 0",
            "POST /hook/a/../b HTTP/1.1\r\nContent-Length: 0",
            "POST /hook/Stop HTTP/1.1",
            "POST /hook/Stop HTTP/1.1\r\nTransfer-Encoding: chunked",
            "POST /hook/Stop HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2",
            "POST /hook/Stop HTTP/1.1\r\nContent-Length: -1",
        ] {
            assert!(parse_head(bad).is_err(), "{bad:?}");
        }
    }
}
