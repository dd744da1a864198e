//! The Codex wing: everything Courier knows about Codex as a host agent, behind the few names
//! re-exported here. The gate, delivery, confirmation, wake, install and doctor use this wing; only
//! it knows Codex's rollout format, its app-server protocol, its binaries and their layouts.
//!
//! - `trust.rs`: the supported version range;
//! - `resolve.rs`: the native binary behind the `codex` a user runs (every npm/pnpm/yarn/bun
//!   layout, a standalone binary, managed-daemon copies);
//! - `follow.rs`: Codex's part of the broker's upgrade follower (`exe/follow.rs` runs the loop):
//!   trusts the new binary when the user's own `codex` is upgraded;
//! - `native.rs`: a native Codex file's version, read from the package files beside it without
//!   running it: the broker never executes a candidate binary;
//! - `rollout/`: reading a thread's rollout incrementally (its identity, open turn, actions);
//! - `proof/`: the hook gate's Codex steps behind `proof::Prover` (the transcript path and the
//!   thread it names, the rollout read intact, the codex process holding the rollout and the
//!   thread's writer lock, the open turn) and which rollout records prove which Codex action
//!   (`proof::ticket`, step 8);
//! - `verified.rs`: what a Codex hook call proved (`Verified`, the gate's verdict);
//! - `owner.rs`: which live, trusted Codex process owns a thread when no hook names one (the wake,
//!   approvals, `broker threads`);
//! - `appserver/`: the app-server as a client (endpoints, the WebSocket client) for wake and
//!   effort;
//! - `effort/`: reasoning-effort changes applied exactly once through the app-server that owns
//!   the thread (`broker effort`, docs/effort.md);
//! - `approval.rs`: the PermissionRequest hook's fields, and answering the app-server's
//!   approval request once;
//! - `patch.rs`: the files an `apply_patch` patch changes, read exactly as Codex's parser reads
//!   them (a held approval lists every file Codex would write);
//! - `standin.rs`: a stand-in Codex for tests (feature `standin`);
//!
//! and below the broker, the crate `codex_format` (`codex-format/`): what Codex hands a command
//! hook and the rules Courier applies per event (`hook`), and the one classifier of rollout lines
//! (`rollout`), pure functions of bytes that the store and the envelope use too.
//!
//! What install and doctor write into and check in Codex's config is the `Codex` row of their
//! table of host agents (`install/agent/codex.rs`, `doctor/agent/codex.rs`).

pub mod approval;
pub mod appserver;
pub mod effort;
pub mod follow;
pub mod native;
pub mod owner;
pub mod patch;
pub mod proof;
pub mod resolve;
pub mod rollout;
/// Test fixtures (the stand-in Codex), for the lib's tests and `--features standin` users only.
#[cfg(any(test, feature = "standin"))]
pub mod standin;
mod trust;
mod verified;

pub use crate::store::{TrustHow, TrustedCodex};

/// Environment variables Codex sets only for commands the model runs (never for its hooks).
pub const TOOL_COMMAND_MARKERS: [&str; 4] = ["CODEX_TOOL_CALL_ID", "CODEX_THREAD_ID", "CODEX_SESSION_ID", "CODEX_CI"];
pub use resolve::{discover, resolve, Discovery, Layout, Resolved};
pub use trust::{support, supported_range, Support, NEWEST_SUPPORTED, OLDEST_SUPPORTED};
pub use verified::Verified;
