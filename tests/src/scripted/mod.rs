//! The core both scripted model APIs share: a loopback HTTP server ([`http::AcceptLoop`]), the
//! script that decides each answer (a closure, or a queue via [`queue`]), the recorder of every
//! request and the bounded waits on it. What each API puts on the wire (which requests it
//! scripts, how an answer is streamed) is its own module's [`Wire`]: `crate::model` (OpenAI's
//! Responses API, for Codex) and `crate::messages` (Anthropic's Messages API, for Claude Code).
//!
//! Files: `http.rs` (the plain HTTP/1.1 side: accept loop, request reader, response writer).

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::util::wait_on;

pub mod http;

use http::{AcceptLoop, RawRequest};

/// One model API's wire format: the request it records and the answer a script gives.
pub trait Wire: Sized + Send + Sync + 'static {
    type Request: Recorded;
    type Answer: Send + 'static;
    /// Names the server's threads.
    const NAME: &'static str;
    /// Serve one HTTP request: record it through `core`, script its answer, write it out (an
    /// `Err` closes the connection).
    fn serve(w: &mut TcpStream, req: RawRequest, core: &Core<Self>) -> std::io::Result<()>;
}

/// A recorded request: numbered in arrival order, summarised in a line for diagnostics.
pub trait Recorded: Clone + Send + 'static {
    fn set_index(&mut self, index: usize);
    fn summary(&self) -> String;
}

type Script<W> = Box<dyn FnMut(&<W as Wire>::Request) -> <W as Wire>::Answer + Send>;

/// What the server saw, behind one lock so a wait sees a consistent picture.
pub struct Log<R> {
    /// The scripted requests, in arrival order.
    pub requests: Vec<R>,
    /// Requests the API does not script (other paths, GETs): (method, path).
    pub other: Vec<(String, String)>,
    /// Protocol problems seen by the server (compressed bodies, holds that timed out, ...).
    pub errors: Vec<String>,
    /// Answers written out completely.
    pub answered: usize,
}

/// The state a server's connection threads share with the test.
pub struct Core<W: Wire> {
    log: Mutex<Log<W::Request>>,
    cond: Condvar,
    script: Mutex<Script<W>>,
    /// Counter for the ids answers carry (`call_0001`, `msg_0002`, ...).
    pub ids: AtomicU64,
}

impl<W: Wire> Core<W> {
    fn change(&self, f: impl FnOnce(&mut Log<W::Request>)) {
        f(&mut self.log.lock().unwrap());
        self.cond.notify_all();
    }

    /// A request the API does not script.
    pub fn note_other(&self, method: String, path: String) {
        self.change(|log| log.other.push((method, path)));
    }

    pub fn note_error(&self, error: String) {
        self.change(|log| log.errors.push(error));
    }

    /// Ask the script for `request`'s answer; a panicking script answers `on_panic` (it must not
    /// poison the server for the rest of the test).
    pub fn script(&self, request: &W::Request, on_panic: impl FnOnce() -> W::Answer) -> W::Answer {
        let mut script = self.script.lock().unwrap();
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (script)(request))).unwrap_or_else(|_| on_panic())
    }

    /// Record a scripted request (numbered here), waking every wait.
    pub fn record(&self, mut request: W::Request) {
        self.change(|log| {
            request.set_index(log.requests.len());
            log.requests.push(request);
        });
    }

    /// One answer went out whole.
    pub fn note_answered(&self) {
        self.change(|log| log.answered += 1);
    }
}

/// A scripted model API on `127.0.0.1:0`. Dropping it stops accepting connections.
pub struct Scripted<W: Wire> {
    core: Arc<Core<W>>,
    server: AcceptLoop,
}

impl<W: Wire> Scripted<W> {
    /// Script every answer with a closure that sees the recorded request.
    pub fn start_with(script: impl FnMut(&W::Request) -> W::Answer + Send + 'static) -> Scripted<W> {
        let log = Log { requests: Vec::new(), other: Vec::new(), errors: Vec::new(), answered: 0 };
        let core =
            Arc::new(Core { log: Mutex::new(log), cond: Condvar::new(), script: Mutex::new(Box::new(script)), ids: AtomicU64::new(0) });
        let c2 = core.clone();
        let server = AcceptLoop::start(W::NAME, move |w, req| W::serve(w, req, &c2));
        Scripted { core, server }
    }

    /// Replace the script (applies to requests that arrive afterwards).
    pub fn set_script(&self, script: impl FnMut(&W::Request) -> W::Answer + Send + 'static) {
        *self.core.script.lock().unwrap() = Box::new(script);
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr
    }

    /// Every scripted request so far, in arrival order.
    pub fn requests(&self) -> Vec<W::Request> {
        self.core.log.lock().unwrap().requests.clone()
    }

    pub fn request_count(&self) -> usize {
        self.core.log.lock().unwrap().requests.len()
    }

    /// Requests the API did not script (method, path).
    pub fn other_requests(&self) -> Vec<(String, String)> {
        self.core.log.lock().unwrap().other.clone()
    }

    /// Protocol errors the server saw (should be empty).
    pub fn errors(&self) -> Vec<String> {
        self.core.log.lock().unwrap().errors.clone()
    }

    /// Answers fully written out.
    pub fn answered(&self) -> usize {
        self.core.log.lock().unwrap().answered
    }

    /// Wait until at least `n` requests arrived; returns all of them.
    pub fn wait_for_requests(&self, n: usize, timeout: Duration) -> Vec<W::Request> {
        self.wait_log(timeout, &format!("{n} model requests"), |log| (log.requests.len() >= n).then(|| log.requests.clone()))
    }

    /// Wait for the first request (past or future) satisfying `pred`.
    pub fn wait_for(&self, timeout: Duration, what: &str, pred: impl Fn(&W::Request) -> bool) -> W::Request {
        self.wait_log(timeout, what, |log| log.requests.iter().find(|r| pred(r)).cloned())
    }

    /// Wait until `n` answers have been completely written.
    pub fn wait_answered(&self, n: usize, timeout: Duration) {
        self.wait_log(timeout, &format!("{n} model replies written"), |log| (log.answered >= n).then_some(()))
    }

    /// Wait until `f` finds what it looks for in the log; panics with every request on timeout.
    pub fn wait_log<T>(&self, timeout: Duration, what: &str, f: impl FnMut(&Log<W::Request>) -> Option<T>) -> T {
        wait_on(&self.core.log, &self.core.cond, timeout, f).unwrap_or_else(|log| {
            let summary: Vec<String> = log.requests.iter().map(Recorded::summary).collect();
            panic!("timed out after {timeout:?} waiting for {what}; requests so far:\n  {}\nerrors: {:?}", summary.join("\n  "), log.errors)
        })
    }

    /// All request summaries, one per line (for assertion messages).
    pub fn dump(&self) -> String {
        self.requests().iter().map(Recorded::summary).collect::<Vec<_>>().join("\n")
    }
}

/// A script answering from `answers` in order, then `fallback`. A request `takes` refuses gets
/// `fallback` and takes nothing from the queue (e.g. a side query beside the conversation).
pub fn queue<R, A: Clone + Send + 'static>(
    answers: Vec<A>,
    fallback: A,
    takes: impl Fn(&R) -> bool + Send + 'static,
) -> impl FnMut(&R) -> A + Send + 'static {
    let mut q: VecDeque<A> = answers.into();
    move |r| match takes(r) {
        true => q.pop_front().unwrap_or_else(|| fallback.clone()),
        false => fallback.clone(),
    }
}
