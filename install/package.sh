#!/usr/bin/env bash
# Release artifacts from one `cargo build --release`: the four binaries with SHA256SUMS, a
# tarball of them, and the two npm packages (npm/: a small launcher and the linux-x64 platform
# package holding the native binaries, laid out like @openai/codex). Nothing is published here:
# .github/workflows/release.yml publishes what this makes, on a version tag.
#
#   install/package.sh [--out DIR] [--version V] [--bin-dir DIR] [--repository URL] [--for-registry]
#
# --bin-dir packs binaries already built there (the tests pack target/debug) instead of building.
# --repository writes the source repository into both package.json files (npm's provenance
# checks it against the repository the publishing workflow runs in). --for-registry marks the
# launcher as one a registry serves (the release workflow publishes it); without it the launcher
# records the directory holding both tarballs, so its error names them when the platform
# package is missing (npm install -g of the launcher tarball alone).
# Binaries: hook-client static (hook-client/build.rs); broker, courier-mcp and courier-bridge
# link the system glibc dynamically and must need no symbol newer than GLIBC_2.34 (Debian 12,
# Ubuntu 22.04, RHEL 9; checked below). Not static like hook-client: static glibc cannot load
# NSS modules (the bridge resolves NATS host names), and no musl target ships with the toolchain.
set -euo pipefail
root=$(realpath "$(dirname "$0")/..")
out=$root/target/package bin_dir="" version="" repository="" from=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$(realpath -m "$2"); shift 2 ;;
    --version) version=$2; shift 2 ;;
    --bin-dir) bin_dir=$(realpath "$2"); shift 2 ;;
    --repository) repository=$2; shift 2 ;;
    --for-registry) from=registry; shift ;;
    *) echo "package.sh: unknown option $1 (see the comment at the top)" >&2; exit 2 ;;
  esac
done
cd "$root" # options name paths relative to where the script was started: resolved above
# The workspace version, unless --version names another (a test packs an upgrade with it).
[ -n "$version" ] || version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
bins=(broker hook-client courier-mcp courier-bridge)
if [ -z "$bin_dir" ]; then
  cargo build --release --locked -p broker -p hook-client -p courier-mcp -p courier-bridge
  # cargo honours CARGO_TARGET_DIR (a separate release target, a CI cache): look where it built.
  bin_dir=$(realpath -m "${CARGO_TARGET_DIR:-$root/target}")/release
fi
min_glibc=2.34
command -v objdump >/dev/null || { echo "package.sh: needs objdump (binutils) to check the glibc each binary needs" >&2; exit 1; }
triple=x86_64-unknown-linux-gnu
dist=$out/courier-$version-$triple
rm -rf "$dist" "$out/npm" && mkdir -p "$dist" "$out/npm"
for b in "${bins[@]}"; do
  [ -f "$bin_dir/$b" ] || { [ "$b" = courier-bridge ] && continue; echo "package.sh: no $bin_dir/$b" >&2; exit 1; }
  # Needs no glibc newer than the stated minimum (a static binary needs none).
  need=$(objdump -T "$bin_dir/$b" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n 1 || true)
  if [ -n "$need" ] && [ "$(printf '%s\n%s\n' "$need" "$min_glibc" | sort -V | tail -n 1)" != "$min_glibc" ]; then
    echo "package.sh: $b needs GLIBC_$need, newer than the supported minimum $min_glibc" >&2; exit 1
  fi
  if [ -n "$need" ]; then echo "package.sh: $b: needs glibc >= $need"; else echo "package.sh: $b: static"; fi
  cp "$bin_dir/$b" "$dist/$b"
done
(cd "$dist" && sha256sum -- * > SHA256SUMS)
tar -C "$out" -czf "$dist.tar.gz" "$(basename "$dist")"
(cd "$out" && sha256sum "$(basename "$dist").tar.gz" > "$(basename "$dist").tar.gz.sha256")

# npm: the platform package carries the binaries and their SHA256SUMS (`broker install` checks
# each copy against it), the launcher names it as an optional dependency of the same version.
stage=$out/npm/stage && rm -rf "$stage" && mkdir -p "$stage"
cp -r npm/courier "$stage/courier" && cp -r npm/courier-linux-x64 "$stage/platform"
mkdir -p "$stage/platform/vendor/$triple/bin"
cp "$dist"/* "$stage/platform/vendor/$triple/bin/"
# Package metadata: the version, the repository (provenance), where the launcher comes from.
node -e 'const fs = require("fs"), [stage, version, repository, from] = process.argv.slice(1);
         for (const p of ["courier", "platform"]) {
           const f = `${stage}/${p}/package.json`, pkg = JSON.parse(fs.readFileSync(f, "utf8").replaceAll("0.0.0-version", version));
           if (repository) pkg.repository = { type: "git", url: `git+${repository}.git` };
           if (p === "courier") pkg.courier = { from };
           fs.writeFileSync(f, JSON.stringify(pkg, null, 2) + "\n");
         }' "$stage" "$version" "$repository" "${from:-$out/npm}"
for p in courier platform; do
  (cd "$stage/$p" && npm pack --silent --pack-destination "$out/npm" >/dev/null)
done
rm -rf "$stage"
(cd "$out/npm" && sha256sum -- *.tgz > SHA256SUMS)
echo "package.sh: $dist.tar.gz"
ls -l "$out/npm"/*.tgz | awk '{print "package.sh: " $NF " (" $5 " bytes)"}'
