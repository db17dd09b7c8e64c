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

. "$ROOT/benches/sidecar.sh"
# (a) build, (b) the upstream, (c) one replica
sidecar_bench_start

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
start_sidecar_envoy "$WORK/sidecar.yaml"

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
        run_load "$mode" x-bench=yes
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
