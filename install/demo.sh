#!/usr/bin/env bash
# Builds everything and shows one delivery on the real Codex CLI in a throwaway CODEX_HOME:
# scripted local model, `broker send` mid-session, the model request that carried the message,
# and `broker inspect` showing it confirmed.
set -euo pipefail
cd "$(dirname "$0")/.."
codex_bin=$(install/fetch-codex.sh | tail -n 1)
export COURIER_CODEX_BIN="$codex_bin"
cargo build --workspace --locked
exec target/debug/courier-demo
