#!/usr/bin/env bash
# A replica's memory with a big store, before and after a restart (issue 33,
# item 11): one single-node replica, secure by default (TLS, ACLs), release
# build; N VirtualServices (~1 KiB each) applied through the CLI in files
# of 1,000; its RSS once loaded, then stopped (SIGTERM) and started again,
# its RSS when ready and 5 s later, and its peak (VmHWM).
#
#   benches/restart-rss.sh [N]                  (default 100000)
#
# Environment:
#   BENCH_CACHE_BYTES=N    store_cache_bytes for the replica (unset: the
#                          default); 1073741824 is sled's own default, as
#                          before the setting existed
#   BENCH_PORT_BASE=19600  first of the three loopback ports used
#   BENCH_KEEP=1           keep the temp dir (data and logs) after the run
#   LODESTAR_BIN=PATH      the binary (default: cargo build --release)
#
# Prints its settings and `result:` lines (key=value). Every step is
# bounded in time; the replica is killed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh

N=${1:-100000}
PORT=${BENCH_PORT_BASE:-19600}
if [ -z "${LODESTAR_BIN:-}" ]; then
    cargo build --release --quiet --bin lodestar
    LODESTAR_BIN=$PWD/target/release/lodestar
fi
WORK=$(mktemp -d /tmp/lodestar-restart-rss.XXXXXX)
PIDS=()
cleanup_on_exit

API=127.0.0.1:$PORT
{
    echo "user_client_config = \"\""
    [ -n "${BENCH_CACHE_BYTES:-}" ] && echo "store_cache_bytes = $BENCH_CACHE_BYTES"
} >"$WORK/lodestar.toml"
start() {
    "$LODESTAR_BIN" server --config "$WORK/lodestar.toml" --data-dir "$WORK/data" \
        --api-addr "$API" --raft-addr "127.0.0.1:$((PORT + 1))" --xds-addr "127.0.0.1:$((PORT + 2))" >>"$WORK/replica.log" 2>&1 &
    PIDS=($!)
    local t0=$SECONDS
    for _ in $(seq 600); do
        if [ -f "$WORK/data/tls/ca.pem" ] && curl -fsS --max-time 2 --cacert "$WORK/data/tls/ca.pem" "https://$API/readyz" >/dev/null 2>&1; then
            READY_S=$((SECONDS - t0))
            return 0
        fi
        kill -0 "${PIDS[0]}" 2>/dev/null || { echo "the replica exited; $WORK/replica.log:" >&2; tail -20 "$WORK/replica.log" >&2; return 1; }
        sleep 0.1
    done
    echo "the replica was not ready within 60 s" >&2
    return 1
}
rss_mb() { awk '/^VmRSS/ {printf "%.0f", $2 / 1024}' "/proc/${PIDS[0]}/status"; }
hwm_mb() { awk '/^VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/${PIDS[0]}/status"; }

echo "command: benches/restart-rss.sh $N (store_cache_bytes=${BENCH_CACHE_BYTES:-default}, $($LODESTAR_BIN --version))"
mkdir -p "$WORK/vs"
python3 - "$N" "$WORK/vs" <<'PY'
import json, sys
n, out = int(sys.argv[1]), sys.argv[2]
for f in range(0, n, 1000):
    with open(f"{out}/vs-{f // 1000:04d}.yaml", "w") as w:
        for i in range(f, min(f + 1000, n)):
            ns = f"team-{i % 50}"
            vs = {"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
                  "metadata": {"name": f"svc-{i}", "namespace": ns, "labels": {"app": f"svc-{i}", "team": ns}},
                  "spec": {"hosts": [f"svc-{i}.{ns}.svc.cluster.local"], "http": [
                      {"name": "canary", "match": [{"headers": {"x-canary": {"exact": "true"}}, "uri": {"prefix": "/api/v2"}}],
                       "route": [{"destination": {"host": f"svc-{i}.{ns}.svc.cluster.local", "subset": "v2", "port": {"number": 8080}}}],
                       "timeout": "5s", "retries": {"attempts": 3, "perTryTimeout": "2s", "retryOn": "5xx,reset,connect-failure"}},
                      {"name": "default", "route": [
                          {"destination": {"host": f"svc-{i}.{ns}.svc.cluster.local", "subset": "v1", "port": {"number": 8080}}, "weight": 90},
                          {"destination": {"host": f"svc-{i}.{ns}.svc.cluster.local", "subset": "v2", "port": {"number": 8080}}, "weight": 10}],
                       "timeout": "10s"}]}}
            w.write("---\n" + json.dumps(vs) + "\n")
PY

start
export LODESTAR_CONFIG=$WORK/data/client.toml
t0=$(date +%s%N)
for f in "$WORK"/vs/*.yaml; do "$LODESTAR_BIN" apply -f "$f" >/dev/null 2>>"$WORK/apply.log"; done
load_ms=$((($(date +%s%N) - t0) / 1000000))
load_s=$((load_ms / 1000)).$(printf %03d $((load_ms % 1000)))
loaded_rss=$(rss_mb)
loaded_hwm=$(hwm_mb)
disk_mb=$(du -sm "$WORK/data/db" | cut -f1)
echo "loaded $N VirtualServices in ${load_s}s: RSS ${loaded_rss} MB (peak ${loaded_hwm} MB), ${disk_mb} MB on disk"

stop_pids
start
ready_rss=$(rss_mb)
sleep 5
after_rss=$(rss_mb)
after_hwm=$(hwm_mb)
count=$(curl -fsS --cacert "$WORK/data/tls/ca.pem" -H "Authorization: Bearer $(cat "$WORK/data/management.token")" \
    "https://$API/v1/resources/virtualservices?consistency=stale" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["items"]))')
[ "$count" = "$N" ] || { echo "after the restart the replica holds $count VirtualServices, not $N" >&2; exit 1; }
echo "restarted: ready in ${READY_S}s, RSS ${ready_rss} MB when ready, ${after_rss} MB 5 s later (peak ${after_hwm} MB); all $N VirtualServices there"
echo "result: objects=$N cache_bytes=${BENCH_CACHE_BYTES:-default} load_s=$load_s loaded_rss_mb=$loaded_rss disk_mb=$disk_mb restart_ready_s=$READY_S restart_rss_mb=$after_rss restart_peak_mb=$after_hwm"
