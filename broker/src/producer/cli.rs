//! `broker send`, `broker status`, `broker wait`, `broker threads`.
//!
//! Exit status of the waiting commands (`wait`, `send --wait`): 0 the wanted state was reached
//! (or passed); 1 an error (I/O, broker, database); 2 a usage error (including a thread id no
//! rollout has, and a `--cwd` that names no thread or several); 3 the timeout ran out with a
//! message still queued, leased or handed; 4 a message ended without reaching it (`uncertain`,
//! `expired`, `cancelled`; the reason is printed).

use super::line::{ErrorCode, ErrorReply};
use super::send::{self, SendError, SendOptions, Target};
use super::threads::{self, Lister, ThreadInfo};
use super::wait::{self, Waited};
use super::{is_message_id, record_json, Outcome, Want};
use crate::cli::{Format, Given, UsageError};
use crate::store::{now_ms, State, Store, MAX_BODY_BYTES};
use anyhow::{bail, Context, Result};
use courier_producer_proto::request::{Request, WakeMode};
use courier_producer_proto::{Mode, SenderClass};
use courier_shared::paths;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

fn open_store() -> Result<Store> {
    let state_dir = paths::state_dir();
    crate::dirs::ensure_private_dir(&state_dir)?;
    Store::open(&state_dir)
}

/// The message body from stdin: at most the limit plus one byte is read, so an endless or huge
/// pipe is refused at once instead of being held in memory.
fn read_stdin_body() -> Result<String> {
    let mut buf = Vec::with_capacity(4096);
    std::io::stdin().lock().take(MAX_BODY_BYTES as u64 + 1).read_to_end(&mut buf).context("reading the message from stdin")?;
    if buf.len() > MAX_BODY_BYTES {
        return Err(crate::store::Invalid(format!("{}; nothing was queued", crate::store::body_too_long())).into());
    }
    String::from_utf8(buf).map_err(|_| crate::store::Invalid("the message on stdin is not UTF-8; nothing was queued".into()).into())
}

/// The threads a running broker sees (its digest cache and rollout reader are warm), else read
/// here from `/proc` and the rollouts.
pub fn fetch_threads(all: bool, limit: usize) -> Result<Vec<ThreadInfo>> {
    let socket = paths::socket_path(&paths::runtime_dir());
    let req = Request::Threads { all, limit: Some(limit) };
    if let Ok(Some(reply)) = super::line::call(&socket, &req, Some(Duration::from_secs(30))) {
        if reply.get("ok") == Some(&Value::Bool(true)) {
            return serde_json::from_value(reply["threads"].clone()).context("the broker's thread list does not parse");
        }
        bail!("the broker could not list threads: {}", reply.get("message").and_then(Value::as_str).unwrap_or("?"));
    }
    let store = open_store()?;
    Lister::for_cli(paths::codex_home()).list(&store, all, limit)
}

/// Tells a running broker that rows were queued in the database behind its back, so its idle
/// passes look at once (the `nudge` request); without a broker, or with one that does not know
/// the request, they find the rows at their fallback. Best effort: the rows are committed.
pub fn nudge() {
    let socket = paths::socket_path(&paths::runtime_dir());
    let _ = super::line::call(&socket, &Request::Nudge {}, Some(Duration::from_secs(2)));
}

/// `--wait`/`--for`: the state to wait for.
fn want_of(g: &Given) -> Result<Option<Want>> {
    let want = |w: &String| Want::parse(w).ok_or_else(|| g.usage_error(format!("{w:?}: wait for handed or confirmed")));
    g.want.as_ref().map(want).transpose()
}

/// A send to a name no thread has: nothing was queued (exit 5, `misaddressed`).
#[derive(Debug)]
struct Misaddressed(String);

impl std::fmt::Display for Misaddressed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Misaddressed {}

pub fn send(cmd: SendCommand) -> Result<ExitCode> {
    let sent = match queue(cmd.opts, cmd.explicit_from) {
        Err(e) if e.is::<Misaddressed>() => {
            let outcome = Outcome::Misaddressed;
            if cmd.format == Format::Json {
                println!("{}", json!({"outcome": outcome, "error": ErrorCode::Misaddressed, "message": e.to_string()}));
            }
            eprintln!("broker send: {}", crate::terminal::escape(&e.to_string()));
            return Ok(ExitCode::from(outcome.exit().code()));
        }
        other => other?,
    };
    if let Some(note) = &sent.note {
        eprintln!("broker send: note: {note}");
    }
    report_send(&sent, cmd.want, cmd.timeout, cmd.format)
}

/// `broker send`'s command line, checked as a whole: what goes where, and how to wait for it.
pub struct SendCommand {
    opts: SendOptions,
    /// `--from` was given (a tool command's sender is then not verified: it chose a name).
    explicit_from: bool,
    want: Option<Want>,
    timeout: Option<Duration>,
    format: Format,
}

impl SendCommand {
    /// Checks the whole line first; only then reads the text from stdin (`-`).
    pub fn parse(mut g: Given) -> Result<SendCommand> {
        let target = match (g.thread.take(), g.cwd.take(), g.agent.take(), g.to.take()) {
            (Some(t), None, None, None) => Target::Thread(t),
            (Some(parent), None, Some(name), None) => Target::Agent { parent, name },
            (None, Some(c), None, None) => Target::Cwd(c),
            (None, None, None, Some(name)) => Target::Name(name),
            (None, None, _, None) => return Err(g.usage_error("--thread <UUID>, --cwd <PATH> or --to <NAME> is required")),
            (_, _, Some(_), Some(_)) | (None, Some(_), Some(_), _) => {
                return Err(g.usage_error("--agent names a sub-agent of --thread, not of --cwd or --to"))
            }
            _ => return Err(g.usage_error("give only one of --thread, --cwd and --to")),
        };
        let mode = match g.mode.as_deref() {
            None => Mode::Steer,
            Some(m) => Mode::parse(m).ok_or_else(|| g.usage_error(format!("--mode takes steer, next-turn or interrupt, not {m:?}")))?,
        };
        if g.future_thread && !matches!(target, Target::Thread(_)) {
            return Err(g.usage_error("--future-thread goes with --thread alone (--cwd and --agent name live threads)"));
        }
        let want = want_of(&g)?;
        if g.timeout.is_some() && want.is_none() {
            return Err(g.usage_error("--timeout needs --wait"));
        }
        let wake = match g.wake.as_deref() {
            None | Some("auto") => true,
            Some("never") => false,
            Some(other) => return Err(g.usage_error(format!("--wake takes auto or never, not {other:?}"))),
        };
        let mut text = g.text()?;
        if text == "-" {
            text = read_stdin_body()?;
        }
        let explicit_from = g.from.is_some();
        let from = g.from.or_else(|| std::env::var("USER").ok()).unwrap_or_else(|| "cli".into());
        let ttl_ms = g.ttl.map(|d| d.as_millis() as u64);
        let opts = SendOptions {
            target,
            text,
            key: g.key,
            ttl_ms,
            from: Some(from),
            verified_sender: false,
            future_thread: g.future_thread,
            wake,
            mode,
            // What a queue written directly proves of its sender; through a running broker the
            // broker decides (`queue`).
            class: SenderClass::Local,
        };
        Ok(SendCommand { opts, explicit_from, want, timeout: g.timeout, format: g.format })
    }
}

/// Queues the message through the running broker, which proves what it can of this process
/// (with no `--from` in a Codex tool command or a Claude Code or Copilot CLI model's command: which thread or
/// session it is, and names the sender after it; else whether it is the user's unconfined
/// process, the inbound policy's `person`), else (no broker) directly in the queue, where the
/// sender counts as `local`.
fn queue(mut opts: SendOptions, explicit_from: bool) -> Result<send::Sent> {
    // Run by a model's command (Codex's `exec_command`, Claude Code's Bash, Copilot's bash) with no --from: let
    // the broker prove which thread or session that is and name the sender after it.
    let in_codex_command = std::env::var_os("CODEX_TOOL_CALL_ID").is_some() && std::env::var_os("CODEX_THREAD_ID").is_some();
    let in_tool_command = in_codex_command || courier_shared::ids::SESSION_VARS.iter().any(|v| std::env::var_os(v).is_some());
    if in_tool_command && !explicit_from {
        match broker_send(&opts, true)? {
            Verified::Sent(s) => return Ok(s),
            Verified::Not(why) => {
                eprintln!("broker send: note: the sender is not verified ({why}); it is sent as {:?}", opts.from.as_deref().unwrap_or(""));
            }
        }
    }
    if let Verified::Sent(s) = broker_send(&opts, false)? {
        return Ok(s);
    }
    opts.verified_sender = false;
    let sent = {
        let mut store = open_store()?;
        send::send(&mut store, &paths::codex_home(), &|| fetch_threads(false, 0), &opts, None)
    };
    match sent {
        Ok(s) => {
            nudge();
            Ok(s)
        }
        Err(SendError::Refused { code: ErrorCode::Misaddressed, message }) => Err(Misaddressed(message).into()),
        Err(SendError::Refused { message, .. }) => Err(UsageError(format!("broker send: {message}")).into()),
        Err(SendError::Failed(e)) => Err(e.context(format!("queueing the message in {}", paths::state_dir().display()))),
    }
}

/// Prints the id (or the JSON record) and, with `--wait`, waits for the wanted state: the exit
/// code says how the wait ended.
fn report_send(sent: &send::Sent, want: Option<Want>, timeout: Option<Duration>, format: Format) -> Result<ExitCode> {
    let Some(want) = want else {
        if format == Format::Json {
            println!("{}", json!(sent));
        } else {
            println!("{}", sent.id);
        }
        return Ok(ExitCode::SUCCESS);
    };
    if format == Format::Text {
        // The id at once, so a caller can note it before the wait ends.
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", sent.id).and_then(|()| out.flush());
    }
    let waited = wait::wait_for(&paths::runtime_dir(), &paths::state_dir(), std::slice::from_ref(&sent.id), want, timeout)?;
    if format == Format::Json {
        let mut v = json!(sent);
        v["outcome"] = json!(waited.outcome.as_str());
        v["message"] = waited.records.first().cloned().unwrap_or(Value::Null);
        println!("{}", crate::terminal::terminal_safe_json(&v.to_string()));
    } else if waited.outcome != Outcome::Reached {
        for m in &waited.messages {
            eprintln!("broker send: {}", wait::describe(m, want));
        }
    }
    Ok(ExitCode::from(waited.outcome.exit().code()))
}

enum Verified {
    Sent(send::Sent),
    /// Not verified (no broker, or the broker could not prove it): why.
    Not(String),
}

/// `send` through the broker. With `verify_sender` it checks which thread's tool command this
/// process is and queues the message as `thread:<id>`; without, as `opts.from`, the broker
/// classing the sender for the inbound policy. `Not`: no broker answered (or it could not verify).
fn broker_send(opts: &SendOptions, verify_sender: bool) -> Result<Verified> {
    let (thread, cwd, agent, to) = match &opts.target {
        Target::Thread(t) => (Some(t.clone()), None, None, None),
        Target::Cwd(c) => (None, Some(std::path::absolute(c).unwrap_or_else(|_| c.clone()).to_string_lossy().into_owned()), None, None),
        Target::Agent { parent, name } => (Some(parent.clone()), None, Some(name.clone()), None),
        Target::Name(name) => (None, None, None, Some(name.clone())),
    };
    let req = Request::Send {
        thread,
        cwd,
        to,
        agent,
        text: opts.text.clone(),
        key: opts.key.clone(),
        ttl_ms: opts.ttl_ms,
        from: if verify_sender { None } else { opts.from.clone() },
        future_thread: opts.future_thread,
        verify_sender,
        sender: None,
        wake: Some(if opts.wake { WakeMode::Auto } else { WakeMode::Never }),
        mode: Some(opts.mode),
        wait: None,
        timeout_ms: None,
    };
    let socket = paths::socket_path(&paths::runtime_dir());
    let reply = match super::line::call(&socket, &req, Some(Duration::from_secs(30))) {
        Ok(Some(r)) => r,
        Ok(None) => return Ok(Verified::Not("no broker answered".into())),
        Err(e) => return Ok(Verified::Not(format!("{e:#}"))),
    };
    if reply.get("ok") != Some(&Value::Bool(true)) {
        let Some(ErrorReply { error, message, .. }) = ErrorReply::of(&reply) else { bail!("the broker refused the message: {reply}") };
        let message = if message.is_empty() { "the broker refused the message".into() } else { message };
        if error == ErrorCode::SenderNotVerified {
            return Ok(Verified::Not(message));
        }
        if error == ErrorCode::Misaddressed {
            return Err(Misaddressed(message).into());
        }
        if error.is_usage() {
            return Err(UsageError(format!("broker send: {message}")).into());
        }
        bail!("{message}");
    }
    let sent = serde_json::from_value(reply).context("the broker's reply to the send does not parse")?;
    Ok(Verified::Sent(sent))
}

/// `broker wait`'s command line.
pub struct WaitCommand {
    ids: Vec<String>,
    want: Want,
    timeout: Option<Duration>,
    format: Format,
}

impl WaitCommand {
    pub fn parse(g: Given) -> Result<WaitCommand> {
        let ids = g.texts()?;
        if let Some(bad) = ids.iter().find(|id| !is_message_id(id)) {
            return Err(g.usage_error(not_a_message_id(bad)));
        }
        Ok(WaitCommand { ids, want: want_of(&g)?.unwrap_or_default(), timeout: g.timeout, format: g.format })
    }
}

fn not_a_message_id(id: &str) -> String {
    format!("{id:?} is not a message id (m_ and 16 hex digits, as broker send prints)")
}

pub fn wait(cmd: WaitCommand) -> Result<ExitCode> {
    let waited = wait::wait_for(&paths::runtime_dir(), &paths::state_dir(), &cmd.ids, cmd.want, cmd.timeout)?;
    print_waited(&waited, cmd.want, cmd.format);
    Ok(ExitCode::from(waited.outcome.exit().code()))
}

fn print_waited(waited: &Waited, want: Want, format: Format) {
    let mut out = std::io::stdout().lock();
    for (m, r) in waited.messages.iter().zip(&waited.records) {
        let line = if format == Format::Json { crate::terminal::terminal_safe_json(&r.to_string()) } else { wait::describe(m, want) };
        if writeln!(out, "{line}").is_err() {
            return;
        }
    }
    let _ = out.flush();
}

/// `broker status|show`'s command line: one message id, checked.
pub struct MessageCommand {
    id: String,
    format: Format,
}

impl MessageCommand {
    pub fn parse(g: Given) -> Result<MessageCommand> {
        let id = g.text()?;
        if !is_message_id(&id) {
            return Err(g.usage_error(not_a_message_id(&id)));
        }
        Ok(MessageCommand { id, format: g.format })
    }
}

/// `broker show ID`: one message's text. Anyone may have written it, so characters a terminal
/// could act on are escaped as `inspect` escapes labels (line breaks and tabs kept).
pub fn show(cmd: MessageCommand) -> Result<ExitCode> {
    let id = cmd.id;
    let store = open_store()?;
    let Some(m) = super::load(&store, &id)? else { bail!("{}", wait::not_found(&id)) };
    let text = if cmd.format == Format::Json {
        let v = json!({"id": m.id, "thread": m.thread, "kind": m.kind, "state": m.state, "from": m.from, "text": m.body});
        crate::terminal::terminal_safe_json(&v.to_string())
    } else {
        crate::terminal::escape_text(&m.body)
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}").and_then(|()| out.flush()); // a reader that went away is not an error
    Ok(ExitCode::SUCCESS)
}

pub fn status(cmd: MessageCommand) -> Result<ExitCode> {
    let id = cmd.id;
    let mut store = open_store()?;
    let Some(mut m) = super::load(&store, &id)? else { bail!("{}", wait::not_found(&id)) };
    // What the broker would have done by now, so the answer holds with no broker running.
    if m.state == State::Handed {
        if let Err(e) = crate::delivery::reconcile(&mut store, Some(&m.thread)) {
            eprintln!("broker: warning: could not settle hand-offs ({e:#}); the state may lag");
        }
    } else if m.state == State::Pending && m.expires_at.is_some_and(|e| e <= now_ms()) {
        let _ = store.expire_due();
    }
    m = super::load(&store, &id)?.context("the message vanished")?;
    let now = now_ms();
    if cmd.format == Format::Json {
        let mut v = record_json(&m, now);
        // Who queued it, as inspect says: `local`, or `nats:<host>` for what a bridge queued.
        v["origin"] = json!(crate::inspect::origin_of(&crate::inspect::bridged_origins(&paths::state_dir()), &m.id));
        println!("{}", crate::terminal::terminal_safe_json(&serde_json::to_string_pretty(&v)?));
        return Ok(ExitCode::SUCCESS);
    }
    let esc = |s: &str| crate::terminal::escape(s).into_owned();
    let ago = |at: i64| format!("{} ago", crate::inspect::age(now - at));
    let mut lines = vec![format!("{} {}", m.id, m.state), format!("  thread     {}", m.thread)];
    if let Some(f) = &m.from {
        lines.push(format!("  from       {}", esc(f)));
    }
    lines.push(format!("  queued     {}", ago(m.created_at)));
    if let Some(e) = m.expires_at.filter(|_| matches!(m.state, State::Pending | State::Leased)) {
        lines.push(format!("  expires    in {}", crate::inspect::age((e - now).max(0))));
    }
    if let Some(h) = m.handed_at {
        let by = match (&m.event, &m.turn_id) {
            (Some(e), Some(t)) => format!(" by {e} in turn {t}"),
            (Some(e), None) => format!(" by {e}"),
            _ => String::new(),
        };
        lines.push(format!("  handed     {}{by}", ago(h)));
    }
    if let Some(c) = m.confirmed_at {
        lines.push(format!("  confirmed  {}", ago(c)));
    }
    if let Some(r) = &m.reason {
        lines.push(format!("  reason     {}", esc(r)));
    }
    println!("{}", lines.join("\n"));
    Ok(ExitCode::SUCCESS)
}

/// `broker mcp`: runs the MCP server, `courier-mcp` beside this `broker` (its own crate and
/// binary, so the async runtime the MCP SDK needs stays out of the broker).
pub fn mcp() -> Result<ExitCode> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("locating the broker executable")?;
    let server = exe.with_file_name("courier-mcp");
    let err = std::process::Command::new(&server).exec();
    bail!("cannot run {} ({err}); it is built with the broker (`cargo build -p courier-mcp`) and installed beside it", server.display())
}

/// `broker threads`'s command line.
pub struct ThreadsCommand {
    /// Also ended threads, at most this many (`--all [--limit N]`); `None`: live ones only.
    ended: Option<usize>,
    format: Format,
}

impl ThreadsCommand {
    pub fn parse(g: Given) -> Result<ThreadsCommand> {
        let limit = match &g.limit {
            None => threads::DEFAULT_ENDED_LIMIT,
            Some(n) => n
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=10_000).contains(n))
                .ok_or_else(|| g.usage_error(format!("--limit {n:?}: a number from 1 to 10000")))?,
        };
        if g.limit.is_some() && !g.all {
            return Err(g.usage_error("--limit goes with --all (it bounds the ended threads)"));
        }
        Ok(ThreadsCommand { ended: g.all.then_some(limit), format: g.format })
    }
}

pub fn threads(cmd: ThreadsCommand) -> Result<ExitCode> {
    let list = fetch_threads(cmd.ended.is_some(), cmd.ended.unwrap_or(threads::DEFAULT_ENDED_LIMIT))?;
    let text = if cmd.format == Format::Json {
        crate::terminal::terminal_safe_json(&serde_json::to_string_pretty(&json!({"threads": list}))?) + "\n"
    } else {
        threads::render_table(&list, now_ms())
    };
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    Ok(ExitCode::SUCCESS)
}
