#!/usr/bin/env bash
# Gateway API scenarios of the public gateway-api-bench (issue 39), against
# one single-node replica (secure by default: TLS, ACLs) and ONE real
# gateway Envoy (`lodestar bootstrap --gateway default/web`), backends two
# tiny HTTP servers on loopback that answer their name:
#
# 1. churn: an HTTPRoute's backend switched v1 <-> v2 CHANGES times (0.5 s
#    apart) while two clients send requests through the gateway without
#    pause: every answer that is not a 200 from v1 or v2, and every
#    connection error, is an error.
# 2. attach: N HTTPRoutes (each its own hostname) written one at a time;
#    after each write the gateway is polled (1 ms apart) with that host
#    until it answers 200: write-to-200 p50/p99/max, and every answer seen
#    must be 404 until the first 200, 200 after.
# 3. scale (BIG > 0): BIG HTTPRoutes in 50 namespaces written in batches of
#    500, then the time from the last write until the Gateway's status
#    says `attachedRoutes` = BIG (read every 50 ms), and the replica's RSS
#    (and the Envoy's) then.
#
#   benches/gateway-api.sh [N] [CHANGES] [BIG]      (default 3000 20 5000)
#
# Environment:
#   BENCH_PORT_BASE=19700  first of the loopback ports used (API, raft, xDS,
#                          Envoy admin; backends at +10, +11)
#   BENCH_TIMEOUT=600      seconds the attach phase may take: it stops
#                          there and reports how many routes it reached
#   BENCH_KEEP=1           keep the temp dir (data and logs) after the run
#   LODESTAR_BIN=PATH      the binary (default: cargo build --release)
#   LODESTAR_ENVOY=PATH    Envoy (default: `envoy` on PATH)
#
# Prints `result:` lines (key=value); exits non-zero when a check fails
# (errors under churn, an answer out of order, attachedRoutes never right).
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh

N=${1:-3000}
CHANGES=${2:-20}
BIG=${3:-5000}
PORT=${BENCH_PORT_BASE:-19700}
LIMIT=${BENCH_TIMEOUT:-600}
ENVOY=${LODESTAR_ENVOY:-envoy}
if [ -z "${LODESTAR_BIN:-}" ]; then
    cargo build --release --quiet --bin lodestar
    LODESTAR_BIN=$PWD/target/release/lodestar
fi
WORK=$(mktemp -d /tmp/lodestar-gateway-api.XXXXXX)
PIDS=()
cleanup_on_exit
cp "$LODESTAR_BIN" "$WORK/lodestar"
LODESTAR=$WORK/lodestar

API=127.0.0.1:$PORT
GW_IP=127.0.0.1
GW_PORT=$((PORT + 5))
echo 'user_client_config = ""' >"$WORK/lodestar.toml"
"$LODESTAR" server --config "$WORK/lodestar.toml" --data-dir "$WORK/data" \
    --api-addr "$API" --raft-addr "127.0.0.1:$((PORT + 1))" --xds-addr "127.0.0.1:$((PORT + 2))" >>"$WORK/replica.log" 2>&1 &
PIDS+=($!)
REPLICA=$!
for _ in $(seq 600); do
    [ -f "$WORK/data/tls/ca.pem" ] && curl -fsS --max-time 2 --cacert "$WORK/data/tls/ca.pem" "https://$API/readyz" >/dev/null 2>&1 && break
    kill -0 "$REPLICA" 2>/dev/null || { tail -20 "$WORK/replica.log" >&2; exit 1; }
    sleep 0.1
done
export LODESTAR_CONFIG=$WORK/data/client.toml

# Two backends answering their name.
for i in 1 2; do
    python3 - "$((PORT + 9 + i))" "v$i" >>"$WORK/backend-$i.log" 2>&1 <<'PY' &
import http.server, socket, sys
port, name = int(sys.argv[1]), sys.argv[2].encode()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body are two writes: without this, Nagle and the peer's
    # delayed ACK hold the body ~40 ms.
    def setup(self):
        super().setup(); self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    def do_GET(self):
        self.send_response(200); self.send_header("content-length", str(len(name))); self.end_headers(); self.wfile.write(name)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
PY
    PIDS+=($!)
done

# The Gateway (every namespace's routes) and the backends as services.
{
    cat <<YAML
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: lodestar}
spec: {controllerName: lodestar.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: web, namespace: default}
spec:
  gatewayClassName: lodestar
  listeners: [{name: http, port: $GW_PORT, protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}]
YAML
    # Routes in team-0..49 may send to default's backends (16 namespaces a grant).
    for g in 0 1 2 3; do
        printf -- '---\napiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: teams-%s, namespace: default}\nspec:\n  to: [{group: "", kind: Service}]\n  from:\n' "$g"
        for t in $(seq $((g * 16)) $((g * 16 + 15))); do
            [ "$t" -lt 50 ] && printf '  - {group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: team-%s}\n' "$t"
        done
    done
    for i in 1 2; do
        printf -- '---\napiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {name: v%s, namespace: default}\nspec: {ports: [{name: http, number: 80, protocol: HTTP}]}\n' "$i"
        printf -- '---\napiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {name: v%s-0, namespace: default}\nspec: {service: v%s, address: 127.0.0.1, ports: {http: %s}}\n' "$i" "$i" "$((PORT + 9 + i))"
    done
} >"$WORK/base.yaml"
"$LODESTAR" apply -f "$WORK/base.yaml" >/dev/null

"$LODESTAR" bootstrap --gateway default/web --name web-gateway --ip "$GW_IP" --admin-port "$((PORT + 3))" \
    --proxy-token-out "$WORK/gateway.proxy-token" >"$WORK/gateway.yaml" 2>>"$WORK/bootstrap.log"
"$ENVOY" -c "$WORK/gateway.yaml" --base-id "$((PORT % 1000 + 40))" >"$WORK/envoy.log" 2>&1 &
PIDS+=($!)
ENVOY_PID=$!
timeout 60 "$LODESTAR" wait --proxy web-gateway.default >/dev/null 2>&1 || true

echo "command: benches/gateway-api.sh $N $CHANGES $BIG ($("$LODESTAR" --version), $("$ENVOY" --version 2>/dev/null | grep -o 'version: [^ ]*' | head -1))"
rc=0
python3 - "$API" "$WORK/data/tls/ca.pem" "$WORK/data/management.token" "$GW_IP:$GW_PORT" "$N" "$CHANGES" "$BIG" "$LIMIT" "$REPLICA" "$ENVOY_PID" <<'PY' || rc=$?
import http.client, json, ssl, sys, threading, time

api, cafile, token_file, gw, n, changes, big, limit, replica, envoy = sys.argv[1:11]
n, changes, big, limit = int(n), int(changes), int(big), float(limit)
token = open(token_file).read().strip()
ctx = ssl.create_default_context(cafile=cafile)
gw_host, gw_port = gw.split(":")
failed = []

def api_conn():
    return http.client.HTTPSConnection(api.split(":")[0], int(api.split(":")[1]), context=ctx, timeout=30)

conn = api_conn()
def call(method, path, body=None, ctype="application/json"):
    global conn
    for attempt in range(2):
        try:
            conn.request(method, path, body=body, headers={"Authorization": f"Bearer {token}", "content-type": ctype})
            r = conn.getresponse()
            data = r.read()
            return r.status, (json.loads(data) if data else None)
        except (http.client.HTTPException, OSError):
            conn = api_conn()
    raise SystemExit(f"{method} {path}: no answer")

def apply(docs):
    status, body = call("POST", "/v1/apply", json.dumps({"resources": docs}))
    if status != 200:
        raise SystemExit(f"apply: {status} {body}")

def route(name, ns, host, backend, backend_ns="default"):
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": name, "namespace": ns},
            "spec": {"parentRefs": [{"name": "web", "namespace": "default"}], "hostnames": [host],
                     "rules": [{"backendRefs": [{"name": backend, "namespace": backend_ns, "port": 80}]}]}}

class Gw:
    """One keep-alive connection to the gateway."""
    def __init__(self):
        self.c = http.client.HTTPConnection(gw_host, int(gw_port), timeout=5)
    def get(self, host, path="/"):
        try:
            self.c.request("GET", path, headers={"Host": host})
            r = self.c.getresponse()
            return r.status, r.read().decode(errors="replace")
        except (http.client.HTTPException, OSError) as e:
            self.c.close()
            self.c = http.client.HTTPConnection(gw_host, int(gw_port), timeout=5)
            return None, repr(e)

def until(what, ok, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if ok():
            return True
        time.sleep(0.005)
    failed.append(f"{what}: not within {seconds}s")
    return False

def rss_mb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
    return 0

def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] if s else 0

# 1. Churn under traffic.
apply([route("churn", "default", "churn.example.com", "v1")])
g = Gw()
until("the churn route", lambda: g.get("churn.example.com") == (200, "v1"), 30)
stop = threading.Event()
seen, errors, lock = {}, [], threading.Lock()
def client():
    c = Gw()
    while not stop.is_set():
        status, body = c.get("churn.example.com")
        with lock:
            if status == 200 and body in ("v1", "v2"):
                seen[body] = seen.get(body, 0) + 1
            else:
                errors.append(f"{status} {body[:80]}")
threads = [threading.Thread(target=client) for _ in range(2)]
for t in threads:
    t.start()
t0 = time.monotonic()
for i in range(changes):
    time.sleep(0.5)
    apply([route("churn", "default", "churn.example.com", "v2" if i % 2 == 0 else "v1")])
time.sleep(1)
stop.set()
for t in threads:
    t.join(10)
elapsed = time.monotonic() - t0
total = sum(seen.values()) + len(errors)
print(f"churn: {changes} backend changes over {elapsed:.1f}s, {total} requests ({total / elapsed:.0f}/s), "
      f"{len(errors)} errors; answers by backend {dict(sorted(seen.items()))}")
if errors:
    failed.append(f"churn: {len(errors)} errors, first {errors[:3]}")
print(f"result: scenario=churn changes={changes} requests={total} errors={len(errors)} v1={seen.get('v1', 0)} v2={seen.get('v2', 0)}")

# 2. Attach N routes one at a time.
latencies, bad_order, start = [], [], time.monotonic()
for i in range(n):
    if time.monotonic() - start > limit:
        print(f"attach: stopped at {i} routes after {limit:.0f}s (BENCH_TIMEOUT)")
        break
    host = f"r{i}.attach.example.com"
    t = time.monotonic()
    apply([route(f"attach-{i}", "default", host, "v1")])
    statuses = []
    while True:
        status, body = g.get(host)
        statuses.append(status)
        if status == 200:
            break
        if status != 404 or time.monotonic() - t > 30:
            bad_order.append((i, statuses[-5:]))
            break
        time.sleep(0.001)
    latencies.append((time.monotonic() - t) * 1000)
    # A route already answering keeps answering (no 404 after the 200).
    if i % 50 == 0 and i > 0:
        status, _ = g.get(f"r{i // 2}.attach.example.com")
        if status != 200:
            bad_order.append((i // 2, ["after", status]))
done = len(latencies)
attach_s = time.monotonic() - start
print(f"attach: {done} HTTPRoutes one at a time in {attach_s:.1f}s; write to 200: p50 {pct(latencies, 50):.1f} ms, "
      f"p99 {pct(latencies, 99):.1f} ms, max {max(latencies, default=0):.1f} ms; first 100: p99 {pct(latencies[:100], 99):.1f} ms, "
      f"last 100: p50 {pct(latencies[-100:], 50):.1f} ms p99 {pct(latencies[-100:], 99):.1f} ms; answers out of order: {len(bad_order)}")
if bad_order:
    failed.append(f"attach: answers other than 404 then 200: {bad_order[:5]}")
print(f"result: scenario=attach routes={done} p50_ms={pct(latencies, 50):.1f} p99_ms={pct(latencies, 99):.1f} max_ms={max(latencies, default=0):.1f} "
      f"last100_p99_ms={pct(latencies[-100:], 99):.1f} out_of_order={len(bad_order)} replica_rss_mb={rss_mb(replica)} envoy_rss_mb={rss_mb(envoy)}")

# 3. BIG routes in 50 namespaces; attachedRoutes within 1 s of the last write.
if big > 0:
    base = done + 1  # the churn route and the attach routes
    t = time.monotonic()
    for b in range(0, big, 500):
        apply([route(f"scale-{i}", f"team-{i % 50}", f"s{i}.team-{i % 50}.example.com", "v1") for i in range(b, min(b + 500, big))])
    last_write = time.monotonic()
    write_s = last_write - t
    want = base + big
    got = [None]
    def attached():
        status, body = call("GET", "/v1/resources/gtw/default/web")
        got[0] = body["status"]["listeners"][0]["attachedRoutes"] if status == 200 else None
        return got[0] == want
    after_ms = -1
    if until(f"attachedRoutes = {want} (last seen {got[0]})", attached, 30):
        after_ms = (time.monotonic() - last_write) * 1000
        print(f"scale: {big} HTTPRoutes in 50 namespaces written in {write_s:.1f}s (batches of 500); attachedRoutes = {want} "
              f"{after_ms:.0f} ms after the last write")
        if after_ms > 1000:
            failed.append(f"scale: attachedRoutes right only {after_ms:.0f} ms after the last write")
    # Traffic: a route of the last batch answers.
    i = big - 1
    until("the last scale route", lambda: g.get(f"s{i}.team-{i % 50}.example.com")[0] == 200, 60)
    print(f"result: scenario=scale routes={big} namespaces=50 write_s={write_s:.1f} attached_after_ms={after_ms:.0f} "
          f"replica_rss_mb={rss_mb(replica)} envoy_rss_mb={rss_mb(envoy)}")

for f in failed:
    print(f"FAILED: {f}", file=sys.stderr)
sys.exit(1 if failed else 0)
PY
grep -q 'rejected' "$WORK/envoy.log" && { echo "the gateway Envoy rejected config: see $WORK/envoy.log" >&2; rc=1; }
exit "$rc"
