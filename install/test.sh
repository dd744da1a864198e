#!/usr/bin/env bash
# The whole test suite, as CI runs it: fetch the pinned Codex (checked by SHA-256), build, test.
set -euo pipefail
cd "$(dirname "$0")/.."
# The install tests verify the systemd units (systemd-analyze, systemd-socket-activate).
if ! command -v systemd-socket-activate >/dev/null || ! command -v systemd-analyze >/dev/null; then
  echo "test.sh: installing Debian's systemd package for systemd-analyze/systemd-socket-activate" >&2
  apt-get update -qq && apt-get install -y -qq systemd >/dev/null
fi
codex_bin=$(install/fetch-codex.sh | tail -n 1)
export COURIER_CODEX_BIN="$codex_bin"
cargo build --workspace --locked
# Last line: `N passed, M failed`, summed over every test binary (cargo's own status is kept).
exec install/test-summary.sh cargo test --workspace --locked --no-fail-fast "$@"
