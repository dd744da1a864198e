//! Code shared by `hook-client` and `broker`: where things live ([`paths`]), how they talk
//! ([`wire`]), how a request proves it comes from this login ([`auth`]), and what a thread id looks
//! like ([`ids`]). What Codex hands a hook and writes to its rollout is the broker's Codex wing.
//!
//! This crate is linked into the hook-client, which Codex starts on every tool call: keep it free
//! of heavy dependencies and of work at start-up.

#[doc(hidden)]
pub mod alloc_probe;
pub mod auth;
pub mod ids;
pub mod paths;
pub mod scratch;
pub mod wire;
