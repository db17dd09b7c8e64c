#!/usr/bin/env bash
# Long fault-injection runs: tests/e2e/faults.rs (three replicas in network
# namespaces, clients on every replica, the leader partitioned, paused and
# killed in turn, members removed and added back, a disk filled, every
# key's history checked for linearizability, the
# replicas' final state compared), run RUNS times for SECS seconds each.
#
#   benches/faults.sh [RUNS] [SECS]       (default: 20 runs of 180 s)
#
# Prints each run's `result:` line (faults injected, operations checked,
# indeterminate ones, anomalies) and its fault log; a failing run's
# history and replica logs are kept (the path is printed) and the script
# exits non-zero at the end. Needs root, iproute2 and iptables.
#
# LODESTAR_FAULT_PLANT=stale-reads checks that the harness can fail: the
# clients read stale (a replica's own state) and the checker must object.
set -uo pipefail
cd "$(dirname "$0")/.."
runs="${1:-20}"
secs="${2:-180}"
export LODESTAR_FAULT_SECS="$secs"
cargo nextest run --test e2e --no-run >/dev/null || exit 1
failed=0
for i in $(seq 1 "$runs"); do
  echo "== run $i of $runs ($secs s of faults)"
  out="$(cargo nextest run --test e2e --no-capture --no-fail-fast -E "test(=faults::faults_three_replicas_in_namespaces)" 2>&1)"
  status=$?
  grep -E '^(result:|ANOMALIES|key |replica |final |history and replica logs|SKIPPED| +[0-9.]+s |    client )' <<<"$out"
  if [ "$status" != 0 ]; then
    failed=$((failed + 1))
    # The whole report (the anomalies follow the panic line), kept.
    keep="$(mktemp /tmp/lodestar-faults-run-XXXXXX.log)"
    printf '%s\n' "$out" >"$keep"
    sed -n '/panicked at/,/history and replica logs kept in/p' <<<"$out" | head -60
    echo "full output of the failed run: $keep"
  fi
done
echo "runs: $runs, failed: $failed"
[ "$failed" = 0 ]
