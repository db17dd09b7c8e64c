# One replica, one sidecar Envoy in front of a trivial upstream, for the
# request-latency benches (benches/rbac.sh, benches/escape.sh). Sourced
# after benches/lib.sh; the caller sets PORT, PROXY_IP, PROFILE, ENVOY,
# ROOT, WORK, PIDS and `die`. Ports: API $PORT, raft +1, xDS +2, upstream +3.

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

apply() { curl_api -X POST -H 'content-type: application/yaml' --data-binary @"$1" "https://$API/v1/apply" | python3 -c 'import json,sys; print(json.load(sys.stdin)["revision"])'; }

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

# Status of a probe without the header the benchmark's requests carry.
probe_is() { [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 -H "host: $HOST" "$URL")" = "$1" ]; }

# Build, start the upstream and the replica. Sets LODESTAR, BENCH, API, RAFT, XDS, APP_PORT,
# ADMIN, NODE_ID, URL, HOST.
sidecar_bench_start() {
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
    URL=http://$PROXY_IP:8000/bench/item
    HOST=web.default.svc.cluster.local
}

# Apply the Sidecar YAML file $1, start the workload's Envoy, and wait until
# it is in sync and a first request goes through.
start_sidecar_envoy() {
    local rev
    rev=$(apply "$1")
    "$LODESTAR" bootstrap --server "https://$API" --xds-servers "$XDS" --proxy-token-file "$WORK/ca/management.token" \
        --name web --namespace default --ip "$PROXY_IP" --node-type sidecar --admin-port 15000 --label app=web \
        >"$WORK/bootstrap.yaml"
    "$ENVOY" -c "$WORK/bootstrap.yaml" --use-dynamic-base-id --log-level warn --drain-time-s 1 --parent-shutdown-time-s 2 \
        >"$WORK/envoy.log" 2>&1 &
    PIDS+=($!)
    wait_for 60 "envoy ready" curl -sf --max-time 1 "$ADMIN/ready"
    wait_for 60 "proxy in sync at revision $rev" synced "$rev"
    wait_for 30 "first request through the Envoy" probe_is 200
}

# One round's load in mode $1 with the extra header $2; appends
# "round mode p50 p90 p99 max req/s" to RESULTS ($round is the caller's).
run_load() {
    local mode=$1 header=$2 out
    out=$WORK/$mode-$round.out
    "$BENCH" http --url "$URL" --requests "$REQUESTS" --concurrency "$CONC" --header "host=$HOST" --header "$header" >"$out" 2>"$WORK/$mode-$round.err" \
        || { cat "$out" "$WORK/$mode-$round.err" >&2; die "round $round $mode failed"; }
    grep -q "statuses=200:$REQUESTS\$" "$out" || { cat "$out" >&2; die "round $round $mode: not every request got 200"; }
    [ "$round$mode" = 1A ] && sed -n 's/^command: /client: /p' "$out"
    RESULTS+=("$round $mode $(sed -n 's/^result: .*p50_ms=\([^ ]*\) p90_ms=\([^ ]*\) p99_ms=\([^ ]*\) max_ms=\([^ ]*\).*/\1 \2 \3 \4/p' "$out") $(sed -n 's/^result: .*req_per_s=\([^ ]*\).*/\1/p' "$out")")
}
