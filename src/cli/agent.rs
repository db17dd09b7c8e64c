//! `lodestar agent`: a workload's certificate (from the mesh CA, renewed
//! with itself), SDS for its Envoy, and the Envoy bootstrap that uses it.
//! The work is in `crate::agent`; this is the command line.

use super::bootstrap::{self, BootstrapArgs};
use super::client::Client;
use crate::agent::{AgentOptions, CaClient};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Args, Debug, Clone)]
pub struct AgentArgs {
    /// Where the key and certificate live (0700; key.pem, cert-chain.pem,
    /// root-cert.pem, 0600). A restarted agent resumes from them.
    #[arg(long)]
    pub dir: PathBuf,
    /// A file holding the join token (`lodestar token create --workload
    /// NS/SA`), read only when there is no valid certificate in --dir.
    #[arg(long)]
    pub join_token_file: Option<PathBuf>,
    /// The SDS socket for Envoy (default: DIR/sds.sock).
    #[arg(long)]
    pub sds_socket: Option<PathBuf>,
    /// Also serve ADS on this Unix socket (0600), forwarded to the replicas
    /// over mutual TLS with the workload certificate, for local clients
    /// that cannot do TLS to the xDS port themselves (Node's
    /// `@grpc/grpc-js-xds`). With --grpc, the bootstrap then names this
    /// socket (`unix://…`, `insecure` credentials: a local hop only).
    #[arg(long)]
    pub xds_socket: Option<PathBuf>,
    /// The certificate lifetime to ask for, e.g. 24h (default: the CA's).
    #[arg(long)]
    pub ttl: Option<String>,
    /// Write an Envoy bootstrap here: ADS to the replicas (TLS, the
    /// workload certificate as client certificate) and the SDS cluster.
    #[arg(long)]
    pub bootstrap: Option<PathBuf>,
    #[command(flatten)]
    pub proxy: BootstrapArgs,
}

pub async fn run(client: &Client, ca_pem: Option<&str>, args: AgentArgs) -> Result<()> {
    let Some(ca_pem) = ca_pem else {
        bail!("the agent dials the replicas over TLS and needs the cluster's CA: a client config (--client-config, LODESTAR_CONFIG) or --ca-file");
    };
    let servers = if args.proxy.xds_servers.is_empty() { bootstrap::member_xds_addrs(client).await? } else { args.proxy.xds_servers.clone() };
    let ttl = match args.ttl.as_deref() {
        None => None,
        Some(t) => Some(crate::model::istio::duration::parse_duration(t).map_err(|e| anyhow!("--ttl {t:?}: {e}"))?),
    };
    let socket = args.sds_socket.clone().unwrap_or_else(|| args.dir.join("sds.sock"));
    let socket = if socket.is_absolute() { socket } else { std::env::current_dir()?.join(socket) };
    let absolute = |p: &PathBuf| -> Result<PathBuf> { Ok(if p.is_absolute() { p.clone() } else { std::env::current_dir()?.join(p) }) };
    let xds_socket = args.xds_socket.as_ref().map(absolute).transpose()?;
    if args.proxy.grpc && (args.bootstrap.is_none() || args.proxy.cert_dir.is_some()) {
        bail!("--grpc: the agent writes a gRPC bootstrap to --bootstrap FILE, using its own --dir as the certificate directory (no --cert-dir)");
    }
    if let (Some(path), true) = (&args.bootstrap, args.proxy.grpc) {
        // A proxyless gRPC application: its bootstrap names the files this
        // agent keeps (the workload certificate as its client certificate).
        if args.proxy.proxy_token_file.is_some() {
            bail!("--proxy-token-file with --grpc: gRPC sends only JWTs from a bootstrap; the workload certificate is the credential");
        }
        let doc = match &xds_socket {
            Some(socket) => bootstrap::grpc_bootstrap(&args.proxy, &[format!("unix://{}", socket.display())], None)?,
            None => bootstrap::grpc_bootstrap_files(&args.proxy, &servers, Some(ca_pem), Some(&args.dir))?,
        };
        crate::tls::pki::write_file(path, &serde_json::to_string_pretty(&doc)?, false).with_context(|| format!("writing the bootstrap {}", path.display()))?;
    } else if let Some(path) = &args.bootstrap {
        // Envoy presents the workload certificate on the xDS port; a proxy
        // token, if given, is sent too.
        let mut doc = bootstrap::bootstrap(&args.proxy, &servers, Some(ca_pem), bootstrap::proxy_token(&args.proxy)?.as_deref())?;
        add_sds(&mut doc, &socket)?;
        let text = match args.proxy.output {
            bootstrap::Format::Json => serde_json::to_string_pretty(&doc)?,
            bootstrap::Format::Yaml => yaml_serde::to_string(&doc)?,
        };
        crate::tls::pki::write_file(path, &text, false).with_context(|| format!("writing the bootstrap {}", path.display()))?;
    }
    let opts = AgentOptions {
        ca: CaClient { servers, cluster_ca_pem: Some(ca_pem.to_string()), ttl },
        dir: args.dir,
        join_token_file: args.join_token_file,
        sds_socket: Some(socket),
        xds_socket,
    };
    crate::agent::run(opts, crate::server::shutdown_signal()).await
}

/// The SDS cluster and the xDS port's client certificate for an Envoy
/// bootstrap (from `lodestar bootstrap`): a static cluster `sds-grpc` on
/// the agent's Unix socket, `xds-grpc` presenting the workload
/// certificate (`default` over SDS) as its TLS client certificate, and the
/// node metadata `LODESTAR_SDS` that tells the control plane so (it then
/// sends mutual TLS listeners and clusters, which use these secrets).
pub fn add_sds(doc: &mut serde_json::Value, socket: &Path) -> Result<()> {
    use serde_json::json;
    if let Some(meta) = doc.pointer_mut("/node/metadata").and_then(|m| m.as_object_mut()) {
        meta.insert(crate::model::proxy::SDS_METADATA.into(), json!("true"));
    }
    let clusters =
        doc.pointer_mut("/static_resources/clusters").and_then(|c| c.as_array_mut()).ok_or_else(|| anyhow!("the bootstrap has no static clusters"))?;
    let sds_config = json!({"resource_api_version": "V3", "api_config_source": {"api_type": "GRPC", "transport_api_version": "V3", "grpc_services": [{"envoy_grpc": {"cluster_name": crate::agent::sds::SDS_CLUSTER}}]}});
    for c in clusters.iter_mut() {
        if c["name"] == bootstrap::XDS_CLUSTER {
            if let Some(ctx) = c.pointer_mut("/transport_socket/typed_config/common_tls_context").and_then(|v| v.as_object_mut()) {
                ctx.insert("tls_certificate_sds_secret_configs".into(), json!([{"name": crate::agent::sds::CERT_SECRET, "sds_config": sds_config}]));
            }
        }
    }
    clusters.push(json!({
        "name": crate::agent::sds::SDS_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {"cluster_name": crate::agent::sds::SDS_CLUSTER, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"pipe": {"path": socket.display().to_string()}}}}]}]},
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}}
            }
        }
    }));
    Ok(())
}
