//! Who sends a message when `broker send` runs as a Claude Code model's Bash command: the
//! session whose pinned claude process the command runs under, proven as the Codex sender is
//! (`sender.rs`): ancestry to a trusted binary, then the binary's own proof of the session.
//!
//! 1. the peer (SO_PEERCRED, pinned by a pidfd) is of the broker's uid;
//! 2. its environment names a session (`CLAUDE_CODE_SESSION_ID`, which Claude Code adds to the
//!    commands its model runs): a claim, checked next;
//! 3. walking its parents, the nearest trusted host binary (Codex or Claude Code, by digest) is a
//!    trusted claude: a command of a Codex thread run under a claude is Codex's, and the reverse;
//! 4. the claimed session is pinned to exactly that claude (pid and start time): the pin was
//!    taken by a hook every kernel step of the Claude Code gate proved (`claude/session.rs`), so
//!    no state a model command can write names the session;
//! 5. the start times of the chain and the peer are unchanged at the end.
//!
//! What this cannot tell apart: two sessions pinned to the same claude (a `/clear` starts a new
//! session in the same process): a command of one may claim the other. Sessions of any other
//! claude cannot be claimed.

use super::sender::ToolSender;
use super::{Gate, Peer};
use crate::exe::digest::Lookup;
use crate::exe::{ClaudeTrust, CodexTrust};
use crate::os;
use crate::store::SessionPin;
use courier_shared::ids::ThreadId;
use courier_shared::paths::environ_get;
use std::path::Path;
use std::time::{Duration, Instant};

/// The variable Claude Code sets in its model's commands: the session they run for.
pub const SESSION_VAR: &str = "CLAUDE_CODE_SESSION_ID";

/// Either host's trust: the ancestry walk stops at the nearest trusted binary of either.
struct Hosts<'a> {
    codex: &'a dyn CodexTrust,
    claude: &'a dyn ClaudeTrust,
}

impl CodexTrust for Hosts<'_> {
    fn is_trusted(&self, sha256: &str) -> bool {
        self.claude.is_trusted(sha256) || self.codex.is_trusted(sha256)
    }
    fn is_expected(&self, path: &Path, size: u64) -> bool {
        self.claude.is_expected(path, size) || self.codex.is_expected(path, size)
    }
    fn known_digest(&self, key: &crate::exe::ExeKey) -> Option<String> {
        self.claude.known_digest(key).or_else(|| self.codex.known_digest(key))
    }
    fn host(&self) -> &'static str {
        "Codex or Claude Code"
    }
}

impl Gate {
    /// The Claude Code session whose model's command `peer` is (see the module docs): `Ok(None)`
    /// when the peer claims no session (not a Claude Code command), `Err` why a claim failed.
    /// `pin_of` reads a session's pin from the store.
    pub fn verify_claude_sender(
        &self,
        peer: &Peer,
        codex: &dyn CodexTrust,
        claude: &dyn ClaudeTrust,
        pin_of: &dyn Fn(&ThreadId) -> anyhow::Result<Option<SessionPin>>,
    ) -> Result<Option<ToolSender>, String> {
        if peer.uid != self.uid {
            return Err(format!("peer uid {} is not the broker's", peer.uid));
        }
        let mut env = Vec::with_capacity(8192);
        os::read_environ(peer.pid, &mut env).map_err(|e| format!("peer environ: {e}"))?;
        let Some(claim) = environ_get(&env, SESSION_VAR) else { return Ok(None) };
        let session = std::str::from_utf8(claim).ok().and_then(|s| ThreadId::parse(s).ok());
        let session = session.ok_or_else(|| format!("{SESSION_VAR} is not a session id"))?;
        let stat = os::read_stat(peer.pid).map_err(|e| format!("peer stat: {e}"))?;
        let hosts = Hosts { codex, claude };
        let deadline = Instant::now() + Duration::from_secs(2);
        let (chain, host) = self.walk_ancestry(&stat, &hosts, deadline).map_err(|r| format!("{}: {}", r.code, r.detail))?;
        let known = |k: &crate::exe::ExeKey| hosts.known_digest(k);
        let is_claude = match self.digests.lookup(host.pid, &known, &|_: &Path, _| false, Instant::now()) {
            Ok(Lookup::Digest(d)) => claude.is_trusted(&d),
            _ => false,
        };
        if !is_claude {
            return Err(format!("the nearest trusted host process above the sender, pid {}, is not a Claude Code", host.pid));
        }
        let pin = pin_of(&session).map_err(|e| format!("the session pin could not be read: {e:#}"))?;
        match pin {
            Some(pin) if pin.owner == host.key() => {}
            Some(pin) => return Err(format!("session {session} is pinned to pid {}, not to claude {}", pin.owner.pid, host.pid)),
            None => return Err(format!("session {session} is not one the broker proved (no hook of it passed the gate)")),
        }
        self.unchanged_since(&chain, &host, peer, stat.starttime)?;
        Ok(Some(ToolSender { thread: session.as_str().to_string(), call_id: String::new(), codex_pid: host.pid, threads_in_process: 1 }))
    }
}
