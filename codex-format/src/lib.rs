//! The formats of the Codex wing: what Codex hands a command hook and reads back ([`hook`]), and
//! what it writes to a thread's rollout ([`rollout`]), as pure functions of bytes (no I/O, no
//! state). The broker's Codex wing (`broker/src/codex/`) builds its services on them; the store and
//! the envelope name hook events with them, which is why they are a crate below the broker and
//! not a module inside it.

pub mod hook;
pub mod rollout;
#[cfg(test)]
mod rollout_tests;
