#!/usr/bin/env bash
# `install/test-binaries.sh JOBS [CARGO_TEST_ARGS...] [-- TEST_ARGS...]`: builds the test binaries
# `cargo test CARGO_TEST_ARGS` would run and runs them JOBS at a time, each in its package's
# directory as cargo runs it, with TEST_ARGS (a name filter, `--nocapture`, ...). Most of the
# suite waits on real agents (measured: 5.7 min of CPU in 11 min of tests one binary at a time on
# 2 cores), so two binaries at a time take about half the time. Each binary's output is printed
# whole when it ends, headed by cargo's `Running` line, so test-summary.sh reads it as cargo's;
# the doc-tests follow when no target was named. Exits 1 if any binary failed.
set -euo pipefail
jobs=$1
shift
cargo_args=()
while [[ $# -gt 0 && $1 != -- ]]; do
  cargo_args+=("$1")
  shift
done
[[ ${1-} == -- ]] && shift
test_args=("$@")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The binaries, as cargo lists them: package directory, source path, executable (tab-separated).
cargo test "${cargo_args[@]}" --no-run --message-format=json-render-diagnostics | python3 -c '
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        src = os.path.relpath(m["target"]["src_path"], os.path.dirname(m["manifest_path"]))
        print(os.path.dirname(m["manifest_path"]), src, m["executable"], sep="\t")
' >"$work/list"

run_one() {
  local dir=$1 src=$2 exe=$3 out status=0
  out=$(mktemp -p "$work")
  (cd "$dir" && "$exe" "${test_args[@]}") >"$out" 2>&1 || status=$?
  [[ $status -eq 0 ]] || : >"$work/failed"
  # One binary's output at a time, whole.
  {
    flock 9
    echo "     Running $src (${exe#"$PWD"/})"
    cat "$out"
  } 9>"$work/print.lock"
  rm -f "$out"
}
export -f run_one
export work
# Bash cannot export arrays: the test arguments go through a file.
: >"$work/args"
[[ ${#test_args[@]} -eq 0 ]] || printf '%s\0' "${test_args[@]}" >"$work/args"
while IFS=$'\t' read -r dir src exe; do printf '%s\0%s\0%s\0' "$dir" "$src" "$exe"; done <"$work/list" |
  xargs -0 -n 3 -P "$jobs" bash -c 'mapfile -d "" test_args <"$work/args"; run_one "$@"' run_one

doc=1
for a in "${cargo_args[@]}"; do
  case $a in --test | --lib | --bin | --bins | --tests | --example | --examples | --bench | --benches) doc=0 ;; esac
done
if [[ $doc -eq 1 ]]; then
  cargo test "${cargo_args[@]}" --doc -- "${test_args[@]+"${test_args[@]}"}" || : >"$work/failed"
fi
[[ ! -e $work/failed ]]
