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
//!
//! Files: `reply.rs` (replies and their SSE stream), `hold.rs`, `request.rs` (recorded requests),
//! `http.rs` (the connection side); this file is the server and its ready-made scripts.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::util::wait_on;

/// How long a held reply waits for [`Hold::release`] before the server gives up and answers
/// anyway (so a failed test never wedges a Codex process forever).
pub const MAX_HOLD: Duration = Duration::from_secs(90);

mod hold;
pub mod http;
mod reply;
mod request;

pub use hold::Hold;
pub use reply::Reply;
pub use request::{item_text, Request};

type Script = Box<dyn FnMut(&Request) -> Reply + Send>;

struct Shared {
    state: Mutex<State>,
    cond: Condvar,
    script: Mutex<Script>,
    ids: AtomicU64,
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
    server: http::AcceptLoop,
}

impl ScriptedModel {
    /// Default script: while the request carries no function call yet, call `exec_command` with
    /// `echo hello`; afterwards answer `done`. Stateless, so it serves any number of sessions.
    pub fn start() -> ScriptedModel {
        ScriptedModel::start_with(exec_then_done("echo hello"))
    }

    /// Script every reply with a closure that sees the recorded request.
    pub fn start_with(script: impl FnMut(&Request) -> Reply + Send + 'static) -> ScriptedModel {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cond: Condvar::new(),
            script: Mutex::new(Box::new(script)),
            ids: AtomicU64::new(0),
        });
        let s2 = shared.clone();
        let server = http::AcceptLoop::start("scripted-model", move |w, req| http::handle(w, req, &s2));
        ScriptedModel { shared, server }
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
        format!("http://{}/v1", self.server.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr
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

    fn wait_state<T>(&self, timeout: Duration, what: &str, f: impl FnMut(&State) -> Option<T>) -> T {
        wait_on(&self.shared.state, &self.shared.cond, timeout, f).unwrap_or_else(|g| {
            let summary: Vec<String> = g.requests.iter().map(Request::summary).collect();
            panic!("timed out after {timeout:?} waiting for {what}; requests so far:\n  {}\nerrors: {:?}", summary.join("\n  "), g.errors)
        })
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

    /// Asserts the model received `text` exactly once: Codex resends the conversation with every
    /// request, so the first request holding it holds it once, and no request holds it twice
    /// (a second delivery would sit beside the first in every later request).
    pub fn assert_received_once(&self, text: &str, timeout: Duration) {
        // Codex writes the rollout (which confirms) before it sends the request: wait for it.
        self.wait_for(timeout, "a request carrying the message", |r| r.items_containing(text) > 0);
        let counts: Vec<usize> = self.requests().iter().map(|r| r.items_containing(text)).collect();
        let first = counts.iter().position(|c| *c > 0).expect("delivered");
        assert_eq!(counts[first], 1, "once in its first request: {counts:?}\n{}", self.dump());
        assert!(counts.iter().all(|c| *c <= 1), "never twice in one request: {counts:?}\n{}", self.dump());
    }

    /// All request summaries, one per line (for assertion messages).
    pub fn dump(&self) -> String {
        self.requests().iter().map(Request::summary).collect::<Vec<_>>().join("\n")
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

/// The parent's side of a sub-agent session, for a script to return: spawn an agent on `task`
/// while the conversation holds no call yet, then wait (up to `wait_ms`) for the agent it
/// spawned, then `done`.
pub fn parent_of_subagent(r: &Request, task: &str, wait_ms: u64) -> Reply {
    if r.function_calls().is_empty() {
        Reply::spawn_agent(task)
    } else if let Some(agent) = r.spawned_agent() {
        Reply::wait_agent(&[&agent], wait_ms)
    } else {
        Reply::message("done")
    }
}

/// [`exec_then_done`] with the tool call held on `hold`: Codex waits inside the turn, its first
/// tool call not yet made, until the test releases it.
pub fn exec_held_then_done(cmd: &str, hold: &Hold) -> impl FnMut(&Request) -> Reply + Send + 'static {
    exec_held_per_session(cmd, std::slice::from_ref(hold))
}

/// [`exec_held_then_done`] with a hold per session: the n-th session's first reply waits on
/// `holds[n]` (the last hold serves every later session).
pub fn exec_held_per_session(cmd: &str, holds: &[Hold]) -> impl FnMut(&Request) -> Reply + Send + 'static {
    let (cmd, holds) = (cmd.to_string(), holds.to_vec());
    let mut sessions = 0;
    move |r: &Request| {
        if r.function_calls().is_empty() {
            sessions += 1;
            Reply::exec(&cmd).held(&holds[(sessions - 1).min(holds.len() - 1)])
        } else {
            Reply::message("done")
        }
    }
}
