#!/usr/bin/env bash
# `summarize_tests CMD...` runs a command (or shell function) of `cargo test` runs, passing its
# output through, then prints one last line summed over every test binary: `N passed, M failed`.
# When the command failed, a test binary that ended without a `test result:` line (killed,
# crashed) counts as one failed test and is named before the sum. Returns the command's own
# status. Run directly (as test.sh does) it summarizes its arguments as one command; it can also
# be sourced for `summarize_tests`.
summarize_tests() {
  local log status=0
  log=$(mktemp)
  { set -o pipefail; "$@" 2>&1 | tee "$log"; } || status=$?
  awk -v status="$status" '
    function unfinished() {
      if (open && status != 0) { failed++; notes = notes sprintf("test-summary: no test result from %s (counted as 1 failed)\n", name) }
      open = 0
    }
    /^ *(Running|Doc-tests) / { unfinished(); open = 1; name = $0; sub(/^ +/, "", name) }
    /^test result: (ok|FAILED)\. [0-9]+ passed; [0-9]+ failed;/ { passed += $4; failed += $6; open = 0 }
    END { unfinished(); printf "%s%d passed, %d failed\n", notes, passed, failed }
  ' "$log"
  rm -f "$log"
  return "$status"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -u
  summarize_tests "$@"
fi
