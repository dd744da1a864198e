#!/usr/bin/env bash
# Whole-process benchmark of the hook path (bench/README.md).
#   bench/run.sh                  build release binaries, run every case
#   bench/run.sh --cases 1,4 -n 500 --rounds 5 --json /tmp/bench.json
#   BENCH_NO_BUILD=1 bench/run.sh ...   use target/release as it is
# Needs python3 (stdlib only). Leaves nothing behind unless --keep.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
if [[ -z "${BENCH_NO_BUILD:-}" ]]; then
    (cd "$repo" && cargo build --release -p broker -p hook-client)
fi
# The figures are for the client users install: refuse to measure a dynamically linked one.
if [[ -z "${COURIER_DYNAMIC_HOOK_CLIENT:-}" ]] && ! ldd "$target/release/hook-client" 2>&1 | grep -q "statically linked"; then
    echo "bench/run.sh: $target/release/hook-client is dynamically linked (hook-client/build.rs found no static libc: install libc6-dev)" >&2
    exit 1
fi
echo "uptime: $(uptime)"
exec python3 "$repo/bench/driver.py" --bin-dir "$target/release" "$@"
