//! The Claude Code wing: what Courier knows about Claude Code as a second host agent
//! (docs/claude-code.md).
//!
//! - `resolve.rs`: the native binary behind the `claude` a user runs (npm, pnpm, the native
//!   installer, the local install), found without running it;
//! - `settings.rs`: Courier's HTTP hooks in Claude Code's `settings.json` (merged in and taken out
//!   format-preserving).

pub mod resolve;
pub mod settings;
