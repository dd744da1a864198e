#!/usr/bin/env bash
# The whole test suite, as CI runs it: fetch the pinned Codex, Claude Code and Copilot CLI (checked by SHA-256),
# build, test.
#
# `install/test.sh --fast [TEST_ARGS...]`: the fast tier, run after every change on a built tree (no
# fetch, no tidy checks, no real agent): every crate's unit and contract tests (lib and bin targets,
# the captured sessions of codex-format/testdata, the property tests, the layout and doc-map checks)
# and the end-to-end files that run only stand-in agents, less their `real_codex_*` tests. It sets
# COURIER_FAST_TIER, so a test there that asks the kit for a real agent fails instead of running it.
# CI runs everything (below), the fast tier included.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ${1-} == --fast ]]; then
  shift
  # The end-to-end files whose tests run the stand-in Codex (or no agent at all).
  fast_e2e=(cli crash follow hostile lifecycle rollouts)
  fast_targets=(--lib --bin courier-bridge --test layout --test parsers_prop --test rollout_scan)
  for t in "${fast_e2e[@]}"; do fast_targets+=(--test "$t"); done
  export COURIER_FAST_TIER=1
  cargo build --workspace --locked
  exec install/test-summary.sh install/test-binaries.sh 2 --workspace --locked "${fast_targets[@]}" -- --skip real_codex "$@"
fi
# The install tests verify the systemd units (systemd-analyze, systemd-socket-activate).
if ! command -v systemd-socket-activate >/dev/null || ! command -v systemd-analyze >/dev/null; then
  echo "test.sh: installing Debian's systemd package for systemd-analyze/systemd-socket-activate" >&2
  apt-get update -qq && apt-get install -y -qq systemd >/dev/null
fi
# The bridge tests (tests/tests/bridge.rs) start a real NATS JetStream server.
if ! command -v nats-server >/dev/null && [ ! -x /usr/sbin/nats-server ]; then
  echo "test.sh: installing Debian's nats-server package for the bridge tests" >&2
  apt-get update -qq && apt-get install -y -qq nats-server >/dev/null
fi
# Every test runs on the newest supported Codex; the delivery and approval tests run on the oldest one too
# (install/codex.sha256 lists the supported versions with their digests).
codex_bin=$(install/fetch-codex.sh newest | tail -n 1)
codex_oldest=$(install/fetch-codex.sh oldest | tail -n 1)
export COURIER_CODEX_BIN="$codex_bin" COURIER_CODEX_BIN_OLDEST="$codex_oldest"
# The Claude Code tests (tests/tests/claude.rs) run the pinned Claude Code (install/claude.sha256).
COURIER_CLAUDE_BIN=$(install/fetch-claude.sh newest | tail -n 1)
export COURIER_CLAUDE_BIN
# The GitHub Copilot CLI tests (tests/tests/copilot.rs) run the pinned Copilot CLI
# (install/copilot.sha256), its code pre-extracted by the fetch.
COURIER_COPILOT_BIN=$(install/fetch-copilot.sh newest | tail -n 1)
export COURIER_COPILOT_BIN
# The package test (tests/tests/package.rs) publishes to a local npm registry: the pinned verdaccio.
COURIER_VERDACCIO_BIN=$(install/fetch-verdaccio.sh | tail -n 1)
export COURIER_VERDACCIO_BIN
# Tidy checks first: formatting (rustfmt.toml) and clippy, every warning an error.
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo build --workspace --locked
# Last line: `N passed, M failed`, summed over every test binary of both runs (the status is
# failing if either run failed). The test binaries run two at a time (install/test-binaries.sh);
# the oldest-Codex run names its binaries with `--workspace` as the first run does (with
# `-p courier-tests` cargo would unify features for that package alone and compile the broker
# lib and the kit again, over a minute).
exec install/test-summary.sh bash -c '
  status=0
  install/test-binaries.sh 2 --workspace --locked -- "$@" || status=$?
  echo "test.sh: the delivery, wake, size and approval tests again, on the oldest supported Codex ($("$COURIER_CODEX_BIN_OLDEST" --version))"
  COURIER_CODEX_BIN="$COURIER_CODEX_BIN_OLDEST" install/test-binaries.sh 2 --workspace --locked --test delivery --test wake --test size --test approvals --test approvals_files --test approvals_hold --test approvals_permissions -- "$@" || status=$?
  exit $status' test.sh "$@"
