//! A minimal JSON-RPC-over-WebSocket client for `codex app-server --listen unix://PATH`, std only:
//! HTTP/1.1 Upgrade handshake, then one JSON message per text frame (client frames masked).
//! Every read and write is bounded by one deadline for the whole exchange.

use serde_json::{json, Value};
use sha1::{Digest, Sha1};
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

const MAX_MESSAGE: usize = 4 << 20;
const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// One JSON-RPC session over a WebSocket on a Unix socket (the broker's effort and wake channels,
/// and the test kit's app-server client).
pub struct WsClient {
    stream: UnixStream,
    deadline: Instant,
    buf: Vec<u8>,
    next_id: u64,
}

/// Why an exchange stopped; `sent` tells whether the request at stake may have reached the server.
#[derive(Debug)]
pub struct RpcError {
    pub timed_out: bool,
    pub detail: String,
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail)
    }
}

fn err(e: io::Error, what: &str) -> RpcError {
    let timed_out = matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut);
    RpcError { timed_out, detail: format!("{what}: {e}") }
}

fn proto(detail: impl Into<String>) -> RpcError {
    RpcError { timed_out: false, detail: detail.into() }
}

pub fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

impl WsClient {
    /// Performs the Upgrade handshake on a connected stream.
    pub fn handshake(stream: UnixStream, deadline: Instant) -> Result<WsClient, RpcError> {
        let mut c = WsClient { stream, deadline, buf: Vec::new(), next_id: 1 };
        let mut nonce = [0u8; 16];
        rand::fill(&mut nonce);
        let key = base64(&nonce);
        let req = format!(
            "GET / HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        c.write_all(req.as_bytes())?;
        let end = loop {
            if let Some(at) = c.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            if c.buf.len() > 16 * 1024 {
                return Err(proto("handshake: response header too long"));
            }
            c.fill()?;
        };
        let head = String::from_utf8_lossy(&c.buf[..end]).into_owned();
        c.buf.drain(..end);
        let mut lines = head.split("\r\n");
        let status = lines.next().unwrap_or("");
        if !status.starts_with("HTTP/1.1 101") {
            return Err(proto(format!("handshake refused: {status:?}")));
        }
        let expected = base64(&Sha1::digest(format!("{key}{GUID}").as_bytes()));
        let accept = lines.filter_map(|l| l.split_once(':')).find(|(k, _)| k.trim().eq_ignore_ascii_case("sec-websocket-accept"));
        if accept.map(|(_, v)| v.trim()) != Some(expected.as_str()) {
            return Err(proto("handshake: bad Sec-WebSocket-Accept"));
        }
        Ok(c)
    }

    fn left(&self) -> Result<Duration, RpcError> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(RpcError { timed_out: true, detail: "deadline passed".into() });
        }
        Ok(left)
    }

    fn write_all(&mut self, data: &[u8]) -> Result<(), RpcError> {
        let left = self.left()?;
        self.stream.set_write_timeout(Some(left)).map_err(|e| err(e, "set timeout"))?;
        self.stream.write_all(data).map_err(|e| err(e, "write"))
    }

    fn fill(&mut self) -> Result<(), RpcError> {
        let left = self.left()?;
        self.stream.set_read_timeout(Some(left)).map_err(|e| err(e, "set timeout"))?;
        let mut chunk = [0u8; 8192];
        match self.stream.read(&mut chunk) {
            Ok(0) => Err(proto("connection closed by the app-server")),
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(err(e, "read")),
        }
    }

    fn need(&mut self, n: usize) -> Result<(), RpcError> {
        while self.buf.len() < n {
            self.fill()?;
        }
        Ok(())
    }

    fn send_frame(&mut self, opcode: u8, payload: &[u8]) -> Result<(), RpcError> {
        let mut frame = Vec::with_capacity(payload.len() + 14);
        frame.push(0x80 | opcode);
        match payload.len() {
            n if n < 126 => frame.push(0x80 | n as u8),
            n if n <= 0xffff => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let mut mask = [0u8; 4];
        rand::fill(&mut mask);
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.write_all(&frame)
    }

    pub fn send_text(&mut self, text: &str) -> Result<(), RpcError> {
        self.send_frame(0x1, text.as_bytes())
    }

    /// The next complete text message (pings answered, fragments joined).
    pub fn recv_text(&mut self) -> Result<String, RpcError> {
        let mut message = Vec::new();
        loop {
            self.need(2)?;
            let (b0, b1) = (self.buf[0], self.buf[1]);
            let (fin, opcode, masked) = (b0 & 0x80 != 0, b0 & 0x0f, b1 & 0x80 != 0);
            let (len, mut at) = match b1 & 0x7f {
                126 => {
                    self.need(4)?;
                    (u16::from_be_bytes([self.buf[2], self.buf[3]]) as usize, 4)
                }
                127 => {
                    self.need(10)?;
                    let n = u64::from_be_bytes(self.buf[2..10].try_into().unwrap_or_default());
                    (usize::try_from(n).unwrap_or(usize::MAX), 10)
                }
                n => (n as usize, 2),
            };
            if len > MAX_MESSAGE || message.len() + len > MAX_MESSAGE {
                return Err(proto("app-server message too large"));
            }
            let mask = if masked {
                self.need(at + 4)?;
                let m = [self.buf[at], self.buf[at + 1], self.buf[at + 2], self.buf[at + 3]];
                at += 4;
                Some(m)
            } else {
                None
            };
            self.need(at + len)?;
            let mut payload: Vec<u8> = self.buf.drain(..at + len).skip(at).collect();
            if let Some(m) = mask {
                payload.iter_mut().enumerate().for_each(|(i, b)| *b ^= m[i % 4]);
            }
            match opcode {
                0x8 => return Err(proto("app-server closed the websocket")),
                0x9 => self.send_frame(0xA, &payload)?,
                0xA => {}
                0x0..=0x2 => {
                    message.extend_from_slice(&payload);
                    if fin {
                        return String::from_utf8(message).map_err(|_| proto("non-UTF-8 text frame"));
                    }
                }
                other => return Err(proto(format!("unexpected websocket opcode {other}"))),
            }
        }
    }

    /// Writes one request; returns its id. After this returns, the request may have been acted on.
    pub fn send_request(&mut self, method: &str, params: Value) -> Result<u64, RpcError> {
        let id = self.next_id;
        self.next_id += 1;
        self.send_text(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string())?;
        Ok(id)
    }

    /// Reads until the response to `id` (its `result` or `error` object). Notifications and
    /// requests from the server are skipped ([`WsClient::recv_message`]).
    pub fn wait_response(&mut self, id: u64) -> Result<Value, RpcError> {
        loop {
            let msg = self.recv_message()?;
            if msg.get("method").is_none() && msg.get("id").and_then(Value::as_u64) == Some(id) {
                return Ok(msg);
            }
        }
    }

    /// The next JSON message that is a response or a notification; text that is not JSON is
    /// skipped, and so is a request from the server, unanswered: the app-server sends a thread's
    /// approval request to every subscribed client and takes the first answer, so a refusal here
    /// would deny the person's approval, while a request left unanswered stays with the clients
    /// that can answer it (probed on 0.160.0 and 0.171.0: tests/tests/approvals.rs).
    pub fn recv_message(&mut self) -> Result<Value, RpcError> {
        loop {
            let msg = self.recv_any()?;
            if !(msg.get("id").is_some() && msg.get("method").is_some()) {
                return Ok(msg);
            }
        }
    }

    /// The next JSON message, whatever it is (a server request is left for the caller to answer,
    /// or not: the approvals answer them, the test kit keeps them); text that is not JSON skipped.
    pub fn recv_any(&mut self) -> Result<Value, RpcError> {
        loop {
            let text = self.recv_text()?;
            if let Ok(msg) = serde_json::from_str::<Value>(&text) {
                return Ok(msg);
            }
        }
    }

    /// Answers the server's request `id` with `result`.
    pub fn respond(&mut self, id: &Value, result: Value) -> Result<(), RpcError> {
        self.send_text(&json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string())
    }

    /// Moves the one deadline every later read and write is bounded by (the test kit bounds each
    /// call on a long-lived session on its own; the broker opens a session per exchange).
    pub fn set_deadline(&mut self, deadline: Instant) {
        self.deadline = deadline;
    }

    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, RpcError> {
        let id = self.send_request(method, params)?;
        self.wait_response(id)
    }

    pub fn notify(&mut self, method: &str) -> Result<(), RpcError> {
        self.send_text(&json!({"jsonrpc": "2.0", "method": method}).to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648() {
        for (i, o) in [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foobar", "Zm9vYmFy")] {
            assert_eq!(base64(i.as_bytes()), o);
        }
        // RFC 6455's worked example.
        let accept = base64(&Sha1::digest(format!("dGhlIHNhbXBsZSBub25jZQ=={GUID}").as_bytes()));
        assert_eq!(accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }

    /// The server side of one connection, by hand: answers the Upgrade, then sends `frames` (text,
    /// unmasked) and returns every text message the client sent (unmasked), until it closes.
    fn scripted_server(stream: UnixStream, frames: Vec<String>) -> std::thread::JoinHandle<Vec<String>> {
        std::thread::spawn(move || {
            let mut s = stream;
            let mut buf = Vec::new();
            let end = loop {
                if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break at + 4;
                }
                let mut chunk = [0u8; 1024];
                let n = s.read(&mut chunk).unwrap();
                assert!(n > 0, "client closed during the handshake");
                buf.extend_from_slice(&chunk[..n]);
            };
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            buf.drain(..end);
            let key = head.lines().find_map(|l| l.strip_prefix("Sec-WebSocket-Key: ")).unwrap().trim().to_string();
            let accept = base64(&Sha1::digest(format!("{key}{GUID}").as_bytes()));
            write!(
                s,
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
            )
            .unwrap();
            for f in &frames {
                assert!(f.len() < 126);
                s.write_all(&[0x81, f.len() as u8]).unwrap();
                s.write_all(f.as_bytes()).unwrap();
            }
            let mut got = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                while buf.len() >= 6 && buf.len() >= 6 + (buf[1] & 0x7f) as usize {
                    let len = (buf[1] & 0x7f) as usize;
                    let mask = [buf[2], buf[3], buf[4], buf[5]];
                    let text: Vec<u8> = buf[6..6 + len].iter().enumerate().map(|(i, b)| b ^ mask[i % 4]).collect();
                    got.push(String::from_utf8(text).unwrap());
                    buf.drain(..6 + len);
                }
                match s.read(&mut chunk) {
                    Ok(0) | Err(_) => return got,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
        })
    }

    /// A request from the server is left unanswered (a refusal would be the first answer to a
    /// person's approval) and never returned by `recv_message`; `recv_any` returns it; a
    /// notification is returned but skipped by `wait_response`.
    #[test]
    fn server_requests_are_left_unanswered_and_notifications_passed_on() {
        let (client, server) = UnixStream::pair().unwrap();
        let frames = vec![
            r#"{"id":"s1","method":"ask/user"}"#.to_string(),
            r#"{"method":"note/one"}"#.to_string(),
            r#"{"id":7,"method":"ask/again"}"#.to_string(),
            r#"{"method":"note/two"}"#.to_string(),
            r#"{"id":1,"result":{"ok":true}}"#.to_string(),
        ];
        let peer = scripted_server(server, frames);
        let mut ws = WsClient::handshake(client, Instant::now() + Duration::from_secs(10)).unwrap();
        let note = ws.recv_message().unwrap();
        assert_eq!(note["method"], "note/one", "the server request before it is not returned: {note}");
        let ask = ws.recv_any().unwrap();
        assert_eq!(ask["id"], 7, "recv_any returns a server request: {ask}");
        let r = ws.wait_response(1).unwrap();
        assert_eq!(r["result"]["ok"], true, "{r}");
        drop(ws);
        let sent = peer.join().unwrap();
        assert!(sent.is_empty(), "no server request answered: {sent:?}");
    }

    /// `set_deadline` bounds the reads after it: a silent server times out at the new deadline.
    #[test]
    fn set_deadline_bounds_the_next_read() {
        let (client, server) = UnixStream::pair().unwrap();
        let peer = scripted_server(server, Vec::new());
        let mut ws = WsClient::handshake(client, Instant::now() + Duration::from_secs(10)).unwrap();
        ws.set_deadline(Instant::now() + Duration::from_millis(200));
        let t0 = Instant::now();
        let e = ws.recv_message().unwrap_err();
        assert!(e.timed_out, "{e}");
        assert!(t0.elapsed() < Duration::from_secs(5), "waited {:?}", t0.elapsed());
        drop(ws);
        peer.join().unwrap();
    }
}
