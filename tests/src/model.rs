//! `ScriptedModel`: a scripted OpenAI Responses provider on `127.0.0.1:0`.
//!
//! Codex talks to it as to the real API: `POST /v1/responses` is answered with a server-sent event
//! stream (`response.created`, one `response.output_item.done` per item, `response.completed` with
//! usage), the shapes the real API streams and Codex parses. `GET .../models`
//! returns an empty list. Plain HTTP/1.1 on `std::net`, one thread per connection, keep-alive.
//!
//! A test decides every reply: with a closure ([`ScriptedModel::start_with`]), a queue
//! ([`ScriptedModel::start_queue`]), or the default "one `exec_command`, then `done`" script
//! ([`ScriptedModel::start`]). A reply can be held ([`Reply::held`]) until the test calls
//! [`Hold::release`], so the test can act while Codex waits for the model. Every request is
//! recorded (parsed JSON body plus headers) and can be awaited without sleeping.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// How long a held reply waits for [`Hold::release`] before the server gives up and answers
/// anyway (so a failed test never wedges a Codex process forever).
pub const MAX_HOLD: Duration = Duration::from_secs(90);

// ---------------------------------------------------------------------------------------------
// Replies

/// One output item of a scripted reply.
#[derive(Clone, Debug)]
enum Item {
    Exec { cmd: String, yield_time_ms: u64 },
    Message(String),
    Call { namespace: Option<String>, name: String, arguments: Value },
    Raw(Value),
}

#[derive(Clone, Debug)]
enum Body {
    Items(Vec<Item>),
    /// Answer with this HTTP status and JSON body instead of a stream.
    HttpError(u16, String),
}

/// What the model answers to one request.
#[derive(Clone, Debug)]
pub struct Reply {
    body: Body,
    hold: Option<Hold>,
}

impl Reply {
    /// One `exec_command` function call running `cmd` (`yield_time_ms` 2000, like the probe mock).
    pub fn exec(cmd: &str) -> Reply {
        Reply::items_of(vec![Item::Exec { cmd: cmd.to_string(), yield_time_ms: 2000 }])
    }

    /// One `exec_command` call with an explicit `yield_time_ms`.
    pub fn exec_with_yield(cmd: &str, yield_time_ms: u64) -> Reply {
        Reply::items_of(vec![Item::Exec { cmd: cmd.to_string(), yield_time_ms }])
    }

    /// A final assistant message.
    pub fn message(text: &str) -> Reply {
        Reply::items_of(vec![Item::Message(text.to_string())])
    }

    /// `multi_agent_v1.spawn_agent {"message": message}` (needs `features.multi_agent`).
    pub fn spawn_agent(message: &str) -> Reply {
        Reply::call(Some("multi_agent_v1"), "spawn_agent", json!({ "message": message }))
    }

    /// `multi_agent_v1.wait_agent {"targets": [...], "timeout_ms": ...}`.
    pub fn wait_agent(targets: &[&str], timeout_ms: u64) -> Reply {
        Reply::call(Some("multi_agent_v1"), "wait_agent", json!({ "targets": targets, "timeout_ms": timeout_ms }))
    }

    /// Any function call; `arguments` is serialised to the JSON string the API sends.
    pub fn call(namespace: Option<&str>, name: &str, arguments: Value) -> Reply {
        Reply::items_of(vec![Item::Call { namespace: namespace.map(str::to_string), name: name.to_string(), arguments }])
    }

    /// Raw output items (sent as given; `id`/`call_id` are filled in when missing).
    pub fn raw_items(items: Vec<Value>) -> Reply {
        Reply::items_of(items.into_iter().map(Item::Raw).collect())
    }

    /// Answer with an HTTP error instead of a stream (Codex has provider retries set to 0).
    pub fn http_error(status: u16, message: &str) -> Reply {
        Reply { body: Body::HttpError(status, message.to_string()), hold: None }
    }

    /// Append the items of `other` to this reply (e.g. a message and a tool call together).
    pub fn and(mut self, other: Reply) -> Reply {
        if let (Body::Items(a), Body::Items(b)) = (&mut self.body, other.body) {
            a.extend(b);
        }
        self
    }

    /// Hold this reply until `hold` is released (the request is recorded at once).
    pub fn held(mut self, hold: &Hold) -> Reply {
        self.hold = Some(hold.clone());
        self
    }

    fn items_of(items: Vec<Item>) -> Reply {
        Reply { body: Body::Items(items), hold: None }
    }

    /// Short description for logs and panics.
    pub fn describe(&self) -> String {
        match &self.body {
            Body::HttpError(s, _) => format!("http {s}"),
            Body::Items(items) => items
                .iter()
                .map(|i| match i {
                    Item::Exec { cmd, .. } => format!("exec_command({cmd})"),
                    Item::Message(t) => format!("message({t})"),
                    Item::Call { namespace, name, .. } => match namespace {
                        Some(ns) => format!("{ns}.{name}"),
                        None => name.clone(),
                    },
                    Item::Raw(v) => format!("raw({})", v.get("type").and_then(Value::as_str).unwrap_or("?")),
                })
                .collect::<Vec<_>>()
                .join(" + "),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Holds

/// A gate a held reply waits behind. Cloning shares the gate. Once released it stays open.
#[derive(Clone, Debug, Default)]
pub struct Hold(Arc<(Mutex<HoldState>, Condvar)>);

#[derive(Debug, Default)]
struct HoldState {
    released: bool,
    waiting: usize,
    passed: usize,
}

impl Hold {
    pub fn new() -> Hold {
        Hold::default()
    }

    /// Let every reply held on this gate (now and later) go out.
    pub fn release(&self) {
        let (m, c) = &*self.0;
        m.lock().unwrap().released = true;
        c.notify_all();
    }

    pub fn is_released(&self) -> bool {
        self.0 .0.lock().unwrap().released
    }

    /// Wait until at least `n` replies are parked on this gate (bounded).
    pub fn wait_held(&self, n: usize, timeout: Duration) {
        let (m, c) = &*self.0;
        let deadline = Instant::now() + timeout;
        let mut g = m.lock().unwrap();
        while g.waiting < n {
            let now = Instant::now();
            if now >= deadline {
                panic!("timed out after {timeout:?}: {} of {n} replies held", g.waiting);
            }
            g = c.wait_timeout(g, deadline - now).unwrap().0;
        }
    }

    /// How many held replies have gone out after a release.
    pub fn passed(&self) -> usize {
        self.0 .0.lock().unwrap().passed
    }

    fn park(&self) -> bool {
        let (m, c) = &*self.0;
        let deadline = Instant::now() + MAX_HOLD;
        let mut g = m.lock().unwrap();
        g.waiting += 1;
        c.notify_all();
        while !g.released {
            let now = Instant::now();
            if now >= deadline {
                g.waiting -= 1;
                return false;
            }
            g = c.wait_timeout(g, deadline - now).unwrap().0;
        }
        g.waiting -= 1;
        g.passed += 1;
        c.notify_all();
        true
    }
}

// ---------------------------------------------------------------------------------------------
// Recorded requests

/// One recorded `POST .../responses` request.
#[derive(Clone, Debug)]
pub struct Request {
    /// 0-based order of arrival among `/responses` requests.
    pub index: usize,
    pub method: String,
    pub path: String,
    /// Header names lowercased, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body: Value,
    /// What the script answered (filled in once the reply is decided).
    pub reply: String,
    pub received_at: Instant,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_str())
    }

    /// The thread this request belongs to: the `thread-id` header Codex sends, else
    /// `client_metadata.thread_id` in the body. (`session-id` names the ROOT thread, which differs
    /// inside sub-agents.)
    pub fn thread_id(&self) -> Option<String> {
        self.header("thread-id")
            .map(str::to_string)
            .or_else(|| self.body.pointer("/client_metadata/thread_id").and_then(Value::as_str).map(str::to_string))
    }

    /// The turn id Codex reports in `client_metadata.turn_id`.
    pub fn turn_id(&self) -> Option<String> {
        self.body.pointer("/client_metadata/turn_id").and_then(Value::as_str).map(str::to_string)
    }

    pub fn input(&self) -> &[Value] {
        self.body.get("input").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Texts of every `message` item with this role (`developer`, `user`, `assistant`), one string
    /// per message (its text parts joined by newlines).
    pub fn messages(&self, role: &str) -> Vec<String> {
        self.input()
            .iter()
            .filter(|it| it.get("type").and_then(Value::as_str) == Some("message"))
            .filter(|it| it.get("role").and_then(Value::as_str) == Some(role))
            .map(item_text)
            .collect()
    }

    pub fn developer_messages(&self) -> Vec<String> {
        self.messages("developer")
    }

    pub fn user_messages(&self) -> Vec<String> {
        self.messages("user")
    }

    /// Messages of `role` whose text contains `needle`.
    pub fn messages_containing(&self, role: &str, needle: &str) -> Vec<String> {
        self.messages(role).into_iter().filter(|t| t.contains(needle)).collect()
    }

    pub fn developer_messages_containing(&self, needle: &str) -> Vec<String> {
        self.messages_containing("developer", needle)
    }

    pub fn user_messages_containing(&self, needle: &str) -> Vec<String> {
        self.messages_containing("user", needle)
    }

    /// Number of input items of any kind whose serialised JSON contains `needle`.
    pub fn items_containing(&self, needle: &str) -> usize {
        self.input().iter().filter(|it| it.to_string().contains(needle)).count()
    }

    /// True when `needle` appears anywhere in the body.
    pub fn body_contains(&self, needle: &str) -> bool {
        self.body.to_string().contains(needle)
    }

    /// Function calls in the input (`type == "function_call"`).
    pub fn function_calls(&self) -> Vec<&Value> {
        self.input().iter().filter(|it| it.get("type").and_then(Value::as_str) == Some("function_call")).collect()
    }

    /// Outputs of tool calls in the input.
    pub fn tool_outputs(&self) -> Vec<&Value> {
        self.input()
            .iter()
            .filter(|it| {
                matches!(
                    it.get("type").and_then(Value::as_str),
                    Some("function_call_output" | "custom_tool_call_output" | "local_shell_call_output")
                )
            })
            .collect()
    }

    /// True for a sub-agent's request: its `thread-id` differs from the root `session-id`.
    pub fn is_subagent(&self) -> bool {
        match (self.header("thread-id"), self.header("session-id")) {
            (Some(t), Some(s)) => t != s,
            _ => false,
        }
    }

    /// When the last input item is the output of a `spawn_agent` call: the spawned agent's id
    /// (`agent_id` in that output), to pass to [`Reply::wait_agent`].
    pub fn spawned_agent(&self) -> Option<String> {
        let last = self.input().last()?;
        if last.get("type").and_then(Value::as_str) != Some("function_call_output") {
            return None;
        }
        let call_id = last.get("call_id")?;
        let call = self.function_calls().into_iter().find(|c| c.get("call_id") == Some(call_id))?;
        if call.get("name").and_then(Value::as_str) != Some("spawn_agent") {
            return None;
        }
        let out = match last.get("output")? {
            Value::String(s) => serde_json::from_str::<Value>(s).unwrap_or(Value::String(s.clone())),
            v => v.clone(),
        };
        out.get("agent_id").and_then(Value::as_str).map(str::to_string)
    }

    /// The `type` (and role, for messages) of the last input item, e.g. `message:user`.
    pub fn last_item_kind(&self) -> String {
        match self.input().last() {
            None => String::new(),
            Some(it) => {
                let t = it.get("type").and_then(Value::as_str).unwrap_or("?");
                match it.get("role").and_then(Value::as_str) {
                    Some(r) => format!("{t}:{r}"),
                    None => t.to_string(),
                }
            }
        }
    }

    /// Names of the tools offered in this request (`name`, or `type` for built-ins/namespaces).
    pub fn tool_names(&self) -> Vec<String> {
        self.body
            .get("tools")
            .and_then(Value::as_array)
            .map(|ts| {
                ts.iter()
                    .filter_map(|t| t.get("name").and_then(Value::as_str).or_else(|| t.get("type").and_then(Value::as_str)))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every `exec_command` call in the input with what its command printed: `(cmd, output)`,
    /// where output is the text after Codex's `Output:` line (`None` while it has no output item).
    pub fn exec_results(&self) -> Vec<(String, Option<String>)> {
        self.function_calls()
            .into_iter()
            .filter(|c| c.get("name").and_then(Value::as_str) == Some("exec_command"))
            .map(|c| {
                let args = c.get("arguments").and_then(Value::as_str).unwrap_or("{}");
                let cmd = serde_json::from_str::<Value>(args)
                    .ok()
                    .and_then(|a| a.get("cmd").and_then(Value::as_str).map(str::to_string))
                    .unwrap_or_default();
                let out = self
                    .tool_outputs()
                    .into_iter()
                    .find(|o| o.get("call_id") == c.get("call_id"))
                    .and_then(|o| o.get("output").and_then(Value::as_str))
                    .map(|t| t.split_once("\nOutput:\n").map_or(t, |(_, rest)| rest).to_string());
                (cmd, out)
            })
            .collect()
    }

    /// One-line summary for diagnostics.
    pub fn summary(&self) -> String {
        format!(
            "#{} thread={} items={} last={} calls={} -> {}",
            self.index,
            self.thread_id().unwrap_or_default(),
            self.input().len(),
            self.last_item_kind(),
            self.function_calls().len(),
            self.reply
        )
    }
}

/// Text of a message item: its `text` content parts joined by newlines.
pub fn item_text(item: &Value) -> String {
    item.get("content")
        .and_then(Value::as_array)
        .map(|cs| cs.iter().filter_map(|c| c.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n"))
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// The server

type Script = Box<dyn FnMut(&Request) -> Reply + Send>;

struct Shared {
    state: Mutex<State>,
    cond: Condvar,
    script: Mutex<Script>,
    ids: AtomicU64,
    stop: AtomicBool,
}

#[derive(Default)]
struct State {
    requests: Vec<Request>,
    /// Requests the provider did not script (GETs, other paths): (method, path).
    other: Vec<(String, String)>,
    /// Protocol problems seen by the server (bad requests, compressed bodies, ...).
    errors: Vec<String>,
    /// Replies written out completely.
    answered: usize,
}

/// The scripted provider. Dropping it stops accepting connections.
pub struct ScriptedModel {
    shared: Arc<Shared>,
    addr: SocketAddr,
}

impl ScriptedModel {
    /// Default script: while the request carries no function call yet, call `exec_command` with
    /// `echo hello`; afterwards answer `done`. Stateless, so it serves any number of sessions.
    pub fn start() -> ScriptedModel {
        ScriptedModel::start_with(exec_then_done("echo hello"))
    }

    /// Script every reply with a closure that sees the recorded request.
    pub fn start_with(script: impl FnMut(&Request) -> Reply + Send + 'static) -> ScriptedModel {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cond: Condvar::new(),
            script: Mutex::new(Box::new(script)),
            ids: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let s2 = shared.clone();
        std::thread::Builder::new()
            .name("scripted-model-accept".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if s2.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let s3 = s2.clone();
                    let _ = std::thread::Builder::new().name("scripted-model-conn".into()).spawn(move || serve_connection(conn, s3));
                }
            })
            .expect("spawn accept thread");
        ScriptedModel { shared, addr }
    }

    /// Reply from a queue, in order; once it is empty, answer `fallback` (e.g. `Reply::message("done")`).
    pub fn start_queue(replies: Vec<Reply>, fallback: Reply) -> ScriptedModel {
        let mut q: VecDeque<Reply> = replies.into();
        ScriptedModel::start_with(move |_| q.pop_front().unwrap_or_else(|| fallback.clone()))
    }

    /// Replace the script (applies to requests that arrive afterwards).
    pub fn set_script(&self, script: impl FnMut(&Request) -> Reply + Send + 'static) {
        *self.shared.script.lock().unwrap() = Box::new(script);
    }

    /// `http://127.0.0.1:PORT/v1`, the provider `base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every `/responses` request so far, in arrival order.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.state.lock().unwrap().requests.clone()
    }

    pub fn request_count(&self) -> usize {
        self.shared.state.lock().unwrap().requests.len()
    }

    /// Requests attributed to `thread` (see [`Request::thread_id`]).
    pub fn requests_for_thread(&self, thread: &str) -> Vec<Request> {
        self.requests().into_iter().filter(|r| r.thread_id().as_deref() == Some(thread)).collect()
    }

    /// Distinct thread ids seen, in order of first request.
    pub fn threads(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for r in self.requests() {
            if let Some(t) = r.thread_id() {
                if !out.contains(&t) {
                    out.push(t);
                }
            }
        }
        out
    }

    /// Non-`/responses` requests seen (method, path).
    pub fn other_requests(&self) -> Vec<(String, String)> {
        self.shared.state.lock().unwrap().other.clone()
    }

    /// Protocol errors the server saw (should be empty).
    pub fn errors(&self) -> Vec<String> {
        self.shared.state.lock().unwrap().errors.clone()
    }

    /// Replies fully written to Codex.
    pub fn answered(&self) -> usize {
        self.shared.state.lock().unwrap().answered
    }

    /// Wait until at least `n` requests arrived; returns all of them.
    pub fn wait_for_requests(&self, n: usize, timeout: Duration) -> Vec<Request> {
        self.wait_state(timeout, &format!("{n} model requests"), |st| (st.requests.len() >= n).then(|| st.requests.clone()))
    }

    /// Wait for the first request (past or future) satisfying `pred`.
    pub fn wait_for(&self, timeout: Duration, what: &str, pred: impl Fn(&Request) -> bool) -> Request {
        self.wait_state(timeout, what, |st| st.requests.iter().find(|r| pred(r)).cloned())
    }

    /// Wait until `n` replies have been completely written.
    pub fn wait_answered(&self, n: usize, timeout: Duration) {
        self.wait_state(timeout, &format!("{n} model replies written"), |st| (st.answered >= n).then_some(()))
    }

    fn wait_state<T>(&self, timeout: Duration, what: &str, mut f: impl FnMut(&State) -> Option<T>) -> T {
        let deadline = Instant::now() + timeout;
        let mut g = self.shared.state.lock().unwrap();
        loop {
            if let Some(v) = f(&g) {
                return v;
            }
            let now = Instant::now();
            if now >= deadline {
                let summary: Vec<String> = g.requests.iter().map(Request::summary).collect();
                panic!(
                    "timed out after {timeout:?} waiting for {what}; requests so far:\n  {}\nerrors: {:?}",
                    summary.join("\n  "),
                    g.errors
                );
            }
            g = self.shared.cond.wait_timeout(g, deadline - now).unwrap().0;
        }
    }

    /// Total number of `role` messages containing `needle`, summed over every recorded request.
    /// (Codex resends the whole conversation each time, so one injected message shows up once in
    /// every request after it: use [`ScriptedModel::first_request_with`] and per-request counts
    /// to check "exactly once".)
    pub fn count_messages_containing(&self, role: &str, needle: &str) -> usize {
        self.requests().iter().map(|r| r.messages_containing(role, needle).len()).sum()
    }

    /// Index of the first request holding a `role` message that contains `needle`.
    pub fn first_request_with(&self, role: &str, needle: &str) -> Option<usize> {
        self.requests().iter().find(|r| !r.messages_containing(role, needle).is_empty()).map(|r| r.index)
    }

    /// Number of requests whose body mentions `needle` anywhere.
    pub fn requests_mentioning(&self, needle: &str) -> usize {
        self.requests().iter().filter(|r| r.body_contains(needle)).count()
    }

    /// All request summaries, one per line (for assertion messages).
    pub fn dump(&self) -> String {
        self.requests().iter().map(Request::summary).collect::<Vec<_>>().join("\n")
    }
}

impl Drop for ScriptedModel {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

/// The default script as a reusable closure: `exec_command(cmd)` until the conversation holds a
/// function call, then `done`.
pub fn exec_then_done(cmd: &str) -> impl FnMut(&Request) -> Reply + Send + 'static {
    let cmd = cmd.to_string();
    move |r: &Request| {
        if r.function_calls().is_empty() {
            Reply::exec(&cmd)
        } else {
            Reply::message("done")
        }
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP

struct RawRequest {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

fn read_request(r: &mut BufReader<TcpStream>) -> std::io::Result<Option<RawRequest>> {
    let mut line = String::new();
    // Skip stray empty lines between keep-alive requests.
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        if !line.trim().is_empty() {
            break;
        }
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let path = parts.next().unwrap_or_default().to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 {
            return Ok(None);
        }
        let h = h.trim_end_matches(['\r', '\n']);
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let get = |k: &str| headers.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let mut body = Vec::new();
    if get("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
        loop {
            let mut size = String::new();
            r.read_line(&mut size)?;
            let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16).unwrap_or(0);
            if n == 0 {
                // Trailers until the empty line.
                loop {
                    let mut t = String::new();
                    if r.read_line(&mut t)? == 0 || t.trim().is_empty() {
                        break;
                    }
                }
                break;
            }
            let mut chunk = vec![0; n];
            r.read_exact(&mut chunk)?;
            body.extend_from_slice(&chunk);
            let mut crlf = [0u8; 2];
            r.read_exact(&mut crlf)?;
        }
    } else if let Some(n) = get("content-length").and_then(|v| v.parse::<usize>().ok()) {
        body = vec![0; n];
        r.read_exact(&mut body)?;
    }
    Ok(Some(RawRequest { method, path, headers, body }))
}

fn write_response(w: &mut TcpStream, status: u16, ctype: &str, body: &[u8]) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        _ => "Status",
    };
    let head =
        format!("HTTP/1.1 {status} {reason}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\ncache-control: no-cache\r\n\r\n", body.len());
    w.write_all(head.as_bytes())?;
    w.write_all(body)?;
    w.flush()
}

fn serve_connection(conn: TcpStream, shared: Arc<Shared>) {
    let _ = conn.set_nodelay(true);
    let Ok(mut w) = conn.try_clone() else { return };
    let mut r = BufReader::new(conn);
    while let Ok(Some(req)) = read_request(&mut r) {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        if handle(&mut w, req, &shared).is_err() {
            return;
        }
    }
}

fn handle(w: &mut TcpStream, req: RawRequest, shared: &Arc<Shared>) -> std::io::Result<()> {
    let path_only = req.path.split('?').next().unwrap_or("").trim_end_matches('/').to_string();
    if req.method == "GET" {
        shared.state.lock().unwrap().other.push((req.method.clone(), req.path.clone()));
        shared.cond.notify_all();
        if path_only.ends_with("/models") {
            let body = json!({"object": "list", "data": [], "models": []}).to_string();
            return write_response(w, 200, "application/json", body.as_bytes());
        }
        return write_response(w, 404, "application/json", br#"{"error":"not found"}"#);
    }
    let enc = req.headers.iter().find(|(k, _)| k == "content-encoding").map(|(_, v)| v.to_ascii_lowercase());
    let parsed: Option<Value> = match enc.as_deref() {
        None | Some("identity") => serde_json::from_slice(&req.body).ok(),
        Some(other) => {
            shared.state.lock().unwrap().errors.push(format!("compressed request body ({other}) not supported"));
            None
        }
    };
    let body = match parsed {
        Some(b) if req.method == "POST" && path_only.ends_with("/responses") && b.get("input").is_some() => b,
        _ => {
            {
                let mut st = shared.state.lock().unwrap();
                st.other.push((req.method.clone(), req.path.clone()));
            }
            shared.cond.notify_all();
            let msg = br#"{"error":{"message":"mock: unsupported","type":"invalid_request_error"}}"#;
            return write_response(w, 400, "application/json", msg);
        }
    };

    // Record first (so tests can see the request while its reply is held), then script.
    let mut request = {
        let st = shared.state.lock().unwrap();
        Request {
            index: st.requests.len(),
            method: req.method,
            path: req.path,
            headers: req.headers,
            body,
            reply: String::new(),
            received_at: Instant::now(),
        }
    };
    let reply = {
        let mut script = shared.script.lock().unwrap();
        // A panicking script must not poison the model for the rest of the test.
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (script)(&request))) {
            Ok(r) => r,
            Err(_) => Reply::http_error(500, "script panicked"),
        }
    };
    request.reply = reply.describe();
    {
        let mut st = shared.state.lock().unwrap();
        request.index = st.requests.len();
        st.requests.push(request);
    }
    shared.cond.notify_all();

    if let Some(h) = &reply.hold {
        if !h.park() {
            shared.state.lock().unwrap().errors.push(format!("reply held longer than {MAX_HOLD:?}; sent anyway"));
        }
    }

    let res = match &reply.body {
        Body::HttpError(status, message) => {
            let b = json!({"error": {"message": message, "type": "server_error"}}).to_string();
            write_response(w, *status, "application/json", b.as_bytes())
        }
        Body::Items(items) => {
            let payload = sse_stream(items, &shared.ids);
            write_response(w, 200, "text/event-stream", payload.as_bytes())
        }
    };
    if res.is_ok() {
        shared.state.lock().unwrap().answered += 1;
        shared.cond.notify_all();
    }
    res
}

fn next_id(ids: &AtomicU64, prefix: &str) -> String {
    let n = ids.fetch_add(1, Ordering::SeqCst) + 1;
    format!("{prefix}_{n:04}")
}

fn render_item(item: &Item, ids: &AtomicU64) -> Value {
    match item {
        Item::Exec { cmd, yield_time_ms } => {
            let args = json!({ "cmd": cmd, "yield_time_ms": yield_time_ms });
            let call_id = next_id(ids, "call");
            json!({"type": "function_call", "id": next_id(ids, "fc"), "call_id": call_id,
                   "name": "exec_command", "arguments": args.to_string()})
        }
        Item::Message(text) => json!({
            "type": "message", "role": "assistant", "id": next_id(ids, "msg"), "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]
        }),
        Item::Call { namespace, name, arguments } => {
            let call_id = next_id(ids, "call");
            let mut v = json!({"type": "function_call", "id": next_id(ids, "fc"), "call_id": call_id,
                               "name": name, "arguments": arguments.to_string()});
            if let Some(ns) = namespace {
                v["namespace"] = json!(ns);
            }
            v
        }
        Item::Raw(v) => {
            let mut v = v.clone();
            if let Some(obj) = v.as_object_mut() {
                if !obj.contains_key("id") {
                    obj.insert("id".into(), json!(next_id(ids, "item")));
                }
                if obj.get("type").and_then(Value::as_str) == Some("function_call") && !obj.contains_key("call_id") {
                    obj.insert("call_id".into(), json!(next_id(ids, "call")));
                }
            }
            v
        }
    }
}

/// The SSE body for one reply: `response.created`, one `response.output_item.done` per item,
/// `response.completed` with usage (the shapes the real API streams).
fn sse_stream(items: &[Item], ids: &AtomicU64) -> String {
    let rid = next_id(ids, "resp");
    let mut events = vec![json!({"type": "response.created", "response": {"id": rid}})];
    for it in items {
        events.push(json!({"type": "response.output_item.done", "item": render_item(it, ids)}));
    }
    events.push(json!({"type": "response.completed", "response": {"id": rid, "usage": {
        "input_tokens": 10, "input_tokens_details": null, "output_tokens": 5,
        "output_tokens_details": null, "total_tokens": 15}}}));
    let mut out = String::new();
    for ev in events {
        out.push_str(&format!("event: {}\ndata: {}\n\n", ev["type"].as_str().unwrap(), ev));
    }
    out
}
