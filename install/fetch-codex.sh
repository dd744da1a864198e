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
# already present with the recorded digest, nothing is downloaded.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SUMS="$HERE/codex.sha256"
CACHE=${COURIER_CODEX_CACHE:-${HOME:?HOME is not set}/.cache/courier}

die() { echo "fetch-codex: error: $*" >&2; exit 1; }
say() { echo "fetch-codex: $*" >&2; }

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64)          PKG=@openai/codex-linux-x64 ;;
  Linux-aarch64|Linux-arm64) PKG=@openai/codex-linux-arm64 ;;
  *) die "unsupported platform $(uname -s)-$(uname -m)" ;;
esac

[ -r "$SUMS" ] || die "missing $SUMS"
case "${1:-newest}" in
  newest) VERSION=$(awk -v p="$PKG" '$1 !~ /^#/ && $3 == p { print $2; exit }' "$SUMS") ;;
  oldest) VERSION=$(awk -v p="$PKG" '$1 !~ /^#/ && $3 == p { v = $2 } END { print v }' "$SUMS") ;;
  *) VERSION=$1 ;;
esac
[[ "$VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "bad version '$VERSION' (want X.Y.Z)"
DEST="$CACHE/codex-$VERSION"
# Line format: <sha256>  <version>  <platform package>  <path inside the package>
LINE=$(awk -v v="$VERSION" -v p="$PKG" '$1 !~ /^#/ && $2 == v && $3 == p { print; exit }' "$SUMS")
[ -n "$LINE" ] || die "no digest recorded for $PKG $VERSION in $SUMS; refusing to install an unverified binary"
WANT=$(echo "$LINE" | awk '{print $1}')
REL=$(echo "$LINE" | awk '{print $4}')
[[ "$WANT" =~ ^[0-9a-f]{64}$ ]] || die "malformed digest for $PKG in $SUMS: $WANT"
BIN="$DEST/node_modules/$PKG/$REL"

sha256_of() { sha256sum "$1" | awk '{print $1}'; }

if [ -f "$BIN" ] && [ "$(sha256_of "$BIN")" = "$WANT" ]; then
  say "codex $VERSION already installed and verified"
  echo "$BIN"
  exit 0
fi

command -v npm >/dev/null || die "npm not found (install Node.js >= 18)"
mkdir -p "$CACHE"
STAGE=$(mktemp -d "$CACHE/.codex-$VERSION.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
say "installing @openai/codex@$VERSION with npm into $DEST (about 420 MB unpacked)"
printf '{"private":true,"dependencies":{"@openai/codex":"%s"}}\n' "$VERSION" >"$STAGE/package.json"
( cd "$STAGE" && npm install --no-audit --no-fund --no-save --include=optional --loglevel=error >&2 ) \
  || die "npm install @openai/codex@$VERSION failed"

SBIN="$STAGE/node_modules/$PKG/$REL"
[ -f "$SBIN" ] || die "npm did not install the native binary $PKG/$REL (optional dependency skipped?)"
GOT=$(sha256_of "$SBIN")
if [ "$GOT" != "$WANT" ]; then
  die "SHA-256 MISMATCH for $SBIN
  expected $WANT (install/codex.sha256)
  got      $GOT
The downloaded Codex is not the pinned one; nothing was installed."
fi
chmod 0755 "$SBIN"
"$SBIN" --version >&2 || die "installed binary does not run"

# Swap the verified tree into place (the old one, if any, had a wrong or missing binary).
if [ -e "$DEST" ]; then
  OLD="$CACHE/.codex-$VERSION.old.$$"
  mv "$DEST" "$OLD"
  mv "$STAGE" "$DEST"
  rm -rf "$OLD"
else
  mv "$STAGE" "$DEST"
fi
trap - EXIT
say "installed and verified codex $VERSION ($WANT)"
echo "$BIN"
