#!/usr/bin/env bash
# Install the pinned Claude Code CLI used by Courier's Claude Code tests, verify its native binary
# against install/claude.sha256, and print the binary's absolute path as the last stdout line.
#
#   install/fetch-claude.sh [VERSION|newest|oldest]   # installs into ${COURIER_CLAUDE_CACHE:-$HOME/.cache/courier}/claude-<ver>
#   COURIER_CLAUDE_BIN=$(install/fetch-claude.sh | tail -n1) cargo test -p courier-tests --test claude
#
# VERSION defaults to the newest supported release (the first digest line of install/claude.sha256
# for this platform). The npm package @anthropic-ai/claude-code brings a native Bun binary in a
# per-platform optional dependency (about 180 MB download, 402 MB unpacked); npm warns that it
# wants node >= 22, it installs and runs on node 20.
#
# Needs node + npm and access to the npm registry (nothing else). Idempotent: when the binary is
# already present with the recorded digest, nothing is downloaded (install/fetch-pinned.sh).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=install/fetch-pinned.sh
. "$HERE/fetch-pinned.sh"

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64)          PKG=@anthropic-ai/claude-code-linux-x64 ;;
  Linux-aarch64|Linux-arm64) PKG=@anthropic-ai/claude-code-linux-arm64 ;;
  *) echo "fetch-claude: error: unsupported platform $(uname -s)-$(uname -m)" >&2; exit 1 ;;
esac

fetch_pinned claude @anthropic-ai/claude-code "$PKG" "$HERE/claude.sha256" \
  "${COURIER_CLAUDE_CACHE:-${HOME:?HOME is not set}/.cache/courier}" "${1:-newest}"
