#!/usr/bin/env bash
# The rolling upgrade's cost (issue 40): tests/e2e/upgrade.rs's
# `rolling_upgrade_under_load` (three replicas of the previous release,
# commit 7a825a0, upgraded to this build one at a time, followers first,
# under a steady write and request load through a real Envoy; debug
# builds), run RUNS times. Each run prints a `result:` line: the time
# from the first replica's stop to the last one caught up
# (`upgrade_ms`), and the longest time between two acknowledged writes
# (`longest_write_gap_ms`: the writer goes to the next replica when one
# does not answer).
#
#   benches/upgrade.sh [RUNS]       (default 5)
set -uo pipefail
cd "$(dirname "$0")/.."
runs="${1:-5}"
LODESTAR_ENVOY="$(tests/support/install-envoy.sh)" || exit 1
LODESTAR_PREVIOUS="$(tests/support/build-previous.sh)" || exit 1
export LODESTAR_ENVOY LODESTAR_PREVIOUS
cargo nextest run --test e2e --no-run >/dev/null 2>&1 || exit 1
failed=0
for i in $(seq 1 "$runs"); do
  out="$(cargo nextest run --test e2e --no-capture -E 'test(=upgrade::rolling_upgrade_under_load)' 2>&1)"
  status=$?
  grep -E '^result:' <<<"$out" | sed "s/^result:/result: run=$i/"
  if [ "$status" != 0 ]; then
    failed=$((failed + 1))
    tail -40 <<<"$out"
  fi
done
echo "runs=$runs failed=$failed"
[ "$failed" = 0 ]
