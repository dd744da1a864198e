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
//! The same scripting speaks OpenAI chat completions for GitHub Copilot CLI: [`ScriptedChat`]
//! (`chat.rs`).
//!
//! Files: `reply.rs` (replies and their SSE stream), `hold.rs`, `request.rs` (recorded requests),
//! `wire.rs` (what goes over HTTP); the server, recorder and waits are the shared core's
//! (`crate::scripted`); this file is the provider's queries and its ready-made scripts.

use std::time::Duration;

use crate::scripted::{self, Scripted};

/// How long a held reply waits for [`Hold::release`] before the server gives up and answers
/// anyway (so a failed test never wedges a Codex process forever).
pub const MAX_HOLD: Duration = Duration::from_secs(90);

mod chat;
mod hold;
mod reply;
mod request;
mod wire;

pub use chat::{chat_text, Chat, ScriptedChat};
pub use hold::Hold;
pub use reply::Reply;
pub use request::{item_text, Request};
pub use wire::Responses;

/// The scripted provider: the shared core ([`Scripted`]: requests, waits, script) speaking the
/// Responses API. Dropping it stops accepting connections.
pub type ScriptedModel = Scripted<Responses>;

impl Scripted<Responses> {
    /// Default script: while the request carries no function call yet, call `exec_command` with
    /// `echo hello`; afterwards answer `done`. Stateless, so it serves any number of sessions.
    pub fn start() -> ScriptedModel {
        ScriptedModel::start_with(exec_then_done("echo hello"))
    }

    /// Reply from a queue, in order; once it is empty, answer `fallback` (e.g. `Reply::message("done")`).
    pub fn start_queue(replies: Vec<Reply>, fallback: Reply) -> ScriptedModel {
        ScriptedModel::start_with(scripted::queue(replies, fallback, |_: &Request| true))
    }

    /// `http://127.0.0.1:PORT/v1`, the provider `base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr())
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
