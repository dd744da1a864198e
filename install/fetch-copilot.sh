#!/usr/bin/env bash
# Install the pinned GitHub Copilot CLI used by Courier's Copilot tests, verify its native binary
# against install/copilot.sha256, pre-extract the code it runs, and print the binary's absolute path
# as the last stdout line.
#
#   install/fetch-copilot.sh [VERSION|newest|oldest]   # installs into ${COURIER_COPILOT_CACHE:-$HOME/.cache/courier}/copilot-<ver>
#   COURIER_COPILOT_BIN=$(install/fetch-copilot.sh | tail -n1) cargo test -p courier-tests --test copilot
#
# The npm package @github/copilot is a 1 KB launcher (npm-loader.js); the agent is the native
# binary of the per-platform optional dependency (a Node single-executable application, about
# 200 MB). On its first start that binary unpacks about 235 MB of JavaScript and a native addon
# (its "dist dir") into $COPILOT_PKG_CACHE_HOME/pkg/<platform>/<version>/ and runs them from
# there. This script does that once, into copilot-<ver>/pkg-cache beside node_modules, so a test
# that sets COPILOT_PKG_CACHE_HOME to it (tests/src/copilot.rs) never unpacks per run.
#
# Needs node + npm and access to the npm registry (nothing else). Idempotent: when the binary is
# already present with the recorded digest, nothing is downloaded (install/fetch-pinned.sh), and
# an already complete extraction is kept.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=install/fetch-pinned.sh
. "$HERE/fetch-pinned.sh"

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64)              PKG=@github/copilot-linux-x64 ;;
  Linux-aarch64|Linux-arm64) PKG=@github/copilot-linux-arm64 ;;
  *) echo "fetch-copilot: error: unsupported platform $(uname -s)-$(uname -m)" >&2; exit 1 ;;
esac

# Unpack the dist dir into DEST/pkg-cache (nothing else: COPILOT_SEA_EXTRACT_ONLY makes the binary
# stop after extracting). Private HOME and XDG dirs so the run writes nothing of the caller's.
extract_dist() {
  local bin=$1 dest=$2 scratch
  scratch=$(mktemp -d)
  HOME=$scratch XDG_CACHE_HOME=$scratch/cache XDG_CONFIG_HOME=$scratch/config XDG_STATE_HOME=$scratch/state \
    COPILOT_SEA_EXTRACT_ONLY=1 COPILOT_PKG_CACHE_HOME="$dest/pkg-cache" "$bin" --binary-version
  local status=$?
  rm -rf "$scratch"
  return $status
}
fetch_pinned_smoke() { extract_dist "$1" "$2"; }

bin=$(fetch_pinned copilot @github/copilot "$PKG" "$HERE/copilot.sha256" \
  "${COURIER_COPILOT_CACHE:-${HOME:?HOME is not set}/.cache/courier}" "${1:-newest}" | tail -n 1)
# An install made before the extraction step (or one whose extraction was interrupted) is
# completed here; the binary itself writes .extraction-complete last.
dest=$(cd "$(dirname "$bin")/../../.." && pwd)
if ! compgen -G "$dest/pkg-cache/pkg/*/*/.extraction-complete" >/dev/null; then
  echo "fetch-copilot: extracting the dist dir into $dest/pkg-cache" >&2
  extract_dist "$bin" "$dest" >&2 || { echo "fetch-copilot: error: extraction failed" >&2; exit 1; }
fi
echo "$bin"
