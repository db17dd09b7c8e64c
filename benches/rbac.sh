#!/usr/bin/env bash
# Envoy request latency with and without a 50-rule RBAC filter, in the same
# sitting (issue 22; a report, no target). One replica, one Envoy
# (`lodestar bootstrap`) whose Sidecar has an HTTP ingress port forwarding to
# a trivial keep-alive HTTP/1.1 upstream (Python, on 127.0.0.1), and
# `lodestar-bench http` sending requests through the Envoy. Rounds alternate:
#
#   A  no AuthorizationPolicy (no RBAC filter on the inbound listener)
#   B  one ALLOW AuthorizationPolicy with 50 rules (paths, methods, headers,
#      ipBlocks, varied); only the last rule matches the benchmark's
#      requests, so every request is allowed after the others are evaluated
#
# After each switch the script waits until the replica reports the proxy
# in sync at the write's revision (`/debug/syncz`, LDS ACKed) and until a
# probe request gets what the round expects (B: a request without the
# matching header is denied, 403; A: it is allowed), then runs the load.
# Prints p50/p99 per round and, per pair, the B/A ratio; and the medians.
#
#   benches/rbac.sh                       5 pairs of 5000 requests, 1 connection
#   BENCH_REQUESTS=500 BENCH_ROUNDS=2 benches/rbac.sh
#
# Environment:
#   BENCH_REQUESTS=5000     requests per round
#   BENCH_CONCURRENCY=1     keep-alive connections (workers); 1: latency
#                             without queueing behind other requests
#   BENCH_ROUNDS=5          A/B pairs
#   BENCH_PORT_BASE=19700   first of the loopback ports used (API, raft,
#                             xDS, upstream); Envoy listens on 127.0.77.41
#                             (8000, admin 15000)
#   BENCH_PROFILE=release   cargo profile of both binaries (release|debug)
#   BENCH_KEEP=1            keep the temp dir (data and logs) after the run
#   LODESTAR_ENVOY=PATH     the Envoy binary (default: envoy on PATH)
#
# Needs: cargo, curl, python3, envoy. Every wait is bounded; every process
# started here is killed on exit.
set -euo pipefail

PORT=${BENCH_PORT_BASE:-19700}
REQUESTS=${BENCH_REQUESTS:-5000}
CONC=${BENCH_CONCURRENCY:-1}
ROUNDS=${BENCH_ROUNDS:-5}
PROFILE=${BENCH_PROFILE:-release}
ENVOY=${LODESTAR_ENVOY:-$(command -v envoy || true)}
PROXY_IP=127.0.77.41

cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lodestar-rbac.XXXXXX")
PIDS=()

. "$ROOT/benches/lib.sh"
cleanup_on_exit

die() { echo "error: $*" >&2; exit 1; }
[ -n "$ENVOY" ] && [ -x "$ENVOY" ] || die "no Envoy binary: set LODESTAR_ENVOY"

# (a) build (copies: a concurrent build must not swap a binary under us)
case $PROFILE in
    release) FLAG=(--release) ;;
    debug) FLAG=() ;;
    *) die "BENCH_PROFILE: release or debug" ;;
esac
echo "# building lodestar and lodestar-bench ($PROFILE)" >&2
timeout 3600 nice -n 10 cargo build "${FLAG[@]}" --quiet --bin lodestar --bin lodestar-bench
cp "$ROOT/target/$PROFILE/lodestar" "$WORK/lodestar"
cp "$ROOT/target/$PROFILE/lodestar-bench" "$WORK/lodestar-bench"
LODESTAR=$WORK/lodestar
BENCH=$WORK/lodestar-bench
secure_cluster_files "$LODESTAR" "$WORK"

API=127.0.0.1:$PORT RAFT=127.0.0.1:$((PORT + 1)) XDS=127.0.0.1:$((PORT + 2)) APP_PORT=$((PORT + 3))
ADMIN=http://$PROXY_IP:15000
NODE_ID=sidecar~$PROXY_IP~web.default~default.svc.cluster.local

curl_api() { curl -sS --cacert "$WORK/ca/ca.pem" -H "Authorization: Bearer $LODESTAR_TOKEN" --max-time 10 "$@"; }

# Poll until `$@` (a command) succeeds, at most LIMIT seconds.
wait_for() {
    local limit=$1 what=$2 i
    shift 2
    for i in $(seq $((limit * 10))); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    die "$what: not within ${limit}s"
}

# (b) the upstream: HTTP/1.1 keep-alive, 200 and a short body for any GET.
cat >"$WORK/app.py" <<'PY'
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body are separate writes: without this, Nagle and the
    # peer's delayed ACK add ~40 ms to every response.
    disable_nagle_algorithm = True
    def do_GET(self):
        body = b"ok\n"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
python3 "$WORK/app.py" "$APP_PORT" >"$WORK/app.log" 2>&1 &
PIDS+=($!)

# (c) one replica
RUST_LOG=warn "$LODESTAR" server --config "$WORK/tls.toml" --id 1 --data-dir "$WORK/lodestar-1" \
    --api-addr "$API" --raft-addr "$RAFT" --xds-addr "$XDS" --initial-member "1=$RAFT,$API,$XDS" \
    >"$WORK/lodestar-1.log" 2>&1 &
PIDS+=($!)
wait_for 60 "lodestar ready" curl -sf --cacert "$WORK/ca/ca.pem" --max-time 1 "https://$API/readyz"
wait_for 10 "upstream ready" curl -sf --max-time 1 "http://127.0.0.1:$APP_PORT/"

apply() { curl_api -X POST -H 'content-type: application/yaml' --data-binary @"$1" "https://$API/v1/apply" | python3 -c 'import json,sys; print(json.load(sys.stdin)["revision"])'; }

# (d) the workload's Sidecar, and its Envoy
cat >"$WORK/sidecar.yaml" <<YAML
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: web, namespace: default}
spec:
  workloadSelector: {labels: {app: web}}
  ingress:
  - port: {number: 8000, protocol: HTTP, name: http}
    defaultEndpoint: 127.0.0.1:$APP_PORT
YAML
REV=$(apply "$WORK/sidecar.yaml")
"$LODESTAR" bootstrap --server "https://$API" --xds-servers "$XDS" --proxy-token-file "$WORK/ca/management.token" \
    --name web --namespace default --ip "$PROXY_IP" --node-type sidecar --admin-port 15000 --label app=web \
    >"$WORK/bootstrap.yaml"
"$ENVOY" -c "$WORK/bootstrap.yaml" --use-dynamic-base-id --log-level warn --drain-time-s 1 --parent-shutdown-time-s 2 \
    >"$WORK/envoy.log" 2>&1 &
PIDS+=($!)
wait_for 60 "envoy ready" curl -sf --max-time 1 "$ADMIN/ready"

# Until the replica reports the proxy ACKed LDS at revision $1 or newer.
synced() {
    curl_api "https://$API/debug/syncz" | python3 -c '
import json, sys
rev, node = int(sys.argv[1]), sys.argv[2]
for p in json.load(sys.stdin)["proxies"]:
    if p["id"] != node:
        continue
    t = p["types"].get("LDS", {})
    assert t.get("last_nack") is None, "LDS NACKed: %s" % t["last_nack"]
    v = t.get("acked_version")
    sys.exit(0 if t.get("in_sync") and v is not None and int(v) >= rev else 1)
sys.exit(1)' "$1" "$NODE_ID"
}
URL=http://$PROXY_IP:8000/bench/item
HOST=web.default.svc.cluster.local
# Status of a probe without the header the last rule needs.
probe_is() { [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 -H "host: $HOST" "$URL")" = "$1" ]; }
wait_for 60 "proxy in sync at revision $REV" synced "$REV"
wait_for 30 "first request through the Envoy" probe_is 200

# (e) the policy: 49 rules that do not match the benchmark's requests, then
# one that does (ipBlocks, method, path and header).
{
    printf 'apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: bench-50, namespace: default}\n'
    printf 'spec:\n  selector: {matchLabels: {app: web}}\n  action: ALLOW\n  rules:\n'
    for i in $(seq 1 49); do
        case $((i % 4)) in
            0) printf '  - to: [{operation: {methods: [POST], paths: ["/api/v%d/*", "/admin/%d"]}}]\n' "$i" "$i" ;;
            1) printf '  - to: [{operation: {paths: ["/tenant/%d/*"]}}]\n    when: [{key: "request.headers[x-tenant]", values: ["tenant-%d"]}]\n' "$i" "$i" ;;
            2) printf '  - from: [{source: {ipBlocks: ["10.%d.0.0/16", "192.168.%d.0/24"]}}]\n' "$i" "$i" ;;
            3) printf '  - to: [{operation: {methods: [PUT, DELETE], paths: ["*.v%d", "/static/%d/*"]}}]\n' "$i" "$i" ;;
        esac
    done
    printf '  - from: [{source: {ipBlocks: ["127.0.0.0/8"]}}]\n    to: [{operation: {methods: [GET], paths: ["/bench/*"]}}]\n'
    printf '    when: [{key: "request.headers[x-bench]", values: ["yes"]}]\n'
} >"$WORK/policy.yaml"
[ "$(grep -c '^  - ' "$WORK/policy.yaml")" = 50 ] || die "the policy does not have 50 rules"

set_mode() {
    local rev
    if [ "$1" = B ]; then
        rev=$(apply "$WORK/policy.yaml")
        wait_for 60 "proxy in sync at revision $rev" synced "$rev"
        wait_for 30 "RBAC in force" probe_is 403
    else
        rev=$(curl_api -X DELETE "https://$API/v1/resources/authorizationpolicies/default/bench-50" | python3 -c 'import json,sys; print(json.load(sys.stdin)["revision"])')
        wait_for 60 "proxy in sync at revision $rev" synced "$rev"
        wait_for 30 "RBAC gone" probe_is 200
    fi
}

echo
echo "RBAC latency: 1 replica, 1 Envoy ($("$ENVOY" --version 2>/dev/null | sed -n 's/.*version: \([^ ]*\).*/\1/p')), upstream python3 on 127.0.0.1; $(nproc) cores; $("$LODESTAR" --version) ($PROFILE)"
echo "script: BENCH_REQUESTS=$REQUESTS BENCH_CONCURRENCY=$CONC BENCH_ROUNDS=$ROUNDS BENCH_PROFILE=$PROFILE benches/rbac.sh"
echo "1-minute load average before: $(cut -d' ' -f1 /proc/loadavg)"
RESULTS=()
for round in $(seq "$ROUNDS"); do
    for mode in A B; do
        # Round 1's A runs on the fresh proxy, which has no policy yet.
        if [ "$mode" = B ] || [ "$round" -gt 1 ]; then set_mode "$mode"; fi
        out=$WORK/$mode-$round.out
        "$BENCH" http --url "$URL" --requests "$REQUESTS" --concurrency "$CONC" --header "host=$HOST" --header x-bench=yes >"$out" 2>"$WORK/$mode-$round.err" \
            || { cat "$out" "$WORK/$mode-$round.err" >&2; die "round $round $mode failed"; }
        grep -q "statuses=200:$REQUESTS\$" "$out" || { cat "$out" >&2; die "round $round $mode: not every request got 200"; }
        [ "$round$mode" = 1A ] && sed -n 's/^command: /client: /p' "$out"
        RESULTS+=("$round $mode $(sed -n 's/^result: .*p50_ms=\([^ ]*\) p90_ms=\([^ ]*\) p99_ms=\([^ ]*\) max_ms=\([^ ]*\).*/\1 \2 \3 \4/p' "$out") $(sed -n 's/^result: .*req_per_s=\([^ ]*\).*/\1/p' "$out")")
    done
done

echo
printf '%-6s %-5s %9s %9s %9s %9s %9s\n' round mode p50_ms p90_ms p99_ms max_ms req/s
for r in "${RESULTS[@]}"; do
    # shellcheck disable=SC2086
    printf '%-6s %-5s %9s %9s %9s %9s %9s\n' $r
done
echo
printf '%-6s %12s %12s\n' round p50_B/A p99_B/A
printf '%s\n' "${RESULTS[@]}" | awk '
    $2 == "A" { a50[$1] = $3; a99[$1] = $5 }
    $2 == "B" { b50[$1] = $3; b99[$1] = $5 }
    END {
        for (r = 1; r in a50; r++) printf "%-6s %12.3f %12.3f\n", r, b50[r] / a50[r], b99[r] / a99[r]
    }'
printf '%s\n' "${RESULTS[@]}" | python3 -c '
import statistics, sys
rows = [l.split() for l in sys.stdin if l.strip()]
m = {(mode, k): statistics.median(float(r[i]) for r in rows if r[1] == mode) for mode in "AB" for k, i in (("p50", 2), ("p99", 4))}
print("result: median_p50_A_ms=%.3f median_p50_B_ms=%.3f p50_ratio=%.3f median_p99_A_ms=%.3f median_p99_B_ms=%.3f p99_ratio=%.3f" % (
    m["A", "p50"], m["B", "p50"], m["B", "p50"] / m["A", "p50"], m["A", "p99"], m["B", "p99"], m["B", "p99"] / m["A", "p99"]))'
echo "1-minute load average after: $(cut -d' ' -f1 /proc/loadavg)"
