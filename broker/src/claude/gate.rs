//! The Claude Code gate's kernel proofs: who holds the hook connection, and that it is a genuine,
//! digest-trusted claude started without a code loader. Never touches the store (trust comes
//! through [`ClaudeTrust`]); the session and ticket steps that need the store follow in
//! `claude/session.rs`. docs/claude-code.md "Gate design" has what each step rests on.
//!
//! Steps, in order: `payload` (the request is a hook payload of the event its path names),
//! `peer_socket`, `sole_holder` (`claude/peer.rs`), `trusted_claude` (the holder's executable),
//! `clean_start` (no loader variable in its environment), `transcript` (the payload's transcript
//! is that claude's own).

use super::peer::{self, Holder};
use super::Event;
use crate::exe::digest::{DigestCache, Lookup};
use crate::exe::ClaudeTrust;
use crate::exe::ExeKey;
use crate::os::ProcessKey;
use crate::refusal::Refusal;
use crate::refusal::RefusalCode;
use courier_shared::ids::ThreadId;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Environment variables that make a claude process run code that is not Claude Code's: Bun's
/// preload and inspector, Bun-as-runtime, the dynamic loader's. `BUN_OPTIONS=--preload=x.js`
/// runs any script inside the genuine binary (probed on 2.1.332), so without this step a model's
/// command could start a trusted claude that POSTs a forged payload.
pub const LOADER_VARS: [&str; 9] = [
    "BUN_OPTIONS",
    "BUN_INSPECT",
    "BUN_INSPECT_CONNECT_TO",
    "BUN_INSPECT_NOTIFY",
    "BUN_INSPECT_PRELOAD",
    "BUN_BE_BUN",
    "LD_PRELOAD",
    "LD_AUDIT",
    "LD_LIBRARY_PATH",
];

/// The fields of a hook payload the gate and delivery read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    pub event: Event,
    pub session_id: ThreadId,
    pub transcript_path: PathBuf,
    /// The turn (every served event carries it).
    pub prompt_id: String,
    /// The tool call (PreToolUse and PostToolUse carry it).
    pub tool_use_id: Option<String>,
    /// Set on a sub-agent's hooks (which carry the parent's session and transcript).
    pub agent_id: Option<String>,
}

/// A request every step passed: the claude process that sent it, pinned, and its payload.
#[derive(Debug)]
pub struct Proven {
    pub claude: Holder,
    pub payload: Payload,
}

impl Proven {
    pub fn key(&self) -> ProcessKey {
        self.claude.key
    }
}

/// Runs every kernel step on one request; `client`/`server` are the connection's addresses.
pub fn verify(
    event: &str,
    body: &[u8],
    client: SocketAddr,
    server: SocketAddr,
    digests: &DigestCache,
    trust: &dyn ClaudeTrust,
    until: Instant,
) -> Result<Proven, Refusal> {
    let payload = payload(event, body)?;
    let refuse = |code, detail: String| Err(refusal(code, detail, &payload));
    let socket = match peer::client_socket(client, server) {
        Ok(s) if s.uid == nix::unistd::getuid().as_raw() => s,
        Ok(s) => return refuse(RefusalCode::ClaudePeer, format!("the client socket belongs to uid {}", s.uid)),
        Err(e) => return refuse(RefusalCode::ClaudePeer, e),
    };
    let holder = match peer::sole_holder(socket.inode, socket.uid, until) {
        Ok(h) => h,
        Err(e) => return refuse(RefusalCode::ClaudeHolder, e),
    };
    prove_claude(holder, payload, digests, trust, until)
}

/// The steps after the caller's claude is found (`trusted_claude`, `clean_start`, `transcript`),
/// for the HTTP hooks and the idle wake (`claude/wake.rs`) alike.
pub fn prove_claude(
    holder: Holder,
    payload: Payload,
    digests: &DigestCache,
    trust: &dyn ClaudeTrust,
    until: Instant,
) -> Result<Proven, Refusal> {
    let refuse = |code, detail: String| Err(refusal(code, detail, &payload));
    if let Err((code, detail)) = trusted_claude(&holder, digests, trust, until).and_then(|_| clean_start(&holder)) {
        return refuse(code, detail);
    }
    if let Err(detail) = transcript(&holder, &payload) {
        return refuse(RefusalCode::ClaudeTranscript, detail);
    }
    if !holder.is_alive() {
        return refuse(RefusalCode::ClaudeHolder, format!("pid {} exited during the check", holder.key.pid));
    }
    Ok(Proven { claude: holder, payload })
}

pub(super) fn refusal(code: RefusalCode, detail: String, p: &Payload) -> Refusal {
    Refusal { code, detail, thread: Some(p.session_id.to_string()), event: Some(p.event.as_str().to_string()) }
}

/// `payload`: a JSON object naming the event of its path, a session id, a transcript path.
pub fn payload(event: &str, body: &[u8]) -> Result<Payload, Refusal> {
    let bad = |d: String| Refusal::new(RefusalCode::ClaudeRequest, d);
    let event = Event::parse(event).ok_or_else(|| bad(format!("/hook/{event}: not an event Courier serves")))?;
    let v: Value = serde_json::from_slice(body).map_err(|e| bad(format!("payload is not JSON: {e}")))?;
    let field = |name: &str| v.get(name).and_then(Value::as_str).filter(|s| !s.is_empty()).map(String::from);
    if field("hook_event_name").as_deref() != Some(event.as_str()) {
        return Err(bad(format!("hook_event_name {:?} is not the path's {}", v.get("hook_event_name"), event.as_str())));
    }
    let session_id = field("session_id").and_then(|s| ThreadId::try_from(s).ok()).ok_or_else(|| bad("no session_id UUID".into()))?;
    let transcript_path = field("transcript_path").map(PathBuf::from).ok_or_else(|| bad("no transcript_path".into()))?;
    let prompt_id = field("prompt_id").ok_or_else(|| bad("no prompt_id".into()))?;
    let tool_use_id = field("tool_use_id");
    if matches!(event, Event::PreToolUse | Event::PostToolUse) && tool_use_id.is_none() {
        return Err(bad(format!("a {} payload without tool_use_id", event.as_str())));
    }
    Ok(Payload { event, session_id, transcript_path, prompt_id, tool_use_id, agent_id: field("agent_id") })
}

/// `trusted_claude`: the holder's executable (through `/proc/<pid>/exe`, the file actually
/// mapped) has a trusted digest. A binary not hashed yet is refused for now (the expected lane
/// is waited for until `until`).
fn trusted_claude(h: &Holder, digests: &DigestCache, trust: &dyn ClaudeTrust, until: Instant) -> Result<(), (RefusalCode, String)> {
    let known = |k: &ExeKey| trust.known_digest(k);
    let expected = |p: &Path, size: u64| trust.is_expected(p, size);
    let pid = h.key.pid;
    let exe = || crate::os::exe_path(pid).map(|p| p.display().to_string()).unwrap_or_default();
    match digests.lookup(pid, &known, &expected, until) {
        Ok(Lookup::Digest(d)) if trust.is_trusted(&d) && h.is_alive() => Ok(()),
        Ok(Lookup::Digest(d)) => {
            Err((RefusalCode::UntrustedClaude, format!("pid {pid} runs {} (sha256 {d}), not a trusted Claude Code", exe())))
        }
        Ok(Lookup::Pending) => Err((RefusalCode::UntrustedClaude, format!("pid {pid} runs {}, not hashed yet", exe()))),
        Ok(Lookup::Unhashable) => Err((RefusalCode::UntrustedClaude, format!("pid {pid} runs {}, which cannot be hashed", exe()))),
        Err(e) => Err((RefusalCode::ClaudeHolder, format!("pid {pid}'s executable: {e}"))),
    }
}

/// `clean_start`: no [`LOADER_VARS`] in the environment the holder was started with.
fn clean_start(h: &Holder) -> Result<(), (RefusalCode, String)> {
    let env = environ(h).map_err(|e| (RefusalCode::ClaudeHolder, e))?;
    for var in env.split(|b| *b == 0) {
        let name = var.split(|b| *b == b'=').next().unwrap_or_default();
        if let Some(hit) = LOADER_VARS.iter().find(|v| v.as_bytes() == name) {
            return Err((RefusalCode::ClaudeLoaderEnv, format!("pid {} was started with {hit} set", h.key.pid)));
        }
    }
    Ok(())
}

fn environ(h: &Holder) -> Result<Vec<u8>, String> {
    let mut buf = Vec::new();
    crate::os::read_environ(h.key.pid, &mut buf).map_err(|e| format!("pid {}'s environment: {e}", h.key.pid))?;
    Ok(buf)
}

/// `transcript`: the payload's transcript is `<config dir>/projects/<one dir>/<session_id>.jsonl`
/// under the holder's own Claude config directory (`$CLAUDE_CONFIG_DIR`, else `$HOME/.claude`,
/// from its environment). What exists of `projects/<dir>/<file>` is no symbolic link, the file a
/// regular one (at a session's first prompt none of it need exist yet).
fn transcript(h: &Holder, p: &Payload) -> Result<(), String> {
    let env = environ(h)?;
    let var = |name: &str| {
        env.split(|b| *b == 0).find_map(|v| v.strip_prefix(name.as_bytes())?.strip_prefix(b"=")).map(|v| {
            use std::os::unix::ffi::OsStrExt;
            PathBuf::from(std::ffi::OsStr::from_bytes(v))
        })
    };
    let config = var("CLAUDE_CONFIG_DIR").or_else(|| var("HOME").map(|h| h.join(".claude"))).ok_or("no HOME in claude's environment")?;
    let (t, projects) = (&p.transcript_path, config.join("projects"));
    let want_name = format!("{}.jsonl", p.session_id);
    let slug = t.parent().filter(|d| d.parent() == Some(projects.as_path()) && d.file_name().is_some_and(|n| n != ".."));
    let (Some(slug), true) = (slug, t.file_name().and_then(|n| n.to_str()) == Some(&want_name)) else {
        return Err(format!("{} is not {}/<project>/{want_name}", t.display(), projects.display()));
    };
    for (path, dir) in [(projects.as_path(), true), (slug, true), (t.as_path(), false)] {
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => return Err(format!("{} is a symbolic link", path.display())),
            Ok(m) if dir != m.is_dir() || !dir && !m.file_type().is_file() => {
                return Err(format!("{} is not a {}", path.display(), if dir { "directory" } else { "regular file" }))
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
            Err(e) => return Err(format!("{}: {e}", path.display())),
        }
    }
    Ok(())
}
