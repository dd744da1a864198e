#!/usr/bin/env bash
# Installs Courier for the current user: release build (hook-client/build.rs links the client
# statically: the hook runs on every tool call; see README "Performance"), then `broker install` (binaries to
# ~/.local/bin, Codex hooks + trust, start at login). Extra arguments go to `broker install`,
# e.g. --prefix DIR, --codex-home DIR, --start systemd|profile|none.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p broker -p hook-client -p courier-mcp
exec target/release/broker install "$@"
