#!/usr/bin/env bash
# Envoy request latency through a sidecar with a CUSTOM AuthorizationPolicy
# (external authorization) and with access logging, against none, in the
# same sitting (issue 38; a report, no target). One replica, one Envoy
# (`lodestar bootstrap`) whose Sidecar has an HTTP ingress port forwarding to
# a trivial keep-alive HTTP/1.1 upstream (Python, on 127.0.0.1), a real
# HTTP ext_authz server (Python, keep-alive: allows a request carrying
# `x-ext-authz: allow`, 403 otherwise), and `lodestar-bench http` sending
# requests through the Envoy. The MeshConfig declares the `envoyExtAuthzHttp`
# provider and replaces Istio's built-in `envoy` logger with one writing to
# a file (Istio's default text format). Rounds alternate:
#
#   A  nothing: no policy, no Telemetry
#   C  CUSTOM: an AuthorizationPolicy `action: CUSTOM` on /bench/* through
#      the provider (shadow RBAC, then Envoy's ext_authz filter: one HTTP
#      check per request to the ext_authz server, which allows it)
#   L  access logging: a namespace Telemetry with provider `envoy` (one
#      line per request to the file)
#
# After each switch the script waits until the replica reports the proxy
# in sync at the write's revision (`/debug/syncz`, LDS ACKed) and until a
# probe gets what the round expects (C: a request without the header is
# denied, 403; L: a request adds a line to the log; A: the probe is allowed
# and the log does not grow), then runs the load. Prints p50/p99 per round
# and, per round, the C/A and L/A ratios; and the medians.
#
#   benches/escape.sh                     5 rounds of 5000 requests, 1 connection
#   BENCH_REQUESTS=500 BENCH_ROUNDS=2 benches/escape.sh
#
# Environment:
#   BENCH_REQUESTS=5000     requests per round
#   BENCH_CONCURRENCY=1     keep-alive connections (workers); 1: latency
#                             without queueing behind other requests
#   BENCH_ROUNDS=5          A/B pairs
#   BENCH_PORT_BASE=19740   first of the loopback ports used (API, raft,
#                             xDS, upstream, ext_authz); Envoy listens on 127.0.77.42
#                             (8000, admin 15000)
#   BENCH_PROFILE=release   cargo profile of both binaries (release|debug)
#   BENCH_KEEP=1            keep the temp dir (data and logs) after the run
#   LODESTAR_ENVOY=PATH     the Envoy binary (default: envoy on PATH)
#
# Needs: cargo, curl, python3, envoy. Every wait is bounded; every process
# started here is killed on exit.
set -euo pipefail

PORT=${BENCH_PORT_BASE:-19740}
REQUESTS=${BENCH_REQUESTS:-5000}
CONC=${BENCH_CONCURRENCY:-1}
ROUNDS=${BENCH_ROUNDS:-5}
PROFILE=${BENCH_PROFILE:-release}
ENVOY=${LODESTAR_ENVOY:-$(command -v envoy || true)}
PROXY_IP=127.0.77.42

cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lodestar-escape.XXXXXX")
PIDS=()

. "$ROOT/benches/lib.sh"
cleanup_on_exit

die() { echo "error: $*" >&2; exit 1; }
[ -n "$ENVOY" ] && [ -x "$ENVOY" ] || die "no Envoy binary: set LODESTAR_ENVOY"

. "$ROOT/benches/sidecar.sh"
# (a) build, (b) the upstream, (c) one replica
sidecar_bench_start
AUTHZ_PORT=$((PORT + 4))

# The ext_authz server: Envoy's HTTP check is the original request (method,
# path, the headers the provider lets through); 200 allows, 403 denies.
cat >"$WORK/authz.py" <<'PY'
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def check(self):
        n = int(self.headers.get("content-length") or 0)
        if n:
            self.rfile.read(n)
        code = 200 if self.headers.get("x-ext-authz") == "allow" else 403
        body = b"denied by ext_authz\n" if code == 403 else b""
        self.send_response(code)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = check
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
python3 "$WORK/authz.py" "$AUTHZ_PORT" >"$WORK/authz.log" 2>&1 &
PIDS+=($!)
wait_for 10 "ext_authz server ready" curl -sf --max-time 1 -H "x-ext-authz: allow" "http://127.0.0.1:$AUTHZ_PORT/"

# (d) the workload's Sidecar, the mesh config and the ext_authz service, and
# the workload's Envoy
LOG=$WORK/access.log
cat >"$WORK/sidecar.yaml" <<YAML
apiVersion: mesh.lodestar.io/v1
kind: MeshConfig
metadata: {name: default}
spec:
  extensionProviders:
  - name: ext-authz-http
    envoyExtAuthzHttp:
      service: ext-authz.default.svc.cluster.local
      port: 8000
      includeRequestHeadersInCheck: [x-ext-authz]
  - name: envoy
    envoyFileAccessLog: {path: $LOG}
---
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {name: ext-authz, namespace: default}
spec:
  ports: [{name: http, number: 8000, protocol: HTTP}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: ext-authz-1, namespace: default}
spec: {service: ext-authz, address: 127.0.0.1, port: $AUTHZ_PORT}
---
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

# (e) the policy and the Telemetry the rounds switch on and off
cat >"$WORK/custom.yaml" <<'YAML'
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: bench-custom, namespace: default}
spec:
  selector: {matchLabels: {app: web}}
  action: CUSTOM
  provider: {name: ext-authz-http}
  rules: [{to: [{operation: {paths: ["/bench/*"]}}]}]
YAML
cat >"$WORK/logs.yaml" <<'YAML'
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: bench-logs, namespace: default}
spec:
  accessLogging: [{providers: [{name: envoy}]}]
YAML

revision_of() { python3 -c 'import json,sys; print(json.load(sys.stdin)["revision"])'; }
remove() { curl_api -X DELETE "https://$API/v1/resources/$1" | revision_of; }
log_lines() { [ -f "$LOG" ] && wc -l <"$LOG" || echo 0; }
# Until a probe adds a line to the access log (Envoy flushes it every 1 s).
log_grows() {
    local before
    before=$(log_lines)
    probe_is 403 || probe_is 200 || return 1
    for _ in $(seq 30); do
        [ "$(log_lines)" -gt "$before" ] && return 0
        sleep 0.1
    done
    return 1
}
CUR=A
set_mode() {
    local rev
    case $CUR in
        C) rev=$(remove authorizationpolicies/default/bench-custom) ;;
        L) rev=$(remove telemetries/default/bench-logs) ;;
    esac
    case $1 in
        C) rev=$(apply "$WORK/custom.yaml") ;;
        L) rev=$(apply "$WORK/logs.yaml") ;;
    esac
    wait_for 60 "proxy in sync at revision $rev" synced "$rev"
    case $1 in
        C) wait_for 30 "CUSTOM in force" probe_is 403 ;;
        L) wait_for 30 "access log in force" probe_is 200; wait_for 30 "access log lines" log_grows ;;
        A) wait_for 30 "CUSTOM gone" probe_is 200 ;;
    esac
    if [ "$1" = A ]; then
        # No line for a request once logging is off (after the last flush).
        sleep 1.5
        local before
        before=$(log_lines)
        probe_is 200 && sleep 1.5
        [ "$(log_lines)" = "$before" ] || die "round A: the access log still grows"
    fi
    CUR=$1
}

echo
echo "CUSTOM and access-log latency: 1 replica, 1 Envoy ($("$ENVOY" --version 2>/dev/null | sed -n 's/.*version: \([^ ]*\).*/\1/p')), upstream and ext_authz server python3 on 127.0.0.1; $(nproc) cores; $("$LODESTAR" --version) ($PROFILE)"
echo "script: BENCH_REQUESTS=$REQUESTS BENCH_CONCURRENCY=$CONC BENCH_ROUNDS=$ROUNDS BENCH_PROFILE=$PROFILE benches/escape.sh"
echo "1-minute load average before: $(cut -d' ' -f1 /proc/loadavg)"
RESULTS=()
for round in $(seq "$ROUNDS"); do
    for mode in A C L; do
        # Round 1's A runs on the fresh proxy, which has neither yet.
        if [ "$mode" != A ] || [ "$round" -gt 1 ]; then set_mode "$mode"; fi
        run_load "$mode" x-ext-authz=allow
    done
done
# The log has a line per request of every L round (and the probes'), once
# Envoy has flushed the last round's.
logged_all() { [ "$(log_lines)" -ge $((ROUNDS * REQUESTS)) ]; }
wait_for 10 "a log line per request of the L rounds ($((ROUNDS * REQUESTS)))" logged_all

echo
printf '%-6s %-5s %9s %9s %9s %9s %9s\n' round mode p50_ms p90_ms p99_ms max_ms req/s
for r in "${RESULTS[@]}"; do
    # shellcheck disable=SC2086
    printf '%-6s %-5s %9s %9s %9s %9s %9s\n' $r
done
echo
printf '%-6s %10s %10s %10s %10s\n' round p50_C/A p99_C/A p50_L/A p99_L/A
printf '%s\n' "${RESULTS[@]}" | awk '
    { p50[$1, $2] = $3; p99[$1, $2] = $5; if ($1 > n) n = $1 }
    END {
        for (r = 1; r <= n; r++)
            printf "%-6s %10.3f %10.3f %10.3f %10.3f\n", r, p50[r, "C"] / p50[r, "A"], p99[r, "C"] / p99[r, "A"], p50[r, "L"] / p50[r, "A"], p99[r, "L"] / p99[r, "A"]
    }'
printf '%s\n' "${RESULTS[@]}" | python3 -c '
import statistics, sys
rows = [l.split() for l in sys.stdin if l.strip()]
m = {(mode, k): statistics.median(float(r[i]) for r in rows if r[1] == mode) for mode in "ACL" for k, i in (("p50", 2), ("p99", 4))}
print("result: " + " ".join("median_%s_%s_ms=%.3f" % (k, mode, m[mode, k]) for mode in "ACL" for k in ("p50", "p99")) +
      " p50_C/A=%.3f p99_C/A=%.3f p50_L/A=%.3f p99_L/A=%.3f" % tuple(m[x, k] / m["A", k] for x in "CL" for k in ("p50", "p99")))'
echo "1-minute load average after: $(cut -d' ' -f1 /proc/loadavg)"
