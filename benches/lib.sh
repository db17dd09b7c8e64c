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
