#!/usr/bin/env bash
# Endpoint-churn benchmark: a three-node Lodestar cluster on 127.0.0.1 and
# `lodestar-bench churn` against it: simulated proxies (one real ADS stream
# each) spread over the three xDS ports, instances registered and deleted
# through all three API ports, the replicas' CPU sampled from /proc.
#
#   benches/churn.sh [CHURN FLAGS...]   (flags of `lodestar-bench churn`)
#
# With no flags, churn's defaults: 100 proxies (delta), 20 services x
# 3 instances, 1000 changes/s for 10 s, 32 writers. For example:
#
#   benches/churn.sh --protocol sotw --proxies 500 --rate 200
#
# Environment:
#   BENCH_PORT_BASE=19500  first of the 9 loopback ports used
#   BENCH_TIMEOUT=900      seconds the bench may take, setup to final check
#   BENCH_KEEP=1           keep the temp dir (data and logs) after the run
#
# Needs: cargo, curl. Every step is bounded in time; every process started
# here is killed on exit. Exits non-zero when the bench reports a problem
# (unacknowledged writes, changes that never reached every proxy, proxies
# that disagree with the store), after printing its figures.
set -euo pipefail

PORT=${BENCH_PORT_BASE:-19500}
LIMIT=${BENCH_TIMEOUT:-900}

cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lodestar-churn.XXXXXX")
PIDS=()

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for _ in $(seq 50); do
        local alive=0
        for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    if [ "${BENCH_KEEP:-0}" = 1 ] || [ "$rc" != 0 ]; then
        echo "# data and logs kept in $WORK" >&2
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

die() { echo "error: $*" >&2; exit 1; }

# Poll URL until it answers 200, at most $2 seconds.
wait_ok() {
    local url=$1 limit=$2 i
    for i in $(seq $((limit * 10))); do
        [ "$(curl -s --cacert "$WORK/ca/ca.pem" -o /dev/null -w '%{http_code}' --max-time 1 "$url" || true)" = 200 ] && return 0
        sleep 0.1
    done
    return 1
}

# (a) build
echo "# building lodestar and lodestar-bench (release)" >&2
timeout 3600 cargo build --release --quiet --bin lodestar --bin lodestar-bench
# Copies: a concurrent build must not swap a binary under the benchmark.
cp "$ROOT/target/release/lodestar" "$ROOT/target/release/lodestar-bench" "$WORK/"
LODESTAR=$WORK/lodestar
BENCH=$WORK/lodestar-bench
# Secure by default: the cluster CA and management token (benches/lib.sh).
. "$ROOT/benches/lib.sh"
secure_cluster_files "$LODESTAR" "$WORK"
one_source_many_proxies "$LODESTAR" "$WORK/tls.toml"

# (b) three replicas
three_member_addrs "$PORT"
for n in 1 2 3; do
    RUST_LOG=warn "$LODESTAR" server --config "$WORK/tls.toml" --id "$n" --data-dir "$WORK/lodestar-$n" \
        --api-addr "${API[n - 1]}" --raft-addr "${RAFT[n - 1]}" --xds-addr "${XDS[n - 1]}" \
        "${MEMBERS[@]}" >"$WORK/lodestar-$n.log" 2>&1 &
    PIDS+=($!)
done
for n in 1 2 3; do
    wait_ok "https://${API[n - 1]}/readyz" 60 || { tail -20 "$WORK/lodestar-$n.log" >&2; die "lodestar $n not ready within 60s"; }
done
LEADER=$(curl -s --cacert "$WORK/ca/ca.pem" -H "Authorization: Bearer $LODESTAR_TOKEN" --max-time 2 "https://${API[0]}/v1/node" | sed -n 's/.*"leader":\([0-9]*\).*/\1/p')
echo "# cluster ready (leader: node ${LEADER:-?}); running lodestar-bench churn" >&2

# (c) the bench. CPU of everything else on the machine, to tell whether
# something competed for it: busy jiffies of the whole machine minus the
# replicas' and this script's children's (the bench), as a share of all cores.
machine_busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
ours() {
    local sum=0 pid
    for pid in "${PIDS[@]}"; do
        [ -r "/proc/$pid/stat" ] && sum=$((sum + $(awk '{ print $14 + $15 }' "/proc/$pid/stat")))
    done
    echo $((sum + $(awk '{ print $16 + $17 }' /proc/$$/stat)))
}
ARGS=()
for n in 1 2 3; do ARGS+=(--server "https://${API[n - 1]}" --xds "${XDS[n - 1]}" --pid "${PIDS[n - 1]}"); done
busy0=$(machine_busy) ours0=$(ours) t0=$(date +%s%N)
rc=0
timeout "$LIMIT" "$BENCH" churn "${ARGS[@]}" "$@" >"$WORK/bench.out" 2>"$WORK/bench.err" || rc=$?
other=$(awk -v b="$(($(machine_busy) - busy0))" -v o="$(($(ours) - ours0))" -v ns="$(($(date +%s%N) - t0))" -v hz="$(getconf CLK_TCK)" -v n="$(nproc)" \
    'BEGIN { x = 100 * (b - o) / (ns / 1e9 * hz * n); printf "%.0f", x < 0 ? 0 : x }')

# (d) figures
echo
echo "Endpoint-churn benchmark: 3 replicas on 127.0.0.1 (leader: node ${LEADER:-?}), $(nproc) cores; $("$LODESTAR" --version)"
echo "replica pids: node 1 = ${PIDS[0]}, node 2 = ${PIDS[1]}, node 3 = ${PIDS[2]}; bench client and replicas share the machine"
cat "$WORK/bench.out"
echo "other processes on the machine used ${other}% of it during the bench$([ "$other" -ge 15 ] && echo ': numbers are disturbed')"
if [ "$rc" = 124 ]; then
    die "lodestar-bench churn did not finish within ${LIMIT}s"
elif [ "$rc" != 0 ]; then
    cat "$WORK/bench.err" >&2
    die "lodestar-bench churn reported a problem (exit $rc)"
fi
