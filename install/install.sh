#!/usr/bin/env bash
# Installs Courier for the current user: release build, statically linked hook-client (the hook
# runs on every tool call; see README "Performance"), then `broker install` (binaries to
# ~/.local/bin, Codex hooks + trust, start at login). Extra arguments go to `broker install`,
# e.g. --prefix DIR, --codex-home DIR, --start systemd|profile|none.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p broker -p hook-client -p courier-mcp
hook-client/build-release.sh --locked
exec target/release/broker install "$@"
