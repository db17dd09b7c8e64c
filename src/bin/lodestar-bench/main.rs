//! `lodestar-bench`: load generators for a running Lodestar cluster, kept
//! out of the product binary (as etcd's `benchmark` and Istio's load tools
//! are). They are clients like any other: everything they use of Lodestar
//! comes from the `lodestar` library's public API (the gRPC client API in
//! `lodestar::proto::api`, `ResourceType`, the model), and nothing of theirs
//! is in the library or the `lodestar` binary.
//!
//! # Layout
//! - [`write`]: `write`, concurrent writes at several client counts, against
//!   Lodestar or, for comparison, etcd (its `KV.Put` client lives here).
//! - [`churn`]: `churn`, endpoint churn and its propagation to every proxy.
//! - [`xds`]: `xds`, the push engine: convergence, EDS fan-out, RSS per idle
//!   stream, replica memory.
//! - [`adsclient`]: the simulated Envoy `churn` and `xds` run on.
//! - [`csr`]: `csr`, the mesh CA: certificates per second through the
//!   replicas' xDS ports, as agents renewing.
//! - [`http`]: `http`, a bounded HTTP load against any URL (e.g. through
//!   an Envoy sidecar): statuses and p50/p90/p99/max latency.
//! - [`abuse`]: `abuse`, the attacks of issue 32 replayed against a
//!   replica: did each door hold, and the replica's memory.
//!
//! `churn`, `xds` and `abuse` print their command line (`command:`) and end with
//! `result:` lines of `key=value` pairs, for scripts and tests.

mod abuse;
mod adsclient;
mod churn;
mod csr;
mod http;
mod write;
mod xds;

use clap::{Parser, Subcommand};

// The same allocator as the `lodestar` binary: the client's own memory
// (xds's `client_per_proxy_kib`) stays comparable with earlier runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "lodestar-bench", version, about = "Benchmarks against a running Lodestar cluster (and etcd, for comparison)")]
struct Cli {
    /// API URL of a replica (default http://127.0.0.1:8470); `churn` and
    /// `xds` take several: repeat it. `write` takes `--servers`.
    #[arg(long = "server", value_name = "URL", global = true, env = "LODESTAR_SERVER", action = clap::ArgAction::Append)]
    servers: Vec<String>,
    /// Client config with the cluster's CA, as `lodestar server` writes it
    /// (default as for `lodestar`: ~/.config/lodestar/client.toml, else
    /// ./lodestar-data/client.toml).
    #[arg(long = "client-config", value_name = "FILE", global = true, env = "LODESTAR_CONFIG")]
    client_config: Option<std::path::PathBuf>,
    /// CA bundle (PEM) to check the replicas' certificates against.
    #[arg(long, value_name = "FILE", global = true, env = "LODESTAR_CACERT")]
    ca_file: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Concurrent writes of ~SIZE-byte resources; prints writes/s, p50, p99.
    Write(write::WriteArgs),
    /// Endpoint churn: simulated proxies on ADS streams while instances
    /// register and deregister; prints changes/s and the time until every
    /// proxy has each change. API URLs: the global --server, repeatable.
    Churn(churn::ChurnArgs),
    /// The xDS push engine: convergence of one VirtualService write over
    /// scoped proxies, EDS fan-out, RSS per idle stream, replica memory.
    /// API URLs: the global --server, repeatable.
    Xds(xds::XdsArgs),
    /// The mesh CA: concurrent certificate renewals (a key, a CSR, a TLS
    /// connection each) over the replicas' xDS ports; certs/s, p50, p99.
    /// `--cold-start`: N agents at once with join tokens, time until all
    /// have certificates.
    Csr(csr::CsrArgs),
    /// A bounded HTTP/1.1 load against one URL (e.g. through an Envoy):
    /// keep-alive workers; statuses, p50/p90/p99/max latency.
    Http(http::HttpArgs),
    /// An attack on a replica (issue 32: anonymous bootstrap, alias bombs,
    /// metric labels, idle connections, slowloris, xDS floods...); prints
    /// `result: held=true|false ...` and, with --pid, its memory.
    Abuse(abuse::AbuseArgs),
}

impl Cli {
    /// The subcommand, with the global `--server`s in its arguments.
    fn into_command(self) -> Command {
        match self.command {
            Command::Churn(a) => Command::Churn(churn::ChurnArgs { servers: self.servers, ..a }),
            Command::Xds(a) => Command::Xds(xds::XdsArgs { servers: self.servers, ..a }),
            Command::Abuse(mut a) => {
                a.servers = self.servers;
                Command::Abuse(a)
            }
            Command::Csr(mut a) => {
                a.servers = self.servers;
                Command::Csr(a)
            }
            write => write,
        }
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Write(args) => write::run(args).await,
        Command::Csr(args) => csr::run(args).await,
        Command::Http(args) => http::run(args).await,
        Command::Abuse(args) => abuse::run(args).await,
        Command::Churn(args) => {
            let report = churn::run(args).await?;
            report.print();
            report.verdict()
        }
        Command::Xds(args) => {
            let report = xds::run(args).await?;
            report.print();
            report.verdict()
        }
    }
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let token = std::env::var("LODESTAR_TOKEN").ok().filter(|t| !t.is_empty());
    let result = match lodestar::cli::client::Access::resolve(None, cli.client_config.clone(), cli.ca_file.clone(), token) {
        Ok(access) => {
            let _ = ACCESS.set(access);
            run(cli.into_command()).await
        }
        Err(e) => Err(e),
    };
    if let Err(e) = result {
        eprintln!("{e:#}");
        std::process::exit(1);
    }
}

/// How this run reaches the replicas, as the CLI does: the cluster's CA
/// from `--ca-file`, `LODESTAR_CACERT` or the client config; the token from
/// `LODESTAR_TOKEN` or the client config.
static ACCESS: std::sync::OnceLock<lodestar::cli::client::Access> = std::sync::OnceLock::new();

fn tls() -> anyhow::Result<Option<std::sync::Arc<rustls::ClientConfig>>> {
    let Some(pem) = ACCESS.get().and_then(|a| a.ca_pem.as_deref()) else { return Ok(None) };
    let roots = lodestar::tls::roots_from_pem_text(pem)?;
    Ok(Some(std::sync::Arc::new(lodestar::tls::client_config(roots, None)?)))
}

/// A gRPC channel to a replica (`https://`, `http://` or a bare address:
/// TLS when the CA is known), connected within `timeout`.
async fn grpc(target: &str, timeout: std::time::Duration) -> anyhow::Result<tonic::transport::Channel> {
    let (endpoint, connector) = lodestar::tls::dial(target, tls()?)?;
    Ok(endpoint.connect_timeout(timeout).connect_with_connector(connector).await?)
}

/// An HTTP client trusting the cluster's CA, if known, and sending the
/// token (`LODESTAR_TOKEN` or the client config's), if any.
fn http() -> anyhow::Result<reqwest::Client> {
    ACCESS.get().cloned().unwrap_or_default().http_with_token()
}

/// The gRPC interceptor sending the same token.
fn bearer() -> anyhow::Result<lodestar::cli::client::Bearer> {
    ACCESS.get().cloned().unwrap_or_default().bearer()
}

/// A replica's URL: a bare address is https when the CA is known.
fn base_url(server: &str) -> String {
    let s = server.trim_end_matches('/');
    match (s.contains("://"), ACCESS.get().is_some_and(|a| a.ca_pem.is_some())) {
        (true, _) => s.to_string(),
        (false, true) => format!("https://{s}"),
        (false, false) => format!("http://{s}"),
    }
}

/// The command line, quoted for a POSIX shell (the `command:` line).
fn command_line() -> String {
    std::env::args()
        .map(|a| {
            if !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c)) {
                a
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Parse `lodestar-bench ARGS` as `main` does (for unit tests).
#[cfg(test)]
fn parse<I: IntoIterator<Item = &'static str>>(args: I) -> Result<Command, clap::Error> {
    Ok(Cli::try_parse_from(std::iter::once("lodestar-bench").chain(args))?.into_command())
}
