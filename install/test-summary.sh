#!/usr/bin/env bash
# Runs a `cargo test` command line (its arguments), passing its output through, then prints one
# last line summed over every test binary: `N passed, M failed`. A test binary that ended without
# a `test result:` line (killed, crashed) counts as one failed test and is named before the sum.
# Exits with the command's own status.
set -uo pipefail
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
awk '
  function unfinished() {
    if (open) { failed++; notes = notes sprintf("test-summary: no test result from %s (counted as 1 failed)\n", name) }
    open = 0
  }
  /^ *(Running|Doc-tests) / { unfinished(); open = 1; name = $0; sub(/^ +/, "", name) }
  /^test result: (ok|FAILED)\. [0-9]+ passed; [0-9]+ failed;/ { passed += $4; failed += $6; open = 0 }
  END { unfinished(); printf "%s%d passed, %d failed\n", notes, passed, failed }
' "$log"
exit "$status"
