#!/usr/bin/env bash
# Installs Courier for the current user: release build (hook-client/build.rs links the client
# statically: the hook runs on every tool call; see bench/README.md), then `broker install` (binaries to
# ~/.local/bin, Codex hooks + trust, start at login). Extra arguments go to `broker install`,
# e.g. --prefix DIR, --codex-home DIR, --start systemd|profile|none, --bridge --nats URL --host NAME.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(-p broker -p hook-client -p courier-mcp)
for a in "$@"; do
  # The NATS bridge (tokio, async-nats) is built only for those who install it.
  if [ "$a" = --bridge ]; then pkgs+=(-p courier-bridge); fi
done
cargo build --release --locked "${pkgs[@]}"
exec target/release/broker install "$@"
