# Shared by the benchmark scripts (sourced, not run).

# secure_cluster_files LODESTAR WORK: secure by default, as `lodestar server`
# is. One cluster CA in WORK/ca for the three replicas (each issues its own
# certificate from it) and one management token they all accept (ACLs are
# on by default); both appended to WORK/tls.toml. Exports LODESTAR_CACERT
# and LODESTAR_TOKEN, which curl (by hand) and lodestar-bench use.
secure_cluster_files() {
    local lodestar=$1 work=$2
    local ca=$work/ca
    "$lodestar" tls ca create --dir "$ca" >/dev/null
    (umask 077; od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$ca/management.token")
    printf 'tls_ca_file = "%s"\ntls_ca_key_file = "%s"\nuser_client_config = ""\ninitial_management_token_file = "%s"\n' \
        "$ca/ca.pem" "$ca/ca-key.pem" "$ca/management.token" >>"$work/tls.toml"
    LODESTAR_CACERT=$ca/ca.pem
    LODESTAR_TOKEN=$(cat "$ca/management.token")
    export LODESTAR_CACERT LODESTAR_TOKEN
}

# three_member_addrs PORT: the loopback addresses of a three-replica cluster
# from PORT on (API, raft, xDS for each, in turn), in the arrays API, RAFT
# and XDS, and its `--initial-member` flags in MEMBERS.
three_member_addrs() {
    local port=$1 n
    API=() RAFT=() XDS=() MEMBERS=()
    for n in 1 2 3; do
        API+=("127.0.0.1:$((port + n * 3 - 3))")
        RAFT+=("127.0.0.1:$((port + n * 3 - 2))")
        XDS+=("127.0.0.1:$((port + n * 3 - 1))")
        MEMBERS+=(--initial-member "$n=${RAFT[n - 1]},${API[n - 1]},${XDS[n - 1]}")
    done
}

# stop_pids: TERM every process in PIDS, KILL what is left after 5 s, and
# reap them quietly (bash would otherwise report each one killed).
stop_pids() {
    local pid alive
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for _ in $(seq 50); do
        alive=0
        for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    PIDS=()
}

# cleanup_on_exit: on exit, INT or TERM, stop_pids, then remove WORK unless
# BENCH_KEEP=1 or the script failed (then say where it is kept).
cleanup_on_exit() {
    trap _bench_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}
_bench_cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_pids
    if [ "${BENCH_KEEP:-0}" = 1 ] || [ "$rc" != 0 ]; then
        echo "# data and logs kept in $WORK" >&2
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}

# one_source_many_proxies LODESTAR FILE: the simulated proxies and agents of
# a benchmark all connect from 127.0.0.1, one connection each, thousands of
# them, with one token: lift the xDS port's per-source connection limit,
# and raise its stream quotas per credential and per source past any
# benchmark's count (their bookkeeping is still measured) (FILE: the
# replicas' config), each if LODESTAR has it (an older build under test
# does not, and must not stop on an unknown setting).
one_source_many_proxies() {
    local lodestar=$1 file=$2
    if grep -qa xds_max_connections_per_source "$lodestar"; then
        printf 'xds_max_connections_per_source = 0\n' >>"$file"
    fi
    if grep -qa xds_max_streams_per_source "$lodestar"; then
        printf 'xds_max_streams_per_credential = 1000000\nxds_max_streams_per_source = 1000000\n' >>"$file"
    fi
}

# build_lodestar PROFILE BINARY...: cargo build the binaries in the profile
# (release|debug; not when BENCH_NO_BUILD=1). Other scripts still spell
# this out (csr.sh, console.sh, abuse.sh).
build_lodestar() {
    local profile=$1 flag=() bin bins=()
    shift
    case $profile in
        release) flag=(--release) ;;
        debug) ;;
        *) echo "error: BENCH_PROFILE: release or debug" >&2; return 1 ;;
    esac
    for bin in "$@"; do bins+=(--bin "$bin"); done
    if [ "${BENCH_NO_BUILD:-0}" != 1 ]; then
        echo "# building $* ($profile)" >&2
        timeout 3600 nice -n 10 cargo build "${flag[@]}" --locked --quiet "${bins[@]}"
    fi
}

# wait_replica_ready API LOG: until https://API/readyz answers (trusting
# WORK/ca/ca.pem), at most 60 s; else LOG's tail and failure.
wait_replica_ready() {
    local api=$1 log=$2
    for _ in $(seq 600); do
        curl -sf --cacert "$WORK/ca/ca.pem" --max-time 1 -o /dev/null "https://$api/readyz" && return 0
        sleep 0.1
    done
    tail -20 "$log" >&2
    echo "error: the replica at $api is not ready within 60s" >&2
    return 1
}

# wait_proxies_connected API CACERT N BENCH_PID OUT...: until the replica at
# API counts N connected proxies (`pilot_xds` on /metrics, read with
# LODESTAR_TOKEN, trusting CACERT), polled every 0.5 s for at most 600 s;
# fails when the load generator BENCH_PID exits first (printing the files
# OUT...) or time runs out.
wait_proxies_connected() {
    local api=$1 cacert=$2 want=$3 bench=$4 connected=0
    shift 4
    for _ in $(seq 1200); do
        connected=$(curl -s --cacert "$cacert" -H "Authorization: Bearer $LODESTAR_TOKEN" --max-time 2 "https://$api/metrics" | awk '$1 == "pilot_xds" {print int($2)}')
        [ "${connected:-0}" -ge "$want" ] && return 0
        kill -0 "$bench" 2>/dev/null || { cat "$@" >&2; echo "error: lodestar-bench exited" >&2; return 1; }
        sleep 0.5
    done
    echo "error: only ${connected:-0} of $want proxies connected within 600 s" >&2
    return 1
}
