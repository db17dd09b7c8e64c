//! `csr`: the mesh CA under load, in two modes.
//!
//! Renewal (default): one workload certificate is obtained with a join
//! token; then `--clients` concurrent agents renew with it (a new P-256
//! key, a CSR, a new TLS connection presenting the certificate, one
//! `CreateCertificate` each, as `lodestar agent` does), spread over the
//! replicas' xDS ports, for `--requests` certificates in all. Prints the
//! certificates per second and the latency per request (connection and
//! handshake included).
//!
//! Cold start (`--cold-start`): `--agents` agents (default 10,000) all
//! start at once, each with its own P-256 key, its own TLS connection to
//! one replica (agent i to replica i mod n) and a join token, and retry
//! as `lodestar agent` does (`agent::join`: the same key, a jittered
//! backoff from 0.5 s, doubling) while the answer is "try again"
//! (UNAVAILABLE, RESOURCE_EXHAUSTED, no answer in time). Tokens: `--token-per-agent` creates one
//! single-use join token per agent first (through the API, before the
//! clock starts: what a deployment provisioning hosts does, and each use
//! is a compare-and-set on its own token); otherwise every agent sends the
//! token of `--join-token-file` (one token with as many uses: every use a
//! compare-and-set on the same object). Prints the time until every agent
//! has its certificate, the p50/p99 of the agents' completion times (from
//! the common start) and of single requests, retries and errors.
//!
//! The clients' key generation and TLS handshakes run on this machine
//! too: on one host, the figures are a lower bound for the replicas.

use anyhow::{bail, Context, Result};
use clap::Args;
use lodestar::agent::{CaClient, Identity, IssueError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args, Clone)]
pub struct CsrArgs {
    /// The API URLs (the global --server), for --token-per-agent.
    #[arg(skip)]
    pub servers: Vec<String>,
    /// The replicas' xDS addresses, HOST:PORT.
    #[arg(long, value_delimiter = ',', required = true)]
    xds_servers: Vec<String>,
    /// A join token's file (`lodestar token create --workload NS/SA`), for
    /// the first certificate (renewal), or every agent's (cold start
    /// without --token-per-agent).
    #[arg(long)]
    join_token_file: Option<std::path::PathBuf>,
    /// Concurrent clients (renewal).
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Certificates in all (renewal).
    #[arg(long, default_value_t = 1000)]
    requests: u64,
    /// Cold start: `--agents` agents at once, each a first certificate
    /// with a join token.
    #[arg(long)]
    cold_start: bool,
    /// Cold start: how many agents.
    #[arg(long, default_value_t = 10_000)]
    agents: usize,
    /// Cold start: at most this many agents in flight (each holds a TLS
    /// connection, a file descriptor); default: all of them.
    #[arg(long)]
    max_in_flight: Option<usize>,
    /// Cold start: create a single-use join token per agent (workload
    /// NS/SA of --workload), through the API at --server, before starting.
    #[arg(long)]
    token_per_agent: bool,
    /// Cold start: the workload of the tokens --token-per-agent creates.
    #[arg(long, default_value = "bench/agent")]
    workload: String,
    /// Cold start: give up (and count errors) after this many seconds.
    #[arg(long, default_value_t = 300)]
    deadline_s: u64,
}

pub async fn run(args: CsrArgs) -> Result<()> {
    println!("command: {}", super::command_line());
    let Some(ca_pem) = super::ACCESS.get().and_then(|a| a.ca_pem.clone()) else { bail!("csr needs the cluster's CA (a client config, --ca-file)") };
    if args.cold_start {
        return cold_start(args, ca_pem).await;
    }
    let Some(token_file) = &args.join_token_file else { bail!("--join-token-file: the first certificate's join token") };
    let token = std::fs::read_to_string(token_file)?.trim().to_string();
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

fn percentile(sorted: &[Duration], q: f64) -> f64 {
    sorted.get(((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1))).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// `--token-per-agent`: `n` single-use join tokens for `workload`, made
/// through the API (32 requests at a time).
async fn create_tokens(servers: &[String], n: usize, workload: &str) -> Result<Vec<String>> {
    let Some(server) = servers.first() else { bail!("--token-per-agent needs --server (the API) and a management token") };
    let url = format!("{}/v1/acl/tokens", super::base_url(server));
    let http = super::http()?;
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (http, url, next, workload) = (http.clone(), url.clone(), next.clone(), workload.to_string());
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < n as u64 {
                let body = serde_json::json!({"workload": workload, "uses": 1, "ttl": "1h"});
                let r = http.post(&url).json(&body).timeout(Duration::from_secs(30)).send().await?;
                let status = r.status();
                let v: serde_json::Value = r.json().await.unwrap_or_default();
                let Some(secret) = v["secret"].as_str() else { bail!("creating a join token: {status}: {v}") };
                out.push(secret.to_string());
            }
            Ok::<_, anyhow::Error>(out)
        }));
    }
    let mut all = Vec::with_capacity(n);
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(all)
}

/// What one cold-starting agent ended with.
struct AgentRun {
    /// Since the common start, when it had its certificate (None: never).
    done: Option<Duration>,
    /// Each request's latency (connection and handshake included).
    requests: Vec<Duration>,
    retries: u64,
    /// Of the retries, those the CA turned away (RESOURCE_EXHAUSTED).
    busy: u64,
    error: Option<String>,
}

async fn cold_start(args: CsrArgs, ca_pem: String) -> Result<()> {
    let n = args.agents;
    let tokens: Vec<String> = if args.token_per_agent {
        let t = Instant::now();
        let tokens = create_tokens(&args.servers, n, &args.workload).await.context("creating the agents' join tokens")?;
        println!("created {n} single-use join tokens in {:.1} s (not counted)", t.elapsed().as_secs_f64());
        tokens
    } else {
        let Some(file) = &args.join_token_file else { bail!("--cold-start needs --token-per-agent or --join-token-file (a token with --uses >= agents)") };
        vec![std::fs::read_to_string(file)?.trim().to_string()]
    };
    let tokens = Arc::new(tokens);
    let limit = Arc::new(tokio::sync::Semaphore::new(args.max_in_flight.unwrap_or(n).max(1)));
    let deadline = Duration::from_secs(args.deadline_s);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let server = args.xds_servers[i % args.xds_servers.len()].clone();
        let client = CaClient { servers: vec![server], cluster_ca_pem: Some(ca_pem.clone()), ttl: Some(Duration::from_secs(3600)) };
        let (tokens, limit) = (tokens.clone(), limit.clone());
        tasks.push(tokio::spawn(async move {
            let token = &tokens[i % tokens.len()];
            let _permit = limit.acquire().await;
            let mut run = AgentRun { done: None, requests: Vec::new(), retries: 0, busy: 0, error: None };
            // What `lodestar agent` does: one key, asked again with it
            // (jittered backoff) while the answer is "try again".
            let key = match rcgen::KeyPair::generate() {
                Ok(k) => k,
                Err(e) => {
                    run.error = Some(format!("generating a key: {e}"));
                    return run;
                }
            };
            let mut first_retry = true;
            let joined = lodestar::agent::join(&client, token, &key, |took, r| {
                run.requests.push(took);
                if let Err(IssueError::Retry(e)) = r {
                    run.retries += 1;
                    run.busy += u64::from(e.contains("ResourceExhausted") || e.contains("resource exhausted") || e.contains("is busy"));
                    if std::mem::take(&mut first_retry) && i % 1000 == 0 {
                        eprintln!("agent {i}: retrying: {e}");
                    }
                }
            });
            match tokio::time::timeout(deadline.saturating_sub(started.elapsed()), joined).await {
                Ok(Ok(_)) => run.done = Some(started.elapsed()),
                Ok(Err(e)) => run.error = Some(e.to_string()),
                Err(_) => run.error = Some(format!("no certificate within the deadline ({} s)", deadline.as_secs())),
            }
            run
        }));
    }
    let mut done = Vec::with_capacity(n);
    let mut requests = Vec::with_capacity(n);
    let (mut retries, mut busy, mut errors, mut first_error) = (0u64, 0u64, 0u64, None);
    for t in tasks {
        let run = t.await?;
        retries += run.retries;
        busy += run.busy;
        requests.extend(run.requests);
        match run.done {
            Some(d) => done.push(d),
            None => {
                errors += 1;
                first_error = first_error.or(run.error);
            }
        }
    }
    let total = started.elapsed();
    done.sort();
    requests.sort();
    let all_done = done.last().map_or(0.0, |d| d.as_secs_f64());
    let mode = if args.token_per_agent { "per_agent" } else { "shared" };
    if let Some(e) = &first_error {
        eprintln!("first error: {e}");
    }
    println!(
        "{:>8} {:>10} {:>8} {:>8} {:>8} {:>10} {:>10} {:>10} {:>11} {:>11}",
        "agents", "tokens", "certs", "errors", "retries", "all_s", "done_p50", "done_p99", "req_p50_ms", "req_p99_ms"
    );
    println!(
        "{:>8} {:>10} {:>8} {:>8} {:>8} {:>10.2} {:>10.2} {:>10.2} {:>11.1} {:>11.1}",
        n,
        mode,
        done.len(),
        errors,
        retries,
        all_done,
        percentile(&done, 0.5) / 1000.0,
        percentile(&done, 0.99) / 1000.0,
        percentile(&requests, 0.5),
        percentile(&requests, 0.99)
    );
    println!(
        "result: mode=cold_start tokens={mode} agents={n} certs={} errors={errors} retries={retries} turned_away={busy} all_done_s={all_done:.2} wall_s={:.2} certs_per_s={:.1} done_p50_s={:.2} done_p99_s={:.2} req_p50_ms={:.1} req_p99_ms={:.1}",
        done.len(),
        total.as_secs_f64(),
        done.len() as f64 / all_done.max(1e-9),
        percentile(&done, 0.5) / 1000.0,
        percentile(&done, 0.99) / 1000.0,
        percentile(&requests, 0.5),
        percentile(&requests, 0.99)
    );
    if errors > 0 {
        bail!("{errors} agents got no certificate");
    }
    Ok(())
}
