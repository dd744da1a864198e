//! The Claude Code wing: everything Courier knows about Claude Code as a host agent (its trusted
//! binaries, its HTTP hooks and the gate they pass, its transcript). docs/claude-code.md has the
//! design and the probes each step rests on.

pub mod trust;
