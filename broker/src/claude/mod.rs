//! The Claude Code wing: everything Courier knows about Claude Code as a host agent. Claude Code
//! calls the broker's loopback HTTP endpoint for its hooks (`[claude] hook_port`); no Courier
//! process runs under claude, so there is no process a model's command could stand in for.
//! docs/claude-code.md has the design and the probes each step rests on.
//!
//! # Rooms
//! - `trust.rs`: trusting a Claude Code native binary by digest (`broker trust-claude`);
//! - `gate_trust.rs`: the gate's view of that trust (`StoreTrust`): trusted digests, and the files
//!   the followed commands run now (the expected lane);
//! - `follow.rs`: one pass of the broker's follower (`exe/follow.rs` runs the loop): trusts
//!   the binary the user's `claude` now runs after an upgrade;
//! - `resolve.rs`: the native binary behind the `claude` a user runs (npm, pnpm, the native
//!   installer, the local install), found without running it (`broker install`, `doctor`);
//! - `settings.rs`: Courier's HTTP hooks in Claude Code's `settings.json` (where, what, the
//!   user's own style kept);
//! - `mcp_config.rs`: Courier's MCP server in Claude Code's user config (`.claude.json`);
//! - `http.rs`: the bounded HTTP/1.1 of one hook request and its answer;
//! - `peer.rs`: the kernel's view of a connection (`peer_socket`, `sole_holder`);
//! - `gate.rs`: the kernel steps of the gate (payload, holder, trusted binary, clean start,
//!   transcript), store-free;
//! - `session.rs`: the steps that need the store (`session_owner`, `turn_ticket`);
//! - `resume.rs`: who may take over a session whose claude ended (`claude_resume`: a claude
//!   leading a terminal's foreground job, never a tool command's);
//! - `turn.rs`: the turn a session's transcript shows (a queued prompt's turn, which no
//!   UserPromptSubmit names);
//! - `deliver.rs`: what a proven hook is handed (PostToolUse `additionalContext`; `agent_scope`);
//! - `confirm.rs`: hand-offs settled from the transcript's request records;
//! - `refusals.rs`: refusals of the endpoint and the wake, recorded at a bounded rate;
//! - `serve.rs`: the endpoint's threads in `broker serve`: accept, verify, record, answer, and
//!   the confirmation pass;
//! - `wake.rs`: an idle session woken by its `asyncRewake` Stop hook (`hook-client
//!   --claude-wake` on the wake socket): proof by the sockets claude made, hold, hand-off.

pub mod confirm;
pub mod deliver;
pub mod follow;
pub mod gate;
pub mod gate_trust;
pub mod http;
pub mod mcp_config;
pub mod peer;
pub mod refusals;
pub mod resolve;
pub mod resume;
pub mod serve;
pub mod session;
pub mod settings;
pub mod trust;
pub mod turn;
pub mod wake;

/// The Claude Code hook events the broker serves (the ones that take HTTP hooks and that Courier
/// registers; SessionStart takes none, probed on 2.1.332).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    UserPromptSubmit,
    PreToolUse,
    PostToolUse,
    Stop,
}

impl Event {
    pub const ALL: [Event; 4] = [Event::UserPromptSubmit, Event::PreToolUse, Event::PostToolUse, Event::Stop];

    /// The name in the hook's URL (`/hook/<name>`) and in the payload's `hook_event_name`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Event::UserPromptSubmit => "UserPromptSubmit",
            Event::PreToolUse => "PreToolUse",
            Event::PostToolUse => "PostToolUse",
            Event::Stop => "Stop",
        }
    }

    /// What a main-conversation hook of this event says of the session's turn: a prompt or a tool
    /// call runs in an open turn, Stop ends it.
    pub const fn activity(self) -> crate::store::SessionActivity {
        match self {
            Event::UserPromptSubmit | Event::PreToolUse | Event::PostToolUse => crate::store::SessionActivity::Busy,
            Event::Stop => crate::store::SessionActivity::Idle,
        }
    }

    pub fn parse(s: &str) -> Option<Event> {
        Event::ALL.into_iter().find(|e| e.as_str() == s)
    }
}
