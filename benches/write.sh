#!/usr/bin/env bash
# Write benchmark: Lodestar vs etcd, each a three-node cluster on loopback,
# same machine, same client (`lodestar-bench write`), same concurrency, same
# ~1 KiB values. Every write is checked acknowledged (Lodestar: a revision
# and a change; etcd: a revision in the Put response header).
#
#   benches/write.sh [SECONDS_PER_LEVEL]          (default 10)
#
# Environment:
#   BENCH_ROUNDS=2         rounds; each round runs every level on Lodestar,
#                          then on etcd (L/E/L/E...), since runs drift 20-30%
#   BENCH_CLIENTS="1 16 64" concurrency levels
#   BENCH_SIZE=1024        value size in bytes
#   BENCH_API=grpc         Lodestar client API: grpc | rest
#   BENCH_PORT_BASE=19400  first of the loopback ports used (15 of them)
#   BENCH_KEEP=1           keep the temp dir (data and logs) after the run
#
# Needs: cargo, curl, and etcd (Debian's etcd-server; installed with apt-get
# when missing and running as root). Every step is bounded in time; every
# process started here is killed on exit.
set -euo pipefail

SECS=${1:-${BENCH_SECONDS:-10}}
ROUNDS=${BENCH_ROUNDS:-2}
LEVELS=${BENCH_CLIENTS:-"1 16 64"}
SIZE=${BENCH_SIZE:-1024}
API=${BENCH_API:-grpc}
PORT=${BENCH_PORT_BASE:-19400}

cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lodestar-bench.XXXXXX")
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
    # Reap them here, quietly: bash would otherwise report each one killed.
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
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
# Secure by default: one cluster CA for the three replicas (each issues its
# own certificate from it), trusted by curl and by lodestar-bench.
"$LODESTAR" tls ca create --dir "$WORK/ca" >/dev/null
printf 'tls_ca_file = "%s"\ntls_ca_key_file = "%s"\nuser_client_config = ""\n' "$WORK/ca/ca.pem" "$WORK/ca/ca-key.pem" >>"$WORK/tls.toml"
export LODESTAR_CACERT=$WORK/ca/ca.pem
# ACLs are on by default: one management token for the replicas, sent by
# curl and by lodestar-bench (LODESTAR_TOKEN).
(umask 077; od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$WORK/ca/management.token")
printf 'initial_management_token_file = "%s"\n' "$WORK/ca/management.token" >>"$WORK/tls.toml"
LODESTAR_TOKEN=$(cat "$WORK/ca/management.token")
export LODESTAR_TOKEN

if ! command -v etcd >/dev/null; then
    [ "$(id -u)" = 0 ] || die "etcd not found; install Debian's etcd-server"
    echo "# installing etcd-server" >&2
    timeout 600 apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq etcd-server >&2
fi
ETCD_VERSION=$(etcd --version 2>/dev/null | sed -n 1p)

# (b) three Lodestar replicas
L_API=() L_RAFT=() L_XDS=()
for n in 1 2 3; do
    L_API+=("127.0.0.1:$((PORT + n * 3 - 3))")
    L_RAFT+=("127.0.0.1:$((PORT + n * 3 - 2))")
    L_XDS+=("127.0.0.1:$((PORT + n * 3 - 1))")
done
MEMBERS=()
for n in 1 2 3; do
    MEMBERS+=(--initial-member "$n=${L_RAFT[n - 1]},${L_API[n - 1]},${L_XDS[n - 1]}")
done
for n in 1 2 3; do
    RUST_LOG=warn "$LODESTAR" server --config "$WORK/tls.toml" --id "$n" --data-dir "$WORK/lodestar-$n" \
        --api-addr "${L_API[n - 1]}" --raft-addr "${L_RAFT[n - 1]}" --xds-addr "${L_XDS[n - 1]}" \
        "${MEMBERS[@]}" >"$WORK/lodestar-$n.log" 2>&1 &
    PIDS+=($!)
done

# (c) three etcd members
E_CLIENT=() E_PEER=()
for n in 1 2 3; do
    E_CLIENT+=("http://127.0.0.1:$((PORT + 9 + n * 2 - 2))")
    E_PEER+=("http://127.0.0.1:$((PORT + 9 + n * 2 - 1))")
done
CLUSTER="e1=${E_PEER[0]},e2=${E_PEER[1]},e3=${E_PEER[2]}"
for n in 1 2 3; do
    etcd --name "e$n" --data-dir "$WORK/etcd-$n" \
        --listen-client-urls "${E_CLIENT[n - 1]}" --advertise-client-urls "${E_CLIENT[n - 1]}" \
        --listen-peer-urls "${E_PEER[n - 1]}" --initial-advertise-peer-urls "${E_PEER[n - 1]}" \
        --initial-cluster "$CLUSTER" --initial-cluster-token lodestar-bench --initial-cluster-state new \
        --logger zap --log-level warn >"$WORK/etcd-$n.log" 2>&1 &
    PIDS+=($!)
done

for n in 1 2 3; do
    wait_ok "https://${L_API[n - 1]}/readyz" 60 || { tail -20 "$WORK/lodestar-$n.log" >&2; die "lodestar $n not ready within 60s"; }
    wait_ok "${E_CLIENT[n - 1]}/health" 60 || { tail -20 "$WORK/etcd-$n.log" >&2; die "etcd $n not healthy within 60s"; }
done
echo "# both clusters ready; $ROUNDS rounds x {$LEVELS} clients x ${SECS}s, lodestar and etcd alternating" >&2

# Which replica leads matters for one client: it talks to the first one
# listed, and pays the hop to the leader when that is a follower. Both
# systems list their leader first, so a single client writes to the leader
# on both (clients are spread round robin, so 16 and 64 are unaffected).
L_LEADER=$(curl -s --cacert "$WORK/ca/ca.pem" -H "Authorization: Bearer $LODESTAR_TOKEN" --max-time 2 "https://${L_API[0]}/v1/node" | sed -n 's/.*"leader":\([0-9]*\).*/\1/p')
E_LEADER=
for n in 1 2 3; do
    st=$(curl -s --max-time 2 -X POST -d '{}' "${E_CLIENT[n - 1]}/v3/maintenance/status" || true)
    me=$(echo "$st" | sed -n 's/.*"member_id":"\([0-9]*\)".*/\1/p')
    lead=$(echo "$st" | sed -n 's/.*"leader":"\([0-9]*\)".*/\1/p')
    [ -n "$me" ] && [ "$me" = "$lead" ] && E_LEADER=$n
done

# The list with member $1 (1-based, may be empty) first.
leader_first() {
    local first=$1 i
    shift
    local all=("$@")
    [ -n "$first" ] && printf '%s,' "${all[first - 1]}"
    for i in "${!all[@]}"; do [ "$((i + 1))" = "$first" ] || printf '%s,' "${all[i]}"; done
}
L_SERVERS=$(leader_first "$L_LEADER" "${L_API[@]/#/https://}")
E_SERVERS=$(leader_first "$E_LEADER" "${E_CLIENT[@]}")

# (d) alternate: every level on Lodestar then etcd, round after round.
# Rows: target round clients writes writes/s p50 p99 max errors other_cpu%
RESULTS=$WORK/results.tsv
: >"$RESULTS"

# CPU accounting, to tell whether something else competed for the machine:
# busy jiffies of the whole machine, minus those of both clusters and of
# this script's children (the bench client), as a share of all cores. Kernel
# threads count as "other": etcd's fdatasyncs alone show as 5-10% (journal
# commits), so only 15% and more is flagged.
machine_busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
ours() {
    local sum=0 pid
    for pid in "${PIDS[@]}"; do
        [ -r "/proc/$pid/stat" ] && sum=$((sum + $(awk '{ print $14 + $15 }' "/proc/$pid/stat")))
    done
    echo $((sum + $(awk '{ print $16 + $17 }' /proc/$$/stat)))
}
TICKS=$(getconf CLK_TCK)
CORES=$(nproc)

bench() {
    local target=$1 servers=$2 round=$3 clients=$4 out busy0 ours0 t0 other
    busy0=$(machine_busy) ours0=$(ours) t0=$(date +%s%N)
    out=$(timeout $((SECS + 120)) "$BENCH" write --target "$target" --api "$API" --servers "${servers%,}" \
        --clients "$clients" --seconds "$SECS" --size "$SIZE" 2>"$WORK/bench-$target.err") || {
        cat "$WORK/bench-$target.err" >&2
        echo "$out" >&2
        die "bench against $target failed (round $round, $clients clients)"
    }
    other=$(awk -v b="$(($(machine_busy) - busy0))" -v o="$(($(ours) - ours0))" -v ns="$(($(date +%s%N) - t0))" -v hz="$TICKS" -v n="$CORES" \
        'BEGIN { x = 100 * (b - o) / (ns / 1e9 * hz * n); printf "%.0f", x < 0 ? 0 : x }')
    echo "$out" | awk -v t="$target" -v r="$round" -v x="$other" '$1 ~ /^[0-9]+$/ { print t, r, $1, $2, $3, $4, $5, $6, $7, x }' >>"$RESULTS"
    echo "$out" | awk -v t="$target" -v r="$round" -v x="$other" '$1 ~ /^[0-9]+$/ {
        printf "#   round %s %-8s %3s clients: %7s writes/s  p50 %6s ms  p99 %6s ms  errors %s  other load %s%%\n", r, t, $1, $3, $4, $5, $7, x }' >&2
}
for round in $(seq "$ROUNDS"); do
    for c in $LEVELS; do
        bench lodestar "$L_SERVERS" "$round" "$c"
        bench etcd "$E_SERVERS" "$round" "$c"
    done
done

# (e) tables and ratios
echo
echo "Write benchmark: 3 replicas on loopback, ${SIZE}-byte values, ${SECS}s per level, $ROUNDS rounds alternating; $(nproc) cores"
echo "lodestar: $("$LODESTAR" --version), api=$API;  etcd: $ETCD_VERSION, KV.Put over gRPC"
echo "leaders at the start: lodestar node ${L_LEADER:-?}, etcd member ${E_LEADER:-?} (a single client talks to the leader on both)"
echo "(writes/s: mean over rounds [per round]; p50/p99: mean over rounds; errors: total;"
echo " other%: most CPU, as a share of the machine, that processes outside the benchmark used during a run)"
for target in lodestar etcd; do
    echo
    echo "== $target"
    awk -v t="$target" -v levels="$LEVELS" '
        $1 == t { k = $3; n[k]++; w[k] += $4; ws[k] += $5; p50[k] += $6; p99[k] += $7; e[k] += $9; if ($10 > o[k]) o[k] = $10
                  per[k] = per[k] (per[k] == "" ? "" : " ") sprintf("%.0f", $5) }
        END {
            printf "%8s %9s %10s %9s %9s %7s %7s  %s\n", "clients", "writes", "writes/s", "p50_ms", "p99_ms", "errors", "other%", "per-round writes/s"
            split(levels, L, " ")
            for (i = 1; i in L; i++) { k = L[i]; if (n[k]) printf "%8s %9d %10.0f %9.2f %9.2f %7d %7d  [%s]\n", k, w[k], ws[k] / n[k], p50[k] / n[k], p99[k] / n[k], e[k], o[k], per[k] }
        }' "$RESULTS"
done
HI=$(echo "$LEVELS" | awk '{ print $NF }')
LO=$(echo "$LEVELS" | awk '{ print $1 }')
echo
awk -v hi="$HI" -v lo="$LO" '
    $3 == hi { ws[$1] += $5; n[$1]++; if ($1 == "lodestar") lw[$2] = $5; else ew[$2] = $5 }
    $3 == lo { p[$1] += $6; m[$1]++; if ($1 == "lodestar") lp[$2] = $6; else ep[$2] = $6 }
    $9 > 0 { errors += $9 }
    $10 > maxother { maxother = $10 }
    END {
        if (n["lodestar"] && n["etcd"] && ws["etcd"] > 0) {
            r = (ws["lodestar"] / n["lodestar"]) / (ws["etcd"] / n["etcd"])
            pr = ""; for (k in lw) if (ew[k] > 0) pr = pr sprintf(" %.2f", lw[k] / ew[k])
            printf "writes/s at %s clients, lodestar/etcd: %.2fx  (per round:%s)  target >= 1.5x: %s\n", hi, r, pr, (r >= 1.5 ? "MET" : "NOT MET")
        }
        if (m["lodestar"] && m["etcd"] && p["etcd"] > 0) {
            a = p["lodestar"] / m["lodestar"]; b = p["etcd"] / m["etcd"]
            printf "p50 at %s client(s): lodestar %.2f ms, etcd %.2f ms, lodestar/etcd %.2fx  target <= 1.0x: %s\n", lo, a, b, a / b, (a <= b ? "MET" : "NOT MET")
        }
        if (maxother >= 15) printf "WARNING: other processes used up to %d%% of the machine during a run: numbers are disturbed\n", maxother
        if (errors > 0) { printf "UNACKNOWLEDGED WRITES: %d\n", errors; exit 1 }
    }' "$RESULTS"
