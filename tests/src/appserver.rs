//! Minimal JSON-RPC client for `codex app-server` over stdio (one JSON object per line: the
//! `initialize` request, the `initialized` notification, then requests). Server-to-client requests are refused with an error so nothing
//! blocks. Every wait is bounded.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub struct AppServer {
    child: Child,
    stdin: Arc<Mutex<Option<ChildStdin>>>,
    rx: Receiver<Value>,
    next_id: u64,
    /// Notifications received so far (in order).
    pub notifications: Vec<Value>,
    stderr: Arc<Mutex<String>>,
}

impl AppServer {
    /// Spawn `codex app-server [extra args]` from a prepared command (env, cwd already set).
    pub fn spawn(mut cmd: Command) -> AppServer {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn codex app-server: {e}"));
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let stdin = Arc::new(Mutex::new(child.stdin.take()));
        let (tx, rx) = channel();
        let stdin2 = stdin.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Ok(msg) = serde_json::from_str::<Value>(line.trim()) else { continue };
                if msg.get("id").is_some() && msg.get("method").is_some() {
                    // Server -> client request: refuse politely.
                    let m = msg["method"].as_str().unwrap_or("?");
                    let reply = json!({"jsonrpc": "2.0", "id": msg["id"],
                        "error": {"code": -32601, "message": format!("courier-tests does not handle {m}")}});
                    if let Some(w) = stdin2.lock().unwrap().as_mut() {
                        let _ = writeln!(w, "{reply}");
                        let _ = w.flush();
                    }
                }
                if tx.send(msg).is_err() {
                    break;
                }
            }
        });
        let err_buf = Arc::new(Mutex::new(String::new()));
        let err2 = err_buf.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut g = err2.lock().unwrap();
                g.push_str(&line);
                g.push('\n');
            }
        });
        AppServer { child, stdin, rx, next_id: 1, notifications: Vec::new(), stderr: err_buf }
    }

    fn send(&self, msg: &Value) {
        let mut g = self.stdin.lock().unwrap();
        let w = g.as_mut().expect("app-server stdin closed");
        writeln!(w, "{msg}").expect("write to app-server");
        w.flush().expect("flush app-server stdin");
    }

    /// Send a request and wait (bounded) for its response; returns the whole response object
    /// (`result` or `error`).
    pub fn request_raw(&mut self, method: &str, params: Value, timeout: Duration) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(msg) => {
                    let is_response = msg.get("method").is_none()
                        && msg.get("id").and_then(Value::as_u64) == Some(id)
                        && (msg.get("result").is_some() || msg.get("error").is_some());
                    if is_response {
                        return msg;
                    }
                    if msg.get("id").is_none() {
                        self.notifications.push(msg);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("app-server: no response to {method} within {timeout:?}; stderr:\n{}", self.stderr.lock().unwrap())
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("app-server exited before answering {method}; stderr:\n{}", self.stderr.lock().unwrap())
                }
            }
        }
    }

    /// Like [`AppServer::request_raw`] but returns `result`, panicking on an error response.
    pub fn request(&mut self, method: &str, params: Value, timeout: Duration) -> Value {
        let r = self.request_raw(method, params, timeout);
        match r.get("result") {
            Some(v) => v.clone(),
            None => panic!("app-server {method} failed: {r}"),
        }
    }

    pub fn notify(&self, method: &str, params: Option<Value>) {
        let mut msg = json!({"jsonrpc": "2.0", "method": method});
        if let Some(p) = params {
            msg["params"] = p;
        }
        self.send(&msg);
    }

    /// `initialize` (+ `initialized`), as the probe kit does.
    pub fn initialize(&mut self, experimental: bool, timeout: Duration) -> Value {
        let r = self.request(
            "initialize",
            json!({"clientInfo": {"name": "courier-tests", "title": "courier tests", "version": "0.0.1"},
                   "capabilities": {"experimentalApi": experimental}}),
            timeout,
        );
        self.notify("initialized", None);
        r
    }

    /// Close stdin and wait (bounded) for exit; kill if it lingers.
    pub fn close(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stdin.lock().unwrap().take();
        let exited = crate::util::poll_until(Duration::from_secs(5), || self.child.try_wait().ok().flatten());
        if exited.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Drop for AppServer {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.shutdown();
        }
    }
}

/// `codex app-server --listen unix://PATH [args]` running in the background (killed on drop), the
/// shape of a long-lived app-server that owns threads and runs their hooks.
pub struct ListeningAppServer {
    child: Child,
    pub socket: std::path::PathBuf,
    pub log: std::path::PathBuf,
}

impl ListeningAppServer {
    /// Start it from a prepared `codex` command and wait (bounded) until its socket accepts.
    pub fn start(mut cmd: Command, socket: std::path::PathBuf, args: &[&str], log: std::path::PathBuf) -> ListeningAppServer {
        let f = std::fs::File::create(&log).unwrap();
        cmd.arg("app-server").arg("--listen").arg(format!("unix://{}", socket.display())).args(args);
        cmd.stdin(Stdio::null()).stdout(f.try_clone().unwrap()).stderr(f);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn codex app-server --listen: {e}"));
        let mut s = ListeningAppServer { child, socket, log };
        let ok = crate::util::poll_until(Duration::from_secs(30), || {
            if let Ok(Some(st)) = s.child.try_wait() {
                panic!("codex app-server exited early ({st}): {}", std::fs::read_to_string(&s.log).unwrap_or_default());
            }
            std::os::unix::net::UnixStream::connect(&s.socket).ok()
        });
        assert!(ok.is_some(), "app-server socket {} never accepted", s.socket.display());
        s
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A JSON-RPC client on the socket (WebSocket, as Codex speaks it there).
    pub fn client(&self, timeout: Duration) -> WsAppServer {
        WsAppServer::connect(&self.socket, timeout)
    }
}

impl Drop for ListeningAppServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Minimal JSON-RPC-over-WebSocket client for `codex app-server --listen unix://` (the kit's own,
/// independent of the broker's): Upgrade handshake, masked text frames out, text frames in.
/// Server requests are refused; notifications are kept in order. Every read is bounded.
pub struct WsAppServer {
    stream: std::os::unix::net::UnixStream,
    buf: Vec<u8>,
    next_id: u64,
    pub notifications: Vec<Value>,
}

impl WsAppServer {
    pub fn connect(path: &std::path::Path, timeout: Duration) -> WsAppServer {
        use std::io::Read;
        let mut stream = std::os::unix::net::UnixStream::connect(path).unwrap_or_else(|e| panic!("connect {}: {e}", path.display()));
        stream.set_read_timeout(Some(timeout)).unwrap();
        let req = "GET / HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                   Sec-WebSocket-Key: Y291cmllci10ZXN0cy1rZXk=\r\nSec-WebSocket-Version: 13\r\n\r\n";
        stream.write_all(req.as_bytes()).unwrap();
        let mut buf = Vec::new();
        let end = loop {
            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).expect("app-server handshake");
            assert!(n > 0, "app-server closed during the handshake");
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        assert!(head.starts_with("HTTP/1.1 101"), "handshake refused: {head}");
        buf.drain(..end);
        WsAppServer { stream, buf, next_id: 1, notifications: Vec::new() }
    }

    fn send(&mut self, v: &Value) {
        let data = v.to_string().into_bytes();
        let mut f = vec![0x81u8];
        match data.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n if n <= 0xffff => {
                f.push(0x80 | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(0x80 | 127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let mask = [0x5a, 0x17, 0xc3, 0x3e];
        f.extend_from_slice(&mask);
        f.extend(data.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.stream.write_all(&f).expect("write to app-server");
    }

    fn need(&mut self, n: usize, deadline: Instant) {
        use std::io::Read;
        while self.buf.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "app-server: read timed out");
            self.stream.set_read_timeout(Some(left)).unwrap();
            let mut chunk = [0u8; 65536];
            let got = self.stream.read(&mut chunk).unwrap_or_else(|e| panic!("app-server read: {e}"));
            assert!(got > 0, "app-server closed the connection");
            self.buf.extend_from_slice(&chunk[..got]);
        }
    }

    /// Next JSON message (bounded by `deadline`).
    fn recv(&mut self, deadline: Instant) -> Value {
        let mut msg = Vec::new();
        loop {
            self.need(2, deadline);
            let (fin, op, len7) = (self.buf[0] & 0x80 != 0, self.buf[0] & 0x0f, self.buf[1] & 0x7f);
            let (len, at) = match len7 {
                126 => {
                    self.need(4, deadline);
                    (u16::from_be_bytes([self.buf[2], self.buf[3]]) as usize, 4)
                }
                127 => {
                    self.need(10, deadline);
                    (u64::from_be_bytes(self.buf[2..10].try_into().unwrap()) as usize, 10)
                }
                n => (n as usize, 2),
            };
            self.need(at + len, deadline);
            let payload: Vec<u8> = self.buf.drain(..at + len).skip(at).collect();
            match op {
                0x8 => panic!("app-server closed the websocket"),
                0x9 | 0xA => {}
                _ => {
                    msg.extend_from_slice(&payload);
                    if fin {
                        return serde_json::from_slice(&msg).unwrap_or(Value::Null);
                    }
                }
            }
        }
    }

    /// Send a request and wait (bounded) for its response; returns `result`, panics on `error`.
    pub fn request(&mut self, method: &str, params: Value, timeout: Duration) -> Value {
        let r = self.request_raw(method, params, timeout);
        r.get("result").cloned().unwrap_or_else(|| panic!("app-server {method} failed: {r}"))
    }

    pub fn request_raw(&mut self, method: &str, params: Value, timeout: Duration) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let deadline = Instant::now() + timeout;
        loop {
            let msg = self.recv(deadline);
            match (msg.get("id"), msg.get("method")) {
                (Some(got), None) if got.as_u64() == Some(id) => return msg,
                (Some(sid), Some(m)) => {
                    let reply = json!({"jsonrpc": "2.0", "id": sid, "error": {"code": -32601, "message": format!("courier-tests does not handle {m}")}});
                    self.send(&reply);
                }
                (None, Some(_)) => self.notifications.push(msg),
                _ => {}
            }
        }
    }

    pub fn initialize(&mut self, experimental: bool, timeout: Duration) -> Value {
        let r = self.request(
            "initialize",
            json!({"clientInfo": {"name": "courier-tests", "title": "courier tests", "version": "0.0.1"},
                   "capabilities": {"experimentalApi": experimental}}),
            timeout,
        );
        self.send(&json!({"jsonrpc": "2.0", "method": "initialized"}));
        r
    }

    /// Wait (bounded) for a notification `method` whose params satisfy `pred` (earlier ones count).
    pub fn wait_notification(&mut self, method: &str, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        let hit = |m: &Value| m.get("method").and_then(Value::as_str) == Some(method) && pred(&m["params"]);
        if let Some(m) = self.notifications.iter().find(|m| hit(m)) {
            return m["params"].clone();
        }
        let deadline = Instant::now() + timeout;
        loop {
            let msg = self.recv(deadline);
            if let (Some(sid), Some(_)) = (msg.get("id"), msg.get("method")) {
                let reply = json!({"jsonrpc": "2.0", "id": sid, "error": {"code": -32601, "message": "not handled"}});
                self.send(&reply);
                continue;
            }
            if msg.get("id").is_none() {
                let found = hit(&msg);
                let params = msg["params"].clone();
                self.notifications.push(msg);
                if found {
                    return params;
                }
            }
        }
    }
}
