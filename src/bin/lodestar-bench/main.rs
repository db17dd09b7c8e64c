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
//!
//! `churn` and `xds` print their command line (`command:`) and end with
//! `result:` lines of `key=value` pairs, for scripts and tests.

mod adsclient;
mod churn;
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
}

impl Cli {
    /// The subcommand, with the global `--server`s in its arguments.
    fn into_command(self) -> Command {
        match self.command {
            Command::Churn(a) => Command::Churn(churn::ChurnArgs { servers: self.servers, ..a }),
            Command::Xds(a) => Command::Xds(xds::XdsArgs { servers: self.servers, ..a }),
            write => write,
        }
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Write(args) => write::run(args).await,
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
    if let Err(e) = run(Cli::parse().into_command()).await {
        eprintln!("{e:#}");
        std::process::exit(1);
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
