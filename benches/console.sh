#!/usr/bin/env bash
# The web console with many resources (issue 36's "Measure"): one release
# replica on loopback (TLS, ACLs on), BENCH_RESOURCES VirtualServices over
# 50 namespaces and BENCH_INSTANCES instances of BENCH_SERVICES registry
# services, then Debian's headless Chromium (playwright-core, as the
# browser test installs it) times, ROUNDS times each:
#   first-paint   the sign-in page's first contentful paint
#   overview      Enter on the sign-in form -> the Overview's members table
#   config-list   navigation -> the VirtualService list's table (every one)
#   services      navigation -> the Services view with its topology table
#   api-*         the REST calls behind those views, alone (analyze is the
#                 Overview's slowest)
# then the replica's CPU while 10 consoles sit open on the Overview, live
# and idle, for 10 s, and with none (percent of one core),
#   proxies       navigation -> the Proxies view's table (every proxy)
# and prints one `result:` line per figure (median and max, ms), and the
# bundle's gzipped size. BENCH_PROXIES simulated proxies (delta xDS streams
# from `lodestar-bench xds --scenario idle`, with its own 100 services) stay
# connected to the replica throughout, so the Overview and the Proxies view
# list them.
#
# Environment:
#   BENCH_PORT_BASE=19950   first of the 3 loopback ports used
#   BENCH_RESOURCES=10000   VirtualServices
#   BENCH_SERVICES=200      registry services (BENCH_INSTANCES spread over them)
#   BENCH_INSTANCES=2000
#   BENCH_PROXIES=5000      simulated proxies (0: none)
#   BENCH_ROUNDS=5
#   BENCH_PROFILE=release   cargo profile (release|debug)
#   BENCH_NO_BUILD=1        use target/$PROFILE's binary as it is
#   LODESTAR_BIN, LODESTAR_BENCH_BIN  given binaries instead (no build)
#   LODESTAR_CONSOLE_NODE   playwright-core's node_modules (default: what
#                           tests/support/install-console.sh installs)
set -euo pipefail
PORT=${BENCH_PORT_BASE:-19950}
RESOURCES=${BENCH_RESOURCES:-10000}
SERVICES=${BENCH_SERVICES:-200}
INSTANCES=${BENCH_INSTANCES:-2000}
ROUNDS=${BENCH_ROUNDS:-5}
PROFILE=${BENCH_PROFILE:-release}
PROXIES=${BENCH_PROXIES:-5000}

cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lodestar-console.XXXXXX")
PIDS=()
. "$ROOT/benches/lib.sh"
cleanup_on_exit
die() { echo "error: $*" >&2; exit 1; }

NODE_MODULES=${LODESTAR_CONSOLE_NODE:-$("$ROOT/tests/support/install-console.sh")}
case $PROFILE in
    release) FLAG=(--release) ;;
    debug) FLAG=() ;;
    *) die "BENCH_PROFILE: release or debug" ;;
esac
if [ "${BENCH_NO_BUILD:-0}" != 1 ] && [ -z "${LODESTAR_BIN:-}" ]; then
    echo "# building lodestar ($PROFILE)" >&2
    timeout 3600 nice -n 10 cargo build "${FLAG[@]}" --locked --quiet --bin lodestar --bin lodestar-bench
fi
cp "${LODESTAR_BIN:-$ROOT/target/$PROFILE/lodestar}" "$WORK/lodestar"
cp "${LODESTAR_BENCH_BIN:-$ROOT/target/$PROFILE/lodestar-bench}" "$WORK/lodestar-bench"
secure_cluster_files "$WORK/lodestar" "$WORK"
one_source_many_proxies "$WORK/lodestar" "$WORK/tls.toml"
API=127.0.0.1:$PORT RAFT=127.0.0.1:$((PORT + 1)) XDS=127.0.0.1:$((PORT + 2))
RUST_LOG=warn "$WORK/lodestar" server --config "$WORK/tls.toml" --id 1 --data-dir "$WORK/lodestar-1" \
    --api-addr "$API" --raft-addr "$RAFT" --xds-addr "$XDS" --initial-member "1=$RAFT,$API,$XDS" \
    >"$WORK/lodestar-1.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 600); do
    curl -sf --cacert "$WORK/ca/ca.pem" --max-time 1 "https://$API/readyz" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -sf --cacert "$WORK/ca/ca.pem" --max-time 1 "https://$API/readyz" >/dev/null || die "the replica is not ready"

# The mesh, applied 500 objects a write.
echo "# applying $RESOURCES VirtualServices, $SERVICES services, $INSTANCES instances" >&2
python3 - "$RESOURCES" "$SERVICES" "$INSTANCES" "$WORK/batches" <<'PY'
import json, os, sys
vs, services, instances, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
objs = []
for i in range(services):
    ns = f"ns{i % 50}"
    objs.append({"apiVersion": "registry.lodestar.io/v1", "kind": "Service", "metadata": {"name": f"svc{i}", "namespace": ns},
                 "spec": {"ports": [{"name": "http", "number": 8000 + i % 100}]}})
for i in range(instances):
    s = i % services
    objs.append({"apiVersion": "registry.lodestar.io/v1", "kind": "Instance", "metadata": {"name": f"i{i}", "namespace": f"ns{s % 50}", "labels": {"app": f"svc{s}"}},
                 "spec": {"service": f"svc{s}", "address": f"127.1.{i // 250}.{i % 250 + 1}", "port": 8000 + s % 100, "serviceAccount": f"svc{s}"}})
for i in range(vs):
    s = i % services
    objs.append({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService", "metadata": {"name": f"vs{i}", "namespace": f"ns{s % 50}"},
                 "spec": {"hosts": [f"h{i}.example.com"], "http": [{"route": [{"destination": {"host": f"svc{s}.ns{s % 50}.svc.cluster.local"}}]}]}})
os.makedirs(out)
for n in range(0, len(objs), 500):
    with open(f"{out}/{n // 500:05d}.json", "w") as f:
        json.dump({"resources": objs[n:n + 500]}, f)
PY
for f in "$WORK"/batches/*.json; do
    curl -sS --fail-with-body --cacert "$WORK/ca/ca.pem" -H "Authorization: Bearer $LODESTAR_TOKEN" -H 'content-type: application/json' \
        --max-time 60 --data-binary @"$f" "https://$API/v1/apply" >/dev/null || die "applying $f"
done

if [ "$PROXIES" -gt 0 ]; then
    echo "# connecting $PROXIES simulated proxies" >&2
    ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
    "$WORK/lodestar-bench" --server "https://$API" xds --scenario idle --xds "$XDS" --pid "${PIDS[0]}" \
        --proxies "$PROXIES" --services 100 --namespaces 10 --hold 600 >"$WORK/bench.out" 2>"$WORK/bench.err" &
    PIDS+=($!)
    wait_proxies_connected "$API" "$WORK/ca/ca.pem" "$PROXIES" "${PIDS[1]}" "$WORK/bench.out" "$WORK/bench.err" || exit 1
fi

echo "# bundle: $(gzip -9 -c "$ROOT/ui/dist/app.js" | wc -c) bytes of gzipped JavaScript, $(gzip -9 -c "$ROOT/ui/dist/app.css" | wc -c) of CSS" >&2
NODE_PATH=$NODE_MODULES CONSOLE_PID=${PIDS[0]} CONSOLE_URL="https://$API/ui/" CONSOLE_TOKEN=$LODESTAR_TOKEN CONSOLE_ROUNDS=$ROUNDS CONSOLE_VS=$RESOURCES CONSOLE_PROXIES=$PROXIES \
    timeout 600 node "$ROOT/benches/console/timing.cjs"
echo "result: bundle-gzip-bytes=$(gzip -9 -c "$ROOT/ui/dist/app.js" | wc -c)"
