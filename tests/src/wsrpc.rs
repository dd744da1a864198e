//! A minimal JSON-RPC client for `codex app-server --listen unix://...` (the managed daemon's
//! control socket): one JSON message per WebSocket text frame over a Unix socket (codex-facts §7).
//! Client frames are masked as RFC 6455 requires; pings are answered. Every wait is bounded.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub struct WsRpc {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    next_id: u64,
    /// Notifications received so far (in order).
    pub notifications: Vec<Value>,
}

impl WsRpc {
    /// Connect and upgrade to WebSocket.
    pub fn connect(sock: &Path, timeout: Duration) -> std::io::Result<WsRpc> {
        let s = UnixStream::connect(sock)?;
        s.set_read_timeout(Some(timeout))?;
        let mut writer = s.try_clone()?;
        write!(
            writer,
            "GET / HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: Y291cmllci10ZXN0cy1rZXk=\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )?;
        let mut reader = BufReader::new(s);
        let mut status = String::new();
        reader.read_line(&mut status)?;
        if !status.contains(" 101 ") {
            return Err(std::io::Error::other(format!("no WebSocket upgrade: {status:?}")));
        }
        loop {
            let mut l = String::new();
            if reader.read_line(&mut l)? == 0 || l == "\r\n" {
                break;
            }
        }
        Ok(WsRpc { reader, writer, next_id: 1, notifications: Vec::new() })
    }

    fn send_frame(&mut self, opcode: u8, payload: &[u8]) -> std::io::Result<()> {
        let mask = [0x5a, 0x17, 0xc3, 0x81];
        let mut f = vec![0x80 | opcode];
        match payload.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n if n < 65536 => {
                f.push(0x80 | 126);
                f.extend((n as u16).to_be_bytes());
            }
            n => {
                f.push(0x80 | 127);
                f.extend((n as u64).to_be_bytes());
            }
        }
        f.extend(mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.writer.write_all(&f)
    }

    /// Next text message (answers pings, skips other control frames).
    fn recv(&mut self) -> std::io::Result<Value> {
        loop {
            let mut h = [0u8; 2];
            self.reader.read_exact(&mut h)?;
            let opcode = h[0] & 0x0f;
            let mut len = (h[1] & 0x7f) as u64;
            if len == 126 {
                let mut b = [0u8; 2];
                self.reader.read_exact(&mut b)?;
                len = u16::from_be_bytes(b) as u64;
            } else if len == 127 {
                let mut b = [0u8; 8];
                self.reader.read_exact(&mut b)?;
                len = u64::from_be_bytes(b);
            }
            let mut mask = [0u8; 4];
            if h[1] & 0x80 != 0 {
                self.reader.read_exact(&mut mask)?;
            }
            let mut p = vec![0u8; len as usize];
            self.reader.read_exact(&mut p)?;
            if h[1] & 0x80 != 0 {
                p.iter_mut().enumerate().for_each(|(i, b)| *b ^= mask[i % 4]);
            }
            match opcode {
                0x1 | 0x0 => {
                    if let Ok(v) = serde_json::from_slice(&p) {
                        return Ok(v);
                    }
                }
                0x8 => return Err(std::io::Error::other("WebSocket closed by the server")),
                0x9 => self.send_frame(0xA, &p)?,
                _ => {}
            }
        }
    }

    fn send(&mut self, msg: &Value) {
        self.send_frame(0x1, msg.to_string().as_bytes()).expect("write to app-server socket");
    }

    /// Send a request and wait (bounded) for its `result`; panics on an error or timeout.
    /// Server-to-client requests are refused with an error.
    pub fn request(&mut self, method: &str, params: Value, timeout: Duration) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let msg = self.recv().unwrap_or_else(|e| panic!("app-server socket, waiting for {method}: {e}"));
            if msg.get("method").is_some() {
                if msg.get("id").is_some() {
                    let reply = json!({"jsonrpc": "2.0", "id": msg["id"],
                        "error": {"code": -32601, "message": "courier-tests does not handle it"}});
                    self.send(&reply);
                } else {
                    self.notifications.push(msg);
                }
                continue;
            }
            if msg.get("id") == Some(&json!(id)) {
                return match msg.get("result") {
                    Some(r) => r.clone(),
                    None => panic!("app-server {method} failed: {msg}"),
                };
            }
        }
        panic!("app-server: no response to {method} within {timeout:?}")
    }

    /// `initialize` + `initialized`.
    pub fn initialize(&mut self, timeout: Duration) -> Value {
        let r = self.request(
            "initialize",
            json!({"clientInfo": {"name": "courier-tests", "title": "courier tests", "version": "0.0.1"},
                   "capabilities": {"experimentalApi": true}}),
            timeout,
        );
        self.send(&json!({"jsonrpc": "2.0", "method": "initialized"}));
        r
    }
}
