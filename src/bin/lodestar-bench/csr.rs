//! `csr`: the mesh CA under load. One workload certificate is obtained with
//! a join token; then `--clients` concurrent agents renew with it (a new
//! P-256 key, a CSR, a new TLS connection presenting the certificate, one
//! `CreateCertificate` each, as `lodestar agent` does), spread over the
//! replicas' xDS ports, for `--requests` certificates in all. Prints the
//! certificates per second and the latency per request (connection and
//! handshake included). The clients' key generation runs on this machine
//! too: on one host, the figure is a lower bound for the replicas.

use anyhow::{bail, Result};
use clap::Args;
use lodestar::agent::{CaClient, Identity, IssueError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args, Clone)]
pub struct CsrArgs {
    /// The replicas' xDS addresses, HOST:PORT.
    #[arg(long, value_delimiter = ',', required = true)]
    xds_servers: Vec<String>,
    /// A join token's file (`lodestar token create --workload NS/SA`), for
    /// the first certificate.
    #[arg(long)]
    join_token_file: std::path::PathBuf,
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Certificates in all.
    #[arg(long, default_value_t = 1000)]
    requests: u64,
}

pub async fn run(args: CsrArgs) -> Result<()> {
    println!("command: {}", super::command_line());
    let Some(ca_pem) = super::ACCESS.get().and_then(|a| a.ca_pem.clone()) else { bail!("csr needs the cluster's CA (a client config, --ca-file)") };
    let token = std::fs::read_to_string(&args.join_token_file)?.trim().to_string();
    let ca = |servers: Vec<String>| CaClient { servers, cluster_ca_pem: Some(ca_pem.clone()), ttl: Some(Duration::from_secs(3600)) };
    let first: Identity = ca(args.xds_servers.clone()).issue(Some(&token), None).await.map_err(|e| anyhow::anyhow!("the first certificate: {e}"))?;
    let first = Arc::new(first);
    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..args.clients {
        // Each client starts at another replica and keeps to it.
        let mut servers = args.xds_servers.clone();
        let shift = c % servers.len().max(1);
        servers.rotate_left(shift);
        let (client, first, next, errors, total) = (ca(servers), first.clone(), next.clone(), errors.clone(), args.requests);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < total {
                let t = Instant::now();
                match client.issue(None, Some(&first)).await {
                    Ok(_) => latencies.push(t.elapsed()),
                    Err(IssueError::Refused(e)) | Err(IssueError::Retry(e)) | Err(IssueError::Fatal(e)) => {
                        if errors.fetch_add(1, Ordering::Relaxed) == 0 {
                            eprintln!("first error: {e}");
                        }
                    }
                }
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await?);
    }
    let elapsed = started.elapsed();
    all.sort();
    let at = |q: f64| all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1))).map_or(0.0, |d| d.as_secs_f64() * 1000.0);
    let errors = errors.load(Ordering::Relaxed);
    println!("{:>8} {:>8} {:>8} {:>10} {:>9} {:>9}", "clients", "certs", "errors", "certs/s", "p50_ms", "p99_ms");
    let rate = all.len() as f64 / elapsed.as_secs_f64();
    println!("{:>8} {:>8} {:>8} {:>10.1} {:>9.2} {:>9.2}", args.clients, all.len(), errors, rate, at(0.5), at(0.99));
    println!("result: clients={} certs={} errors={} certs_per_s={rate:.1} p50_ms={:.2} p99_ms={:.2}", args.clients, all.len(), errors, at(0.5), at(0.99));
    if errors > 0 {
        bail!("{errors} requests failed");
    }
    Ok(())
}
