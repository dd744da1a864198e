//! `broker threads`: the Codex threads Courier can reach, found from what Codex itself holds,
//! never from a registry anyone could write.
//!
//! A thread is **live** when a trusted codex process (its executable's SHA-256 is in the trusted
//! set, the same digests the gate uses) holds both its rollout open for append and its
//! `thread-writer-locks/<thread>.lock` flock, through fds it opened itself: the gate's step-5
//! evidence (`codex/proof/holder.rs`). Candidates come from `/proc/locks` (who holds an flock on a file
//! in the lock directory), so only those few processes' fds are read. For each live thread the
//! rollout's `session_meta` gives parent, cwd and originator, the rollout tracker
//! (`rollout/`) the open turn (`busy` with it, else `idle`), and the first user prompt becomes
//! its title. `--all` adds ended threads from the rollout files, most recently active first, bounded.
//!
//! The JSON field names are a stable interface (docs/producers.md).
//!
//! Claude Code sessions are listed beside them (`host` `claude-code`, `claude.rs`): the sessions
//! the Claude Code gate pinned to a proven claude process, live while that process runs; and
//! Copilot CLI sessions (`host` `copilot`, `copilot.rs`), live while a copilot holds the lock.
//!
//! This file lists every host's; `codex.rs` finds Codex's; `facts.rs` reads a rollout's `session_meta` and title; `tree.rs` orders the
//! list as the sub-agent tree and renders the table.

pub(super) mod claude;
pub mod codex;
pub mod copilot;
mod facts;
mod tree;

pub use codex::{lock_held, Lister};
use courier_shared::ids::ThreadId;
pub use facts::{one_line, SessionInfo};
pub use tree::{order, render_table};

use crate::store::{State, Store};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

/// Ended threads `--all` lists at most by default (newest first).
pub const DEFAULT_ENDED_LIMIT: usize = 50;

/// Which agent runs a thread: the closed set of hosts Courier delivers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Host {
    /// An OpenAI Codex thread (its id is the rollout's).
    #[default]
    Codex,
    /// A Claude Code session (its id is the session id) the gate proved and pinned.
    ClaudeCode,
    /// A GitHub Copilot CLI session of the user's Copilot home (its id is the session id).
    Copilot,
}

impl Host {
    pub fn as_str(self) -> &'static str {
        match self {
            Host::Codex => "codex",
            Host::ClaudeCode => "claude-code",
            Host::Copilot => "copilot",
        }
    }
}

/// Which kind of host process runs a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProcessKind {
    /// `codex exec` (non-interactive; no app-server endpoint).
    Exec,
    /// `codex app-server` (stdio or `--listen`).
    AppServer,
    /// The interactive TUI's managed daemon (`app-server --managed-daemon`), which runs its hooks.
    TuiDaemon,
    /// The TUI itself (`--no-daemon`), or a codex whose command line says nothing else.
    Tui,
    /// Claude Code's native binary (`claude`, interactive or `-p`).
    Claude,
    /// Copilot CLI's native binary (`copilot`, interactive or `-p`).
    Copilot,
}

impl ProcessKind {
    /// From the process's argv (NUL-separated `/proc/<pid>/cmdline`).
    pub fn of_cmdline(cmdline: &[u8]) -> ProcessKind {
        // Codex's global options that take a separate value (`--enable f exec ...`).
        const VALUED: [&[u8]; 16] = [
            b"-c",
            b"--config",
            b"--enable",
            b"--disable",
            b"-m",
            b"--model",
            b"-p",
            b"--profile",
            b"-C",
            b"--cd",
            b"-s",
            b"--sandbox",
            b"-a",
            b"--ask-for-approval",
            b"-i",
            b"--image",
        ];
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).skip(1).filter(|a| !a.is_empty()).collect();
        let mut sub = None;
        let mut i = 0;
        while i < args.len() {
            let a = args[i];
            if VALUED.contains(&a) {
                i += 2;
                continue;
            }
            if !a.starts_with(b"-") {
                sub = Some(a);
                break;
            }
            i += 1;
        }
        match sub {
            Some(b"exec" | b"e") => ProcessKind::Exec,
            Some(b"app-server") if args.iter().any(|a| *a == b"--managed-daemon") => ProcessKind::TuiDaemon,
            Some(b"app-server") => ProcessKind::AppServer,
            _ => ProcessKind::Tui,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ProcessKind::Exec => "exec",
            ProcessKind::AppServer => "app-server",
            ProcessKind::TuiDaemon => "tui-daemon",
            ProcessKind::Tui => "tui",
            ProcessKind::Claude => "claude",
            ProcessKind::Copilot => "copilot",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub pid: i32,
    pub kind: ProcessKind,
    /// The executable (`/proc/<pid>/exe`).
    pub exe: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThreadState {
    /// A turn is open (`turn_id` names it).
    Busy,
    /// Live, no turn open.
    Idle,
    /// A Claude Code session whose pinned claude process runs and whose turn no proven hook has
    /// told since (a pin an older broker took); else a live session is busy or idle.
    Live,
    /// No trusted codex process holds it; a message for it waits until it is resumed.
    Ended,
}

impl ThreadState {
    pub fn as_str(self) -> &'static str {
        match self {
            ThreadState::Busy => "busy",
            ThreadState::Idle => "idle",
            ThreadState::Live => "live",
            ThreadState::Ended => "ended",
        }
    }
}

/// One thread of `broker threads --json` (`threads[]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadInfo {
    pub id: String,
    /// Its name (`broker name`), which `send --to` addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Which agent runs it (absent in an older broker's answer: `codex`).
    #[serde(default)]
    pub host: Host,
    pub state: ThreadState,
    /// The open turn (busy threads).
    pub turn_id: Option<String>,
    /// Parent thread of a sub-agent.
    pub parent: Option<String>,
    /// The root thread (`session_meta.session_id`; the thread itself for a root).
    pub root: Option<String>,
    /// Listed threads whose parent this is.
    pub children: Vec<String>,
    pub cwd: Option<String>,
    /// The first user prompt, on one line, at most 80 characters.
    pub title: Option<String>,
    /// A sub-agent's nickname (`session_meta.agent_nickname`).
    pub agent_nickname: Option<String>,
    /// `session_meta.originator` (`codex_exec`, `codex_cli_rs`, ...).
    pub originator: Option<String>,
    pub cli_version: Option<String>,
    /// The trusted host process that holds it (live threads; a Claude Code session's pinned claude).
    pub process: Option<ProcessInfo>,
    /// The rollout (a Claude Code session: its transcript).
    pub rollout: String,
    /// The rollout's last modification, Unix ms.
    pub last_activity_at: Option<i64>,
    /// Messages queued and not yet handed (`pending` + `leased`).
    pub pending: u64,
    /// Messages that ended without reaching the model (`uncertain` + `expired`).
    pub undelivered: u64,
    /// Context messages per state, as `inspect --json`'s `threads` map.
    pub messages: crate::store::StateCounts,
    /// Approvals the thread waits on a person for (`broker approvals`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_on_approval: Vec<WaitingApproval>,
    /// Why a message for this idle thread is not delivered now but at its next turn, in its
    /// host's words (a Claude Code session with no wake hook held).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_woken: Option<String>,
}

/// An approval a listed thread waits on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WaitingApproval {
    pub id: String,
    /// What it asks for (`Approval::summary`: the command, or the files of a file change).
    pub command: String,
}
impl Lister {
    /// `broker threads`: the live threads and, with `all`, up to `limit` ended ones (newest
    /// rollouts first); with queue counts, children filled in, ordered for reading.
    pub fn list(&self, store: &Store, all: bool, limit: usize) -> anyhow::Result<Vec<ThreadInfo>> {
        let mut threads = self.live(store);
        threads.extend(claude::sessions(store, all, limit)?);
        threads.extend(copilot::sessions(all, limit));
        if all {
            let live: HashSet<String> = threads.iter().map(|t| t.id.clone()).collect();
            threads.extend(self.ended(&live, limit));
        }
        let counts = super::counts_by_thread(store)?;
        let approvals = store.approvals(false)?;
        let names = store.thread_names()?;
        for t in &mut threads {
            t.name = ThreadId::parse(&t.id).ok().and_then(|id| names.get(&id).cloned());
            t.waiting_on_approval = approvals
                .iter()
                .filter(|a| a.thread == t.id.as_str())
                .map(|a| WaitingApproval { id: a.id.clone(), command: a.summary() })
                .collect();
            if let Some(c) = ThreadId::parse(&t.id).ok().and_then(|id| counts.get(&id)) {
                let n = |s: State| c.get(&s).copied().unwrap_or(0);
                t.pending = n(State::Pending) + n(State::Leased);
                t.undelivered = n(State::Uncertain) + n(State::Expired);
                t.messages = c.clone();
            }
        }
        Ok(order(threads))
    }
}
#[cfg(test)]
mod tests;
