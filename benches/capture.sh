#!/usr/bin/env bash
# The latency transparent capture adds (issue 37): the same Envoy, the
# same requests, the same backend, through today's bound listener and
# through the capture rules, on "VMs" made of network namespaces as
# tests/e2e/capture.rs builds them:
#
#   root ns   one replica on 198.18.X.1 (TLS, ACLs on, a mesh CA)
#   VM A      198.18.X.2: `lodestar agent --run-envoy` (Envoy with one
#             worker, --concurrency 1) and the client; default route to
#             the root, so the service VIP 198.19.X.10 is dialable
#   VM B      198.18.X.66: the backend, an Envoy answering 200 "ok" from a
#             direct_response (fast and steady, unlike a Python server)
#
# The service `reviews` (VIP 198.19.X.10, HTTP 9080, one instance at
# B:8081, plaintext) is called with `Host: reviews.shop.svc.cluster.local`:
#
#   direct    the client to B:8081 itself (no Envoy: the floor)
#   bound     agent without --capture: the client dials the bound listener
#             198.18.X.2:9080 (today's path)
#   capture   agent --capture: the client dials the VIP 198.19.X.10:9080;
#             iptables REDIRECTs it to 15001 (virtualOutbound,
#             use_original_dst), handed to the unbound 0.0.0.0_9080
#
# Each measured twice: `keepalive` (BENCH_REQUESTS sequential requests on
# one connection: the per-request cost) and `connect` (a new connection per
# request: the REDIRECT and the original-destination hand-off are paid at
# connect). The modes alternate, BENCH_ROUNDS rounds (a fresh agent and
# Envoy each), after 200 warm-up requests each; the figures are each
# round's p50/p99 and their median over the rounds.
#
#   sudo benches/capture.sh
#
# Environment:
#   BENCH_REQUESTS=5000   requests per kind, per round
#   BENCH_ROUNDS=3        rounds (bound and capture alternate)
#   BENCH_SUBNET=251      X in 198.18.X.0/24 and 198.19.X.0/24
#   BENCH_PORT_BASE=19940 the replica's API port (raft, xDS: the next two)
#   BENCH_PROFILE=release cargo profile (release|debug)
#   BENCH_NO_BUILD=1      use target/$PROFILE/lodestar as it is
#   BENCH_KEEP=1          keep the temp dir (data and logs)
#   LODESTAR_ENVOY=PATH   the Envoy binary (default: envoy on PATH)
#
# Needs: root (network namespaces, iptables), iproute2, iptables, curl,
# python3. Every wait and every load loop is bounded; the namespaces and
# every process started here are removed on exit.
set -euo pipefail

REQUESTS=${BENCH_REQUESTS:-5000}
ROUNDS=${BENCH_ROUNDS:-3}
X=${BENCH_SUBNET:-251}
PORT=${BENCH_PORT_BASE:-19940}
PROFILE=${BENCH_PROFILE:-release}
ENVOY=${LODESTAR_ENVOY:-$(command -v envoy || true)}

cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lodestar-capture.XXXXXX")
# Envoy runs as uid 1337 under --capture: it must reach the agent's files.
chmod 755 "$WORK"
PIDS=()
NS_A=lsbench${X}a NS_B=lsbench${X}b ROOT_END=lsbench${X}r

. "$ROOT/benches/lib.sh"
cleanup_on_exit
remove_netns() {
    local ns
    for ns in "$NS_A" "$NS_B"; do ip netns del "$ns" 2>/dev/null || true; done
    ip link del "$ROOT_END" 2>/dev/null || true
}
# Processes first, then the namespaces, then lib.sh's cleanup.
trap 'rc=$?; trap - EXIT; stop_pids; remove_netns; (exit $rc); _bench_cleanup' EXIT

die() { echo "error: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root: the benchmark creates network namespaces"
[ -n "$ENVOY" ] && [ -x "$ENVOY" ] || die "no Envoy binary: set LODESTAR_ENVOY (tests/support/install-envoy.sh prints one)"
command -v iptables >/dev/null || die "no iptables"
build_lodestar "$PROFILE" lodestar
cp "$ROOT/target/$PROFILE/lodestar" "$WORK/lodestar"
LODESTAR=$WORK/lodestar

# The namespaces (as tests/e2e/capture.rs: root <-> A <-> B).
remove_netns
for ns in "$NS_A" "$NS_B"; do
    ip netns add "$ns"
    ip -n "$ns" link set lo up
done
ip link add "$ROOT_END" type veth peer name eth0 netns "$NS_A"
ip addr add "198.18.$X.1/26" dev "$ROOT_END"
ip link set "$ROOT_END" up
ip -n "$NS_A" addr add "198.18.$X.2/26" dev eth0
ip -n "$NS_A" link set eth0 up
ip -n "$NS_A" route add default via "198.18.$X.1"
ip -n "$NS_A" link add eth1 type veth peer name eth0 netns "$NS_B"
ip -n "$NS_A" addr add "198.18.$X.65/26" dev eth1
ip -n "$NS_A" link set eth1 up
ip -n "$NS_B" addr add "198.18.$X.66/26" dev eth0
ip -n "$NS_B" link set eth0 up
in_a() { ip netns exec "$NS_A" "$@"; }

# The replica.
secure_cluster_files "$LODESTAR" "$WORK"
"$LODESTAR" tls ca create --mesh --dir "$WORK/mesh-ca" >/dev/null
printf 'mesh_ca_dir = "%s"\n' "$WORK/mesh-ca" >>"$WORK/tls.toml"
API=198.18.$X.1:$PORT RAFT=198.18.$X.1:$((PORT + 1)) XDS=198.18.$X.1:$((PORT + 2))
RUST_LOG=warn "$LODESTAR" server --config "$WORK/tls.toml" --id 1 --data-dir "$WORK/lodestar-1" \
    --api-addr "$API" --raft-addr "$RAFT" --xds-addr "$XDS" --initial-member "1=$RAFT,$API,$XDS" >"$WORK/lodestar-1.log" 2>&1 &
PIDS+=($!)
wait_replica_ready "$API" "$WORK/lodestar-1.log"
export LODESTAR_SERVER=https://$API
cat >"$WORK/mesh.yaml" <<EOF
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {name: reviews, namespace: shop}
spec:
  addresses: [198.19.$X.10]
  ports: [{name: http, number: 9080}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: reviews-1, namespace: shop}
spec: {service: reviews, address: 198.18.$X.66, port: 8081}
EOF
"$LODESTAR" apply -f "$WORK/mesh.yaml" >"$WORK/apply.log" 2>&1 || { cat "$WORK/apply.log" >&2; die "apply failed"; }

# The backend on VM B.
cat >"$WORK/backend.yaml" <<'EOF'
node: {id: backend, cluster: backend}
admin: {address: {socket_address: {address: 127.0.0.1, port_value: 15100}}}
static_resources:
  listeners:
  - name: backend
    address: {socket_address: {address: 0.0.0.0, port_value: 8081}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: backend
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: /}
                direct_response: {status: 200, body: {inline_string: "ok\n"}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
EOF
ip netns exec "$NS_B" "$ENVOY" -c "$WORK/backend.yaml" --use-dynamic-base-id --concurrency 1 --log-level warn >"$WORK/backend.log" 2>&1 &
PIDS+=($!)

# The client: N sequential GETs (after 200 warm-up ones), each timed;
# prints "p50_us p99_us max_us". Every socket operation times out after 5 s.
cat >"$WORK/client.py" <<'EOF'
import socket, sys, time
ip, port, host, n, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
req = ("GET / HTTP/1.1\r\nHost: %s\r\n\r\n" % host).encode()
def connect():
    s = socket.create_connection((ip, port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s
def get(s):
    s.sendall(req)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(4096)
        if not chunk:
            raise SystemExit("connection closed before the response")
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise SystemExit("status: %r" % head[:40])
    length = next(int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = s.recv(4096)
        if not chunk:
            raise SystemExit("connection closed in the body")
        body += chunk
lat = []
s = connect() if kind == "keepalive" else None
for i in range(200 + n):
    t0 = time.perf_counter()
    if kind == "keepalive":
        get(s)
    else:
        c = connect()
        get(c)
        c.close()
    if i >= 200:
        lat.append(time.perf_counter() - t0)
lat.sort()
us = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e6
print("%.0f %.0f %.0f" % (us(0.5), us(0.99), lat[-1] * 1e6))
EOF
HOST=reviews.shop.svc.cluster.local
client() { in_a timeout 600 python3 "$WORK/client.py" "$1" "$2" "$HOST" "$REQUESTS" "$3"; }
ok=0
for _ in $(seq 100); do
    in_a curl -sf --max-time 1 -o /dev/null "http://198.18.$X.66:8081/" && { ok=1; break; }
    sleep 0.1
done
[ "$ok" = 1 ] || { tail -20 "$WORK/backend.log" >&2; die "the backend on VM B is not ready within 10s"; }

# start_agent MODE: the agent (and its Envoy) on VM A; waits until a
# request through Envoy is answered. Sets AGENT_PID.
start_agent() {
    local mode=$1 extra=() url
    [ "$mode" = capture ] && extra=(--capture)
    TOKEN=$("$LODESTAR" token create --workload shop/web --uses 1 -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["secret"])')
    printf '%s' "$TOKEN" >"$WORK/join.token"
    # `ip netns exec` execs: $! is the agent itself (not a subshell).
    ip netns exec "$NS_A" env RUST_LOG=warn LODESTAR_ENVOY="$ENVOY" "$LODESTAR" --server "https://$API" agent --dir "$WORK/agent-$mode" \
        --xds-servers "$XDS" --name web --namespace shop --ip "198.18.$X.2" --label app=web --admin-port 15000 \
        --join-token-file "$WORK/join.token" --run-envoy --drain-time 1s --envoy-arg=--concurrency --envoy-arg=1 \
        "${extra[@]}" >>"$WORK/agent-$mode.log" 2>&1 &
    AGENT_PID=$!
    PIDS+=("$AGENT_PID")
    url=http://198.18.$X.2:9080/
    [ "$mode" = capture ] && url=http://198.19.$X.10:9080/
    for _ in $(seq 600); do
        in_a curl -sf --max-time 1 -o /dev/null -H "Host: $HOST" "$url" && return 0
        kill -0 "$AGENT_PID" 2>/dev/null || break
        sleep 0.1
    done
    tail -30 "$WORK/agent-$mode.log" >&2
    die "$mode: no answer through Envoy within 60s"
}

stop_agent() {
    kill -TERM "$AGENT_PID" 2>/dev/null || true
    for _ in $(seq 300); do kill -0 "$AGENT_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$AGENT_PID" 2>/dev/null || true
    wait "$AGENT_PID" 2>/dev/null || true
    local p rest=()
    for p in "${PIDS[@]}"; do [ "$p" = "$AGENT_PID" ] || rest+=("$p"); done
    PIDS=("${rest[@]}")
    [ "$(in_a iptables-save -t nat | grep -c LODESTAR || true)" = 0 ] || die "the agent's exit left capture rules"
}

echo
echo "capture latency: $(nproc) cores (shared); $("$LODESTAR" --version) ($PROFILE); $("$ENVOY" --version 2>/dev/null | grep -o 'version: [^ ]*' | head -1)"
echo "script: BENCH_REQUESTS=$REQUESTS BENCH_ROUNDS=$ROUNDS benches/capture.sh"
echo "1-minute load average before: $(cut -d' ' -f1 /proc/loadavg)"
RESULTS=$WORK/results
: >"$RESULTS"
for round in $(seq "$ROUNDS"); do
    for kind in keepalive connect; do
        echo "$round direct $kind $(client "198.18.$X.66" 8081 "$kind")" | tee -a "$RESULTS"
    done
    for mode in bound capture; do
        start_agent "$mode"
        target=(198.18.$X.2 9080)
        [ "$mode" = capture ] && target=(198.19.$X.10 9080)
        for kind in keepalive connect; do
            echo "$round $mode $kind $(client "${target[@]}" "$kind")" | tee -a "$RESULTS"
        done
        if [ "$mode" = capture ]; then
            # The requests went through the capture path (virtualOutbound
            # hands each connection to 0.0.0.0_9080).
            handed=$(in_a curl -sf --max-time 5 "http://127.0.0.1:15000/stats?filter=^listener.0.0.0.0_9080.downstream_cx_total$" | awk '{print $2}')
            [ "${handed:-0}" -ge "$REQUESTS" ] || die "capture: only ${handed:-0} connections through 0.0.0.0_9080"
        fi
        stop_agent
    done
done
echo "1-minute load average after: $(cut -d' ' -f1 /proc/loadavg)"
echo
echo "median over $ROUNDS rounds (µs; each round's p50 / p99 of $REQUESTS requests):"
python3 - "$RESULTS" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
med = lambda xs: statistics.median(float(x) for x in xs)
print("| kind | direct (no Envoy) p50 / p99 | bound p50 / p99 | capture p50 / p99 | capture - bound, p50 / p99 |")
print("|---|---|---|---|---|")
for kind in ["keepalive", "connect"]:
    cell = {}
    for mode in ["direct", "bound", "capture"]:
        r = [x for x in rows if x[1] == mode and x[2] == kind]
        cell[mode] = (med(x[3] for x in r), med(x[4] for x in r))
    d = (cell["capture"][0] - cell["bound"][0], cell["capture"][1] - cell["bound"][1])
    print("| %s | %s | %s | %s | %+.0f / %+.0f |" % (kind, *("%.0f / %.0f" % cell[m] for m in ["direct", "bound", "capture"]), *d))
EOF
