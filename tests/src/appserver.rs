//! Minimal JSON-RPC client for `codex app-server` over stdio (one JSON object per line), after
//! probe-kit/appserver_client.py. Server-to-client requests are refused with an error so nothing
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
                Err(RecvTimeoutError::Timeout) => panic!(
                    "app-server: no response to {method} within {timeout:?}; stderr:\n{}",
                    self.stderr.lock().unwrap()
                ),
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "app-server exited before answering {method}; stderr:\n{}",
                    self.stderr.lock().unwrap()
                ),
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
