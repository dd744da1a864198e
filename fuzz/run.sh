#!/usr/bin/env bash
# Runs every fuzz target for N seconds (default 300), one job each, one after the other.
# Usage: fuzz/run.sh [SECONDS] [TARGET...]   Needs a nightly toolchain and `cargo install cargo-fuzz`.
# New interesting inputs go to fuzz/corpus/<target>/ (not committed), crashes to
# fuzz/artifacts/<target>/, libFuzzer's log to fuzz/logs/<target>.log.
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-300}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(frame hook_payload rollout_line)
mkdir -p logs
cargo +nightly fuzz build "${targets[@]:0:1}" >/dev/null # fail early on a build error
status=0
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    echo "== $t: ${secs}s"
    if cargo +nightly fuzz run "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$secs" -rss_limit_mb=512 -malloc_limit_mb=256 -dict="dict/$t.dict" \
        -print_final_stats=1 >"logs/$t.log" 2>&1; then
        grep -E '^#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb' "logs/$t.log" || true
    else
        status=1
        echo "$t FAILED: see fuzz/logs/$t.log and fuzz/artifacts/$t/"
        grep -E 'panicked|ERROR|SUMMARY|Test unit written' "logs/$t.log" || true
    fi
done
exit $status
