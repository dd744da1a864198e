//! JSON-RPC clients for `codex app-server`: over stdio ([`AppServer`], one JSON object per line)
//! and over its `--listen unix://` socket ([`WsAppServer`], the broker's own WebSocket client,
//! `broker::codex::appserver::WsClient`). The JSON-RPC bookkeeping (ids, responses, notifications kept in
//! order) is written once, in [`Rpc`]; server-to-client requests are refused on stdio so nothing blocks, and kept on the socket (`wait_server_request`, `respond`).
//! Every wait is bounded.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use broker_lib::codex::appserver::WsClient;
use serde_json::{json, Value};

/// One way of carrying JSON-RPC messages to and from an app-server.
pub trait Transport {
    fn send(&mut self, msg: &Value);
    /// The next response, notification or (on the socket) server request, by `deadline`; panics
    /// naming `what` it was waiting for when the server is silent or gone. On stdio, requests
    /// from the server are refused on the way; on the socket they are kept for the test.
    fn recv(&mut self, deadline: Instant, what: &str) -> Value;
}

/// A JSON-RPC session on `T`.
pub struct Rpc<T> {
    transport: T,
    next_id: u64,
    /// Notifications received so far (in order).
    pub notifications: Vec<Value>,
    /// Requests from the server received so far (on the socket: left unanswered for the test).
    pub server_requests: Vec<Value>,
}

/// `codex app-server` on stdio.
pub type AppServer = Rpc<Pipes>;
/// `codex app-server --listen unix://PATH`, on its socket.
pub type WsAppServer = Rpc<Ws>;

impl<T: Transport> Rpc<T> {
    fn new(transport: T) -> Rpc<T> {
        Rpc { transport, next_id: 1, notifications: Vec::new(), server_requests: Vec::new() }
    }

    /// Send a request and wait (bounded) for its response; returns the whole response object
    /// (`result` or `error`).
    pub fn request_raw(&mut self, method: &str, params: Value, timeout: Duration) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.transport.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let deadline = Instant::now() + timeout;
        loop {
            let msg = self.transport.recv(deadline, method);
            if msg.get("method").is_none() && msg.get("id").and_then(Value::as_u64) == Some(id) {
                return msg;
            }
            self.keep(msg);
        }
    }

    /// Like [`Rpc::request_raw`] but returns `result`, panicking on an error response.
    pub fn request(&mut self, method: &str, params: Value, timeout: Duration) -> Value {
        let r = self.request_raw(method, params, timeout);
        r.get("result").cloned().unwrap_or_else(|| panic!("app-server {method} failed: {r}"))
    }

    pub fn notify(&mut self, method: &str, params: Option<Value>) {
        let mut msg = json!({"jsonrpc": "2.0", "method": method});
        if let Some(p) = params {
            msg["params"] = p;
        }
        self.transport.send(&msg);
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

    /// `thread/start` in `cwd`; returns the thread id.
    pub fn start_thread(&mut self, cwd: &Path, timeout: Duration) -> String {
        let r = self.request("thread/start", json!({"cwd": cwd.display().to_string()}), timeout);
        r.pointer("/thread/id").and_then(Value::as_str).expect("thread id").to_string()
    }

    /// `turn/start` of a user message `text` on `thread`; returns the turn id at once.
    pub fn start_turn(&mut self, thread: &str, text: &str, timeout: Duration) -> String {
        let r = self.request("turn/start", json!({"threadId": thread, "input": [{"type": "text", "text": text}]}), timeout);
        r.pointer("/turn/id").and_then(Value::as_str).expect("turn id").to_string()
    }

    /// Wait (bounded) for `turn/completed` of `turn` (the thread is idle again).
    pub fn wait_turn_completed(&mut self, turn: &str, timeout: Duration) {
        self.wait_notification("turn/completed", timeout, |p| p.pointer("/turn/id").and_then(Value::as_str) == Some(turn));
    }

    /// A user turn run to completion (afterwards the thread is idle); returns its id.
    pub fn run_turn(&mut self, thread: &str, text: &str, timeout: Duration) -> String {
        let turn = self.start_turn(thread, text, timeout);
        self.wait_turn_completed(&turn, timeout);
        turn
    }

    /// Keeps a notification or a server request for later waits.
    fn keep(&mut self, msg: Value) {
        match (msg.get("id").is_some(), msg.get("method").is_some()) {
            (false, _) => self.notifications.push(msg),
            (true, true) => self.server_requests.push(msg),
            (true, false) => {}
        }
    }

    /// Wait (bounded) for a server request `method` whose params satisfy `pred` (earlier ones
    /// count); returns the whole request (its `id` and `params`).
    pub fn wait_server_request(&mut self, method: &str, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        self.wait_server_request_where(method, timeout, |m| m.get("method").and_then(Value::as_str) == Some(method) && pred(&m["params"]))
    }

    /// Wait (bounded) for a server request (the whole message) that satisfies `hit`, earlier
    /// ones counting; `what` names it in the timeout's panic.
    pub fn wait_server_request_where(&mut self, what: &str, timeout: Duration, hit: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(m) = self.server_requests.iter().find(|m| hit(m)) {
                return m.clone();
            }
            let msg = self.transport.recv(deadline, what);
            self.keep(msg);
        }
    }

    /// Answers a server request `id` with `result`.
    pub fn respond(&mut self, id: &Value, result: Value) {
        self.transport.send(&json!({"jsonrpc": "2.0", "id": id, "result": result}));
    }

    /// Wait (bounded) for a notification `method` whose params satisfy `pred` (earlier ones count).
    pub fn wait_notification(&mut self, method: &str, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        let hit = |m: &Value| m.get("method").and_then(Value::as_str) == Some(method) && pred(&m["params"]);
        if let Some(m) = self.notifications.iter().find(|m| hit(m)) {
            return m["params"].clone();
        }
        let deadline = Instant::now() + timeout;
        loop {
            let msg = self.transport.recv(deadline, method);
            if msg.get("id").is_none() && hit(&msg) {
                let params = msg["params"].clone();
                self.notifications.push(msg);
                return params;
            }
            self.keep(msg);
        }
    }
}

/// The stdio transport: a reader thread forwards each line (answering server requests itself),
/// another keeps stderr for the panic messages.
pub struct Pipes {
    child: Child,
    stdin: Arc<Mutex<Option<ChildStdin>>>,
    rx: Receiver<Value>,
    stderr: Arc<Mutex<String>>,
}

impl Transport for Pipes {
    fn send(&mut self, msg: &Value) {
        let mut g = self.stdin.lock().unwrap();
        let w = g.as_mut().expect("app-server stdin closed");
        writeln!(w, "{msg}").expect("write to app-server");
        w.flush().expect("flush app-server stdin");
    }

    fn recv(&mut self, deadline: Instant, what: &str) -> Value {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                // A server request: the reader thread has refused it.
                Ok(msg) if msg.get("id").is_some() && msg.get("method").is_some() => {}
                Ok(msg) => return msg,
                Err(RecvTimeoutError::Timeout) => {
                    panic!("app-server: nothing for {what} within the deadline; stderr:\n{}", self.stderr.lock().unwrap())
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("app-server exited while waiting for {what}; stderr:\n{}", self.stderr.lock().unwrap())
                }
            }
        }
    }
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
        Rpc::new(Pipes { child, stdin, rx, stderr: err_buf })
    }

    /// Close stdin and wait (bounded) for exit; kill if it lingers.
    pub fn close(mut self) {
        self.transport.shutdown();
    }
}

impl Pipes {
    fn shutdown(&mut self) {
        self.stdin.lock().unwrap().take();
        let exited = crate::util::poll_until(Duration::from_secs(5), || self.child.try_wait().ok().flatten());
        if exited.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Drop for Pipes {
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
    pub socket: PathBuf,
    pub log: PathBuf,
}

impl ListeningAppServer {
    /// Start it from a prepared `codex` command and wait (bounded) until its socket accepts.
    pub fn start(mut cmd: Command, socket: PathBuf, args: &[&str], log: PathBuf) -> ListeningAppServer {
        let f = std::fs::File::create(&log).unwrap();
        cmd.arg("app-server").arg("--listen").arg(format!("unix://{}", socket.display())).args(args);
        cmd.stdin(Stdio::null()).stdout(f.try_clone().unwrap()).stderr(f);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn codex app-server --listen: {e}"));
        let mut s = ListeningAppServer { child, socket, log };
        let ok = crate::util::poll_until(Duration::from_secs(30), || {
            if let Ok(Some(st)) = s.child.try_wait() {
                panic!("codex app-server exited early ({st}): {}", std::fs::read_to_string(&s.log).unwrap_or_default());
            }
            UnixStream::connect(&s.socket).ok()
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

/// A `codex app-server --listen unix://` with a thread that ran one user turn and is idle now:
/// what the wake channel wakes.
pub fn idle_thread(env: &crate::CodexEnv, timeout: Duration) -> (ListeningAppServer, WsAppServer, String) {
    let server = ListeningAppServer::start(env.codex_command(), env.root.join("as.sock"), &[], env.root.join("app-server.log"));
    let mut client = server.client(timeout);
    client.initialize(false, timeout);
    let thread = client.start_thread(&env.work, timeout);
    client.run_turn(&thread, "hello", timeout);
    (server, client, thread)
}

impl Drop for ListeningAppServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The TUI's managed app-server daemon, started the way the TUI starts it (`codex app-server
/// daemon start`, which prints its socket); `daemon stop` on drop.
pub struct ManagedDaemon {
    stop: Option<Command>,
    pub socket: PathBuf,
}

impl ManagedDaemon {
    pub fn start(env: &crate::CodexEnv, timeout: Duration) -> ManagedDaemon {
        let mut stop = env.codex_command();
        stop.args(["app-server", "daemon", "stop"]);
        // Stopped on drop even if `start` fails half-way: it may have started the daemon first.
        let mut d = ManagedDaemon { stop: Some(stop), socket: PathBuf::new() };
        let out = crate::broker::run_bounded(env.codex_command().args(["app-server", "daemon", "start"]), timeout);
        assert!(out.status.success(), "daemon start: {out:?}");
        let started: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("daemon start JSON ({e}): {out:?}"));
        d.socket = PathBuf::from(started["socketPath"].as_str().unwrap_or_else(|| panic!("no socketPath: {started}")));
        d
    }

    /// A JSON-RPC client on its socket.
    pub fn client(&self, timeout: Duration) -> WsAppServer {
        WsAppServer::connect(&self.socket, timeout)
    }
}

impl Drop for ManagedDaemon {
    fn drop(&mut self) {
        if let Some(mut stop) = self.stop.take() {
            let _ = crate::broker::run_bounded(&mut stop, Duration::from_secs(30));
        }
    }
}

/// The socket transport: the broker's WebSocket client, its deadline moved to each wait's.
pub struct Ws(WsClient);

impl Transport for Ws {
    fn send(&mut self, msg: &Value) {
        // Writes are bounded too: a stalled server fails the test rather than hanging it.
        self.0.set_deadline(Instant::now() + Duration::from_secs(30));
        self.0.send_text(&msg.to_string()).unwrap_or_else(|e| panic!("write to app-server: {e}"));
    }

    fn recv(&mut self, deadline: Instant, what: &str) -> Value {
        self.0.set_deadline(deadline);
        self.0.recv_any().unwrap_or_else(|e| panic!("app-server, waiting for {what}: {e}"))
    }
}

impl WsAppServer {
    /// Connect and upgrade (bounded by `timeout`).
    pub fn connect(path: &Path, timeout: Duration) -> WsAppServer {
        let stream = UnixStream::connect(path).unwrap_or_else(|e| panic!("connect {}: {e}", path.display()));
        let ws = WsClient::handshake(stream, Instant::now() + timeout).unwrap_or_else(|e| panic!("app-server handshake: {e}"));
        Rpc::new(Ws(ws))
    }
}
