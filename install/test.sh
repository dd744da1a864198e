#!/usr/bin/env bash
# The whole test suite, as CI runs it: fetch the pinned Codex (checked by SHA-256), build, test.
set -euo pipefail
cd "$(dirname "$0")/.."
codex_bin=$(install/fetch-codex.sh | tail -n 1)
export COURIER_CODEX_BIN="$codex_bin"
cargo build --workspace --locked
cargo test --workspace --locked --no-fail-fast "$@"
