//! Courier's end-to-end test kit: a scripted OpenAI Responses provider ([`ScriptedModel`]), a
//! private Codex home wired to it with trusted hooks ([`CodexEnv`]), the real pinned Codex binary
//! ([`codex_bin`]), and helpers that drive the broker CLI ([`Broker`]).
//!
//! Nothing here skips silently: a missing Codex binary or a missing broker build panics with the
//! command that fixes it (`install/fetch-codex.sh`, `cargo build --workspace`).
//!
//! Every wait is bounded (condition variables or polling against a deadline) and panics with a
//! description of what it waited for.

pub mod approval_rig;
pub mod appserver;
pub mod attack;
pub mod bridge;
pub mod broker;
pub mod claude;
pub mod codex;
pub mod copilot;
pub mod hooks;
pub mod install_rig;
pub mod messages;
pub mod model;
pub mod rng;
pub mod rollout;
pub mod scripted;
pub mod serve;
pub mod standin;
pub mod tmux;
pub mod util;

pub use broker::{broker_bin, hook_client_bin, hook_command, target_bin_dir, Broker};
pub use codex::{codex_bin, CodexEnv, ExecChild, ExecOutput};
pub use hooks::{hook_trust_hash, snake_event, Hook};
pub use model::{Hold, Reply, Request, ScriptedModel};
pub use rollout::Rollout;
pub use serve::Serve;
pub use standin::{HookCall, Standin, Stepped};
