//! The broker's side of a Claude Code test: a broker serving Claude Code's hooks on a loopback
//! port (`[claude] hook_port`) with the pinned claude trusted, and what its gate proved (the
//! debug log's `claude hook <Event> of session <id> from pid <pid>: proven`) and refused.

use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::broker::{broker_bin, refusals, Broker};
use crate::codex::CodexEnv;
use crate::util::{poll_until, str_field};

/// How long a test waits for a hook to be proven, a session to be listed.
const BOUND: Duration = Duration::from_secs(30);

/// Makes `env`'s broker serve Claude Code's hooks on a free loopback port, logging at debug (a
/// proven hook is logged there): the port. Write it before the broker starts.
pub fn serve_hooks(env: &CodexEnv) -> u16 {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    std::fs::write(&env.courier_config, format!("log_level = \"debug\"\n[claude]\nhook_port = {port}\n")).unwrap();
    port
}

/// A broker serving Claude Code's hooks on a free loopback port ([`serve_hooks`]), with no Codex
/// model behind it.
pub struct ClaudeBroker {
    pub env: CodexEnv,
    pub port: u16,
}

impl ClaudeBroker {
    pub fn new() -> ClaudeBroker {
        let env = CodexEnv::with_base_url("http://127.0.0.1:9/v1");
        let port = serve_hooks(&env);
        ClaudeBroker { env, port }
    }

    /// `broker serve`, with `claude` trusted.
    pub fn start(&self, claude: &Path) -> Broker<'_> {
        let broker = Broker::start(&self.env);
        broker.trust_claude(claude);
        broker
    }
}

impl Default for ClaudeBroker {
    fn default() -> ClaudeBroker {
        ClaudeBroker::new()
    }
}

/// One hook the gate proved: (event, session, claude pid).
pub type Proven = (String, String, u32);

/// The lines of the broker log saying a Claude Code hook was proven, in order.
pub fn proven_hooks(log: &str) -> Vec<Proven> {
    log.lines()
        .filter_map(|l| {
            let rest = l.split("claude hook ").nth(1)?.strip_suffix(": proven")?;
            let t: Vec<&str> = rest.split(' ').collect();
            match t.as_slice() {
                [event, "of", "session", sid, "from", "pid", pid] => Some((event.to_string(), sid.to_string(), pid.parse().ok()?)),
                _ => None,
            }
        })
        .collect()
}

/// Waits (bounded) until the broker log shows `n` proven hooks: all of them.
pub fn wait_proven(broker: &Broker, n: usize) -> Vec<Proven> {
    poll_until(BOUND, || Some(proven_hooks(&broker.log_text())).filter(|p| p.len() >= n))
        .unwrap_or_else(|| panic!("fewer than {n} proven hooks; log:\n{}", broker.log_text()))
}

/// The refusal codes of the Claude Code gate.
const CLAUDE_CODES: [&str; 11] = [
    "claude_request",
    "claude_peer",
    "claude_holder",
    "untrusted_claude",
    "claude_loader_env",
    "claude_transcript",
    "session_owned",
    "claude_turn",
    "claude_resume",
    "ticket_used",
    "claude_wake_fd",
];

/// The refusals of the Claude Code gate in `inspect --json`: (code, detail).
pub fn claude_refusals(broker: &Broker) -> Vec<(String, String)> {
    refusals(&broker.inspect_json())
        .iter()
        .map(|r| (str_field(r, "reason").to_string(), str_field(r, "detail").to_string()))
        .filter(|(code, _)| CLAUDE_CODES.contains(&code.as_str()))
        .collect()
}

/// The threads of `list` on `host` (`codex`, `claude-code`).
pub fn of_host<'a>(list: &'a [Value], host: &str) -> Vec<&'a Value> {
    list.iter().filter(|t| t["host"] == host).collect()
}

/// The live Claude Code session the broker proved (bounded wait): its `threads --json` listing.
pub fn wait_claude_session(b: &Broker) -> Value {
    poll_until(BOUND, || of_host(&b.threads_json(false), "claude-code").first().map(|t| (*t).clone()))
        .unwrap_or_else(|| panic!("no live claude-code session listed; log:\n{}", b.log_text()))
}

/// `broker` on the command line of a Claude Code model's Bash command: claude runs it with its own
/// (cleared) environment, so Courier's directories are given.
pub fn broker_in_claude(env: &CodexEnv) -> String {
    format!(
        "COURIER_RUNTIME_DIR={} COURIER_STATE_DIR={} COURIER_CONFIG={} CODEX_HOME={} {}",
        env.runtime_dir.display(),
        env.state_dir.display(),
        env.courier_config.display(),
        env.codex_home.display(),
        broker_bin().display()
    )
}

/// The message queued with idempotency key `key` (`inspect --json`); panics naming the messages
/// when there is none.
pub fn message_by_key(b: &Broker, key: &str) -> Value {
    let msgs = b.inspect_json()["messages"].as_array().cloned().unwrap_or_default();
    msgs.iter().find(|m| m["key"] == key).cloned().unwrap_or_else(|| panic!("no message with key {key}: {msgs:#?}"))
}
