//! The GitHub Copilot CLI wing: everything Courier knows about Copilot CLI as a host agent.
//! Copilot runs command hooks; Courier's is `hook-client --host copilot --event <event>` (its
//! camelCase payloads do not name their event), which reaches the broker's Unix socket as a
//! Codex hook does. The gate's kernel (peer, client MAC, parents up to a trusted binary) is the
//! gate's; this wing proves the rest and delivers. docs/copilot-cli.md has the design and the
//! probes each step rests on.
//!
//! # Rooms
//! - `payload.rs`: the camelCase payloads Courier reads (`sessionId`, `stop_hook_active`);
//! - `fds.rs`: what the copilot process holds (its pipes' read ends, its `inuse.<pid>.hold` locks);
//! - `trust.rs`: the native binary and the code it unpacks (the dist dir), trusted by digest
//!   (`broker trust-copilot`), checked by file identity on the hook path (never hashed there);
//! - `follow.rs`: its part of the upgrade follower (`exe/follow.rs`): what the user's `copilot`
//!   runs after an upgrade, binary and dist dir, trusted with no command from the user;
//! - `gate.rs`: the host's named steps after the kernel (parent, session, stdout pipe, dist dir,
//!   session lock);
//! - `approval.rs`: a permissionRequest a person answers (`[approvals] hold`), and the hook's
//!   decision;
//! - `deliver.rs`: what a proven hook is handed (postToolUse `additionalContext` in parts,
//!   agentStop `block` once);
//! - `confirm.rs`: hand-offs settled from the session record (`events.jsonl`);
//! - `sender.rs`: its row of the sender proof (`gate/session_sender.rs`): a model's `broker send`
//!   proven to run for the session its copilot holds the lock of;
//! - `serve.rs`: one hook call in `broker serve`, and the confirmation thread;
//! - `session.rs`: the sessions of the user's Copilot home, live or ended (`broker send`,
//!   `broker threads`).

pub mod approval;
pub mod confirm;
pub mod deliver;
mod fds;
pub mod follow;
pub mod gate;
pub mod payload;
pub mod sender;
pub mod serve;
pub mod session;
pub mod trust;

/// The host's name in `hook-client --host`, the trust table and refusals.
pub const HOST: &str = "copilot";

/// The Copilot CLI hook events Courier registers (camelCase dialect, probed on 1.0.102).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// After a tool call: its `additionalContext` is appended to the call's tool message, which
    /// the model gets with its next request in the same turn.
    PostToolUse,
    /// The turn's end: `{"decision":"block","reason":R}` makes R a new user message and runs
    /// another turn.
    AgentStop,
    /// Before every tool call (under `--allow-all-tools` too): `{"behavior":"allow"}` or
    /// `{"behavior":"deny","message":M}` overrides Copilot's own rules; no output leaves them to
    /// decide. Held for a person's `broker approve|deny` where `[approvals] hold` asks
    /// (`approval.rs`), else answered at once with no decision.
    PermissionRequest,
}

impl Event {
    pub const ALL: [Event; 3] = [Event::PostToolUse, Event::AgentStop, Event::PermissionRequest];

    /// The key in Copilot's hook config and `hook-client --event`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Event::PostToolUse => "postToolUse",
            Event::AgentStop => "agentStop",
            Event::PermissionRequest => "permissionRequest",
        }
    }

    pub fn parse(s: &str) -> Option<Event> {
        Event::ALL.into_iter().find(|e| e.as_str() == s)
    }
}
