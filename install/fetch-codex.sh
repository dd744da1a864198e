#!/usr/bin/env bash
# Install the pinned Codex CLI used by Courier's end-to-end tests, verify its native binary
# against install/codex.sha256, and print the binary's absolute path as the last stdout line.
#
#   install/fetch-codex.sh [VERSION|newest|oldest]   # installs into ${COURIER_CODEX_CACHE:-$HOME/.cache/courier}/codex-<ver>
#   COURIER_CODEX_BIN=$(install/fetch-codex.sh | tail -n1) cargo test -p courier-tests
#
# VERSION defaults to the newest supported release (the first digest line of install/codex.sha256
# for this platform); any version with a recorded digest can be fetched, e.g. the oldest
# supported one: install/fetch-codex.sh oldest (or 0.160.0)
#
# Needs node + npm and access to the npm registry (nothing else). Idempotent: when the binary is
# already present with the recorded digest, nothing is downloaded (install/fetch-pinned.sh).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=install/fetch-pinned.sh
. "$HERE/fetch-pinned.sh"

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64)          PKG=@openai/codex-linux-x64 ;;
  Linux-aarch64|Linux-arm64) PKG=@openai/codex-linux-arm64 ;;
  *) echo "fetch-codex: error: unsupported platform $(uname -s)-$(uname -m)" >&2; exit 1 ;;
esac

fetch_pinned codex @openai/codex "$PKG" "$HERE/codex.sha256" \
  "${COURIER_CODEX_CACHE:-${HOME:?HOME is not set}/.cache/courier}" "${1:-newest}"
