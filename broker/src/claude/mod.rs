//! The Claude Code wing: everything Courier knows about Claude Code as a host agent (its trusted
//! binaries, its HTTP hooks and the gate they pass, its transcript). docs/claude-code.md has the
//! design and the probes each step rests on.
//!
//! - `resolve.rs`: the native binary behind the `claude` a user runs (npm, pnpm, the native
//!   installer, the local install), found without running it;
//! - `settings.rs`: Courier's HTTP hooks in Claude Code's `settings.json` (where, what, the
//!   user's own style kept);
//! - `trust.rs`: trusting a native binary's digest.

pub mod resolve;
pub mod settings;
pub mod trust;
