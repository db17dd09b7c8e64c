//! `lodestar bootstrap`: print an Envoy v3 bootstrap that connects to the
//! replicas' ADS ports, the way Istio's pilot-agent writes one.
//!
//! - `node.id` is Istio's `TYPE~IP~NAME.NAMESPACE~NAMESPACE.svc.DOMAIN` and
//!   the metadata carries NAMESPACE, NAME, INSTANCE_IPS and LABELS, which is
//!   what the server's `ProxyIdentity::parse` reads.
//! - `xds-grpc` lists every replica: a replica that goes away fails the
//!   stream, and Envoy reconnects (with backoff) to the next one round-robin.
//! - HTTP/2 is explicit on `xds-grpc`: without it Envoy silently never
//!   connects to a gRPC server.
//! - TLS to the xDS port whenever the CLI has the cluster's CA (from its
//!   client config or `--ca-file`): the CA is inlined, and the server's
//!   certificate must name a member (`member-<id>.lodestar`), so a proxy
//!   talks to no one else the CA may have signed.
//! - Envoy's admin listens on loopback (`--ip` if it is a loopback
//!   address, else 127.0.0.1, as Istio's does), since whoever reaches it
//!   reads the whole config and can stop Envoy; `--admin-address` puts it
//!   elsewhere, with a warning.
//! - A proxy token (`--proxy-token-file`) is not written into the
//!   bootstrap: Envoy reads the file itself. `GrpcService.initial_metadata`
//!   takes only literal values (shown by `/config_dump`), so the token is
//!   sent by the `credential_injector` upstream filter of `xds-grpc`,
//!   from a static `generic_secret` whose `filename` is the token file:
//!   secrets are redacted from `/config_dump`, the file name too.
//!
//! With `--grpc` it writes a gRPC xDS bootstrap instead (the file
//! `GRPC_XDS_BOOTSTRAP` names, for proxyless gRPC applications; gRFC A27):
//! `xds_servers` (one per replica, in order: gRPC falls back to the next
//! while the one before is unreachable, but only for resources it has not
//! received yet, A71, so a running client waits for its replica to come
//! back; for failover give one `dns:` target naming every replica, e.g.
//! `--xds-servers dns:///xds.example:7002`, which gRPC re-resolves and
//! reconnects to the next address; the name must be in the replicas'
//! certificates, `tls_hosts`), `server_features: ["xds_v3"]`,
//! and a `node` with GENERATOR `grpc` in its metadata, which the server
//! reads as `ProxyKind::Grpc`. Its credentials are TLS (`"type": "tls"`,
//! A65) checked against the cluster CA, with the workload certificate of
//! `--cert-dir` (a `lodestar agent` directory) as client certificate: the
//! proxy credential on the xDS port. gRPC's only way to send a token from a
//! bootstrap is `call_creds` `jwt_token_file` (A97), which takes JWTs only
//! (the client reads its expiry), and Lodestar's proxy tokens are opaque
//! secrets, so a proxy token is refused with `--grpc` and the mesh-CA
//! certificate is the credential. Never `insecure` when the CLI has the CA.
//!
//! It is a config file, not xDS, so it is plain JSON built with serde_json.

use super::client::Client;
use crate::model::proxy::{ProxyIdentity, ProxyKind};
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use serde_json::{json, Map, Value};
use std::net::IpAddr;

/// The static cluster that carries ADS.
pub const XDS_CLUSTER: &str = "xds-grpc";

#[derive(Args, Debug, Clone)]
pub struct BootstrapArgs {
    /// ADS servers, HOST:PORT[,HOST:PORT...]. Default: every cluster
    /// member's xDS address, asked from --server. With --grpc also a gRPC
    /// `dns:` target naming every replica (`dns:///xds.example:7002`).
    #[arg(long, value_delimiter = ',')]
    pub xds_servers: Vec<String>,
    /// sidecar, or router for a gateway.
    #[arg(long, value_enum, default_value = "sidecar")]
    pub node_type: NodeType,
    /// The proxy's address: where its listeners bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub ip: String,
    /// Workload name (e.g. productpage-v1).
    #[arg(long)]
    pub name: String,
    /// The workload's namespace: its config and the identity it claims.
    #[arg(long, default_value = crate::model::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// A workload label, KEY=VALUE; repeat for each.
    #[arg(long = "label", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Envoy's admin port.
    #[arg(long, default_value_t = 15000)]
    pub admin_port: u16,
    /// Where Envoy's admin listens. Default: --ip if it is a loopback
    /// address, else 127.0.0.1. The admin serves the whole config
    /// (/config_dump) and stops Envoy (/quitquitquit) for whoever reaches
    /// it: any other address warns.
    #[arg(long, value_name = "IP")]
    pub admin_address: Option<String>,
    /// The mesh's DNS suffix (the replicas' domain_suffix).
    #[arg(long, default_value = "cluster.local")]
    pub domain_suffix: String,
    /// Use incremental xDS (DELTA_GRPC) instead of state of the world.
    #[arg(long)]
    pub delta: bool,
    /// A file holding this proxy's token (`lodestar token create --proxy
    /// NAMESPACE[/NAME]`), sent on the xDS stream as gRPC metadata
    /// `authorization: Bearer <secret>`. Envoy reads the file itself (the
    /// bootstrap names it, never holds the secret): keep it readable by
    /// Envoy only.
    #[arg(long, env = "LODESTAR_PROXY_TOKEN_FILE")]
    pub proxy_token_file: Option<std::path::PathBuf>,
    /// Without --proxy-token-file: make no proxy token either, and write
    /// no credential (the xDS port then refuses the proxy while ACLs are
    /// on). By default one is made with the CLI's credential.
    #[arg(long, conflicts_with = "proxy_token_file")]
    pub no_proxy_token: bool,
    /// Where the proxy token that bootstrap makes (without
    /// --proxy-token-file) is written, 0600, for Envoy to read (the
    /// bootstrap names the file, never holds the secret). Default:
    /// NAME.NAMESPACE.proxy-token in the current directory (replaced).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["proxy_token_file", "no_proxy_token"])]
    pub proxy_token_out: Option<std::path::PathBuf>,
    /// yaml or json.
    #[arg(short, long, value_enum, default_value = "yaml")]
    pub output: Format,
    /// Write a gRPC xDS bootstrap (GRPC_XDS_BOOTSTRAP) for a proxyless gRPC
    /// application instead of an Envoy one; always JSON.
    #[arg(long)]
    pub grpc: bool,
    /// With --grpc: the workload certificate directory (`lodestar agent
    /// --dir`: cert-chain.pem, key.pem), presented to the replicas as the
    /// client's credential; the cluster CA is written there as xds-ca.pem.
    #[arg(long)]
    pub cert_dir: Option<std::path::PathBuf>,
    /// Serve a Gateway API Gateway, NAMESPACE/NAME: a router (gateway
    /// proxy) in the Gateway's namespace, labelled
    /// `gateway.networking.k8s.io/gateway-name=NAME` (as Istio's manual
    /// deployment). Its listeners bind the Gateway's `spec.addresses`
    /// (else --ip).
    #[arg(long = "gateway", value_name = "NAMESPACE/NAME", conflicts_with = "grpc")]
    pub gateway_api: Option<String>,
    /// Serve every Gateway API Gateway of a GatewayClass, each at its own
    /// `spec.addresses`: a router labelled
    /// `gateway.networking.k8s.io/gateway-class-name=CLASS`.
    #[arg(long, value_name = "CLASS", conflicts_with = "grpc")]
    pub gateway_class: Option<String>,
}

impl BootstrapArgs {
    /// `--gateway` and `--gateway-class` as what they stand for: a router,
    /// its namespace and its label.
    pub fn resolve_gateway(&mut self) -> Result<()> {
        if let Some(g) = self.gateway_api.clone() {
            let Some((ns, name)) = g.split_once('/').filter(|(ns, n)| !ns.is_empty() && !n.is_empty() && !n.contains('/')) else {
                bail!("--gateway {g:?}: expected NAMESPACE/NAME");
            };
            self.node_type = NodeType::Router;
            self.namespace = ns.to_string();
            self.labels.push((crate::translate::gateway_api::NAME_LABEL.to_string(), name.to_string()));
        }
        if let Some(class) = self.gateway_class.clone() {
            self.node_type = NodeType::Router;
            self.labels.push((crate::translate::gateway_api::CLASS_LABEL.to_string(), class));
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum NodeType {
    Sidecar,
    Router,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Yaml,
    Json,
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{s:?}: expected KEY=VALUE")),
    }
}

pub async fn run(client: &Client, ca_pem: Option<&str>, mut args: BootstrapArgs) -> Result<()> {
    args.resolve_gateway()?;
    let token = proxy_token(&args)?;
    let servers = if args.xds_servers.is_empty() { member_xds_addrs(client).await? } else { args.xds_servers.clone() };
    if args.grpc {
        if token.is_some() {
            bail!("--proxy-token-file with --grpc: gRPC clients send a bootstrap token only as a JWT (call_creds jwt_token_file, gRFC A97), and proxy tokens are not JWTs; use --cert-dir with a `lodestar agent` workload certificate");
        }
        let doc = grpc_bootstrap_files(&args, &servers, ca_pem, args.cert_dir.as_deref())?;
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    // Check everything else before a token is made for it.
    bootstrap(&args, &servers, ca_pem, None)?;
    let token = match token {
        Some(t) => Some(t.path),
        None if args.no_proxy_token => None,
        None => mint_proxy_token(client, ca_pem.is_some(), &args).await?,
    };
    let doc = bootstrap(&args, &servers, ca_pem, token.as_deref())?;
    match args.output {
        Format::Json => println!("{}", serde_json::to_string_pretty(&doc)?),
        Format::Yaml => print!("{}", yaml_serde::to_string(&doc)?),
    }
    Ok(())
}

/// Without `--proxy-token-file`, on a cluster with TLS (so ACLs, by
/// default): a proxy token for this proxy (`NAMESPACE/NAME`; a gateway's,
/// `--gateway`, for `--node-type router`), made with the CLI's own
/// credential when it may make tokens (`admin` on the cluster, as the
/// management token in the client config a server writes), written to
/// `--proxy-token-out` (0600) for Envoy to read: the path of that file.
/// Else a warning that the xDS port will refuse this Envoy, naming the
/// command that makes a token. A plaintext (`--insecure`) cluster takes no
/// credential (and a bootstrap without the CA sends none): nothing to make.
pub async fn mint_proxy_token(client: &Client, tls: bool, args: &BootstrapArgs) -> Result<Option<std::path::PathBuf>> {
    if client.base().starts_with("http://") || !tls {
        return Ok(None);
    }
    let identity = format!("{}/{}", args.namespace, args.name);
    let mut body = serde_json::json!({"proxy": identity, "description": format!("lodestar bootstrap for {}.{}", args.name, args.namespace)});
    if args.node_type == NodeType::Router {
        body["gateway"] = json!(true);
    }
    let made = client.post("/v1/acl/tokens", &body).await.and_then(|t| {
        let field = |k: &str| t[k].as_str().map(String::from).ok_or_else(|| anyhow!("the answer has no {k}"));
        Ok((field("accessorId")?, field("secret")?))
    });
    let (accessor, secret) = match made {
        Ok(made) => made,
        Err(e) => {
            eprintln!(
                "Warning: this bootstrap has no proxy credential, so the xDS port will refuse its Envoy (ACLs are on), and could not make one: {e:#}\n  \
                 With an admin's token: lodestar token create --proxy {identity} -o json, put the secret in a file (readable by Envoy only), then pass --proxy-token-file FILE."
            );
            return Ok(None);
        }
    };
    let out = match &args.proxy_token_out {
        Some(p) => p.clone(),
        None => std::path::PathBuf::from(format!("{}.{}.proxy-token", args.name, args.namespace)),
    };
    let written = crate::tls::pki::write_file(&out, &secret, true)
        .map_err(anyhow::Error::from)
        .and_then(|()| std::fs::canonicalize(&out).with_context(|| format!("{}", out.display())));
    let path = match written {
        Ok(path) => path,
        Err(e) => {
            // Not left behind where no one has its secret.
            let revoked = client.delete(&format!("/v1/resources/tokens/lodestar-system/{accessor}")).await;
            let left = if revoked.is_ok() { "revoked it".to_string() } else { format!("revoke it: lodestar token revoke {accessor}") };
            bail!("writing the proxy token made for {identity} to {}: {e:#} (made accessor {accessor}; {left})", out.display());
        }
    };
    let gateway = if args.node_type == NodeType::Router { " (a gateway's: served its namespace's Secrets)" } else { "" };
    eprintln!(
        "Made a proxy token for {identity}{gateway} (accessor {accessor}; `lodestar token revoke {accessor}` ends it), in {} (0600), which Envoy reads: keep it readable by Envoy only.",
        path.display()
    );
    Ok(Some(path))
}

/// `--proxy-token-file`, if given: checked to hold one token, by its
/// absolute path (Envoy reads it, from wherever it runs).
pub struct TokenFile {
    pub path: std::path::PathBuf,
}

/// See [`TokenFile`].
pub fn proxy_token(args: &BootstrapArgs) -> Result<Option<TokenFile>> {
    let Some(path) = &args.proxy_token_file else { return Ok(None) };
    let text = std::fs::read_to_string(path).with_context(|| format!("--proxy-token-file {}", path.display()))?;
    let t = text.trim();
    if t.is_empty() || t.chars().any(|c| c.is_whitespace() || c.is_control()) {
        bail!("--proxy-token-file {}: expected one token (no spaces)", path.display());
    }
    let path = std::fs::canonicalize(path).with_context(|| format!("--proxy-token-file {}", path.display()))?;
    Ok(Some(TokenFile { path }))
}

/// Where Envoy's admin listens (see `--admin-address`); a warning on
/// stderr when that is not a loopback address.
pub fn admin_host(args: &BootstrapArgs) -> Result<String> {
    let Some(addr) = &args.admin_address else {
        return Ok(match args.ip.parse::<IpAddr>() {
            Ok(ip) if ip.is_loopback() => args.ip.clone(),
            _ => "127.0.0.1".to_string(),
        });
    };
    let ip: IpAddr = addr.parse().map_err(|_| anyhow!("--admin-address {addr:?} is not an IP address"))?;
    // Once, however often the bootstrap is built.
    static WARNED: std::sync::Once = std::sync::Once::new();
    if !ip.is_loopback() {
        WARNED.call_once(|| eprintln!(
            "warning: Envoy's admin will listen on {addr}:{}, which is not a loopback address: whoever reaches it reads the whole config (/config_dump) and can stop Envoy (/quitquitquit); keep it on loopback unless a firewall guards it",
            args.admin_port
        ));
    }
    Ok(addr.clone())
}

/// The static secret holding the proxy token, sent by `xds-grpc`'s
/// credential injector.
const TOKEN_SECRET: &str = "lodestar-proxy-token";

/// Every member's xDS address, from `GET /v1/cluster`.
pub(super) async fn member_xds_addrs(client: &Client) -> Result<Vec<String>> {
    let status = client.get("/v1/cluster").await.context("asking the cluster for its members' xDS addresses (or pass --xds-servers)")?;
    let addrs: Vec<String> = status["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["info"]["xds_addr"].as_str())
        .filter(|a| !a.is_empty())
        .map(str::to_string)
        .collect();
    if addrs.is_empty() {
        bail!("the cluster lists no member with an xDS address; pass --xds-servers");
    }
    Ok(addrs)
}

/// `host:port` or `[v6]:port`.
fn host_port(addr: &str) -> Result<(String, u16)> {
    let err = || anyhow!("xDS server {addr:?}: expected HOST:PORT");
    let (host, port) = addr.trim().rsplit_once(':').ok_or_else(err)?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if host.is_empty() {
        return Err(err());
    }
    Ok((host.to_string(), port.parse().map_err(|_| err())?))
}

fn socket_address(host: &str, port: u16) -> Value {
    json!({"socket_address": {"address": host, "port_value": port}})
}

/// The bootstrap document for `args`, connecting to `xds_servers`, over
/// TLS checked against `ca_pem` when given, presenting the proxy token in
/// the file `token_file` (an absolute path, read by Envoy) when given.
pub fn bootstrap(args: &BootstrapArgs, xds_servers: &[String], ca_pem: Option<&str>, token_file: Option<&std::path::Path>) -> Result<Value> {
    let kind = match args.node_type {
        NodeType::Sidecar => ProxyKind::Sidecar,
        NodeType::Router => ProxyKind::Router,
    };
    if args.ip.parse::<IpAddr>().is_err() {
        bail!("--ip {:?} is not an IP address", args.ip);
    }
    let node_id = ProxyIdentity::node_id(kind, &args.ip, &args.name, &args.namespace, &args.domain_suffix);
    let labels: Map<String, Value> = args.labels.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    let metadata = json!({"NAMESPACE": args.namespace, "NAME": args.name, "INSTANCE_IPS": args.ip, "LABELS": labels});
    // What the server will make of it: fail here, not at connect time.
    ProxyIdentity::parse(&node_id, &metadata).map_err(|e| anyhow!("{e}"))?;

    if xds_servers.is_empty() {
        bail!("no xDS servers");
    }
    let servers = xds_servers.iter().map(|a| host_port(a)).collect::<Result<Vec<_>>>()?;
    // STATIC needs IP literals; names are resolved (and re-resolved) by DNS.
    let all_ips = servers.iter().all(|(h, _)| h.parse::<IpAddr>().is_ok());
    let endpoints: Vec<Value> = servers.iter().map(|(h, p)| json!({"endpoint": {"address": socket_address(h, *p)}})).collect();
    let mut xds_cluster = json!({
        "name": XDS_CLUSTER,
        "type": if all_ips { "STATIC" } else { "STRICT_DNS" },
        // Short: a dead replica is skipped quickly in favour of the next.
        "connect_timeout": "1s",
        "lb_policy": "ROUND_ROBIN",
        "load_assignment": {"cluster_name": XDS_CLUSTER, "endpoints": [{"lb_endpoints": endpoints}]},
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                // gRPC needs HTTP/2; HTTP/2 pings notice a replica that vanished.
                "explicit_http_config": {"http2_protocol_options": {"connection_keepalive": {"interval": "30s", "timeout": "10s"}}}
            }
        },
        "upstream_connection_options": {"tcp_keepalive": {"keepalive_time": 300}}
    });
    if !all_ips {
        xds_cluster["dns_lookup_family"] = json!("V4_PREFERRED");
    }
    if let Some(ca) = ca_pem {
        xds_cluster["transport_socket"] = json!({
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "common_tls_context": {
                    "alpn_protocols": ["h2"],
                    "validation_context": {
                        "trusted_ca": {"inline_string": ca},
                        "match_typed_subject_alt_names": [{"san_type": "DNS", "matcher": {"safe_regex": {"regex": r"^member-[0-9]+\.lodestar$"}}}]
                    }
                }
            }
        });
    }

    let grpc_service = json!({
        "envoy_grpc": {
            "cluster_name": XDS_CLUSTER,
            // Reconnect fast after a replica fails (Envoy's default
            // backs off to 30s); each attempt picks the next replica.
            "retry_policy": {"retry_back_off": {"base_interval": "0.25s", "max_interval": "5s"}}
        }
    });
    let mut secrets = Vec::new();
    if let Some(path) = token_file {
        if ca_pem.is_none() {
            bail!("a proxy token is only sent over TLS: the bootstrap has no CA (pass --ca-file or a client config)");
        }
        // Every request on xds-grpc (the ADS stream) gets `authorization:
        // Bearer <the file's token>`; the secret is never in the bootstrap.
        let http = &mut xds_cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
        http["http_filters"] = json!([
            {"name": "envoy.filters.http.credential_injector", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.credential_injector.v3.CredentialInjector",
                "overwrite": true,
                "credential": {"name": "envoy.http.injected_credentials.generic", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.http.injected_credentials.generic.v3.Generic",
                    "credential": {"name": TOKEN_SECRET},
                    "header": "authorization",
                    "header_value_prefix": "Bearer "
                }}
            }},
            {"name": "envoy.filters.http.upstream_codec", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec"
            }}
        ]);
        secrets.push(json!({"name": TOKEN_SECRET, "generic_secret": {"secret": {"filename": path.display().to_string()}}}));
    }
    let mut static_resources = json!({"clusters": [xds_cluster]});
    if !secrets.is_empty() {
        static_resources["secrets"] = json!(secrets);
    }

    Ok(json!({
        "node": {
            "id": node_id,
            // Istio's service cluster: NAME.NAMESPACE.
            "cluster": format!("{}.{}", args.name, args.namespace),
            "metadata": metadata
        },
        "admin": {"address": socket_address(&admin_host(args)?, args.admin_port)},
        "dynamic_resources": {
            "ads_config": {
                "api_type": if args.delta { "DELTA_GRPC" } else { "GRPC" },
                "transport_api_version": "V3",
                "set_node_on_first_message_only": true,
                "grpc_services": [grpc_service]
            },
            "cds_config": {"ads": {}, "resource_api_version": "V3"},
            "lds_config": {"ads": {}, "resource_api_version": "V3"}
        },
        "static_resources": static_resources
    }))
}

/// The CA file gRPC reads (it takes paths, not PEM), written into the
/// certificate directory.
pub const GRPC_CA_FILE: &str = "xds-ca.pem";

/// `grpc_bootstrap`, with the cluster CA written to `cert_dir` first.
pub fn grpc_bootstrap_files(args: &BootstrapArgs, xds_servers: &[String], ca_pem: Option<&str>, cert_dir: Option<&std::path::Path>) -> Result<Value> {
    match (ca_pem, cert_dir) {
        (Some(ca), Some(dir)) => {
            std::fs::create_dir_all(dir).with_context(|| format!("--cert-dir {}", dir.display()))?;
            let path = dir.join(GRPC_CA_FILE);
            crate::tls::pki::write_file(&path, ca, false).with_context(|| format!("writing {}", path.display()))?;
            grpc_bootstrap(args, xds_servers, Some(dir))
        }
        (Some(_), None) => {
            bail!("--grpc: the replicas speak TLS and want a proxy credential; pass --cert-dir (a `lodestar agent --dir` with the workload certificate)")
        }
        (None, Some(_)) => bail!("--grpc --cert-dir: no cluster CA to check the replicas with (pass --ca-file or a client config)"),
        (None, None) => grpc_bootstrap(args, xds_servers, None),
    }
}

/// A gRPC xDS bootstrap (see the module doc). `cert_dir`: TLS with the CA
/// in `cert_dir/xds-ca.pem` and the workload certificate there; `None`:
/// plaintext, for a cluster that has no TLS at all.
pub fn grpc_bootstrap(args: &BootstrapArgs, xds_servers: &[String], cert_dir: Option<&std::path::Path>) -> Result<Value> {
    if args.node_type != NodeType::Sidecar {
        bail!("--grpc: a proxyless gRPC client is a sidecar-type node (not --node-type router)");
    }
    if args.delta {
        bail!("--grpc: gRPC clients choose the xDS variant themselves; --delta does not apply");
    }
    if args.ip.parse::<IpAddr>().is_err() {
        bail!("--ip {:?} is not an IP address", args.ip);
    }
    let node_id = ProxyIdentity::node_id(ProxyKind::Grpc, &args.ip, &args.name, &args.namespace, &args.domain_suffix);
    let labels: Map<String, Value> = args.labels.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    let metadata = json!({"NAMESPACE": args.namespace, "NAME": args.name, "INSTANCE_IPS": args.ip, "LABELS": labels, "GENERATOR": "grpc"});
    let parsed = ProxyIdentity::parse(&node_id, &metadata).map_err(|e| anyhow!("{e}"))?;
    debug_assert_eq!(parsed.kind, ProxyKind::Grpc);
    if xds_servers.is_empty() {
        bail!("no xDS servers");
    }
    let channel_creds = match cert_dir {
        Some(dir) => {
            let path = |f: &str| dir.join(f).display().to_string();
            json!([{"type": "tls", "config": {
                "ca_certificate_file": path(GRPC_CA_FILE),
                "certificate_file": path(crate::agent::CHAIN_FILE),
                "private_key_file": path(crate::agent::KEY_FILE),
                // The agent renews the certificate in place; gRPC re-reads it.
                "refresh_interval": "60s"
            }}])
        }
        None => json!([{"type": "insecure"}]),
    };
    let servers = xds_servers
        .iter()
        .map(|a| {
            // A gRPC target URI (`dns://DNS-SERVER/NAME:PORT`, `dns:///NAME:PORT`)
            // as is: one name for every replica, re-resolved when the
            // connection drops; else HOST:PORT.
            // `unix://PATH`: the agent's local xDS socket (`lodestar agent
            // --xds-socket`), which forwards over mutual TLS.
            let uri = if a.starts_with("dns:") || a.starts_with("unix:") {
                a.trim().to_string()
            } else {
                let (h, p) = host_port(a)?;
                let host = if h.contains(':') { format!("[{h}]") } else { h };
                format!("{host}:{p}")
            };
            Ok(json!({"server_uri": uri, "channel_creds": channel_creds.clone(), "server_features": ["xds_v3"]}))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(json!({
        "xds_servers": servers,
        "node": {"id": node_id, "cluster": format!("{}.{}", args.name, args.namespace), "metadata": metadata, "locality": {}}
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        args: BootstrapArgs,
    }

    fn args(flags: &[&str]) -> BootstrapArgs {
        Cmd::try_parse_from(std::iter::once("bootstrap").chain(flags.iter().copied())).unwrap().args
    }

    /// `--gateway NS/NAME`: a router in the Gateway's namespace with its
    /// name label; `--gateway-class`: one with the class label.
    #[test]
    fn gateway_api_gateways() {
        let mut a = args(&["--name", "web-gw", "--gateway", "shop/web"]);
        a.resolve_gateway().unwrap();
        let b = bootstrap(&a, &["127.0.0.1:8472".into()], None, None).unwrap();
        assert_eq!(b["node"]["id"], "router~127.0.0.1~web-gw.shop~shop.svc.cluster.local");
        assert_eq!(b["node"]["metadata"]["LABELS"][crate::translate::gateway_api::NAME_LABEL], "web");
        let mut a = args(&["--name", "edge", "--gateway-class", "lodestar"]);
        a.resolve_gateway().unwrap();
        assert_eq!(a.node_type, NodeType::Router);
        assert_eq!(a.labels, [(crate::translate::gateway_api::CLASS_LABEL.to_string(), "lodestar".to_string())]);
        let mut a = args(&["--name", "x", "--gateway", "web"]);
        assert!(a.resolve_gateway().unwrap_err().to_string().contains("NAMESPACE/NAME"));
    }

    #[test]
    fn sidecar_with_every_replica() {
        let a = args(&["--name", "reviews-v2", "--namespace", "bookinfo", "--ip", "127.0.0.7", "--label", "app=reviews", "--label", "version=v2"]);
        let b = bootstrap(&a, &["127.0.0.1:8472".into(), "127.0.0.2:8472".into()], None, None).unwrap();
        assert_eq!(b["node"]["id"], "sidecar~127.0.0.7~reviews-v2.bookinfo~bookinfo.svc.cluster.local");
        assert_eq!(b["node"]["cluster"], "reviews-v2.bookinfo");
        assert_eq!(b["node"]["metadata"]["LABELS"]["version"], "v2");
        assert_eq!(b["admin"]["address"]["socket_address"]["port_value"], 15000);
        let ads = &b["dynamic_resources"]["ads_config"];
        assert_eq!((ads["api_type"].as_str(), ads["transport_api_version"].as_str()), (Some("GRPC"), Some("V3")));
        let cluster = &b["static_resources"]["clusters"][0];
        assert_eq!((cluster["name"].as_str(), cluster["type"].as_str()), (Some(XDS_CLUSTER), Some("STATIC")));
        assert_eq!(cluster["load_assignment"]["endpoints"][0]["lb_endpoints"].as_array().unwrap().len(), 2);
        assert!(cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]["explicit_http_config"]
            ["http2_protocol_options"]
            .is_object());
        // The node the server will see parses to the same identity.
        let id = ProxyIdentity::parse(b["node"]["id"].as_str().unwrap(), &b["node"]["metadata"]).unwrap();
        assert_eq!((id.ip.as_str(), id.labels.len()), ("127.0.0.7", 2));
    }

    #[test]
    fn router_delta_and_names() {
        let a = args(&["--name", "ingress", "--namespace", "istio-system", "--node-type", "router", "--delta", "--domain-suffix", "example.org"]);
        let token = std::path::Path::new("/etc/lodestar/proxy.token");
        let b = bootstrap(&a, &["localhost:8472".into(), "[::1]:8472".into()], Some("CA PEM"), Some(token)).unwrap();
        // The token file is named, for Envoy to read; no literal metadata.
        let grpc = &b["dynamic_resources"]["ads_config"]["grpc_services"][0];
        assert!(grpc.get("initial_metadata").is_none(), "{grpc}");
        assert_eq!(b["static_resources"]["secrets"][0], json!({"name": TOKEN_SECRET, "generic_secret": {"secret": {"filename": "/etc/lodestar/proxy.token"}}}));
        let filters =
            &b["static_resources"]["clusters"][0]["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]["http_filters"];
        let generic = &filters[0]["typed_config"]["credential"]["typed_config"];
        assert_eq!((generic["credential"]["name"].as_str(), generic["header_value_prefix"].as_str()), (Some(TOKEN_SECRET), Some("Bearer ")));
        assert_eq!(filters[1]["name"], "envoy.filters.http.upstream_codec", "the codec ends the upstream filters");
        assert_eq!(b["node"]["id"], "router~127.0.0.1~ingress.istio-system~istio-system.svc.example.org");
        assert_eq!(b["dynamic_resources"]["ads_config"]["api_type"], "DELTA_GRPC");
        let cluster = &b["static_resources"]["clusters"][0];
        assert_eq!(cluster["type"], "STRICT_DNS");
        assert_eq!(cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][1]["endpoint"]["address"]["socket_address"]["address"], "::1");
        let tls = &cluster["transport_socket"]["typed_config"]["common_tls_context"];
        assert_eq!(tls["validation_context"]["trusted_ca"]["inline_string"], "CA PEM");
        assert_eq!(tls["alpn_protocols"][0], "h2");
    }

    /// Envoy's admin binds loopback unless told otherwise: --ip when it is
    /// a loopback address (several Envoys on one host, each on its own
    /// 127.x), else 127.0.0.1, never the proxy's routable address.
    #[test]
    fn admin_listens_on_loopback_by_default() {
        let admin = |flags: &[&str]| {
            let b = bootstrap(&args(flags), &["127.0.0.1:1".into()], None, None).unwrap();
            b["admin"]["address"]["socket_address"]["address"].as_str().unwrap().to_string()
        };
        assert_eq!(admin(&["--name", "x", "--ip", "10.1.2.3"]), "127.0.0.1");
        assert_eq!(admin(&["--name", "x", "--ip", "127.0.0.7"]), "127.0.0.7");
        assert_eq!(admin(&["--name", "x", "--ip", "10.1.2.3", "--admin-address", "10.1.2.3"]), "10.1.2.3");
    }

    #[test]
    fn grpc_bootstrap_with_tls_and_every_replica() {
        let a = args(&["--grpc", "--name", "client", "--namespace", "shop", "--ip", "127.0.0.8", "--label", "app=client"]);
        let dir = std::path::Path::new("/var/lib/client");
        let b = grpc_bootstrap(&a, &["127.0.0.1:7002".into(), "127.0.0.2:7002".into()], Some(dir)).unwrap();
        let servers = b["xds_servers"].as_array().unwrap();
        assert_eq!(servers.len(), 2);
        assert_eq!(servers[1]["server_uri"], "127.0.0.2:7002");
        assert_eq!(servers[0]["server_features"], json!(["xds_v3"]));
        let dns = grpc_bootstrap(&a, &["dns:///xds.example:7002".into()], Some(dir)).unwrap();
        assert_eq!(dns["xds_servers"][0]["server_uri"], "dns:///xds.example:7002");
        let creds = &servers[0]["channel_creds"][0];
        assert_eq!(creds["type"], "tls");
        assert_eq!(creds["config"]["ca_certificate_file"], "/var/lib/client/xds-ca.pem");
        assert_eq!(creds["config"]["certificate_file"], "/var/lib/client/cert-chain.pem");
        assert_eq!(creds["config"]["private_key_file"], "/var/lib/client/key.pem");
        let id = ProxyIdentity::parse(b["node"]["id"].as_str().unwrap(), &b["node"]["metadata"]).unwrap();
        assert_eq!((id.kind, id.namespace.as_str(), id.labels["app"].as_str()), (ProxyKind::Grpc, "shop", "client"));
        // Plaintext only for a cluster without TLS; a router or delta is refused.
        assert_eq!(grpc_bootstrap(&a, &["127.0.0.1:7002".into()], None).unwrap()["xds_servers"][0]["channel_creds"][0]["type"], "insecure");
        let e = grpc_bootstrap_files(&a, &["127.0.0.1:7002".into()], Some("CA"), None).unwrap_err().to_string();
        assert!(e.contains("--cert-dir"), "{e}");
        assert!(grpc_bootstrap(&args(&["--grpc", "--name", "g", "--node-type", "router"]), &["127.0.0.1:1".into()], None).is_err());
        assert!(grpc_bootstrap(&args(&["--grpc", "--name", "g", "--delta"]), &["127.0.0.1:1".into()], None).is_err());
    }

    #[test]
    fn bad_input_is_named() {
        let a = args(&["--name", "x", "--ip", "not-an-ip"]);
        assert!(bootstrap(&a, &["127.0.0.1:1".into()], None, None).unwrap_err().to_string().contains("not-an-ip"));
        let a = args(&["--name", "x"]);
        assert!(bootstrap(&a, &["127.0.0.1".into()], None, None).unwrap_err().to_string().contains("HOST:PORT"));
        assert!(bootstrap(&a, &[], None, None).is_err());
        // Never a token over plaintext.
        let token = std::path::Path::new("/t");
        assert!(bootstrap(&a, &["127.0.0.1:1".into()], None, Some(token)).unwrap_err().to_string().contains("only sent over TLS"));
        assert!(bootstrap(&args(&["--name", "x", "--admin-address", "localhost"]), &["127.0.0.1:1".into()], None, None).is_err());
        assert!(parse_label("novalue").is_err());
    }
}
