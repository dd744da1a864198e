//! The Codex wing: everything Courier knows about Codex as a host agent, behind the few names
//! re-exported here. The gate, delivery, confirmation, wake, install and doctor use this wing; only
//! it knows Codex's rollout format, its app-server protocol, its binaries and their layouts.
//!
//! - `trust.rs`: which binaries are trusted (hashing, the supported version range);
//! - `resolve.rs`: the native binary behind the `codex` a user runs (every npm/pnpm/yarn/bun
//!   layout, a standalone binary, managed-daemon copies);
//! - `follow.rs`: the broker's thread that watches those places and trusts the new binary when the
//!   user's own `codex` is upgraded;
//! - `native.rs`: what a native file is (its version, whether it is whole), read without running
//!   it: the broker never executes a candidate binary;
//! - `hook.rs`: what Codex hands a command hook (the payload), the rules Courier applies per
//!   event, and the output Codex reads back;
//! - `rollout/`: reading a thread's rollout (its identity, open turn, actions, hook output), with
//!   the one classifier of rollout lines (`rollout/classify.rs`);
//! - `appserver/`: the app-server as a client (endpoints, the WebSocket client) for wake and
//!   effort;
//! - `standin.rs`: a stand-in Codex for tests (feature `standin`).
//!
//! Still outside the wing (see ARCHITECTURE.md, "To add a host agent"): the gate's
//! Codex-specific steps (`gate/binding.rs`, `gate/holder.rs`, `gate/turn.rs`, `gate/ticket.rs`),
//! and what install writes into Codex's config (`install/hooks.rs`, `config_toml.rs`, `mcp.rs`).

pub mod appserver;
pub mod follow;
pub mod hook;
pub mod native;
pub mod resolve;
pub mod rollout;
/// Test fixtures (the stand-in Codex), for the lib's tests and `--features standin` users only.
#[cfg(any(test, feature = "standin"))]
pub mod standin;
mod trust;

pub use crate::store::{TrustHow, TrustedCodex};

/// Environment variables Codex sets only for commands the model runs (never for its hooks).
pub const TOOL_COMMAND_MARKERS: [&str; 4] = ["CODEX_TOOL_CALL_ID", "CODEX_THREAD_ID", "CODEX_SESSION_ID", "CODEX_CI"];
pub use resolve::{discover, resolve, Discovery, Layout, Resolved};
pub use trust::{hash_and_note, parse_version, sha256_file, support, supported_range, Support, NEWEST_SUPPORTED, OLDEST_SUPPORTED};
