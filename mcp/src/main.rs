//! `courier-mcp` (run as `broker mcp`): an MCP server on stdio, so agents in Codex and Claude Code
//! can message other Codex threads and Claude Code sessions and read receipts. Tools: `send_message`, `list_threads`,
//! `message_status`, `list_approvals` (read-only: an approval is answered only by a person, never
//! through this server, which runs under Codex). Each call is one request of the broker's JSON-lines socket protocol
//! (docs/producers.md): this process holds no queue state and needs a running broker.
//!
//! The calling thread: Codex puts the thread id and the tool call id in each `tools/call`
//! request's `_meta` (`threadId`/`callId`, or inside `x-codex-turn-metadata`). They are claims;
//! this server passes them on as the sender, and the broker checks them against what Codex
//! holds (its parent is a trusted codex that runs that thread, whose open turn has that call)
//! before the message reads `from="thread:<id>" verified="true"`.
//!
//! Claude Code names nothing of the kind in `_meta` (only `claudecode/toolUseId`), but starts its
//! MCP servers with the session's id in `CLAUDE_CODE_SESSION_ID` (probed on 2.1.332). This server
//! then asks the broker to verify it as it verifies a Claude Code model's `broker send`
//! (`verify_sender`: the peer's nearest trusted host above it is a claude, and the session it
//! claims is pinned to that very process). GitHub Copilot CLI does the same with
//! `COPILOT_AGENT_SESSION_ID` (probed on 1.0.102), checked by Copilot's row of the same proof
//! (the nearest trusted host above is a copilot that holds that session's lock).

use courier_producer_proto::request::{Record, Request, SenderClaim};
use courier_producer_proto::{Mode, Outcome, Progress, State, Want};
use courier_shared::ids::SESSION_VARS;
use courier_shared::wire::ErrorCode;
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{CallToolResult, ContentBlock, Implementation, RequestMetaObject, ServerCapabilities, ServerConfig};
use rmcp::{schemars, tool, tool_handler, tool_router, ErrorData, ServerHandler, ServiceExt};
use serde::Deserialize;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

/// Longest reply line read from the broker.
const MAX_REPLY: u64 = 16 << 20;
/// How long `send_message` waits for a receipt when asked to and no timeout is given.
const DEFAULT_WAIT_S: u64 = 60;
/// The longest wait `send_message` takes (the CLI's longest duration, 365 days).
const MAX_WAIT_S: u64 = 365 * 86_400;
/// `send_message`'s `wait` when it should return at once.
const NO_WAIT: &str = "none";
/// The sender label of a message whose sender could not be verified.
const UNVERIFIED_FROM: &str = "mcp";

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct SendMessage {
    /// The message text (at most about 7,800 bytes).
    text: String,
    /// The thread to message: its id, as `list_threads` shows it.
    #[serde(default)]
    thread: Option<String>,
    /// Or: the working directory of the one live top-level thread to message.
    #[serde(default)]
    cwd: Option<String>,
    /// Or: the thread's name (as `list_threads` shows it, given by a person with `broker name`),
    /// or relative to the calling thread: "parent" (the thread that spawned you), or
    /// "child:<nickname or thread id>" (a sub-agent you spawned).
    #[serde(default)]
    to: Option<String>,
    /// steer (default): into its running turn, or a new turn when idle; next-turn: never inside
    /// a running turn, only when it is over or with the next prompt; interrupt: stop its running
    /// turn and deliver in a new one (a Codex thread with an app-server only).
    #[serde(default)]
    mode: Option<String>,
    /// Idempotency key: the same key and text again give the same message id.
    #[serde(default)]
    key: Option<String>,
    /// Expire the message if it is not delivered within this many seconds.
    #[serde(default)]
    ttl_seconds: Option<u64>,
    /// none (default): return at once with the id; handed: return once the other thread's
    /// Codex has it; confirmed: once it reached the other thread's model.
    #[serde(default)]
    wait: Option<String>,
    /// With wait: give up after this many seconds (default 60).
    #[serde(default)]
    timeout_seconds: Option<u64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct ListThreads {
    /// Also threads that have ended (newest first).
    #[serde(default)]
    all: bool,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct MessageStatus {
    /// The message id `send_message` returned (m_ and 16 hex digits).
    id: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct ListApprovals {
    /// Also approvals already answered or over (with who answered, how, when and the outcome).
    #[serde(default)]
    all: bool,
}

#[derive(Clone)]
struct Courier {
    socket: PathBuf,
    #[allow(dead_code, reason = "read by the tool_handler macro")]
    tool_router: ToolRouter<Courier>,
}

fn text_result(v: &Value) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(serde_json::to_string_pretty(v).unwrap_or_default())])
}

fn error_result(msg: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(msg.into())])
}

/// The calling thread and tool call, as Codex names them in the request's `_meta`.
fn caller(meta: &RequestMetaObject) -> (Option<String>, Option<String>) {
    let m: &serde_json::Map<String, Value> = &meta.0 .0;
    let s = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    let turn = m.get("x-codex-turn-metadata");
    let thread =
        s(m.get("threadId")).or_else(|| s(turn.and_then(|t| t.get("thread_id")))).or_else(|| s(turn.and_then(|t| t.get("session_id"))));
    let call = s(m.get("callId")).or_else(|| s(turn.and_then(|t| t.get("call_id"))));
    (thread, call)
}

/// `send_message`'s `wait`: the state to wait for, `None` to return at once.
fn want_of(wait: Option<&str>) -> Result<Option<Want>, String> {
    match wait {
        None | Some(NO_WAIT) => Ok(None),
        Some(w) => Want::parse(w)
            .map(Some)
            .ok_or_else(|| format!("wait: {w:?}: use {NO_WAIT}, {} or {}", Want::Handed.as_str(), Want::Confirmed.as_str())),
    }
}

/// What the broker is asked to verify the sender by: the thread and call Codex named, or (under
/// Claude Code or Copilot CLI) the peer itself (`verify_sender`); with neither, why the sender is not verified.
fn claims(me: Option<String>, call_id: Option<String>) -> (Option<SenderClaim>, bool, Option<String>) {
    match (me, call_id) {
        (Some(thread), Some(call_id)) => (Some(SenderClaim { thread, call_id }), false, None),
        _ if under_session_host() => (None, true, None),
        _ => (None, false, Some(format!(
            "Codex named no calling thread and tool call in the request (_meta threadId, callId), and no Claude Code or Copilot CLI session started this server ({})", SESSION_VARS.join(", ")
        ))),
    }
}

/// Whether a host that names its session in the environment started this server for a session
/// ([`SESSION_VARS`]): a claim the broker checks.
fn under_session_host() -> bool {
    SESSION_VARS.iter().any(|k| std::env::var_os(k).is_some_and(|v| !v.is_empty()))
}

impl Courier {
    /// One request line to the broker, one reply line back.
    async fn call(&self, request: &Request) -> Result<Value, String> {
        let socket = self.socket.clone();
        let mut line = serde_json::to_vec(request).map_err(|e| e.to_string())?;
        line.push(b'\n');
        let out = tokio::task::spawn_blocking(move || -> Result<Value, String> {
            let mut s = UnixStream::connect(&socket).map_err(|e| {
                format!("the Courier broker does not answer at {} ({e}); start it with `broker serve --daemonize`", socket.display())
            })?;
            s.write_all(&line).map_err(|e| format!("writing to the broker: {e}"))?;
            let mut reply = Vec::new();
            BufReader::new(s.take(MAX_REPLY)).read_until(b'\n', &mut reply).map_err(|e| format!("reading the broker's reply: {e}"))?;
            serde_json::from_slice(&reply).map_err(|e| format!("the broker's reply is not JSON ({e})"))
        })
        .await
        .map_err(|e| e.to_string())?;
        let reply = out?;
        if reply.get("ok") == Some(&Value::Bool(true)) {
            Ok(reply)
        } else {
            Err(format!(
                "{}: {}",
                reply.get("error").and_then(Value::as_str).unwrap_or("error"),
                reply.get("message").and_then(Value::as_str).unwrap_or("the broker refused the request")
            ))
        }
    }

    /// Waits for a queued message by asking its status every second, until it reached `want`,
    /// ended, or `timeout`; adds `outcome` and `messages` to `reply` as a parked wait's answer
    /// would (judged by the protocol's one rule).
    async fn poll(&self, reply: &mut Value, want: Want, timeout: std::time::Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        let Some(id) = reply["id"].as_str().map(str::to_string) else { return };
        loop {
            let Ok(status) = self.call(&Request::Status { id: id.clone() }).await else { return };
            let Ok(record) = serde_json::from_value::<Record>(status["message"].clone()) else { return };
            let outcome = match record.progress(want) {
                Progress::InFlight | Progress::Held if tokio::time::Instant::now() < deadline => None,
                p => Some(Outcome::of([p])),
            };
            if let Some(outcome) = outcome {
                reply["outcome"] = json!(outcome);
                reply["messages"] = json!([status["message"]]);
                return;
            }
            tokio::time::sleep(std::time::Duration::from_secs(1).min(deadline.saturating_duration_since(tokio::time::Instant::now())))
                .await;
        }
    }

    /// `to: "parent"` / `"child:<name>"`, relative to the calling thread.
    async fn relative(&self, to: &str, me: Option<&str>) -> Result<String, String> {
        let me = me.ok_or("`to` needs the calling thread, which this Codex did not name in the request")?;
        let threads = self.call(&Request::Threads { all: true, limit: Some(200) }).await?;
        let list = threads["threads"].as_array().cloned().unwrap_or_default();
        let mine = list.iter().find(|t| t["id"] == me).ok_or_else(|| format!("the calling thread {me} is not listed"))?;
        if to == "parent" {
            return mine["parent"].as_str().map(str::to_string).ok_or_else(|| format!("thread {me} has no parent (it is not a sub-agent)"));
        }
        let Some(name) = to.strip_prefix("child:") else {
            return Err(format!("to: {to:?}: use \"parent\" or \"child:<nickname or thread id>\""));
        };
        let children: Vec<&Value> = list.iter().filter(|t| t["parent"] == me).collect();
        let hits: Vec<&&Value> = children.iter().filter(|t| t["id"] == name || t["agent_nickname"] == name).collect();
        match hits.as_slice() {
            [one] => Ok(one["id"].as_str().unwrap_or_default().to_string()),
            [] => Err(format!(
                "no sub-agent of {me} is called {name:?}; its sub-agents: {:?}",
                children.iter().map(|t| (t["id"].as_str().unwrap_or(""), t["agent_nickname"].as_str().unwrap_or(""))).collect::<Vec<_>>()
            )),
            _ => Err(format!("several sub-agents of {me} are called {name:?}: give a thread id")),
        }
    }
}

#[tool_router]
impl Courier {
    fn new(socket: PathBuf) -> Courier {
        Courier { socket, tool_router: Self::tool_router() }
    }

    #[tool(description = "Send a message to another Codex thread or Claude Code session (by thread or session id, working directory, \
        or as your parent/child). It reaches that thread's model exactly once, inside its running turn or its next one. Returns the message id; \
        with wait, also whether it arrived (outcome reached / timed_out / ended).")]
    async fn send_message(&self, meta: RequestMetaObject, Parameters(p): Parameters<SendMessage>) -> Result<CallToolResult, ErrorData> {
        let (me, call_id) = caller(&meta);
        let (thread, cwd, name) = match (p.thread, p.cwd, p.to) {
            (Some(t), None, None) => (Some(t), None, None),
            (None, Some(c), None) => (None, Some(c), None),
            (None, None, Some(to)) if to == "parent" || to.starts_with("child:") => match self.relative(&to, me.as_deref()).await {
                Ok(t) => (Some(t), None, None),
                Err(e) => return Ok(error_result(e)),
            },
            // A name: the broker resolves it (`misaddressed` when no thread has it).
            (None, None, Some(name)) => (None, None, Some(name)),
            _ => return Ok(error_result("give exactly one of thread, cwd and to")),
        };
        let mode = match p.mode.as_deref().map(|m| Mode::parse(m).ok_or(m)) {
            None => None,
            Some(Ok(m)) => Some(m),
            Some(Err(m)) => return Ok(error_result(format!("mode {m:?}: steer, next-turn or interrupt"))),
        };
        let timeout = std::time::Duration::from_secs(p.timeout_seconds.unwrap_or(DEFAULT_WAIT_S).min(MAX_WAIT_S));
        let wait = match want_of(p.wait.as_deref()) {
            Ok(w) => w,
            Err(e) => return Ok(error_result(e)),
        };
        // Why the sender is not verified, for the result (`sender_note`), when it is not.
        let (sender, verify_sender, mut unverified) = claims(me, call_id);
        let verified = sender.is_some() || verify_sender;
        let request = |sender: Option<SenderClaim>, verify_sender: bool| Request::Send {
            thread: thread.clone(),
            cwd: cwd.clone(),
            to: name.clone(),
            agent: None,
            text: p.text.clone(),
            key: p.key.clone(),
            // Saturating: a huge ttl reaches the broker as one, which refuses it (`bad_ttl`).
            ttl_ms: p.ttl_seconds.map(|s| s.saturating_mul(1000)),
            from: (sender.is_none() && !verify_sender).then(|| UNVERIFIED_FROM.to_string()),
            future_thread: false,
            verify_sender,
            sender,
            wake: None,
            mode,
            wait,
            timeout_ms: wait.map(|_| timeout.as_millis() as u64),
        };
        let mut sent = self.call(&request(sender, verify_sender)).await;
        if let Err(e) = &sent {
            let not_verified = format!("{}: ", ErrorCode::SenderNotVerified.as_str());
            if let Some(why) = e.strip_prefix(&not_verified).filter(|_| verified) {
                // Sent anyway, as a label the model reads as unverified; the caller hears why.
                unverified = Some(why.to_string());
                sent = self.call(&request(None, false)).await;
            }
        }
        if let (Ok(reply), Some(want)) = (&mut sent, wait) {
            if reply["parked"] == json!(false) {
                // The broker's parked waits are full: queued, not waited for. Poll its status.
                self.poll(reply, want, timeout).await;
            }
        }
        Ok(match sent {
            Ok(mut reply) => {
                if let Some(why) = unverified {
                    reply["sender_note"] = json!(format!("the sender could not be verified ({why}); sent as from=\"{UNVERIFIED_FROM}\""));
                }
                if let Some(m) = reply.get("messages").and_then(|m| m.get(0)).cloned() {
                    reply["state"] = m["state"].clone();
                    reply["reason"] = m["reason"].clone();
                }
                if let Value::Object(o) = &mut reply {
                    o.remove("messages");
                    o.remove("ok");
                }
                text_result(&reply)
            }
            Err(e) => error_result(e),
        })
    }

    #[tool(description = "List the live Codex threads and Claude Code sessions on this machine that can receive messages: \
        id, host (codex or claude-code), state (busy: a turn is open, idle: none, live: running, turn not yet known), cwd, title (first prompt), \
        parent and children, queued and handed messages. all=true adds ended ones.")]
    async fn list_threads(&self, Parameters(p): Parameters<ListThreads>) -> Result<CallToolResult, ErrorData> {
        Ok(match self.call(&Request::Threads { all: p.all, limit: None }).await {
            Ok(reply) => {
                let brief: Vec<Value> = reply["threads"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|t| {
                        let mut brief = json!({"id": t["id"], "host": t["host"], "state": t["state"], "cwd": t["cwd"], "title": t["title"],
                               "parent": t["parent"], "children": t["children"], "agent_nickname": t["agent_nickname"], "pending": t["pending"]});
                        // Messages handed and not settled yet: the thread's count in that state.
                        let handed = State::Handed.as_str();
                        brief[handed] = json!(t["messages"][handed].as_u64().unwrap_or(0));
                        brief["process"] = t["process"]["kind"].clone();
                        brief
                    })
                    .collect();
                text_result(&json!({"threads": brief}))
            }
            Err(e) => error_result(e),
        })
    }

    #[tool(description = "The state of a message sent with send_message: pending, leased, handed (its Codex has it), \
        confirmed (it reached the model), or uncertain / expired / cancelled with the reason.")]
    async fn message_status(&self, Parameters(p): Parameters<MessageStatus>) -> Result<CallToolResult, ErrorData> {
        Ok(match self.call(&Request::Status { id: p.id }).await {
            Ok(reply) => text_result(&reply["message"]),
            Err(e) => error_result(e),
        })
    }

    #[tool(description = "List the commands Codex threads on this machine wait on a person to approve: id, thread, \
        tool, command, the model's reason, since when (ms since the epoch), state. all=true adds answered ones with the \
        answer record. Read-only: only a person answers an approval, at the Codex prompt or with `broker approve|deny`.")]
    async fn list_approvals(&self, Parameters(p): Parameters<ListApprovals>) -> Result<CallToolResult, ErrorData> {
        Ok(match self.call(&Request::Approvals { all: p.all }).await {
            Ok(reply) => text_result(&json!({"approvals": reply["approvals"]})),
            Err(e) => error_result(e),
        })
    }
}

#[tool_handler]
impl ServerHandler for Courier {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("courier", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Courier delivers messages between Codex threads and Claude Code sessions exactly once, with receipts. list_threads finds \
                 threads; send_message sends (to a thread id, a cwd, or your parent/child); message_status tells \
                 whether it arrived; list_approvals shows the commands threads wait on a person to approve \
                 (read-only). A message you send is shown to the other model as from=\"thread:<your id>\" \
                 verified=\"true\" when the broker could verify it came from your thread.",
            )
    }
}

fn main() {
    let arg = std::env::args().nth(1);
    match arg.as_deref() {
        None => {}
        Some("--version" | "-V") => {
            println!("courier-mcp {}", env!("CARGO_PKG_VERSION"));
            return;
        }
        Some(_) => {
            println!(
                "broker mcp: an MCP server on stdio (tools send_message, list_threads, message_status, list_approvals).\n\
                 Register it in Codex: [mcp_servers.courier] command = \"broker\", args = [\"mcp\"]"
            );
            return;
        }
    }
    let socket = courier_shared::paths::socket_path(&courier_shared::paths::runtime_dir());
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("broker mcp: {e}");
            std::process::exit(1);
        }
    };
    let served = runtime.block_on(async move {
        let service = Courier::new(socket).serve(rmcp::transport::stdio()).await.map_err(|e| e.to_string())?;
        service.waiting().await.map_err(|e| e.to_string())?;
        Ok::<(), String>(())
    });
    if let Err(e) = served {
        eprintln!("broker mcp: {e}");
        std::process::exit(1);
    }
}
