#!/usr/bin/env bash
# xDS push-engine benchmark: `lodestar-bench xds` against a three-node
# Lodestar cluster on 127.0.0.1 (release build), a fresh cluster for each
# scenario so that one scenario's memory does not show in the next:
#
#   convergence  1000 proxies over the three replicas, 1000 services scoped
#                by a Sidecar per proxy namespace (20 services + web each);
#                5 writes of web's VirtualService: ack -> every proxy ACKed
#                RDS with it, p50/p99/max (target p99 <= 50 ms)
#   fanout       one endpoint change of web at a time, to 1000 then 5000
#                proxies: ack -> last proxy ACKed EDS, EDS bytes received
#   idle         10000 streams on ONE replica (a follower), each on its own
#                HTTP/2 connection as Envoys connect: its RSS per stream
#                (target <= 40 KiB: every stream is TLS);
#                `idle --streams-per-connection 100`
#                for streams sharing connections
#   memory       2000 proxies over the three replicas with the same mesh:
#                each replica's RSS (target <= 300 MB)
#   failover     reconnect storm: 2000 proxies over the three replicas, all
#                with their config; kill -9 one replica (a third of the
#                proxies are on it); each of those reconnects to a survivor
#                after a random delay below 500 ms (Envoy's first xDS
#                retry): kill -> whole config again, p50/p99/max (target
#                p99 <= 2 s). BENCH_FAILOVER_KILL=follower (default) or
#                leader picks the victim.
#
#   benches/xds.sh                          every scenario, default flags
#   benches/xds.sh SCENARIO [FLAGS...]      one scenario, extra `lodestar-bench xds` flags
#   benches/xds.sh fanout --proxies 500,2000 --repeat 3
#
# The replicas run with stream rebalancing and the maximum stream age off
# (xds_rebalance_interval_ms = 0, xds_max_stream_age_s = 0): the simulated
# proxies do not reconnect, and idle puts every stream on one replica on
# purpose; and with the per-credential and per-source stream quotas raised
# out of reach (every proxy is one token from one address). Everything else
# is the default configuration.
#
# Environment:
#   BENCH_ROUNDS=1         run every scenario this many times, each on a fresh
#                            cluster (scenario after scenario, round after
#                            round); the summary lists every round
#   BENCH_PORT_BASE=19600  first of the 9 loopback ports used
#   BENCH_TIMEOUT=600      seconds each scenario may take, setup included
#   BENCH_MAX_LOAD=1.5     before each scenario, wait until the 1-minute load
#   BENCH_LOAD_WAIT=300      average is at most this, waiting at most this
#                            many seconds over the whole run
#   BENCH_KEEP=1           keep the temp dir (data and logs) after the run
#   BENCH_BINARY=PATH      run the replicas from this lodestar binary instead
#                            of the tree's (A/B runs: alternate two builds,
#                            since the machine's speed drifts between
#                            sittings); the client is always the tree's
#                            lodestar-bench, so both are measured alike
#   BENCH_CLIENT=PATH      with BENCH_BINARY: this lodestar-bench, no build
#
# Needs: cargo, curl. Every step is bounded in time; every process started
# here is killed on exit. Exits non-zero when a scenario reports a problem
# (a failed write, a stream that ended, a proxy that never converged),
# after printing every scenario's figures.
set -euo pipefail

PORT=${BENCH_PORT_BASE:-19600}
ROUNDS=${BENCH_ROUNDS:-1}
LIMIT=${BENCH_TIMEOUT:-600}
MAX_LOAD=${BENCH_MAX_LOAD:-1.5}
LOAD_BUDGET=${BENCH_LOAD_WAIT:-300}

cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lodestar-xds.XXXXXX")
PIDS=()

stop_cluster() {
    local pid
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for _ in $(seq 100); do
        local alive=0
        for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    PIDS=()
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_cluster
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

SCENARIOS=(convergence fanout idle memory failover)
if [ $# -gt 0 ] && [ "$1" != all ]; then
    case $1 in
        convergence | fanout | idle | memory | failover) SCENARIOS=("$1") ;;
        *) die "unknown scenario $1 (convergence, fanout, idle, memory, failover, all)" ;;
    esac
fi
[ $# -gt 0 ] && shift

# 10000 streams and 5000 connections need descriptors (replicas and bench
# inherit this limit).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
[ "$(ulimit -n)" = unlimited ] || [ "$(ulimit -n)" -ge 12000 ] || echo "# warning: only $(ulimit -n) file descriptors allowed" >&2

# (a) build
if [ -n "${BENCH_BINARY:-}" ]; then
    if [ -z "${BENCH_CLIENT:-}" ]; then
        echo "# building lodestar-bench (release)" >&2
        timeout 3600 nice -n 10 cargo build --release --quiet --bin lodestar-bench
    fi
    # A given build, e.g. an older commit's, to compare with in one sitting
    # (one with TLS by default: `lodestar tls ca create` and the tls_* settings).
    cp "$BENCH_BINARY" "$WORK/lodestar"
else
    echo "# building lodestar and lodestar-bench (release)" >&2
    timeout 3600 nice -n 10 cargo build --release --quiet --bin lodestar --bin lodestar-bench
    cp "$ROOT/target/release/lodestar" "$WORK/lodestar"
fi
# Copies: a concurrent build must not swap a binary under the benchmark.
cp "${BENCH_CLIENT:-$ROOT/target/release/lodestar-bench}" "$WORK/lodestar-bench"
LODESTAR=$WORK/lodestar
BENCH=$WORK/lodestar-bench
# Secure by default: the cluster CA and management token (benches/lib.sh).
. "$ROOT/benches/lib.sh"
secure_cluster_files "$LODESTAR" "$WORK"
one_source_many_proxies "$LODESTAR" "$WORK/tls.toml"

three_member_addrs "$PORT"
cat "$WORK/tls.toml" - >"$WORK/replica.toml" <<'TOML'
xds_rebalance_interval_ms = 0
xds_max_stream_age_s = 0
TOML

# (b) three fresh replicas in $WORK/$1; sets PIDS and LEADER.
start_cluster() {
    local dir=$WORK/$1 n
    mkdir -p "$dir"
    for n in 1 2 3; do
        RUST_LOG=warn "$LODESTAR" server --config "$WORK/replica.toml" --id "$n" --data-dir "$dir/lodestar-$n" \
            --api-addr "${API[n - 1]}" --raft-addr "${RAFT[n - 1]}" --xds-addr "${XDS[n - 1]}" \
            "${MEMBERS[@]}" >"$dir/lodestar-$n.log" 2>&1 &
        PIDS+=($!)
    done
    for n in 1 2 3; do
        wait_ok "https://${API[n - 1]}/readyz" 60 || { tail -20 "$dir/lodestar-$n.log" >&2; die "lodestar $n not ready within 60s"; }
    done
    LEADER=$(curl -s --cacert "$WORK/ca/ca.pem" -H "Authorization: Bearer $LODESTAR_TOKEN" --max-time 2 "https://${API[0]}/v1/node" | sed -n 's/.*"leader":\([0-9]*\).*/\1/p')
}

# Wait (bounded over the whole run) until the 1-minute load is at most MAX_LOAD.
LOAD_WAITED=0
wait_load() {
    local load
    while :; do
        load=$(cut -d' ' -f1 /proc/loadavg)
        awk -v l="$load" -v m="$MAX_LOAD" 'BEGIN { exit !(l <= m) }' && break
        if [ "$LOAD_WAITED" -ge "$LOAD_BUDGET" ]; then
            echo "# load average $load still above $MAX_LOAD after ${LOAD_WAITED}s of waiting in all; running anyway" >&2
            break
        fi
        echo "# load average $load above $MAX_LOAD; waiting" >&2
        sleep 10
        LOAD_WAITED=$((LOAD_WAITED + 10))
    done
    LOAD_NOW=$load
}

# CPU of everything else on the machine, to tell whether something
# competed for it: busy jiffies of the whole machine minus the replicas'
# and this script's children's (the bench), as a share of all cores.
machine_busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
ours() {
    local sum=0 pid
    for pid in "${PIDS[@]}"; do
        [ -r "/proc/$pid/stat" ] && sum=$((sum + $(awk '{ print $14 + $15 }' "/proc/$pid/stat")))
    done
    echo $((sum + $(awk '{ print $16 + $17 }' /proc/$$/stat)))
}

FAILED=()
echo
echo "xDS push-engine benchmark: 3 replicas on 127.0.0.1, $(nproc) cores; $("$LODESTAR" --version); bench client and replicas share the machine"
for round in $(seq "$ROUNDS"); do
for scenario in "${SCENARIOS[@]}"; do
    run=$scenario-$round
    wait_load
    echo "# scenario $scenario, round $round: starting a fresh cluster" >&2
    start_cluster "$run"
    ARGS=(--scenario "$scenario")
    for n in 1 2 3; do ARGS+=(--server "https://${API[n - 1]}"); done
    if [ "$scenario" = idle ]; then
        # One replica: a follower (the leader also does the raft work).
        f=0
        [ "${LEADER:-1}" = 1 ] && f=1
        ARGS+=(--xds "${XDS[f]}" --pid "${PIDS[f]}")
    elif [ "$scenario" = failover ]; then
        # Proxies round-robin over the three; the victim: the leader, or a
        # follower (the first that is not the leader).
        v=0
        case ${BENCH_FAILOVER_KILL:-follower} in
            leader) v=$((${LEADER:-1} - 1)) ;;
            follower) [ "${LEADER:-1}" = 1 ] && v=1 ;;
            *) die "BENCH_FAILOVER_KILL: leader or follower" ;;
        esac
        for n in 1 2 3; do ARGS+=(--xds "${XDS[n - 1]}"); done
        ARGS+=(--kill "${PIDS[v]}" --kill-xds "${XDS[v]}")
        echo "# failover: killing node $((v + 1)) (${BENCH_FAILOVER_KILL:-follower}; leader is node ${LEADER:-?})" >&2
    else
        # xDS addresses: asked from the cluster.
        for n in 1 2 3; do ARGS+=(--pid "${PIDS[n - 1]}"); done
    fi
    busy0=$(machine_busy) ours0=$(ours) t0=$(date +%s%N)
    rc=0
    timeout "$LIMIT" "$BENCH" xds "${ARGS[@]}" "$@" >"$WORK/$run.out" 2>"$WORK/$run.err" || rc=$?
    secs=$(awk -v ns="$(($(date +%s%N) - t0))" 'BEGIN { printf "%.0f", ns / 1e9 }')
    other=$(awk -v b="$(($(machine_busy) - busy0))" -v o="$(($(ours) - ours0))" -v ns="$(($(date +%s%N) - t0))" -v hz="$(getconf CLK_TCK)" -v n="$(nproc)" \
        'BEGIN { x = 100 * (b - o) / (ns / 1e9 * hz * n); printf "%.0f", x < 0 ? 0 : x }')
    echo
    echo "== scenario $scenario, round $round of $ROUNDS (leader: node ${LEADER:-?}; replica pids: node 1 = ${PIDS[0]}, node 2 = ${PIDS[1]}, node 3 = ${PIDS[2]})"
    echo "script: benches/xds.sh $scenario${*:+ $*}"
    echo "1-minute load average before: $LOAD_NOW"
    cat "$WORK/$run.out"
    echo "took ${secs}s; other processes on the machine used ${other}% of it meanwhile$([ "$other" -ge 15 ] && echo ': numbers are disturbed')"
    if [ "$rc" = 124 ]; then
        echo "FAILED: lodestar-bench xds --scenario $scenario did not finish within ${LIMIT}s"
        FAILED+=("$run")
    elif [ "$rc" != 0 ]; then
        sed 's/^/stderr: /' "$WORK/$run.err"
        FAILED+=("$run")
    fi
    stop_cluster
done
done

echo
echo "== summary"
for scenario in "${SCENARIOS[@]}"; do
    for round in $(seq "$ROUNDS"); do
        grep -h '^result: ' "$WORK/$scenario-$round.out" 2>/dev/null | sed "s/^result: /result: round=$round /" || true
    done
done
[ ${#FAILED[@]} = 0 ] || die "scenarios that reported a problem: ${FAILED[*]}"
