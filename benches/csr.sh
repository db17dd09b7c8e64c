#!/usr/bin/env bash
# The mesh CA under load (issue 21): a three-replica release cluster on
# loopback (TLS on every port, ACLs on, one mesh CA directory for all),
# then `lodestar-bench csr`:
#
#   cold     N agents (default 10,000) all at once, each with its own
#            P-256 key and its own TLS connection to one replica (spread
#            over the three), a join token each: the time until all have
#            certificates, p50/p99 of their completion and of requests,
#            retries, errors. BENCH_TOKENS=per-agent (default: one
#            single-use token per agent, created through the API before the
#            clock starts) or shared (one token with N uses).
#   renew    renewal throughput and latency: BENCH_CLIENTS concurrent
#            agents renewing with their certificate, BENCH_REQUESTS in all
#            (certs/s, p50, p99), and the replicas' CPU per certificate
#            (utime+stime of the three replica processes, /proc/PID/stat,
#            around the run).
#
#   envoy    Envoy's CPU for certificate rotations over SDS: two real
#            Envoys, each fed by its own `lodestar agent` (bootstrap from
#            the agent: ADS over TLS presenting the workload certificate,
#            which Envoy takes from SDS), side by side for BENCH_ENVOY_S
#            seconds: one agent at --ttl 24h (no rotation in the window),
#            one at --ttl 2s (a rotation about every second). CPU per
#            rotation = (rotating Envoy's utime+stime - the idle one's) /
#            its sds.default.update_success count (/proc/PID/stat).
#
#   benches/csr.sh [cold|renew|envoy|all]          (default all)
#
# Environment:
#   BENCH_AGENTS=10000      cold start: agents
#   BENCH_TOKENS=per-agent  cold start: per-agent | shared
#   BENCH_IN_FLIGHT=        cold start: at most this many agents in flight
#                             (default all; each holds a connection, an fd)
#   BENCH_CLIENTS=16        renew: concurrent clients
#   BENCH_REQUESTS=3000     renew: certificates
#   BENCH_ENVOY_S=120       envoy: seconds measured
#   LODESTAR_ENVOY=PATH     envoy: the Envoy binary (default: envoy on PATH)
#   BENCH_PORT_BASE=19800   first of the loopback ports used (9 of them)
#   BENCH_PROFILE=release   cargo profile (release|debug)
#   BENCH_KEEP=1            keep the temp dir (data and logs) after the run
#   BENCH_NO_BUILD=1        use target/$PROFILE's binaries as they are
#
# Needs: cargo, curl. Every wait is bounded; every process started here is
# killed on exit.
set -euo pipefail

MODE=${1:-all}
AGENTS=${BENCH_AGENTS:-10000}
TOKENS=${BENCH_TOKENS:-per-agent}
IN_FLIGHT=${BENCH_IN_FLIGHT:-}
CLIENTS=${BENCH_CLIENTS:-16}
REQUESTS=${BENCH_REQUESTS:-3000}
PORT=${BENCH_PORT_BASE:-19800}
PROFILE=${BENCH_PROFILE:-release}
ENVOY_S=${BENCH_ENVOY_S:-120}
ENVOY=${LODESTAR_ENVOY:-$(command -v envoy || true)}

cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lodestar-csr.XXXXXX")
PIDS=()

. "$ROOT/benches/lib.sh"
cleanup_on_exit

die() { echo "error: $*" >&2; exit 1; }
case $MODE in cold | renew | envoy | all) ;; *) die "mode: cold, renew, envoy or all" ;; esac
if [ "$MODE" = envoy ] || [ "$MODE" = all ]; then
    [ -n "$ENVOY" ] && [ -x "$ENVOY" ] || die "no Envoy binary: set LODESTAR_ENVOY"
fi
case $TOKENS in per-agent | shared) ;; *) die "BENCH_TOKENS: per-agent or shared" ;; esac

# Each agent holds a connection (an fd here, one at a replica): as many as
# the hard limit allows.
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
one_source_many_proxies "$LODESTAR" "$WORK/tls.toml"
"$LODESTAR" tls ca create --mesh --dir "$WORK/mesh-ca" >/dev/null
printf 'mesh_ca_dir = "%s"\n' "$WORK/mesh-ca" >>"$WORK/tls.toml"

three_member_addrs "$PORT"
REPLICA_PIDS=()
for n in 1 2 3; do
    RUST_LOG=warn "$LODESTAR" server --config "$WORK/tls.toml" --id "$n" --data-dir "$WORK/lodestar-$n" \
        --api-addr "${API[n - 1]}" --raft-addr "${RAFT[n - 1]}" --xds-addr "${XDS[n - 1]}" "${MEMBERS[@]}" \
        >"$WORK/lodestar-$n.log" 2>&1 &
    PIDS+=($!)
    REPLICA_PIDS+=($!)
done
for n in 1 2 3; do
    ok=0
    for _ in $(seq 600); do
        curl -sf --cacert "$WORK/ca/ca.pem" --max-time 1 -o /dev/null "https://${API[n - 1]}/readyz" && { ok=1; break; }
        sleep 0.1
    done
    [ "$ok" = 1 ] || { tail -20 "$WORK/lodestar-$n.log" >&2; die "replica $n not ready within 60s"; }
done
SERVERS=$(IFS=,; echo "${XDS[*]}")
export LODESTAR_SERVER=https://${API[0]}

# A join token: `lodestar token create --workload bench/agent ...`.
token() {
    "$LODESTAR" --server "https://${API[0]}" token create --workload "${TOKEN_WORKLOAD:-bench/agent}" "$@" -o json \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["secret"])'
}

# utime+stime (clock ticks) of one process.
ticks_of() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# Sum of utime+stime (clock ticks) of the replica processes.
replica_ticks() {
    local pid total=0
    for pid in "${REPLICA_PIDS[@]}"; do
        total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat")))
    done
    echo "$total"
}
HZ=$(getconf CLK_TCK)

echo
echo "mesh CA: 3 replicas on loopback, TLS, ACLs on; $(nproc) cores (shared); $("$LODESTAR" --version) ($PROFILE); fd limit $(ulimit -n)"
echo "script: BENCH_AGENTS=$AGENTS BENCH_TOKENS=$TOKENS BENCH_IN_FLIGHT=$IN_FLIGHT BENCH_CLIENTS=$CLIENTS BENCH_REQUESTS=$REQUESTS benches/csr.sh $MODE"
echo "1-minute load average before: $(cut -d' ' -f1 /proc/loadavg)"

if [ "$MODE" = cold ] || [ "$MODE" = all ]; then
    args=(csr --cold-start --agents "$AGENTS" --xds-servers "$SERVERS" --deadline-s 240)
    [ -n "$IN_FLIGHT" ] && args+=(--max-in-flight "$IN_FLIGHT")
    if [ "$TOKENS" = per-agent ]; then
        args+=(--token-per-agent)
    else
        token --uses "$AGENTS" --ttl 1h >"$WORK/shared.token"
        args+=(--join-token-file "$WORK/shared.token")
    fi
    before=$(replica_ticks)
    timeout 600 "$BENCH" "${args[@]}" >"$WORK/cold.out" 2>"$WORK/cold.err" || { cat "$WORK/cold.out"; tail -5 "$WORK/cold.err" >&2; echo "cold start: FAILED (see above)"; }
    after=$(replica_ticks)
    cat "$WORK/cold.out"
    certs=$(sed -n 's/^result: .* certs=\([0-9]*\) .*/\1/p' "$WORK/cold.out")
    # Token creation is included in the ticks when BENCH_TOKENS=per-agent.
    echo "replica CPU during the run (3 replicas, token creation included): $(( (after - before) * 1000 / HZ )) ms for ${certs:-0} certificates"
fi

if [ "$MODE" = renew ] || [ "$MODE" = all ]; then
    token --uses 1 >"$WORK/renew.token"
    before=$(replica_ticks)
    timeout 600 "$BENCH" csr --xds-servers "$SERVERS" --join-token-file "$WORK/renew.token" --clients "$CLIENTS" --requests "$REQUESTS" \
        >"$WORK/renew.out" 2>"$WORK/renew.err" || { cat "$WORK/renew.out" "$WORK/renew.err" >&2; die "renew failed"; }
    after=$(replica_ticks)
    cat "$WORK/renew.out"
    ms=$(( (after - before) * 1000 / HZ ))
    echo "result: mode=renew replica_cpu_ms=$ms certs=$REQUESTS replica_cpu_ms_per_cert=$(python3 -c "print('%.2f' % ($ms / $REQUESTS))")"
fi

if [ "$MODE" = envoy ] || [ "$MODE" = all ]; then
    # Two agents and two Envoys: "idle" (24 h certificates) and "rotating" (2 s).
    ENVOY_PIDS=() AGENT_LOGS=()
    i=0
    for what in idle rotating; do
        i=$((i + 1))
        ttl=24h
        [ "$what" = rotating ] && ttl=2s
        TOKEN_WORKLOAD=bench/envoy-$what token --uses 1 >"$WORK/$what.token"
        ip=127.0.78.$((40 + i))
        RUST_LOG=info "$LODESTAR" --server "https://${API[0]}" agent --dir "$WORK/agent-$what" --xds-servers "$SERVERS" \
            --name "envoy-$what" --namespace bench --ip "$ip" --admin-port 15000 --join-token-file "$WORK/$what.token" \
            --ttl "$ttl" --bootstrap "$WORK/envoy-$what.yaml" >"$WORK/agent-$what.log" 2>&1 &
        PIDS+=($!)
        for _ in $(seq 300); do [ -s "$WORK/envoy-$what.yaml" ] && [ -s "$WORK/agent-$what/cert-chain.pem" ] && break; sleep 0.1; done
        [ -s "$WORK/envoy-$what.yaml" ] || { tail -20 "$WORK/agent-$what.log" >&2; die "agent $what wrote no bootstrap"; }
        "$ENVOY" -c "$WORK/envoy-$what.yaml" --use-dynamic-base-id --log-level warn --concurrency 1 >"$WORK/envoy-$what.log" 2>&1 &
        PIDS+=($!)
        ENVOY_PIDS+=($!)
    done
    for ip in 127.0.78.41 127.0.78.42; do
        ok=0
        for _ in $(seq 600); do curl -sf --max-time 1 -o /dev/null "http://$ip:15000/ready" && { ok=1; break; }; sleep 0.1; done
        [ "$ok" = 1 ] || { tail -20 "$WORK"/envoy-*.log >&2; die "Envoy at $ip not ready within 60s"; }
    done
    sds_updates() { curl -sf --max-time 5 "http://$1:15000/stats?filter=^sds.default.update_success$" | awk '{print $2}'; }
    sleep 5
    i0=$(ticks_of "${ENVOY_PIDS[0]}") r0=$(ticks_of "${ENVOY_PIDS[1]}") u0=$(sds_updates 127.0.78.42) a0=$(sds_updates 127.0.78.41)
    sleep "$ENVOY_S"
    i1=$(ticks_of "${ENVOY_PIDS[0]}") r1=$(ticks_of "${ENVOY_PIDS[1]}") u1=$(sds_updates 127.0.78.42) a1=$(sds_updates 127.0.78.41)
    updates=$((u1 - u0))
    echo "envoy (--concurrency 1, bootstrap from lodestar agent) over ${ENVOY_S}s: idle $(( (i1 - i0) * 1000 / HZ )) ms CPU ($((a1 - a0)) SDS updates), rotating $(( (r1 - r0) * 1000 / HZ )) ms CPU ($updates SDS updates)"
    [ "$updates" -gt 0 ] || die "the rotating Envoy got no SDS update"
    echo "result: mode=envoy seconds=$ENVOY_S updates=$updates idle_cpu_ms=$(( (i1 - i0) * 1000 / HZ )) rotating_cpu_ms=$(( (r1 - r0) * 1000 / HZ )) envoy_cpu_ms_per_rotation=$(python3 -c "print('%.2f' % (((($r1 - $r0) - ($i1 - $i0)) * 1000 / $HZ) / $updates))")"
fi
echo "1-minute load average after: $(cut -d' ' -f1 /proc/loadavg)"
