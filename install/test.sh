#!/usr/bin/env bash
# The whole test suite, as CI runs it: fetch the pinned Codex (checked by SHA-256), build, test.
set -euo pipefail
cd "$(dirname "$0")/.."
# The install tests verify the systemd units (systemd-analyze, systemd-socket-activate).
if ! command -v systemd-socket-activate >/dev/null || ! command -v systemd-analyze >/dev/null; then
  echo "test.sh: installing Debian's systemd package for systemd-analyze/systemd-socket-activate" >&2
  apt-get update -qq && apt-get install -y -qq systemd >/dev/null
fi
# Every test runs on the newest supported Codex; the delivery tests run on the oldest one too
# (install/codex.sha256 lists the supported versions with their digests).
codex_bin=$(install/fetch-codex.sh newest | tail -n 1)
codex_oldest=$(install/fetch-codex.sh oldest | tail -n 1)
export COURIER_CODEX_BIN="$codex_bin" COURIER_CODEX_BIN_OLDEST="$codex_oldest"
cargo build --workspace --locked
run_tests() {
  local status=0
  cargo test --workspace --locked --no-fail-fast "$@" || status=$?
  echo "test.sh: delivery tests on the oldest supported Codex ($("$codex_oldest" --version))" >&2
  COURIER_CODEX_BIN="$codex_oldest" cargo test -p courier-tests --locked --no-fail-fast --test delivery "$@" || status=$?
  return $status
}
# Last line: `N passed, M failed`, summed over every test binary of both runs; the exit status is
# cargo's (non-zero if either run failed).
. install/test-summary.sh
summarize_tests run_tests "$@"
