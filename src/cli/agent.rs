//! `lodestar agent`: a workload's certificate (from the mesh CA, renewed
//! with itself), SDS for its Envoy, the Envoy bootstrap that uses it, and
//! optionally Envoy itself (`--run-envoy`) and the workload's registration
//! (`--register SERVICE`, `--workload-group NS/NAME`). The work is in
//! `crate::agent`; this is the command line.

use super::bootstrap::{self, BootstrapArgs};
use super::client::Client;
use super::registry::{instance_document, RegisterArgs};
use crate::agent::envoy::EnvoyOptions;
use crate::agent::register::{spiffe_workload, Registration};
use crate::agent::{AgentOptions, CaClient, RegistrationPlan};
use crate::model::istio::{Validated, WorkloadGroup};
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
    #[command(flatten)]
    pub run: RunArgs,
    #[command(flatten)]
    pub capture: CaptureArgs,
    /// text (colour on a terminal, unless NO_COLOR is set) or json (one
    /// object per line).
    #[arg(long, value_enum, default_value = "text", env = "LODESTAR_LOG_FORMAT")]
    pub log_format: crate::logging::LogFormat,
}

/// Transparent capture (`--capture`): the redirect rules Istio's
/// istio-iptables installs, in the current network namespace.
#[derive(Args, Debug, Clone)]
pub struct CaptureArgs {
    /// Redirect this network namespace's TCP traffic into Envoy (outbound
    /// to 15001, inbound to 15006) with iptables rules installed before
    /// Envoy starts and removed on exit; the proxy says so in its node
    /// metadata (INTERCEPTION_MODE: REDIRECT) and gets Istio's virtual
    /// listeners. Needs CAP_NET_ADMIN; Envoy (--run-envoy) runs under
    /// --proxy-uid/--proxy-gid.
    #[arg(long)]
    pub capture: bool,
    /// With --capture: print the rules (iptables-restore input) and exit.
    #[arg(long, requires = "capture")]
    pub dry_run: bool,
    /// The uid Envoy runs under; its connections are not captured.
    #[arg(long, default_value_t = crate::agent::capture::rules::DEFAULT_PROXY_ID)]
    pub proxy_uid: u32,
    /// The gid Envoy runs under; its connections are not captured.
    #[arg(long, default_value_t = crate::agent::capture::rules::DEFAULT_PROXY_ID)]
    pub proxy_gid: u32,
    /// Outbound destinations to capture, CIDRs comma-separated, or `*`.
    #[arg(long, default_value = "*")]
    pub include_outbound_cidrs: String,
    /// Outbound destinations never captured, CIDRs comma-separated (the
    /// replicas' addresses are always excluded).
    #[arg(long, default_value = "")]
    pub exclude_outbound_cidrs: String,
    /// Outbound destination ports never captured, comma-separated.
    #[arg(long, default_value = "")]
    pub exclude_outbound_ports: String,
    /// Inbound ports to capture, comma-separated, or `*` (every port but
    /// the excluded ones).
    #[arg(long, default_value = "*")]
    pub include_inbound_ports: String,
    /// Inbound ports never captured (SSH and Istio's VM defaults).
    #[arg(long, default_value = "22,15020,15021,15090")]
    pub exclude_inbound_ports: String,
    /// The iptables backend: auto (what `iptables --version` says), nft or
    /// legacy.
    #[arg(long, value_enum, default_value = "auto")]
    pub iptables_backend: crate::agent::capture::Backend,
    /// With --capture: capture DNS too (Istio's DNS_CAPTURE): queries to
    /// the nameservers of --resolv-conf (UDP and TCP 53) go to the agent's
    /// DNS proxy on 127.0.0.1:--dns-port, which answers mesh names (the
    /// proxy's reachable services, short names by namespace, with their
    /// addresses or auto-allocated 240.240.0.0/16 ones) and forwards the
    /// rest to those nameservers.
    #[arg(long, requires = "capture")]
    pub capture_dns: bool,
    /// The DNS proxy's port (Istio's 15053).
    #[arg(long, default_value_t = crate::agent::capture::rules::DNS_PORT)]
    pub dns_port: u16,
    /// Where the upstream nameservers are read (and captured).
    #[arg(long, default_value = "/etc/resolv.conf")]
    pub resolv_conf: PathBuf,
}

impl CaptureArgs {
    /// The rules' options; `replicas` (`HOST:PORT`) are excluded by
    /// address.
    pub fn options(&self, replicas: &[String]) -> Result<crate::agent::capture::rules::CaptureOptions> {
        use crate::agent::capture::rules::{parse_cidrs, parse_inbound, parse_ports, CaptureOptions, Cidr};
        let mut exclude = parse_cidrs("--exclude-outbound-cidrs", &self.exclude_outbound_cidrs).map_err(|e| anyhow!(e))?;
        for r in replicas {
            let addrs = std::net::ToSocketAddrs::to_socket_addrs(r.as_str()).with_context(|| format!("resolving the replica {r}"))?;
            for a in addrs {
                if let std::net::IpAddr::V4(v4) = a.ip() {
                    let c = Cidr { addr: v4, len: 32 };
                    if !exclude.contains(&c) {
                        exclude.push(c);
                    }
                }
            }
        }
        Ok(CaptureOptions {
            proxy_uid: self.proxy_uid,
            proxy_gid: self.proxy_gid,
            include_outbound_cidrs: parse_cidrs("--include-outbound-cidrs", &self.include_outbound_cidrs).map_err(|e| anyhow!(e))?,
            exclude_outbound_cidrs: exclude,
            exclude_outbound_ports: parse_ports("--exclude-outbound-ports", &self.exclude_outbound_ports).map_err(|e| anyhow!(e))?,
            inbound: parse_inbound(&self.include_inbound_ports).map_err(|e| anyhow!(e))?,
            exclude_inbound_ports: parse_ports("--exclude-inbound-ports", &self.exclude_inbound_ports).map_err(|e| anyhow!(e))?,
            dns: match self.capture_dns {
                true => Some(crate::agent::capture::rules::DnsCapture { nameservers: self.nameservers()?, port: self.dns_port }),
                false => None,
            },
            ..Default::default()
        })
    }

    /// The IPv4 nameservers of --resolv-conf: where DNS is captured from and
    /// forwarded to.
    pub fn nameservers(&self) -> Result<Vec<std::net::Ipv4Addr>> {
        let path = &self.resolv_conf;
        let text = std::fs::read_to_string(path).with_context(|| format!("--capture-dns: reading {}", path.display()))?;
        let out = crate::agent::dns::nameservers(&text);
        if out.is_empty() {
            bail!("--capture-dns: {} names no IPv4 nameserver to forward to", path.display());
        }
        Ok(out)
    }
}

/// Envoy as a child process, and the workload's registration.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Run Envoy as a child process with the bootstrap written to
    /// --bootstrap (default DIR/bootstrap.yaml): restarted with backoff if
    /// it dies, drained and stopped on SIGTERM/SIGINT, through its admin
    /// (--admin-address: loopback by default).
    #[arg(long)]
    pub run_envoy: bool,
    /// The Envoy binary for --run-envoy.
    #[arg(long, env = "LODESTAR_ENVOY", default_value = "envoy")]
    pub envoy_binary: PathBuf,
    /// With --run-envoy: how long Envoy drains its listeners on shutdown
    /// before it is stopped (pilot-agent's termination drain).
    #[arg(long, default_value = "5s")]
    pub drain_time: String,
    /// One more argument for Envoy; repeatable (`--envoy-arg=--log-level
    /// --envoy-arg=debug`).
    #[arg(long = "envoy-arg", allow_hyphen_values = true)]
    pub envoy_args: Vec<String>,
    /// Register this workload as an Instance of SERVICE (a registry Service
    /// name in its namespace, or a hostname), bound to a lease kept alive
    /// while the agent runs and revoked when it stops. Its serviceAccount
    /// is the certificate's; its labels the proxy's (--label).
    #[arg(long, value_name = "SERVICE")]
    pub register: Option<String>,
    /// Register from a WorkloadGroup's template (NS/NAME: its labels,
    /// ports, serviceAccount, weight, locality; its probe as the health
    /// check). The service defaults to the group's name (--register to
    /// name another).
    #[arg(long, value_name = "NS/NAME")]
    pub workload_group: Option<String>,
    /// The instance's address (default: --ip).
    #[arg(long)]
    pub address: Option<String>,
    /// `NAME=PORT` (or `PORT` for every service port); repeatable. Default
    /// with --workload-group: the template's ports.
    #[arg(long = "port")]
    pub ports: Vec<String>,
    /// The instance's (and lease's) name (default SERVICE-ADDRESS, dots as
    /// dashes: Istio's auto-registration name with a group).
    #[arg(long)]
    pub instance_name: Option<String>,
    /// `region/zone/subzone`.
    #[arg(long)]
    pub locality: Option<String>,
    /// The instance's load-balancing weight (default 1).
    #[arg(long)]
    pub weight: Option<u32>,
    /// Health check: a replica GETs this http:// URL.
    #[arg(long, conflicts_with = "check_tcp")]
    pub check_http: Option<String>,
    /// Health check: a replica connects to HOST:PORT.
    #[arg(long)]
    pub check_tcp: Option<String>,
    /// Probe interval, e.g. 5s.
    #[arg(long)]
    pub check_interval: Option<String>,
    /// How long one health check may take (HTTP/TCP), e.g. 1s.
    #[arg(long)]
    pub check_timeout: Option<String>,
    /// The lease's TTL; keepalives go every third of it.
    #[arg(long, default_value = "15s")]
    pub lease_ttl: String,
    /// A file holding the API token for the registration (default: the
    /// client config's token, --token, LODESTAR_TOKEN). It needs write and
    /// delete on instances and leases in the namespace, and read on
    /// workloadgroups with --workload-group.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
}

pub async fn run(client: &Client, ca_pem: Option<&str>, mut args: AgentArgs) -> Result<()> {
    if args.capture.dry_run {
        let servers = if args.proxy.xds_servers.is_empty() { bootstrap::member_xds_addrs(client).await? } else { args.proxy.xds_servers.clone() };
        print!("{}", args.capture.options(&capture_exclusions(&servers, client))?.install());
        return Ok(());
    }
    let Some(ca_pem) = ca_pem else {
        bail!("the agent dials the replicas over TLS and needs the cluster's CA: a client config (--client-config, LODESTAR_CONFIG) or --ca-file");
    };
    args.proxy.resolve_gateway()?;
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
    if args.run.run_envoy && args.proxy.grpc {
        bail!("--run-envoy with --grpc: a proxyless gRPC application has no Envoy to run");
    }
    if args.run.run_envoy && args.bootstrap.is_none() {
        let file = if args.proxy.output == bootstrap::Format::Json { "bootstrap.json" } else { "bootstrap.yaml" };
        args.bootstrap = Some(args.dir.join(file));
    }
    // The registration's client: the API with the agent's token.
    let api = match &args.run.token_file {
        Some(path) => {
            let t = std::fs::read_to_string(path).with_context(|| format!("--token-file {}", path.display()))?.trim().to_string();
            if t.is_empty() || t.chars().any(char::is_whitespace) {
                bail!("--token-file {}: expected one token (no spaces)", path.display());
            }
            client.with_token(Some(t))
        }
        None => client.with_token(client_token(client)),
    };
    // A WorkloadGroup's labels are the proxy's too (node labels win, as in
    // Istio's auto-registration), so Sidecars and policies select it.
    let group = match &args.run.workload_group {
        Some(g) => Some(fetch_group(&api, g).await?),
        None => None,
    };
    if let Some((key, wg)) = &group {
        if key.0 != args.proxy.namespace {
            bail!("--workload-group {}/{}: the group is in namespace {}, the workload in {} (--namespace)", key.0, key.1, key.0, args.proxy.namespace);
        }
        let mut labels = wg.labels();
        labels.extend(args.proxy.labels.iter().cloned());
        args.proxy.labels = labels.into_iter().collect();
    }
    let envoy = if args.run.run_envoy {
        let drain = crate::model::istio::duration::parse_duration(&args.run.drain_time).map_err(|e| anyhow!("--drain-time {:?}: {e}", args.run.drain_time))?;
        Some((bootstrap::admin_host(&args.proxy)?, drain))
    } else {
        None
    };
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
    }
    let mut envoy_node = None;
    if let (Some(path), false) = (&args.bootstrap, args.proxy.grpc) {
        // Envoy presents the workload certificate on the xDS port; a proxy
        // token, if given, is sent too.
        let token = bootstrap::proxy_token(&args.proxy)?;
        let mut doc = bootstrap::bootstrap(&args.proxy, &servers, Some(ca_pem), token.as_ref().map(|t| t.path.as_path()))?;
        add_sds(&mut doc, &socket)?;
        if args.capture.capture {
            if let Some(meta) = doc.pointer_mut("/node/metadata").and_then(|m| m.as_object_mut()) {
                meta.insert(crate::model::proxy::INTERCEPTION_METADATA.into(), serde_json::json!(crate::model::proxy::INTERCEPTION_REDIRECT));
                if args.capture.capture_dns {
                    meta.insert(crate::model::proxy::DNS_CAPTURE_METADATA.into(), serde_json::json!("true"));
                }
            }
        }
        envoy_node = Some(doc["node"].clone());
        let text = match args.proxy.output {
            bootstrap::Format::Json => serde_json::to_string_pretty(&doc)?,
            bootstrap::Format::Yaml => yaml_serde::to_string(&doc)?,
        };
        std::fs::create_dir_all(&args.dir).with_context(|| format!("creating {}", args.dir.display()))?;
        crate::tls::pki::write_file(path, &text, false).with_context(|| format!("writing the bootstrap {}", path.display()))?;
    }
    let envoy = match (envoy, &args.bootstrap) {
        (Some((admin_host, drain)), Some(bootstrap)) => Some(EnvoyOptions {
            binary: args.run.envoy_binary.clone(),
            bootstrap: bootstrap.clone(),
            admin: format!("{admin_host}:{}", args.proxy.admin_port),
            drain,
            extra_args: args.run.envoy_args.clone(),
            user: args.capture.capture.then_some((args.capture.proxy_uid, args.capture.proxy_gid)),
        }),
        _ => None,
    };
    let capture = match args.capture.capture {
        true => Some((args.capture.options(&capture_exclusions(&servers, client))?, args.capture.iptables_backend)),
        false => None,
    };
    let dns = match (args.capture.capture_dns, envoy_node) {
        (false, _) => None,
        (true, None) => bail!("--capture-dns: the DNS proxy asks for the proxy's names as its Envoy's node: give --run-envoy or --bootstrap"),
        (true, Some(node)) => {
            let upstreams = args.capture.nameservers()?.into_iter().map(|ip| std::net::SocketAddr::from((ip, 53))).collect();
            Some(crate::agent::DnsSetup {
                opts: crate::agent::dns::DnsOptions { listen: std::net::SocketAddr::from(([127, 0, 0, 1], args.capture.dns_port)), upstreams },
                node: crate::agent::dns::nds::dns_node(&node)?,
                domain: args.proxy.domain_suffix.clone(),
            })
        }
    };
    let plan = registration_plan(&args, group.map(|(_, g)| g), api)?;
    let opts = AgentOptions {
        ca: CaClient { servers, cluster_ca_pem: Some(ca_pem.to_string()), ttl },
        dir: args.dir,
        join_token_file: args.join_token_file,
        sds_socket: Some(socket),
        xds_socket,
        envoy,
        capture,
        dns,
    };
    crate::agent::run(opts, plan, crate::server::shutdown_signal()).await
}

/// What the agent itself talks to, never captured: the replicas' xDS
/// addresses and the API servers it registers through (`HOST:PORT`).
fn capture_exclusions(xds: &[String], client: &Client) -> Vec<String> {
    let mut out = xds.to_vec();
    for base in client.bases() {
        if let Ok(url) = reqwest::Url::parse(base) {
            if let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) {
                let host = host.trim_start_matches('[').trim_end_matches(']');
                out.push(if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") });
            }
        }
    }
    out
}

/// The token the CLI's client already carries (the client config's, or
/// --token / LODESTAR_TOKEN).
fn client_token(client: &Client) -> Option<String> {
    client.token().map(str::to_string)
}

/// `NS/NAME` → the stored WorkloadGroup, typed.
async fn fetch_group(api: &Client, g: &str) -> Result<((String, String), WorkloadGroup)> {
    let (ns, name) =
        g.split_once('/').filter(|(n, m)| !n.is_empty() && !m.is_empty()).ok_or_else(|| anyhow!("--workload-group {g:?}: expected NAMESPACE/NAME"))?;
    let obj = api.get(&format!("/v1/resources/workloadgroups/{ns}/{name}")).await.with_context(|| format!("reading the WorkloadGroup {ns}/{name}"))?;
    let spec = obj.get("spec").cloned().unwrap_or_default();
    match crate::model::istio::validate("WorkloadGroup", &spec) {
        Ok(Validated::WorkloadGroup { spec, .. }) => Ok(((ns.to_string(), name.to_string()), *spec)),
        Ok(_) => bail!("the WorkloadGroup {ns}/{name} is not a WorkloadGroup"),
        Err(errs) => bail!("the WorkloadGroup {ns}/{name}: {}", errs.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")),
    }
}

/// What the agent registers, decided once its identity is known.
fn registration_plan(args: &AgentArgs, group: Option<WorkloadGroup>, api: Client) -> Result<Option<RegistrationPlan>> {
    let r = &args.run;
    let service = match (&r.register, &r.workload_group) {
        (Some(s), _) => s.clone(),
        (None, Some(g)) => g.split_once('/').map(|(_, n)| n.to_string()).unwrap_or_default(),
        (None, None) => {
            for (flag, set) in [
                ("--port", !r.ports.is_empty()),
                ("--check-http", r.check_http.is_some()),
                ("--check-tcp", r.check_tcp.is_some()),
                ("--address", r.address.is_some()),
                ("--instance-name", r.instance_name.is_some()),
            ] {
                if set {
                    bail!("{flag} describes the registration: give --register SERVICE or --workload-group NS/NAME");
                }
            }
            return Ok(None);
        }
    };
    let lease_ttl = crate::model::istio::duration::parse_duration(&r.lease_ttl).map_err(|e| anyhow!("--lease-ttl {:?}: {e}", r.lease_ttl))?;
    if lease_ttl < std::time::Duration::from_secs(1) {
        bail!("--lease-ttl must be at least 1s");
    }
    let address = r.address.clone().unwrap_or_else(|| args.proxy.ip.clone());
    let template = group.as_ref().and_then(|g| g.template.clone()).unwrap_or_default();
    let mut ports = r.ports.clone();
    if ports.is_empty() {
        ports = template.ports.iter().map(|(n, p)| format!("{n}={p}")).collect();
    }
    if ports.is_empty() {
        bail!("the registration needs ports: --port NAME=PORT (or a WorkloadGroup template with ports)");
    }
    // The probe becomes the health check unless one is given here.
    let probe = match group.as_ref().and_then(|g| g.probe.as_ref()) {
        Some(p) if r.check_http.is_none() && r.check_tcp.is_none() => {
            Some(p.to_check(&address).map_err(|e| anyhow!("WorkloadGroup {}: {e}", r.workload_group.as_deref().unwrap_or("")))?)
        }
        _ => None,
    };
    let secs = |v: Option<u32>| v.map(|s| format!("{s}s"));
    let name = r.instance_name.clone().unwrap_or_else(|| format!("{}-{}", service.replace('.', "-"), address.replace(['.', ':'], "-")));
    let register = RegisterArgs {
        service,
        name: Some(name.clone()),
        namespace: Some(args.proxy.namespace.clone()),
        address,
        ports,
        labels: args.proxy.labels.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        locality: r.locality.clone().or(template.locality.clone()),
        weight: r.weight.or(template.weight),
        ttl: None,
        http: r.check_http.clone().or_else(|| probe.as_ref().and_then(|p| p.http.clone())),
        tcp: r.check_tcp.clone().or_else(|| probe.as_ref().and_then(|p| p.tcp.clone())),
        interval: r.check_interval.clone().or_else(|| probe.as_ref().and_then(|p| secs(p.interval_s))),
        timeout: r.check_timeout.clone().or_else(|| probe.as_ref().and_then(|p| secs(p.timeout_s))),
        deregister_after: None,
        lease: Some(name.clone()),
        service_account: None,
    };
    let mut doc = instance_document(&register)?;
    if let Some(p) = &probe {
        for (k, v) in [("healthyThreshold", p.healthy_threshold), ("unhealthyThreshold", p.unhealthy_threshold)] {
            if let Some(v) = v {
                doc["spec"]["healthCheck"][k] = serde_json::json!(v);
            }
        }
        if let Some(d) = secs(p.initial_delay_s) {
            doc["spec"]["healthCheck"]["initialDelay"] = serde_json::json!(d);
        }
    }
    if let Some(annotations) = group.as_ref().and_then(|g| g.metadata.as_ref()).map(|m| &m.annotations).filter(|a| !a.is_empty()) {
        doc["metadata"]["annotations"] = serde_json::json!(annotations);
    }
    let namespace = args.proxy.namespace.clone();
    let template_sa = template.service_account.clone();
    let group_name = r.workload_group.clone();
    Ok(Some(Box::new(move |id: &crate::agent::Identity| {
        let (ns, sa) =
            id.uris.iter().find_map(|u| spiffe_workload(u)).ok_or_else(|| anyhow!("the certificate names no SPIFFE workload identity: {:?}", id.uris))?;
        if ns != namespace {
            bail!("the certificate is for {ns}/{sa}, but the workload's namespace is {namespace} (--namespace)");
        }
        if let Some(want) = template_sa.filter(|s| !s.is_empty()) {
            if want != sa {
                bail!("WorkloadGroup {}: template.serviceAccount is {want:?}, but the certificate is for {ns}/{sa}", group_name.as_deref().unwrap_or(""));
            }
        }
        doc["spec"]["serviceAccount"] = serde_json::json!(sa);
        // Checked here, so a bad flag fails at start with the field's name.
        crate::model::registry::validate_instance(&doc["spec"])
            .map_err(|errs| anyhow!("the instance: {}", errs.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")))?;
        Ok(Registration { client: api, namespace, name, lease_ttl, instance: doc })
    })))
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
