//! Who sends a message when `broker send` runs as the command of a host agent's model whose
//! commands name their session in an environment variable (Claude Code's Bash:
//! `CLAUDE_CODE_SESSION_ID`; Copilot CLI's bash tool: `COPILOT_AGENT_SESSION_ID`): the session
//! whose host process the command runs under, proven as the Codex sender is (`sender.rs`):
//! ancestry to a trusted binary, then that binary's own proof of the session. One procedure for
//! every such host; what differs is the host's row ([`SessionHost`]: the variable, the trust of
//! its binaries, the proof that a session is that very process's).
//!
//! 1. the peer (SO_PEERCRED, pinned by a pidfd) is of the broker's uid;
//! 2. its environment names a session in some row's variable: a claim, checked next;
//! 3. walking its parents, the nearest trusted host binary of ANY host (Codex's or a row's, by
//!    digest) is a binary of the row whose variable the claim is read from: a command of a Codex
//!    thread run under a claude is Codex's, and the reverse, whatever variables it inherited;
//! 4. the claimed session is that host process's own, by the row's proof ([`SessionHost::owns`]):
//!    Claude Code's pin, taken by a hook every kernel step of its gate proved
//!    (`claude/session.rs`); Copilot's session lock that copilot holds itself
//!    (`copilot/sender.rs`). No state a model command can write names the session;
//! 5. the start times of the chain and the peer are unchanged at the end.
//!
//! What this cannot tell apart: two sessions of the same host process (a `/clear` starts a new
//! Claude Code session in the same process): a command of one may claim the other. Sessions of
//! any other process cannot be claimed.

use super::sender::ToolSender;
use super::{Gate, Peer};
use crate::exe::digest::Lookup;
use crate::exe::{ClaudeTrust, CodexTrust, ExeKey};
use crate::os::{self, ProcessKey};
use courier_shared::ids::ThreadId;
use courier_shared::paths::environ_get;
use std::path::Path;
use std::time::{Duration, Instant};

/// One host whose model's commands claim their session in an environment variable: its row of
/// the sender proof.
pub struct SessionHost<'a> {
    /// The host, as a reason says it ("Claude Code").
    pub name: &'static str,
    /// The variable the host sets in its model's commands: the session they run for.
    pub session_var: &'static str,
    /// Its binaries' trust.
    pub trust: &'a dyn CodexTrust,
    /// Why `session` is not the session of exactly the host process `host` (`Ok`: it is).
    pub owns: &'a dyn Fn(&ThreadId, ProcessKey) -> Result<(), String>,
}

/// A trust of the [`ClaudeTrust`] kind as a row's, named `.1`.
pub struct Hosted<'a>(pub &'a dyn ClaudeTrust, pub &'static str);

impl CodexTrust for Hosted<'_> {
    fn is_trusted(&self, sha256: &str) -> bool {
        self.0.is_trusted(sha256)
    }
    fn is_expected(&self, path: &Path, size: u64) -> bool {
        self.0.is_expected(path, size)
    }
    fn known_digest(&self, key: &ExeKey) -> Option<String> {
        self.0.known_digest(key)
    }
    fn host(&self) -> &'static str {
        self.1
    }
}

/// Every host's trust at once: the ancestry walk stops at the nearest trusted binary of any.
struct AnyHost<'a> {
    codex: &'a dyn CodexTrust,
    rows: &'a [SessionHost<'a>],
    names: &'static str,
}

impl AnyHost<'_> {
    fn all(&self) -> impl Iterator<Item = &dyn CodexTrust> {
        self.rows.iter().map(|r| r.trust).chain(std::iter::once(self.codex))
    }
}

impl CodexTrust for AnyHost<'_> {
    fn is_trusted(&self, sha256: &str) -> bool {
        self.all().any(|t| t.is_trusted(sha256))
    }
    fn is_expected(&self, path: &Path, size: u64) -> bool {
        self.all().any(|t| t.is_expected(path, size))
    }
    fn known_digest(&self, key: &ExeKey) -> Option<String> {
        self.all().find_map(|t| t.known_digest(key))
    }
    fn host(&self) -> &'static str {
        self.names
    }
}

impl Gate {
    /// The session whose model's command `peer` is, for the host of `rows` it runs under (see
    /// the module docs): `Ok(None)` when the peer claims no session in any row's variable (not
    /// such a command), `Err` why a claim failed. `codex` is Codex's trust (the walk stops at a
    /// codex too); `names` says every host, for a walk that found none.
    pub fn verify_session_sender(
        &self,
        peer: &Peer,
        codex: &dyn CodexTrust,
        rows: &[SessionHost],
        names: &'static str,
    ) -> Result<Option<ToolSender>, String> {
        if peer.uid != self.uid {
            return Err(format!("peer uid {} is not the broker's", peer.uid));
        }
        let mut env = Vec::with_capacity(8192);
        os::read_environ(peer.pid, &mut env).map_err(|e| format!("peer environ: {e}"))?;
        if !rows.iter().any(|r| environ_get(&env, r.session_var).is_some()) {
            return Ok(None);
        }
        let stat = os::read_stat(peer.pid).map_err(|e| format!("peer stat: {e}"))?;
        let any = AnyHost { codex, rows, names };
        let deadline = Instant::now() + Duration::from_secs(2);
        let (chain, host) = self.walk_ancestry(&stat, &any, deadline).map_err(|r| format!("{}: {}", r.code, r.detail))?;
        let known = |k: &ExeKey| any.known_digest(k);
        let digest = match self.digests.lookup(host.pid, &known, &|_: &Path, _| false, Instant::now()) {
            Ok(Lookup::Digest(d)) => Some(d),
            _ => None,
        };
        let claimed: Vec<&str> = rows.iter().filter(|r| environ_get(&env, r.session_var).is_some()).map(|r| r.name).collect();
        let row = digest.and_then(|d| rows.iter().find(|r| r.trust.is_trusted(&d)));
        let Some(row) = row.filter(|r| claimed.contains(&r.name)) else {
            let said = claimed.join(" or ");
            return Err(format!("the nearest trusted host process above the sender, pid {}, is not a {said}", host.pid));
        };
        let claim = environ_get(&env, row.session_var).expect("claimed above");
        let session = std::str::from_utf8(claim).ok().and_then(|s| ThreadId::parse(s).ok());
        let session = session.ok_or_else(|| format!("{} is not a session id", row.session_var))?;
        (row.owns)(&session, host.key())?;
        self.unchanged_since(&chain, &host, peer, stat.starttime)?;
        Ok(Some(ToolSender { thread: session.as_str().to_string(), call_id: String::new(), codex_pid: host.pid, threads_in_process: 1 }))
    }
}
