#!/usr/bin/env bash
# The doors of issue 32 under attack: `lodestar-bench abuse` against a
# release replica on loopback (TLS, ACLs on, the management token from
# benches/lib.sh), a fresh replica for each scenario so that one attack's
# memory does not show in the next. The replica runs with an open-file
# limit of 1,024 (the issue's), its other settings the defaults, except
# shorter connection timeouts unless BENCH_TIMEOUTS=default (the defaults,
# 120 s idle and 10 s headers, make silent-connections take two minutes).
# Each scenario prints one `result: held=true|false ...` line with the
# replica's memory before and after (KiB); the summary lists them and the
# script exits non-zero if a door did not hold.
#
#   benches/abuse.sh                  every scenario
#   benches/abuse.sh SCENARIO...      some of them (see lodestar-bench abuse --help)
#
# Besides lodestar-bench's scenarios, what one proxy token may make a
# replica hold within the xDS limits:
#   nack-texts-1000                   1,000 streams (one credential's quota)
#                                     each NACKing with 3 MB of text: what
#                                     is kept (4 KiB a stream) does not
#                                     grow with the streams
#   node-metadata-at-caps             100 streams whose nodes are at the
#                                     caps: 256 labels of 240 bytes (64 KiB)
#   delta-subscriptions-in-budget     30 delta streams, each 6,000 names of
#                                     100 bytes (just under the 1 MiB a
#                                     stream's subscriptions may take)
#   benches/abuse.sh xds-port         the xDS port's older abuse tests
#                                     (tests/e2e/xds.rs xds_abuse_*: garbage,
#                                     a 100 MiB request, a million names,
#                                     4,000 streams; `rss:` lines)
#
# Environment:
#   BENCH_PORT_BASE=19900   first of the 3 loopback ports used
#   BENCH_TIMEOUTS=short    short: conn_idle_timeout_ms 5000,
#                             http_header_read_timeout_ms 3000,
#                             tls_handshake_timeout_ms 3000; default: none set
#   BENCH_PROFILE=release   cargo profile (release|debug)
#   BENCH_KEEP=1            keep the temp dir (data and logs) after the run
#   BENCH_NO_BUILD=1        use target/$PROFILE's binaries as they are
#
# Needs: cargo, curl. Every wait is bounded; every process started here is
# killed on exit. On a build without issue 32's fixes the attacks report
# held=false; the memory ones then take the replica to a few hundred MB.
# The xDS memory scenarios read the replica's memory once it is back under
# the bound (the allocator gives the megabyte requests' freed buffers back
# after some seconds), 30 s at most, with their streams still open.
set -euo pipefail

ALL=(bootstrap yaml-aliases reader-apply metric-labels idle-flood-api idle-flood-xds silent-connections-api silent-connections-xds slowloris
    xds-stream-flood nack-texts node-metadata delta-subscriptions nack-texts-1000 node-metadata-at-caps delta-subscriptions-in-budget)
PORT=${BENCH_PORT_BASE:-19900}
PROFILE=${BENCH_PROFILE:-release}
TIMEOUTS=${BENCH_TIMEOUTS:-short}

cd "$(dirname "$0")/.."
ROOT=$(pwd)

if [ "${1:-}" = xds-port ]; then
    : "${LODESTAR_ENVOY:=$ROOT/.cache/envoy/bin/envoy}"
    export LODESTAR_ENVOY
    cargo nextest run --test e2e --no-capture -E "test(/^xds::xds_abuse_/)" 2>&1 | grep -E '^rss:|PASS|FAIL|panicked'
    exit "${PIPESTATUS[0]}"
fi

SCENARIOS=("$@")
[ ${#SCENARIOS[@]} -gt 0 ] || SCENARIOS=("${ALL[@]}")

WORK=$(mktemp -d "${TMPDIR:-/tmp}/lodestar-abuse.XXXXXX")
PIDS=()
. "$ROOT/benches/lib.sh"
cleanup_on_exit
die() { echo "error: $*" >&2; exit 1; }

# The bench holds a connection per idle-flood connection.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

case $PROFILE in
    release) FLAG=(--release) ;;
    debug) FLAG=() ;;
    *) die "BENCH_PROFILE: release or debug" ;;
esac
if [ "${BENCH_NO_BUILD:-0}" != 1 ]; then
    echo "# building lodestar and lodestar-bench ($PROFILE)" >&2
    timeout 3600 nice -n 10 cargo build "${FLAG[@]}" --locked --quiet --bin lodestar --bin lodestar-bench
fi
cp "$ROOT/target/$PROFILE/lodestar" "$WORK/lodestar"
cp "$ROOT/target/$PROFILE/lodestar-bench" "$WORK/lodestar-bench"
LODESTAR=$WORK/lodestar
BENCH=$WORK/lodestar-bench
secure_cluster_files "$LODESTAR" "$WORK"
case $TIMEOUTS in
    short)
        printf 'conn_idle_timeout_ms = 5000\nhttp_header_read_timeout_ms = 3000\ntls_handshake_timeout_ms = 3000\n' >>"$WORK/tls.toml"
        CLOSE_WITHIN=15
        ;;
    default) CLOSE_WITHIN=135 ;;
    *) die "BENCH_TIMEOUTS: short or default" ;;
esac
API=127.0.0.1:$PORT
export LODESTAR_SERVER=https://$API

# start_replica NAME: a fresh single replica in $WORK/NAME, at most 1,024
# open files (soft and hard: it cannot raise them); sets REPLICA.
start_replica() {
    local dir=$WORK/$1
    mkdir -p "$dir"
    (
        ulimit -n 1024
        RUST_LOG=warn exec "$LODESTAR" server --config "$WORK/tls.toml" --data-dir "$dir/data" \
            --api-addr "$API" --raft-addr "127.0.0.1:$((PORT + 1))" --xds-addr "127.0.0.1:$((PORT + 2))"
    ) >"$dir/lodestar.log" 2>&1 &
    REPLICA=$!
    PIDS+=("$REPLICA")
    for _ in $(seq 300); do
        curl -sf --cacert "$WORK/ca/ca.pem" --max-time 1 -o /dev/null "https://$API/readyz" && return 0
        sleep 0.1
    done
    tail -20 "$dir/lodestar.log" >&2
    die "the replica for $1 was not ready within 30 s"
}

RESULTS=()
for s in "${SCENARIOS[@]}"; do
    args=()
    case $s in
        idle-flood-api | idle-flood-xds) args=(--scenario idle-flood --port "${s##*-}" --source 127.0.0.50 --other-source 127.0.0.51) ;;
        silent-connections-api | silent-connections-xds) args=(--scenario silent-connections --port "${s##*-}" --close-within-s "$CLOSE_WITHIN") ;;
        slowloris) args=(--scenario slowloris --close-within-s "$CLOSE_WITHIN") ;;
        nack-texts-1000) args=(--scenario nack-texts --count 1000) ;;
        node-metadata-at-caps) args=(--scenario node-metadata --count 100 --bytes 61440 --label-bytes 240) ;;
        delta-subscriptions-in-budget) args=(--scenario delta-subscriptions --count 30 --bytes 600000) ;;
        *) args=(--scenario "$s") ;;
    esac
    start_replica "$s"
    echo "# $s" >&2
    out=$(timeout 600 "$BENCH" abuse "${args[@]}" --pid "$REPLICA" 2>&1) || { echo "$out" >&2; die "$s: lodestar-bench abuse failed"; }
    line=$(grep '^result:' <<<"$out" | tail -1)
    echo "$line"
    RESULTS+=("$s: ${line#result: }")
    stop_pids
done

echo
echo "# summary (replica: $PROFILE build, 1,024 open files, timeouts $TIMEOUTS)"
open=0
for r in "${RESULTS[@]}"; do
    echo "$r"
    case $r in *held=false*) open=1 ;; esac
done
[ "$open" = 0 ] || { echo "# some doors did not hold" >&2; exit 2; }
