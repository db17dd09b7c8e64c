#!/usr/bin/env bash
# The xDS port under abuse, and the replica's memory under each.
#
# Per-client scenarios (issue 32): one replica process (release build,
# default configuration, a fresh one per scenario), a proxy token bound to
# namespace team-a, and `lodestar-bench xds-abuse` on its xDS port; the
# replica's VmRSS before and after, in KiB, and what was served or refused:
#
#   nack            100 streams, each NACKing with 3 MiB of error text
#   nack-1000       the same with 1,000 streams (one token's quota): what
#                   is held does not grow with the streams
#   labels          100 streams at the node caps (256 labels of 240 bytes)
#   labels-over     100 streams with 12,000 labels each (a 3.3 MB node):
#                   refused at admission
#   subs            100 delta streams, 8,000 EDS names of 60 bytes each
#                   (just under the 1 MiB per-stream budget)
#   subs-over       100 delta streams asking 40,000 names each: each ends
#                   at the budget
#   streams         one token opens 20,000 streams as fast as it can; then a
#                   team-b proxy must still connect
#   tests           the older abuse tests (tests/xds.rs `xds_abuse_*`:
#                   garbage, a 100 MiB request, a million names, a stream
#                   flood), with their memory lines
#
#   benches/xds-abuse.sh                 every scenario
#   benches/xds-abuse.sh nack streams    some
#
# Environment: BENCH_BINARY=PATH runs the replica from that lodestar binary
# (an A/B against an older build: the bench client is always the tree's);
# BENCH_PORT_BASE=19700; BENCH_KEEP=1 keeps the temp dir.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PORT=${BENCH_PORT_BASE:-19700}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lodestar-xds-abuse.XXXXXX")
PIDS=()
. "$ROOT/benches/lib.sh"
cleanup_on_exit

SCENARIOS=(nack nack-1000 labels labels-over subs subs-over streams tests)
[ $# -gt 0 ] && SCENARIOS=("$@")

ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
echo "# building lodestar and lodestar-bench (release)" >&2
timeout 3600 nice -n 10 cargo build --release --quiet --bin lodestar --bin lodestar-bench
cp "${BENCH_BINARY:-$ROOT/target/release/lodestar}" "$WORK/lodestar"
cp "$ROOT/target/release/lodestar-bench" "$WORK/lodestar-bench"
LODESTAR=$WORK/lodestar
secure_cluster_files "$LODESTAR" "$WORK"
API=127.0.0.1:$PORT RAFT=127.0.0.1:$((PORT + 1)) XDS=127.0.0.1:$((PORT + 2))

# A fresh replica; sets PIDS and PID.
start_replica() {
    local dir=$WORK/$1
    mkdir -p "$dir"
    RUST_LOG=warn "$LODESTAR" server --config "$WORK/tls.toml" --data-dir "$dir/data" \
        --api-addr "$API" --raft-addr "$RAFT" --xds-addr "$XDS" >"$dir/replica.log" 2>&1 &
    PID=$!
    PIDS+=("$PID")
    for _ in $(seq 600); do
        [ "$(curl -s --cacert "$LODESTAR_CACERT" -o /dev/null -w '%{http_code}' --max-time 1 "https://$API/readyz" || true)" = 200 ] && return 0
        sleep 0.1
    done
    tail -20 "$dir/replica.log" >&2
    echo "error: the replica was not ready within 60s" >&2
    exit 1
}

# A proxy token for namespace $1: its secret.
proxy_token() {
    "$LODESTAR" --server "https://$API" token create --proxy "$1" -o json | sed -n 's/.*"secret": *"\([0-9a-f]*\)".*/\1/p'
}

abuse() {
    local name=$1
    shift
    start_replica "$name"
    ABUSE_TOKEN=$(proxy_token team-a) ABUSE_OTHER_TOKEN=$(proxy_token team-b) \
        timeout 600 "$WORK/lodestar-bench" xds-abuse --xds "$XDS" --api "https://$API" --pid "$PID" --namespace team-a "$@" | tee "$WORK/$name.out"
    stop_pids
}

echo "xDS abuse: one replica on 127.0.0.1, $(nproc) cores; $("$LODESTAR" --version)"
for s in "${SCENARIOS[@]}"; do
    echo
    echo "== $s"
    case $s in
        nack) abuse nack --scenario nack --streams 100 ;;
        nack-1000) abuse nack-1000 --scenario nack --streams 1000 ;;
        labels) abuse labels --scenario labels --streams 100 ;;
        labels-over) abuse labels-over --scenario labels --streams 100 --labels 12000 ;;
        subs) abuse subs --scenario subscriptions --streams 100 --names 8000 ;;
        subs-over) abuse subs-over --scenario subscriptions --streams 100 --names 40000 ;;
        streams) abuse streams --scenario streams --streams 20000 --other-namespace team-b ;;
        tests)
            : "${LODESTAR_ENVOY:=$ROOT/.cache/envoy/bin/envoy}"
            export LODESTAR_ENVOY
            cargo nextest run --test xds --no-capture -E 'test(/^xds_abuse_/)' 2>&1 | grep -E '^rss:|PASS|FAIL|panicked'
            ;;
        *) echo "unknown scenario $s" >&2; exit 1 ;;
    esac
done
echo
echo "== summary"
grep -h '^result: ' "$WORK"/*.out 2>/dev/null || true
