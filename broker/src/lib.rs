//! Courier's broker: the per-login daemon that verifies Codex hook calls and hands each thread the
//! messages queued for it, exactly once; plus the CLI (`send`, `inspect`, ...) that drives it.
//! ARCHITECTURE.md at the repository root maps these modules: rooms by wing, and their invariants.

pub mod approval;
pub mod claude;
pub mod cli;
pub mod client;
pub mod codex;
pub mod config;
pub mod copilot;
pub mod delivery;
pub mod dirs;
pub mod doctor;
pub mod envelope;
pub mod exe;
pub mod failpoint;
pub mod gate;
pub mod inspect;
pub mod install;
pub mod lines;
pub mod logging;
pub mod os;
pub mod person;
pub mod producer;
pub mod reason;
pub mod refusal;
pub mod server;
pub mod store;
pub mod terminal;
pub mod tickets;
pub mod wake;
