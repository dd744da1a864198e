# Sourced by install/fetch-codex.sh, install/fetch-claude.sh and install/fetch-copilot.sh: npm-install one pinned release of a
# CLI whose native binary ships in a per-platform optional dependency, check that binary against
# the SHA-256 recorded in a sums file, and print its absolute path as the last stdout line.
#
# Sums file lines (comments start with #), newest first per platform:
#   <sha256>  <version>  <npm platform package>  <path inside that package>
#
#   fetch_pinned NAME NPM_PACKAGE PLATFORM_PACKAGE SUMS_FILE CACHE_DIR [VERSION|newest|oldest]
# installs into CACHE_DIR/NAME-<version>. Idempotent: when the binary is already present with the
# recorded digest, nothing is downloaded. A wrong digest installs nothing.
#
# The verified binary is smoke-run before it is swapped into place: `BIN --version`, or, when the
# sourcing script defines it, `fetch_pinned_smoke BIN STAGE` (STAGE becomes CACHE_DIR/NAME-<version>,
# so what the smoke run leaves there is kept).

fetch_pinned() {
  local name=$1 npm_pkg=$2 pkg=$3 sums=$4 cache=$5 want_version=${6:-newest}
  local version dest line want rel bin stage sbin got old
  die() { echo "fetch-$name: error: $*" >&2; exit 1; }
  say() { echo "fetch-$name: $*" >&2; }
  sha256_of() { sha256sum "$1" | awk '{print $1}'; }

  [ -r "$sums" ] || die "missing $sums"
  case "$want_version" in
    newest) version=$(awk -v p="$pkg" '$1 !~ /^#/ && $3 == p { print $2; exit }' "$sums") ;;
    oldest) version=$(awk -v p="$pkg" '$1 !~ /^#/ && $3 == p { v = $2 } END { print v }' "$sums") ;;
    *) version=$want_version ;;
  esac
  [[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "bad version '$version' (want X.Y.Z)"
  dest="$cache/$name-$version"
  line=$(awk -v v="$version" -v p="$pkg" '$1 !~ /^#/ && $2 == v && $3 == p { print; exit }' "$sums")
  [ -n "$line" ] || die "no digest recorded for $pkg $version in $sums; refusing to install an unverified binary"
  want=$(echo "$line" | awk '{print $1}')
  rel=$(echo "$line" | awk '{print $4}')
  [[ "$want" =~ ^[0-9a-f]{64}$ ]] || die "malformed digest for $pkg in $sums: $want"
  bin="$dest/node_modules/$pkg/$rel"

  if [ -f "$bin" ] && [ "$(sha256_of "$bin")" = "$want" ]; then
    say "$name $version already installed and verified"
    echo "$bin"
    return 0
  fi

  command -v npm >/dev/null || die "npm not found (install Node.js >= 18)"
  mkdir -p "$cache"
  stage=$(mktemp -d "$cache/.$name-$version.XXXXXX")
  # shellcheck disable=SC2064 # the stage is fixed now, expanded once
  trap "rm -rf '$stage'" EXIT
  say "installing $npm_pkg@$version with npm into $dest"
  printf '{"private":true,"dependencies":{"%s":"%s"}}\n' "$npm_pkg" "$version" >"$stage/package.json"
  ( cd "$stage" && npm install --no-audit --no-fund --no-save --include=optional --loglevel=error >&2 ) \
    || die "npm install $npm_pkg@$version failed"

  sbin="$stage/node_modules/$pkg/$rel"
  [ -f "$sbin" ] || die "npm did not install the native binary $pkg/$rel (optional dependency skipped?)"
  got=$(sha256_of "$sbin")
  if [ "$got" != "$want" ]; then
    die "SHA-256 MISMATCH for $sbin
  expected $want ($sums)
  got      $got
The downloaded $name is not the pinned one; nothing was installed."
  fi
  chmod 0755 "$sbin"
  if declare -F fetch_pinned_smoke >/dev/null; then
    fetch_pinned_smoke "$sbin" "$stage" >&2 || die "installed binary does not run"
  else
    "$sbin" --version >&2 || die "installed binary does not run"
  fi

  # Swap the verified tree into place (the old one, if any, had a wrong or missing binary).
  if [ -e "$dest" ]; then
    old="$cache/.$name-$version.old.$$"
    mv "$dest" "$old"
    mv "$stage" "$dest"
    rm -rf "$old"
  else
    mv "$stage" "$dest"
  fi
  trap - EXIT
  say "installed and verified $name $version ($want)"
  echo "$bin"
}
