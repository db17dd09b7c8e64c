#!/usr/bin/env bash
# What a dry run costs a real replica (issue 35): one single-node replica
# (release build, secure by default) with 1,000 services and 1,000
# simulated delta proxies connected (`lodestar-bench xds --scenario idle`:
# 10 proxy namespaces, each with a Sidecar naming 100 services, and `web`
# in 10% of them, so a change to web's VirtualService reaches 100
# proxies). While the streams are held, N previews of such a change
# (`POST /v1/apply?dryRun=true`, one at a time): each one's answer time,
# and the replica's RSS before, its peak during the previews (VmHWM, reset
# just before them through /proc/PID/clear_refs) and after.
#
#   benches/dryrun-rss.sh [N]            (default 20 previews)
#
# Environment:
#   BENCH_PORT_BASE=19600  first of the three loopback ports used
#   BENCH_WEB_PERCENT=10   share of the proxy namespaces that see web
#   BENCH_KEEP=1           keep the temp dir (data and logs) after the run
#   LODESTAR_BIN=PATH      the replica's binary (default: cargo build --release)
#   LODESTAR_BENCH_BIN=PATH lodestar-bench (default: cargo build --release)
#
# Prints `result:` lines (key=value). Every step is bounded in time; the
# replica and the bench client are killed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh

N=${1:-20}
PORT=${BENCH_PORT_BASE:-19600}
WEB_PERCENT=${BENCH_WEB_PERCENT:-10}
if [ -z "${LODESTAR_BIN:-}" ]; then
    cargo build --release --quiet --bin lodestar --bin lodestar-bench
    LODESTAR_BIN=$PWD/target/release/lodestar
elif [ -z "${LODESTAR_BENCH_BIN:-}" ]; then
    cargo build --release --quiet --bin lodestar-bench
fi
WORK=$(mktemp -d /tmp/lodestar-dryrun-rss.XXXXXX)
# Copies: a concurrent build must not swap a binary under the benchmark.
cp "$LODESTAR_BIN" "$WORK/lodestar"
cp "${LODESTAR_BENCH_BIN:-target/release/lodestar-bench}" "$WORK/lodestar-bench"
PIDS=()
cleanup_on_exit
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

API=127.0.0.1:$PORT
XDS=127.0.0.1:$((PORT + 2))
secure_cluster_files "$WORK/lodestar" "$WORK"
one_source_many_proxies "$WORK/lodestar" "$WORK/tls.toml"
printf 'xds_rebalance_interval_ms = 0\nxds_max_stream_age_s = 0\n' >>"$WORK/tls.toml"
RUST_LOG=warn "$WORK/lodestar" server --config "$WORK/tls.toml" --id 1 --data-dir "$WORK/data" \
    --api-addr "$API" --raft-addr "127.0.0.1:$((PORT + 1))" --xds-addr "$XDS" \
    --initial-member "1=127.0.0.1:$((PORT + 1)),$API,$XDS" >"$WORK/replica.log" 2>&1 &
PIDS+=($!)
REPLICA=${PIDS[0]}
curl_api() { curl -sS --max-time 30 --cacert "$LODESTAR_CACERT" -H "Authorization: Bearer $LODESTAR_TOKEN" "$@"; }
for _ in $(seq 600); do
    [ "$(curl -s --cacert "$LODESTAR_CACERT" -o /dev/null -w '%{http_code}' --max-time 1 "https://$API/readyz" || true)" = 200 ] && break
    kill -0 "$REPLICA" 2>/dev/null || { tail -20 "$WORK/replica.log" >&2; echo "the replica exited" >&2; exit 1; }
    sleep 0.1
done
kib() { awk -v k="$1" '$1 == k":" {print $2}' "/proc/$REPLICA/status"; }

# The proxies: held for long enough to preview N times (bounded: 600 s).
"$WORK/lodestar-bench" --server "https://$API" xds --scenario idle --xds "$XDS" --pid "$REPLICA" \
    --proxies 1000 --services 1000 --namespaces 10 --sidecar-hosts 100 --web-percent "$WEB_PERCENT" --hold 600 \
    >"$WORK/bench.out" 2>"$WORK/bench.err" &
PIDS+=($!)
wait_proxies_connected "$API" "$LODESTAR_CACERT" 1000 "${PIDS[1]}" "$WORK/bench.out" "$WORK/bench.err" || exit 1
# Every stream has its initial config: the replica is quiet (under 10% of
# a core over 2 s; at most 120 s).
ticks() { awk '{print $14 + $15}' "/proc/$REPLICA/stat"; }
hz=$(getconf CLK_TCK)
for _ in $(seq 60); do
    t0=$(ticks)
    sleep 2
    [ $(($(ticks) - t0)) -le $((hz / 5)) ] && break
done

web='{"resources": [{"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
  "metadata": {"name": "web", "namespace": "xdsbench", "labels": {"bench.lodestar.io/xds": "true"}},
  "spec": {"hosts": ["web.xdsbench.svc.cluster.local"], "http": [{"route": [{"destination": {"host": "web.xdsbench.svc.cluster.local", "port": {"number": 8080}}}],
   "headers": {"response": {"set": {"x-lodestar-bench-mark": "dry-run"}}}}]}}]}'
rss_before=$(kib VmRSS)
echo 5 >"/proc/$REPLICA/clear_refs"
times=()
for i in $(seq "$N"); do
    out=$(curl_api -o "$WORK/preview.json" -w '%{http_code} %{time_total}' -X POST -H 'content-type: application/json' \
        --data "$web" "https://$API/v1/apply?dryRun=true")
    [ "${out%% *}" = 200 ] || { cat "$WORK/preview.json" >&2; echo "preview $i: HTTP ${out%% *}" >&2; exit 1; }
    times+=("${out##* }")
done
rss_hwm=$(kib VmHWM)
rss_after=$(kib VmRSS)
read -r changed unchanged < <(python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["proxies"]; print(len(p["changed"]), p["unchanged"])' "$WORK/preview.json")
read -r p50 p99 max < <(printf '%s\n' "${times[@]}" | sort -n | awk '{t[NR] = $1 * 1000} END {
    i50 = int(NR * 0.5 + 0.999); i99 = int(NR * 0.99 + 0.999); printf "%.1f %.1f %.1f\n", t[i50], t[i99], t[NR]}')
echo "command: benches/dryrun-rss.sh $N ($("$WORK/lodestar" --version)); 1,000 proxies on one replica, web in ${WEB_PERCENT}% of their namespaces"
echo "each preview: $changed proxies change, $unchanged unchanged"
echo "answer time (curl, $N previews one at a time): p50 ${p50} ms, p99 ${p99} ms, max ${max} ms"
echo "replica RSS: ${rss_before} KiB before, peak ${rss_hwm} KiB during the previews (+$((rss_hwm - rss_before)) KiB), ${rss_after} KiB after"
echo "result: previews=$N changed=$changed unchanged=$unchanged p50_ms=$p50 p99_ms=$p99 max_ms=$max rss_before_kib=$rss_before rss_peak_kib=$rss_hwm extra_peak_kib=$((rss_hwm - rss_before)) rss_after_kib=$rss_after"
