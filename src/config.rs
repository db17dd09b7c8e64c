//! Server configuration: a TOML file, overridden by command-line flags.
//! Every setting is documented in `ops/lodestar.toml`.

use crate::store::types::{NodeId, NodeInfo};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

pub const DEFAULT_API_ADDR: &str = "127.0.0.1:8470";
pub const DEFAULT_RAFT_ADDR: &str = "127.0.0.1:8471";
pub const DEFAULT_XDS_ADDR: &str = "127.0.0.1:8472";
// What the CLI needs to reach a cluster is the client's (`client::config`);
// its old paths stay.
pub use crate::client::config::{expand_home, ClientConfig, DEFAULT_SERVER_URL};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub id: NodeId,
    pub raft_addr: String,
    pub api_addr: String,
    pub xds_addr: String,
}

impl Member {
    pub fn info(&self) -> NodeInfo {
        NodeInfo { raft_addr: self.raft_addr.clone(), api_addr: self.api_addr.clone(), xds_addr: self.xds_addr.clone() }
    }

    /// `ID=RAFT_ADDR,API_ADDR,XDS_ADDR`, as given to `--initial-member`.
    pub fn parse(s: &str) -> Result<Member, String> {
        let err = || format!("{s:?}: expected ID=RAFT_ADDR,API_ADDR,XDS_ADDR");
        let (id, addrs) = s.split_once('=').ok_or_else(err)?;
        let id: NodeId = id.trim().parse().map_err(|_| err())?;
        let parts: Vec<&str> = addrs.split(',').map(str::trim).collect();
        let [raft, api, xds] = parts.as_slice() else { return Err(err()) };
        Ok(Member { id, raft_addr: raft.to_string(), api_addr: api.to_string(), xds_addr: xds.to_string() })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    pub id: NodeId,
    pub data_dir: PathBuf,
    pub api_addr: String,
    pub raft_addr: String,
    pub xds_addr: String,
    /// The founding members. Each one, on a pristine data dir, initialises
    /// the cluster with exactly this list (doing so on several nodes with the
    /// same list is safe). Empty: a single-node cluster of this node.
    pub initial_members: Vec<Member>,
    /// Start empty and wait to be added with `lodestar cluster add-node`
    /// (never initialise a cluster). Use it for new and replacement nodes.
    pub join: bool,
    pub heartbeat_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// Build a snapshot (and allow purging the log) every this many entries.
    pub snapshot_logs: u64,
    /// Log entries kept behind a snapshot, for followers that lag a little.
    pub logs_to_keep: u64,
    /// History retention (`store::retention`): at least this many
    /// revisions, or every revision younger than `history_max_age_s`,
    /// whichever keeps more. Give every replica the same.
    pub history_revisions: u64,
    pub history_max_age_s: u64,
    /// Cluster-wide revert (`api::revert`): a revision a proxy of this
    /// replica NACKs within `revert_on_nack_window_s` of its write is
    /// rolled back by a new revision, as `apply --revert-on-nack` does.
    pub revert_on_nack: bool,
    pub revert_on_nack_window_s: u64,
    /// Largest accepted API request body.
    pub max_body_bytes: usize,
    /// sled's page cache (see `store::open_db`).
    pub store_cache_bytes: u64,
    /// How long a write may wait for a leader and a quorum.
    pub write_timeout_ms: u64,
    /// Group commit: under load, how long a batch of writes may wait for
    /// the writes answered with the previous batch to come back and join
    /// it (see `node::batcher`). 0: never wait.
    pub group_commit_wait_us: u64,
    /// DNS suffix of short names: `reviews` in `default` is
    /// `reviews.default.svc.DOMAIN_SUFFIX`.
    pub domain_suffix: String,
    /// Namespace whose Sidecar and DestinationRules apply mesh-wide.
    pub root_namespace: String,
    /// A directory of YAML/JSON resources to keep the store in step with
    /// (a GitOps checkout): see `adapters::directory`.
    pub watch_dir: Option<PathBuf>,
    /// How often the watched directory is scanned for changes.
    pub watch_dir_poll_ms: u64,
    /// Ready (`/readyz`, new xDS streams) only while this replica has
    /// confirmed within this bound that it is current with the leader.
    pub ready_max_lag_ms: u64,
    /// How long a reconnecting Envoy's stream waits for this replica to
    /// catch up before it is sent elsewhere.
    pub xds_fence_timeout_ms: u64,
    /// Close each xDS stream after about this long (± 10%); 0: never.
    pub xds_max_stream_age_s: u64,
    /// Shed xDS streams above the fair share; 0: never rebalance.
    pub xds_rebalance_interval_ms: u64,
    /// xDS streams this replica serves at once; more are refused with
    /// RESOURCE_EXHAUSTED (the Envoy retries, reaching another replica as
    /// its bootstrap rotates) and counted in
    /// `lodestar_xds_streams_refused_total{reason="stream_limit"}`. An idle
    /// stream takes about 34 KiB (benches/RESULTS.md). 0: no limit.
    pub xds_max_streams: usize,
    /// Bytes of incomplete xDS requests held across all streams (each
    /// stream is also held to one 4 MiB request); a stream whose request
    /// would take more ends with RESOURCE_EXHAUSTED, counted as
    /// `reason="request_buffer_full"`. 0: no limit.
    pub xds_max_buffered_request_bytes: usize,
    /// xDS streams one credential (a proxy token, a workload certificate's
    /// identity, a management token) may have open on this replica, so
    /// that one credential cannot take every place of `xds_max_streams`;
    /// more are refused with RESOURCE_EXHAUSTED, counted as
    /// `reason="credential_quota"`. 0: no limit.
    pub xds_max_streams_per_credential: usize,
    /// The same per source address (the TCP peer's), above the
    /// per-credential one: a host runs the proxies of several namespaces,
    /// and one credential filling its quota leaves room for the others
    /// there. Counted as `reason="source_quota"`. Behind a NAT or a proxy
    /// that hides the proxies' addresses, raise it (or 0: no limit).
    pub xds_max_streams_per_source: usize,
    /// What one xDS stream's subscribed resource names may hold, every
    /// type together: each name counts its length plus 64 bytes. About
    /// 8,000 names of 60 bytes in the default; a stream over it ends with
    /// RESOURCE_EXHAUSTED, counted as `reason="subscription_limit"`.
    /// 0: no limit (each type is still held to 100,000 names).
    pub xds_max_subscription_bytes: usize,
    /// Connections open at once on each port, TLS handshakes included, and
    /// of them from one source address (an IPv6 client: its /64). Past
    /// either, a new connection is closed as it is accepted, and counted in
    /// `lodestar_connections_refused_total{port, reason="port_limit" |
    /// "source_limit"}`. 0: no limit.
    pub api_max_connections: usize,
    pub api_max_connections_per_source: usize,
    pub xds_max_connections: usize,
    pub xds_max_connections_per_source: usize,
    pub raft_max_connections: usize,
    pub raft_max_connections_per_source: usize,
    /// A TLS handshake that takes longer is dropped (every port).
    pub tls_handshake_timeout_ms: u64,
    /// HTTP/1.1 on the API port: a request whose headers take longer to
    /// arrive is dropped with its connection. 0: no limit.
    pub http_header_read_timeout_ms: u64,
    /// A connection to the API or xDS port with no request in progress for
    /// this long is closed. An open xDS stream or watch is a request in
    /// progress, however quiet, so Envoys' streams are never cut; a client
    /// that connects and sends nothing, or dribbles its request's headers,
    /// is. 0: never.
    pub conn_idle_timeout_ms: u64,
    /// Adaptive debounce window: isolated changes are pushed at once,
    /// bursts at most once per window (see `xds::push`). 0: every revision.
    pub push_debounce_ms: u64,
    /// Enforce ACLs (the default): every API request but `/healthz` and
    /// `/readyz` needs a token or client certificate allowed to do what it
    /// asks, and every xDS stream a proxy credential for the identity it
    /// claims. `insecure` turns them off too.
    pub acl_enabled: bool,
    /// A file holding a secret that is a management token on this replica
    /// (Consul's `initial_management`); give every replica the same file.
    pub initial_management_token_file: Option<PathBuf>,
    /// Where the audit log (JSON lines) goes when ACLs are on; `-`:
    /// stderr. Unset or empty: stderr, but under systemd its own file
    /// (see [`ServerConfig::audit_log_path`]).
    pub audit_log: Option<PathBuf>,
    /// Plaintext on every port, no client certificates, no credentials:
    /// for experiments only (logged loudly at startup).
    pub insecure: bool,
    /// Also serve `/metrics` and `/debug/*` (read-only) on this address,
    /// plaintext and without a token: for a Prometheus or an operator on
    /// the same host. Must be a loopback address.
    pub metrics_addr: Option<String>,
    /// This replica's certificate chain and key (PEM). Unset: generated on
    /// first start in `<data_dir>/tls/` from the CA.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// The CA bundle peers' and clients' certificates are checked against.
    /// Unset: `<data_dir>/tls/ca.pem`.
    pub tls_ca_file: Option<PathBuf>,
    /// The cluster CA's key, to issue this replica's certificate on first
    /// start (with `tls_ca_file`: a CA shared by every member, from
    /// `lodestar tls ca create`). Unset, on a single-node cluster: a new CA
    /// is generated in `<data_dir>/tls/`.
    pub tls_ca_key_file: Option<PathBuf>,
    /// More names or IPs for the generated certificate (besides its
    /// member name, localhost and the addresses it listens on).
    pub tls_hosts: Vec<String>,
    /// The API requires a client certificate from the CA (as Consul's
    /// `verify_incoming`); without it, one is accepted but not required.
    pub verify_incoming: bool,
    /// How often the certificate files are checked for changes (new
    /// connections get the new files; open ones keep theirs).
    pub tls_reload_interval_ms: u64,
    /// Also write the CLI's client config here on first start (as k3s
    /// writes its kubeconfig), unless a person wrote the file there: one an
    /// earlier cluster's first start wrote is replaced. Empty: only
    /// `<data_dir>/client.toml`. `~` is the home directory.
    pub user_client_config: Option<PathBuf>,
    /// The mesh CA (workload certificates), Istio's `cacerts` layout:
    /// ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem. The same
    /// files on every member. Unset: `<data_dir>/mesh-ca`, generated on a
    /// single node's first start; a cluster of several members without it
    /// issues no workload certificates.
    pub mesh_ca_dir: Option<PathBuf>,
    /// The SPIFFE trust domain of workload identities.
    pub trust_domain: String,
    /// A workload certificate's lifetime when the request names none.
    pub workload_cert_ttl_s: u64,
    /// The longest lifetime a workload certificate is given.
    pub workload_cert_max_ttl_s: u64,
    /// Certificate requests worked on at once per replica; more wait in
    /// line (see `ca_max_queue_wait_ms`).
    pub ca_max_in_flight: usize,
    /// The longest a certificate request waits in line before it is
    /// answered RESOURCE_EXHAUSTED (retry later), capped at half the
    /// caller's own deadline (`grpc-timeout`).
    pub ca_max_queue_wait_ms: u64,
    /// How often each RequestAuthentication `jwksUri` is fetched again
    /// (Istio's `PILOT_JWT_PUB_KEY_REFRESH_INTERVAL`, 20 minutes).
    pub jwks_refresh_interval_s: u64,
    /// CA certificates (PEM) that https `jwksUri` servers are verified
    /// against. Unset: the system's bundle (`/etc/ssl/certs/ca-certificates.crt`
    /// or `/etc/pki/tls/certs/ca-bundle.crt`).
    pub jwks_ca_file: Option<PathBuf>,
}

impl ServerConfig {
    /// Whether ACLs are enforced: on unless turned off or `insecure`.
    pub fn acls_on(&self) -> bool {
        self.acl_enabled && !self.insecure
    }

    /// The audit log's file (None: stderr). Unset, under systemd
    /// (`systemd` is `Some`, with `$LOGS_DIRECTORY` if the unit has
    /// `LogsDirectory=`): `$LOGS_DIRECTORY/audit.jsonl`, else
    /// `<data_dir>/audit.jsonl`, so its JSON lines never mix with the human
    /// log in the journal.
    pub fn audit_log_path(&self, systemd: Option<Option<PathBuf>>) -> Option<PathBuf> {
        match self.audit_log.as_deref().filter(|p| !p.as_os_str().is_empty()) {
            Some(p) if p == std::path::Path::new("-") => None,
            Some(p) => Some(p.to_path_buf()),
            None => systemd.map(|logs| logs.filter(|d| !d.as_os_str().is_empty()).unwrap_or_else(|| self.data_dir.clone()).join("audit.jsonl")),
        }
    }

    /// The connection limits of `port` (see `tls::conn`).
    pub fn connection_limits(&self, port: crate::tls::Port) -> crate::tls::conn::Limits {
        use crate::tls::Port;
        let (max, per_source) = match port {
            Port::Api => (self.api_max_connections, self.api_max_connections_per_source),
            Port::Xds => (self.xds_max_connections, self.xds_max_connections_per_source),
            Port::Raft => (self.raft_max_connections, self.raft_max_connections_per_source),
        };
        let idle = std::time::Duration::from_millis(self.conn_idle_timeout_ms);
        crate::tls::conn::Limits {
            max,
            per_source,
            handshake_timeout: std::time::Duration::from_millis(self.tls_handshake_timeout_ms),
            // Members only (mutual TLS at the handshake); their channels
            // may rest between forwarded writes.
            idle_timeout: (port != Port::Raft && !idle.is_zero()).then_some(idle),
        }
    }

    /// The mesh-wide settings translation reads.
    /// What the ACLs take (`auth::acl::AclOptions`); the audit log's path
    /// as it is under systemd when run by it.
    pub fn acl_options(&self) -> crate::auth::acl::AclOptions {
        let systemd = std::env::var_os("INVOCATION_ID").map(|_| std::env::var_os("LOGS_DIRECTORY").map(PathBuf::from));
        crate::auth::acl::AclOptions {
            enabled: self.acls_on(),
            replica: self.id,
            initial_management_token_file: self.initial_management_token_file.clone(),
            audit_log: self.audit_log_path(systemd),
            domain_suffix: self.domain_suffix.clone(),
        }
    }

    /// History retention (`store::retention`).
    pub fn retention(&self) -> crate::store::retention::Retention {
        crate::store::retention::Retention { revisions: self.history_revisions, max_age_ms: self.history_max_age_s.saturating_mul(1000) }
    }

    /// What the node takes (`node::NodeOptions`).
    pub fn node_options(&self) -> crate::node::NodeOptions {
        crate::node::NodeOptions {
            id: self.id,
            info: self.node_info(),
            group_commit_wait_us: self.group_commit_wait_us,
            write_timeout_ms: self.write_timeout_ms,
            data_dir: Some(self.data_dir.clone()),
        }
    }

    pub fn mesh_config(&self) -> crate::translate::mesh::MeshConfig {
        crate::translate::mesh::MeshConfig {
            domain_suffix: self.domain_suffix.clone(),
            root_namespace: self.root_namespace.clone(),
            trust_domain: self.trust_domain.clone(),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            id: 1,
            data_dir: PathBuf::from("./lodestar-data"),
            api_addr: DEFAULT_API_ADDR.into(),
            raft_addr: DEFAULT_RAFT_ADDR.into(),
            xds_addr: DEFAULT_XDS_ADDR.into(),
            initial_members: Vec::new(),
            watch_dir: None,
            watch_dir_poll_ms: 1000,
            ready_max_lag_ms: 2000,
            xds_fence_timeout_ms: 5000,
            xds_max_stream_age_s: 1800,
            xds_rebalance_interval_ms: 1000,
            xds_max_streams: 20_000,
            xds_max_buffered_request_bytes: 64 * 1024 * 1024,
            xds_max_streams_per_credential: 1000,
            xds_max_streams_per_source: 2000,
            xds_max_subscription_bytes: 1024 * 1024,
            push_debounce_ms: 20,
            api_max_connections: 4096,
            api_max_connections_per_source: 256,
            xds_max_connections: 25_000,
            xds_max_connections_per_source: 512,
            raft_max_connections: 256,
            raft_max_connections_per_source: 32,
            tls_handshake_timeout_ms: 10_000,
            http_header_read_timeout_ms: 10_000,
            conn_idle_timeout_ms: 120_000,
            join: false,
            heartbeat_ms: 100,
            election_timeout_min_ms: 500,
            election_timeout_max_ms: 1000,
            snapshot_logs: 10_000,
            logs_to_keep: 1_000,
            history_revisions: 10_000,
            history_max_age_s: 30 * 24 * 3600,
            revert_on_nack: false,
            revert_on_nack_window_s: 300,
            max_body_bytes: 4 * 1024 * 1024,
            store_cache_bytes: crate::store::DEFAULT_CACHE_BYTES,
            write_timeout_ms: 10_000,
            group_commit_wait_us: 5_000,
            domain_suffix: "cluster.local".into(),
            root_namespace: "istio-system".into(),
            acl_enabled: true,
            initial_management_token_file: None,
            audit_log: None,
            insecure: false,
            metrics_addr: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_ca_file: None,
            tls_ca_key_file: None,
            tls_hosts: Vec::new(),
            verify_incoming: false,
            tls_reload_interval_ms: 1000,
            user_client_config: Some(PathBuf::from("~/.config/lodestar/client.toml")),
            mesh_ca_dir: None,
            trust_domain: "cluster.local".into(),
            workload_cert_ttl_s: 24 * 3600,
            workload_cert_max_ttl_s: 90 * 24 * 3600,
            ca_max_in_flight: 256,
            ca_max_queue_wait_ms: 4000,
            jwks_refresh_interval_s: 20 * 60,
            jwks_ca_file: None,
        }
    }
}

impl ServerConfig {
    pub fn from_toml(text: &str) -> Result<ServerConfig, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    pub fn node_info(&self) -> NodeInfo {
        NodeInfo { raft_addr: self.raft_addr.clone(), api_addr: self.api_addr.clone(), xds_addr: self.xds_addr.clone() }
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.id == 0 {
            return Err("id: must be at least 1".into());
        }
        if !self.initial_members.is_empty() && !self.initial_members.iter().any(|m| m.id == self.id) {
            return Err(format!("initial_members: does not include this node's id {}", self.id));
        }
        if self.election_timeout_min_ms <= self.heartbeat_ms || self.election_timeout_max_ms <= self.election_timeout_min_ms {
            return Err("election timeouts must satisfy heartbeat_ms < election_timeout_min_ms < election_timeout_max_ms".into());
        }
        for (name, addr) in [("api_addr", &self.api_addr), ("raft_addr", &self.raft_addr), ("xds_addr", &self.xds_addr)] {
            addr.parse::<std::net::SocketAddr>().map_err(|e| format!("{name}: {addr:?}: {e}"))?;
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            return Err("tls_cert_file and tls_key_file: give both or neither".into());
        }
        if self.tls_handshake_timeout_ms == 0 {
            return Err("tls_handshake_timeout_ms: must be at least 1".into());
        }
        if self.ca_max_in_flight == 0 {
            return Err("ca_max_in_flight: must be at least 1".into());
        }
        if let Some(addr) = &self.metrics_addr {
            let a: std::net::SocketAddr = addr.parse().map_err(|e| format!("metrics_addr: {addr:?}: {e}"))?;
            if !a.ip().is_loopback() {
                return Err(format!("metrics_addr: {addr:?} is not a loopback address; it serves metrics and debug output without credentials, so it may only be reached from this host"));
            }
        }
        if self.history_revisions == 0 {
            return Err("history_revisions: must be at least 1".into());
        }
        if self.revert_on_nack && self.revert_on_nack_window_s == 0 {
            return Err("revert_on_nack_window_s: must be at least 1 with revert_on_nack".into());
        }
        if self.jwks_refresh_interval_s == 0 {
            return Err("jwks_refresh_interval_s: must be at least 1".into());
        }
        if self.workload_cert_ttl_s == 0 || self.workload_cert_max_ttl_s < self.workload_cert_ttl_s {
            return Err("workload_cert_ttl_s, workload_cert_max_ttl_s: need 0 < workload_cert_ttl_s <= workload_cert_max_ttl_s".into());
        }
        if self.trust_domain.is_empty() || self.trust_domain.contains(['/', ':']) || self.trust_domain.chars().any(|c| c.is_whitespace()) {
            return Err(format!("trust_domain: {:?} is not a trust domain (a DNS-like name, no '/' or ':')", self.trust_domain));
        }
        if self.insecure && self.verify_incoming {
            return Err("verify_incoming: needs TLS, and insecure turns it off".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_flag() {
        let m = Member::parse("2=127.0.0.1:1,127.0.0.1:2,127.0.0.1:3").unwrap();
        assert_eq!((m.id, m.api_addr.as_str()), (2, "127.0.0.1:2"));
        assert!(Member::parse("x=1,2,3").is_err());
        assert!(Member::parse("1=a,b").is_err());
    }

    #[test]
    fn audit_log_apart_under_systemd() {
        let mut c = ServerConfig { data_dir: PathBuf::from("/var/lib/lodestar"), ..Default::default() };
        assert_eq!(c.audit_log_path(None), None, "stderr, interactively");
        assert_eq!(c.audit_log_path(Some(None)), Some(PathBuf::from("/var/lib/lodestar/audit.jsonl")));
        assert_eq!(c.audit_log_path(Some(Some("/var/log/lodestar".into()))), Some(PathBuf::from("/var/log/lodestar/audit.jsonl")));
        c.audit_log = Some("-".into());
        assert_eq!(c.audit_log_path(Some(None)), None, "- is stderr, also under systemd");
        c.audit_log = Some("/a.jsonl".into());
        assert_eq!(c.audit_log_path(None), Some(PathBuf::from("/a.jsonl")));
    }

    #[test]
    fn toml_file() {
        let c = ServerConfig::from_toml(
            "id = 2\ndata_dir = \"/tmp/x\"\n[[initial_members]]\nid = 2\nraft_addr = \"127.0.0.1:1\"\napi_addr = \"127.0.0.1:2\"\nxds_addr = \"127.0.0.1:3\"\n",
        )
        .unwrap();
        assert_eq!(c.id, 2);
        assert_eq!(c.heartbeat_ms, 100);
        c.validate().unwrap();
        assert!(ServerConfig::from_toml("bogus = 1").unwrap_err().contains("bogus"));
    }
}

#[cfg(test)]
mod reference_file {
    /// ops/lodestar.toml documents every setting with its default value.
    #[test]
    fn ops_config_parses_to_the_defaults() {
        let text = include_str!("../ops/lodestar.toml");
        let parsed = super::ServerConfig::from_toml(text).unwrap();
        let defaults = super::ServerConfig::default();
        assert_eq!(format!("{parsed:?}"), format!("{defaults:?}"));
    }
}
