#!/usr/bin/env bash
# Install the pinned verdaccio (a local npm registry) that tests/tests/package.rs publishes
# Courier's packages to, and print the path of its `verdaccio` command as the last stdout line.
#
#   install/fetch-verdaccio.sh     # installs into ${COURIER_VERDACCIO_CACHE:-$HOME/.cache/courier}/verdaccio-<ver>
#
# Pinned: version and the SHA-512 integrity of verdaccio's own tarball as the npm registry lists
# it (npm checks every tarball it downloads against its listed integrity; this checks that the
# one listed is still the one pinned here). 6.8.0: the newest that runs on node 20 (6.10 wants 22).
# Needs node + npm and the npm registry the first time. Idempotent: an install already verified
# is reused without a download.
set -euo pipefail

VERSION=6.8.0
INTEGRITY=sha512-fGKQZnFQVuLiRYbTDnyOaQDtAs+SgnoK2gQSztM3MIMXMa5MfiRQ+Ub/+8OMFygoroZU21d05d+JJJr4f2TnEQ==
cache=${COURIER_VERDACCIO_CACHE:-${HOME:?HOME is not set}/.cache/courier}
dest=$cache/verdaccio-$VERSION
die() { echo "fetch-verdaccio: error: $*" >&2; exit 1; }
say() { echo "fetch-verdaccio: $*" >&2; }

# The integrity npm recorded for verdaccio itself in a tree's hidden lockfile.
installed_integrity() {
  node -e 'const l = require(process.argv[1]); const p = l.packages["node_modules/verdaccio"] || {};
           process.stdout.write(p.version === process.argv[2] ? (p.integrity || "") : "")' \
    "$1/node_modules/.package-lock.json" "$VERSION" 2>/dev/null || true
}

if [ -x "$dest/node_modules/.bin/verdaccio" ] && [ "$(installed_integrity "$dest")" = "$INTEGRITY" ]; then
  say "verdaccio $VERSION already installed and verified"
  echo "$dest/node_modules/.bin/verdaccio"
  exit 0
fi
command -v npm >/dev/null || die "npm not found (install Node.js >= 20)"
mkdir -p "$cache"
stage=$(mktemp -d "$cache/.verdaccio-$VERSION.XXXXXX")
# shellcheck disable=SC2064 # the stage is fixed now, expanded once
trap "rm -rf '$stage'" EXIT
say "installing verdaccio@$VERSION with npm into $dest"
printf '{"private":true,"dependencies":{"verdaccio":"%s"}}\n' "$VERSION" >"$stage/package.json"
(cd "$stage" && npm install --no-audit --no-fund --no-save --loglevel=error >&2) || die "npm install verdaccio@$VERSION failed"
got=$(installed_integrity "$stage")
[ "$got" = "$INTEGRITY" ] || die "verdaccio $VERSION integrity MISMATCH: expected $INTEGRITY, got '${got:-none}'; nothing was installed"
rm -rf "$dest" && mv "$stage" "$dest"
trap - EXIT
say "installed and verified verdaccio $VERSION"
echo "$dest/node_modules/.bin/verdaccio"
