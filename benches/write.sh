#!/usr/bin/env bash
# Write benchmark, side by side in one run, each a three-node cluster on
# loopback, same machine, same client (`lodestar-bench write`), same
# concurrency, same ~1 KiB values:
#
#   lodestar   Lodestar as it starts by default: TLS on every port (one
#              cluster CA), ACLs on (the client sends a management token)
#   insecure   the same binary with --insecure: plaintext, no ACLs
#   etcd       etcd 3.4 secured as its docs say: client and peer TLS with
#              certificates from a CA, --client-cert-auth,
#              --peer-client-cert-auth, and `etcdctl auth enable` with a root
#              user; the client presents a certificate (whose CN is no etcd
#              user, so only the token can authorize it), calls
#              Auth.Authenticate once per connection and sends the token
#              on every Put
#
# Every write is checked acknowledged (Lodestar: a revision and a change;
# etcd: a revision in the Put response header). Rounds alternate the three
# targets (the order rotates each round), since the shared machine drifts.
#
#   benches/write.sh [SECONDS_PER_LEVEL]          (default 10)
#
# A/B against another build (e.g. an older commit's release binary):
#
#   BENCH_BASELINE=/path/to/old/lodestar benches/write.sh
#
# replaces the insecure and etcd targets with `baseline`: a second secure
# cluster (same settings, same client) running that binary, alternating
# with this build's.
#
# Environment:
#   BENCH_ROUNDS=3         rounds
#   BENCH_CLIENTS="1 16 64" concurrency levels
#   BENCH_SIZE=1024        value size in bytes
#   BENCH_API=grpc         Lodestar client API: grpc | rest
#   BENCH_PORT_BASE=19400  first of the loopback ports used (24 of them)
#   BENCH_LODESTAR, BENCH_CLIENT  release binaries of lodestar and
#                          lodestar-bench to use instead of building the tree
#   BENCH_KEEP=1           keep the temp dir (data and logs) after the run
#
# Needs: cargo, curl, openssl, and etcd + etcdctl (Debian's etcd-server and
# etcd-client; installed with apt-get when missing and running as root).
# Every step is bounded in time; every process started here is killed on
# exit.
set -euo pipefail

SECS=${1:-${BENCH_SECONDS:-10}}
ROUNDS=${BENCH_ROUNDS:-3}
LEVELS=${BENCH_CLIENTS:-"1 16 64"}
SIZE=${BENCH_SIZE:-1024}
API=${BENCH_API:-grpc}
PORT=${BENCH_PORT_BASE:-19400}
BASELINE=${BENCH_BASELINE:-}
if [ -n "$BASELINE" ]; then
    [ -x "$BASELINE" ] || { echo "error: BENCH_BASELINE=$BASELINE is not an executable" >&2; exit 2; }
    TARGETS=(lodestar baseline)
else
    TARGETS=(lodestar insecure etcd)
fi

cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lodestar-bench.XXXXXX")
PIDS=()

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for _ in $(seq 50); do
        local alive=0
        for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    # Reap them here, quietly: bash would otherwise report each one killed.
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [ "${BENCH_KEEP:-0}" = 1 ] || [ "$rc" != 0 ]; then
        echo "# data and logs kept in $WORK" >&2
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

die() { echo "error: $*" >&2; exit 1; }

# Poll URL until it answers 200, at most $2 seconds; further args go to curl.
wait_ok() {
    local url=$1 limit=$2 i
    shift 2
    for i in $(seq $((limit * 10))); do
        [ "$(curl -s "$@" -o /dev/null -w '%{http_code}' --max-time 1 "$url" || true)" = 200 ] && return 0
        sleep 0.1
    done
    return 1
}

# (a) build
if [ -n "${BENCH_LODESTAR:-}" ] && [ -n "${BENCH_CLIENT:-}" ]; then
    # Given builds (e.g. saved release binaries of two commits): no build.
    cp "$BENCH_LODESTAR" "$WORK/lodestar"
    cp "$BENCH_CLIENT" "$WORK/lodestar-bench"
else
    echo "# building lodestar and lodestar-bench (release)" >&2
    timeout 3600 cargo build --release --quiet --bin lodestar --bin lodestar-bench
    # Copies: a concurrent build must not swap a binary under the benchmark.
    cp "$ROOT/target/release/lodestar" "$ROOT/target/release/lodestar-bench" "$WORK/"
fi
[ -z "$BASELINE" ] || cp "$BASELINE" "$WORK/lodestar-baseline"
LODESTAR=$WORK/lodestar
BENCH=$WORK/lodestar-bench
# Secure by default: one cluster CA for the three replicas (each issues its
# own certificate from it), trusted by curl and by lodestar-bench; etcd's
# certificates come from the same CA.
CA=$WORK/ca
"$LODESTAR" tls ca create --dir "$CA" >/dev/null
printf 'tls_ca_file = "%s"\ntls_ca_key_file = "%s"\nuser_client_config = ""\n' "$CA/ca.pem" "$CA/ca-key.pem" >>"$WORK/tls.toml"
# ACLs are on by default: one management token for the replicas, sent by
# curl and by lodestar-bench (LODESTAR_TOKEN).
(umask 077; od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$CA/management.token")
printf 'initial_management_token_file = "%s"\n' "$CA/management.token" >>"$WORK/tls.toml"
LODESTAR_TOKEN=$(cat "$CA/management.token")
# --insecure: no TLS, no ACLs, and no client config written anywhere.
printf 'user_client_config = ""\n' >"$WORK/insecure.toml"
# lodestar-bench against the insecure cluster: no CA, no token, and an
# empty client config so that none found on this machine applies.
: >"$WORK/empty-client.toml"

# etcd's certificates, from the same CA: one for the members (server and
# peer, both directions; all of them are on 127.0.0.1), one for clients.
issue() {
    local name=$1 cn=$2 eku=$3 ext
    ext=$WORK/$name.ext
    printf 'basicConstraints = CA:FALSE\nkeyUsage = critical, digitalSignature, keyEncipherment\nextendedKeyUsage = %s\nsubjectAltName = IP:127.0.0.1, DNS:localhost\n' "$eku" >"$ext"
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$CA/$name-key.pem" 2>/dev/null
    openssl req -new -key "$CA/$name-key.pem" -subj "/CN=$cn" -out "$WORK/$name.csr" 2>/dev/null
    openssl x509 -req -in "$WORK/$name.csr" -CA "$CA/ca.pem" -CAkey "$CA/ca-key.pem" -CAcreateserial -days 2 \
        -extfile "$ext" -out "$CA/$name.pem" 2>/dev/null
    chmod 600 "$CA/$name-key.pem"
}
issue etcd-member etcd-member serverAuth,clientAuth
# Not an etcd user: with the CN alone (no token) etcd would refuse the Put.
issue etcd-client lodestar-bench clientAuth
ETCD_TLS=(--cacert "$CA/ca.pem" --cert "$CA/etcd-client.pem" --key "$CA/etcd-client-key.pem")
ETCD_PASSWORD=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')

if [ -z "$BASELINE" ] && { ! command -v etcd >/dev/null || ! command -v etcdctl >/dev/null; }; then
    [ "$(id -u)" = 0 ] || die "etcd or etcdctl not found; install Debian's etcd-server and etcd-client"
    echo "# installing etcd-server, etcd-client" >&2
    timeout 600 apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq etcd-server etcd-client >&2
fi
ETCD_VERSION=$(etcd --version 2>/dev/null | sed -n 1p || true)

# (b) two Lodestar clusters, secure default and --insecure: 9 ports each.
# Sets C_API etc. for cluster $1 (lodestar | insecure).
L_API=() L_RAFT=() L_XDS=() I_API=() I_RAFT=() I_XDS=()
for n in 1 2 3; do
    L_API+=("127.0.0.1:$((PORT + n * 3 - 3))")
    L_RAFT+=("127.0.0.1:$((PORT + n * 3 - 2))")
    L_XDS+=("127.0.0.1:$((PORT + n * 3 - 1))")
    I_API+=("127.0.0.1:$((PORT + 9 + n * 3 - 3))")
    I_RAFT+=("127.0.0.1:$((PORT + 9 + n * 3 - 2))")
    I_XDS+=("127.0.0.1:$((PORT + 9 + n * 3 - 1))")
done
start_lodestar() {
    local name=$1 config=$2 n bin=$LODESTAR
    local -n api=$3 raft=$4 xds=$5
    shift 5
    [ "$name" = baseline ] && bin=$WORK/lodestar-baseline
    local members=()
    for n in 1 2 3; do members+=(--initial-member "$n=${raft[n - 1]},${api[n - 1]},${xds[n - 1]}"); done
    for n in 1 2 3; do
        RUST_LOG=warn "$bin" server --config "$config" --id "$n" --data-dir "$WORK/$name-$n" \
            --api-addr "${api[n - 1]}" --raft-addr "${raft[n - 1]}" --xds-addr "${xds[n - 1]}" \
            "${members[@]}" "$@" >"$WORK/$name-$n.log" 2>&1 &
        PIDS+=($!)
    done
}
start_lodestar lodestar "$WORK/tls.toml" L_API L_RAFT L_XDS
if [ -n "$BASELINE" ]; then
    # The baseline cluster on the insecure cluster's ports, secured alike.
    start_lodestar baseline "$WORK/tls.toml" I_API I_RAFT I_XDS
else
    start_lodestar insecure "$WORK/insecure.toml" I_API I_RAFT I_XDS --insecure
fi

if [ -z "$BASELINE" ]; then
    # (c) three etcd members, TLS everywhere, client certificates required.
    E_CLIENT=() E_PEER=()
    for n in 1 2 3; do
        E_CLIENT+=("https://127.0.0.1:$((PORT + 18 + n * 2 - 2))")
        E_PEER+=("https://127.0.0.1:$((PORT + 18 + n * 2 - 1))")
    done
    CLUSTER="e1=${E_PEER[0]},e2=${E_PEER[1]},e3=${E_PEER[2]}"
    for n in 1 2 3; do
        etcd --name "e$n" --data-dir "$WORK/etcd-$n" \
            --listen-client-urls "${E_CLIENT[n - 1]}" --advertise-client-urls "${E_CLIENT[n - 1]}" \
            --listen-peer-urls "${E_PEER[n - 1]}" --initial-advertise-peer-urls "${E_PEER[n - 1]}" \
            --initial-cluster "$CLUSTER" --initial-cluster-token lodestar-bench --initial-cluster-state new \
            --cert-file "$CA/etcd-member.pem" --key-file "$CA/etcd-member-key.pem" \
            --trusted-ca-file "$CA/ca.pem" --client-cert-auth \
            --peer-cert-file "$CA/etcd-member.pem" --peer-key-file "$CA/etcd-member-key.pem" \
            --peer-trusted-ca-file "$CA/ca.pem" --peer-client-cert-auth \
            --logger zap --log-level warn >"$WORK/etcd-$n.log" 2>&1 &
        PIDS+=($!)
    done
fi

for n in 1 2 3; do
    wait_ok "https://${L_API[n - 1]}/readyz" 60 --cacert "$CA/ca.pem" || { tail -20 "$WORK/lodestar-$n.log" >&2; die "lodestar $n not ready within 60s"; }
    if [ -n "$BASELINE" ]; then
        wait_ok "https://${I_API[n - 1]}/readyz" 60 --cacert "$CA/ca.pem" || { tail -20 "$WORK/baseline-$n.log" >&2; die "baseline lodestar $n not ready within 60s"; }
        continue
    fi
    wait_ok "http://${I_API[n - 1]}/readyz" 60 || { tail -20 "$WORK/insecure-$n.log" >&2; die "insecure lodestar $n not ready within 60s"; }
    wait_ok "${E_CLIENT[n - 1]}/health" 60 "${ETCD_TLS[@]}" || { tail -20 "$WORK/etcd-$n.log" >&2; die "etcd $n not healthy within 60s"; }
done
# Plaintext to the secure ones must fail (a sanity check of the setup).
curl -s --max-time 2 -o /dev/null "http://${L_API[0]}/readyz" && die "lodestar answered plaintext HTTP"
[ -n "$BASELINE" ] || { curl -s --max-time 2 -o /dev/null "${E_CLIENT[0]/https:/http:}/health" && die "etcd answered plaintext HTTP"; }

if [ -z "$BASELINE" ]; then
    # etcd auth: a root user, then `auth enable` (etcd's documented way).
    ETCDCTL=(env ETCDCTL_API=3 timeout 30 etcdctl --endpoints "$(IFS=,; echo "${E_CLIENT[*]}")" "${ETCD_TLS[@]}")
    "${ETCDCTL[@]}" user add "root:$ETCD_PASSWORD" >/dev/null || die "etcdctl user add root failed"
    "${ETCDCTL[@]}" auth enable >/dev/null || die "etcdctl auth enable failed"
    # Auth is on: a put without credentials is refused, one as root works.
    "${ETCDCTL[@]}" put /bench/probe x >/dev/null 2>&1 && die "etcd accepted a put without credentials after auth enable"
    "${ETCDCTL[@]}" --user "root:$ETCD_PASSWORD" put /bench/probe x >/dev/null || die "etcd refused root's put"
fi
echo "# ${#TARGETS[@]} clusters ready; $ROUNDS rounds x {$LEVELS} clients x ${SECS}s, ${TARGETS[*]} alternating" >&2

# Which replica leads matters for one client: it talks to the first one
# listed, and pays the hop to the leader when that is a follower. Every
# target lists its leader first, so a single client writes to the leader
# (clients are spread round robin, so 16 and 64 are unaffected).
leader_of() { curl -s "$@" --max-time 2 | sed -n 's/.*"leader":\([0-9]*\).*/\1/p'; }
L_LEADER=$(leader_of --cacert "$CA/ca.pem" -H "Authorization: Bearer $LODESTAR_TOKEN" "https://${L_API[0]}/v1/node")
if [ -n "$BASELINE" ]; then
    I_LEADER=$(leader_of --cacert "$CA/ca.pem" -H "Authorization: Bearer $LODESTAR_TOKEN" "https://${I_API[0]}/v1/node")
else
    I_LEADER=$(leader_of "http://${I_API[0]}/v1/node")
fi
E_LEADER=
for n in 1 2 3; do
    [ -z "$BASELINE" ] || break
    st=$("${ETCDCTL[@]}" --user "root:$ETCD_PASSWORD" --endpoints "${E_CLIENT[n - 1]}" endpoint status -w json 2>/dev/null || true)
    me=$(echo "$st" | sed -n 's/.*"member_id":\([0-9]*\).*/\1/p')
    lead=$(echo "$st" | sed -n 's/.*"leader":\([0-9]*\).*/\1/p')
    [ -n "$me" ] && [ "$me" = "$lead" ] && E_LEADER=$n
done

# The list with member $1 (1-based, may be empty) first.
leader_first() {
    local first=$1 i
    shift
    local all=("$@")
    [ -n "$first" ] && printf '%s,' "${all[first - 1]}"
    for i in "${!all[@]}"; do [ "$((i + 1))" = "$first" ] || printf '%s,' "${all[i]}"; done
}
declare -A SERVERS
SERVERS[lodestar]=$(leader_first "$L_LEADER" "${L_API[@]/#/https://}")
SERVERS[insecure]=$(leader_first "$I_LEADER" "${I_API[@]/#/http://}")
SERVERS[baseline]=$(leader_first "$I_LEADER" "${I_API[@]/#/https://}")
SERVERS[etcd]=$(leader_first "$E_LEADER" "${E_CLIENT[@]}")

# (d) alternate: every level on each target, the order rotating per round.
# Rows: target round clients writes writes/s p50 p99 max errors other_cpu%
RESULTS=$WORK/results.tsv
: >"$RESULTS"

# CPU accounting, to tell whether something else competed for the machine:
# busy jiffies of the whole machine, minus those of the clusters and of
# this script's children (the bench client), as a share of all cores. Kernel
# threads count as "other": etcd's fdatasyncs alone show as 5-10% (journal
# commits), so only 15% and more is flagged.
machine_busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
ours() {
    local sum=0 pid
    for pid in "${PIDS[@]}"; do
        [ -r "/proc/$pid/stat" ] && sum=$((sum + $(awk '{ print $14 + $15 }' "/proc/$pid/stat")))
    done
    echo $((sum + $(awk '{ print $16 + $17 }' /proc/$$/stat)))
}
TICKS=$(getconf CLK_TCK)
CORES=$(nproc)

# The bench command for target $1 (printed in the report, then run).
bench_cmd() {
    case $1 in
        lodestar | baseline) echo env LODESTAR_CACERT="$CA/ca.pem" LODESTAR_TOKEN=\$LODESTAR_TOKEN "$BENCH" write --target lodestar --api "$API" ;;
        insecure) echo env -u LODESTAR_CACERT -u LODESTAR_TOKEN LODESTAR_CONFIG="$WORK/empty-client.toml" "$BENCH" write --target lodestar --api "$API" ;;
        etcd) echo env -u LODESTAR_TOKEN LODESTAR_CACERT="$CA/ca.pem" LODESTAR_BENCH_ETCD_PASSWORD=\$ETCD_PASSWORD "$BENCH" write --target etcd \
            --etcd-cert "$CA/etcd-client.pem" --etcd-key "$CA/etcd-client-key.pem" --etcd-user root ;;
    esac
}

bench() {
    local target=$1 round=$2 clients=$3 servers=${SERVERS[$1]} out busy0 ours0 t0 other cmd
    read -r -a cmd <<<"$(bench_cmd "$target")"
    cmd=("${cmd[@]//\$LODESTAR_TOKEN/$LODESTAR_TOKEN}")
    cmd=("${cmd[@]//\$ETCD_PASSWORD/$ETCD_PASSWORD}")
    busy0=$(machine_busy) ours0=$(ours) t0=$(date +%s%N)
    out=$(timeout $((SECS + 120)) "${cmd[@]}" --servers "${servers%,}" \
        --clients "$clients" --seconds "$SECS" --size "$SIZE" 2>"$WORK/bench-$target.err") || {
        cat "$WORK/bench-$target.err" >&2
        echo "$out" >&2
        die "bench against $target failed (round $round, $clients clients)"
    }
    other=$(awk -v b="$(($(machine_busy) - busy0))" -v o="$(($(ours) - ours0))" -v ns="$(($(date +%s%N) - t0))" -v hz="$TICKS" -v n="$CORES" \
        'BEGIN { x = 100 * (b - o) / (ns / 1e9 * hz * n); printf "%.0f", x < 0 ? 0 : x }')
    echo "$out" | awk -v t="$target" -v r="$round" -v x="$other" '$1 ~ /^[0-9]+$/ { print t, r, $1, $2, $3, $4, $5, $6, $7, x }' >>"$RESULTS"
    echo "$out" | awk -v t="$target" -v r="$round" -v x="$other" '$1 ~ /^[0-9]+$/ {
        printf "#   round %s %-8s %3s clients: %7s writes/s  p50 %6s ms  p99 %6s ms  errors %s  other load %s%%\n", r, t, $1, $3, $4, $5, $7, x }' >&2
}
for round in $(seq "$ROUNDS"); do
    for c in $LEVELS; do
        for k in "${!TARGETS[@]}"; do
            bench "${TARGETS[(round - 1 + k) % ${#TARGETS[@]}]}" "$round" "$c"
        done
    done
done

# (e) tables and ratios: medians over rounds, and the spread (min..max).
echo
echo "Write benchmark: 3 replicas on loopback per target, ${SIZE}-byte values, ${SECS}s per level, $ROUNDS rounds, targets alternating (order rotated per round); $(nproc) cores"
echo "lodestar: $("$LODESTAR" --version), api=$API;  etcd: ${ETCD_VERSION:-not run}, KV.Put over gRPC"
[ -z "$BASELINE" ] || echo "baseline: $("$WORK/lodestar-baseline" --version) ($BASELINE), secured alike"
echo "  lodestar = secure default (TLS on every port, ACLs on, management token);  insecure = same binary with --insecure (plaintext, no ACLs)"
echo "  etcd = client+peer TLS from a CA, --client-cert-auth, --peer-client-cert-auth, auth enabled (root; token from Auth.Authenticate per connection)"
echo "leaders at the start: lodestar node ${L_LEADER:-?}, insecure node ${I_LEADER:-?}, etcd member ${E_LEADER:-?} (a single client talks to the leader on each)"
echo "commands (servers, clients, seconds and size added per run):"
for target in "${TARGETS[@]}"; do echo "  $target: $(bench_cmd "$target")"; done
echo "(writes/s, p50, p99: median over rounds [min..max]; errors: total;"
echo " other%: most CPU, as a share of the machine, that processes outside the benchmark used during a run)"
MEDIAN='function median(s,   a, n, i, j, t) { n = split(s, a, " "); for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
                                       return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
        function minof(s,   a, n, i, m) { n = split(s, a, " "); m = a[1]; for (i = 2; i <= n; i++) if (a[i] + 0 < m + 0) m = a[i]; return m }
        function maxof(s,   a, n, i, m) { n = split(s, a, " "); m = a[1]; for (i = 2; i <= n; i++) if (a[i] + 0 > m + 0) m = a[i]; return m }'
for target in "${TARGETS[@]}"; do
    echo
    echo "== $target"
    awk -v t="$target" -v levels="$LEVELS" "$MEDIAN"'
        $1 == t { k = $3; n[k]++; w[k] += $4; ws[k] = ws[k] " " $5; p50[k] = p50[k] " " $6; p99[k] = p99[k] " " $7; e[k] += $9; if ($10 > o[k]) o[k] = $10 }
        END {
            printf "%8s %9s %22s %22s %22s %7s %7s\n", "clients", "writes", "writes/s", "p50_ms", "p99_ms", "errors", "other%"
            split(levels, L, " ")
            for (i = 1; i in L; i++) { k = L[i]; if (n[k]) printf "%8s %9d %22s %22s %22s %7d %7d\n", k, w[k],
                sprintf("%.0f [%.0f..%.0f]", median(ws[k]), minof(ws[k]), maxof(ws[k])),
                sprintf("%.2f [%.2f..%.2f]", median(p50[k]), minof(p50[k]), maxof(p50[k])),
                sprintf("%.2f [%.2f..%.2f]", median(p99[k]), minof(p99[k]), maxof(p99[k])), e[k], o[k] }
        }' "$RESULTS"
done
HI=$(echo "$LEVELS" | awk '{ print $NF }')
LO=$(echo "$LEVELS" | awk '{ print $1 }')
echo
awk -v hi="$HI" -v lo="$LO" "$MEDIAN"'
    $3 == hi { w[$1, $2] = $5; ws[$1] = ws[$1] " " $5; if ($2 > maxr) maxr = $2 }
    $3 == lo { p[$1, $2] = $6; ps[$1] = ps[$1] " " $6 }
    $9 > 0 { errors += $9 }
    $10 > maxother { maxother = $10 }
    function ratios(a, b, arr,   r, s) { s = ""; for (r = 1; r <= maxr; r++) if (arr[b, r] > 0 && (a, r) in arr) s = s " " sprintf("%.2f", arr[a, r] / arr[b, r]); return s }
    END {
        if (ws["lodestar"] != "" && ws["etcd"] != "") {
            s = ratios("lodestar", "etcd", w)
            r = median(ws["lodestar"]) / median(ws["etcd"])
            printf "writes/s at %s clients, lodestar/etcd (both secured): %.2fx (medians; per round:%s)  target >= 1.5x: %s\n", hi, r, s, (r >= 1.5 ? "MET" : "NOT MET")
        }
        if (ws["lodestar"] != "" && ws["insecure"] != "") {
            s = ratios("lodestar", "insecure", w)
            printf "writes/s at %s clients, lodestar/insecure (the cost of TLS + ACLs): %.2fx (medians; per round:%s)\n", hi, median(ws["lodestar"]) / median(ws["insecure"]), s
        }
        if (ps["lodestar"] != "" && ps["etcd"] != "") {
            a = median(ps["lodestar"]); b = median(ps["etcd"])
            printf "p50 at %s client(s): lodestar %.2f ms, etcd %.2f ms, lodestar/etcd %.2fx (per round:%s)  target <= 1.0x: %s\n", lo, a, b, a / b, ratios("lodestar", "etcd", p), (a <= b ? "MET" : "NOT MET")
        }
        if (ws["lodestar"] != "" && ws["baseline"] != "") {
            printf "writes/s at %s clients, lodestar/baseline: %.2fx (medians; per round:%s)\n", hi, median(ws["lodestar"]) / median(ws["baseline"]), ratios("lodestar", "baseline", w)
            printf "p50 at %s client(s), lodestar/baseline: %.2fx (medians; per round:%s)\n", lo, median(ps["lodestar"]) / median(ps["baseline"]), ratios("lodestar", "baseline", p)
        }
        if (ps["lodestar"] != "" && ps["insecure"] != "") {
            a = median(ps["lodestar"]); b = median(ps["insecure"])
            printf "p50 at %s client(s): lodestar %.2f ms, insecure %.2f ms, lodestar/insecure %.2fx (per round:%s)\n", lo, a, b, a / b, ratios("lodestar", "insecure", p)
        }
        if (maxother >= 15) printf "WARNING: other processes used up to %d%% of the machine during a run: numbers are disturbed\n", maxother
        if (errors > 0) { printf "UNACKNOWLEDGED WRITES: %d\n", errors; exit 1 }
    }' "$RESULTS"
