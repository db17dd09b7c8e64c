//! `http`: a bounded HTTP/1.1 load against one URL, e.g. through an Envoy
//! sidecar. `--concurrency` workers, each on its own keep-alive connection
//! (one client, one pooled connection per worker), send `--requests`
//! requests in all, one after another per worker; prints the count, the
//! errors (no response), the statuses, and the latency per request
//! (p50/p90/p99/max, response body read). Nothing of Lodestar is used: the
//! URL is any HTTP server's; `--header` adds request headers.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args, Clone)]
pub struct HttpArgs {
    /// The URL every request goes to (http:// only).
    #[arg(long)]
    url: String,
    /// Requests in all.
    #[arg(long, default_value_t = 1000)]
    requests: u64,
    /// Concurrent workers, one keep-alive connection each.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Method.
    #[arg(long, default_value = "GET")]
    method: String,
    /// A request header, NAME=VALUE (repeatable; `host=...` sets Host).
    #[arg(long = "header", value_name = "NAME=VALUE")]
    headers: Vec<String>,
    /// Requests per worker sent first and not counted (connection set-up).
    #[arg(long, default_value_t = 5)]
    warmup: u64,
    /// Per-request timeout, milliseconds.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
}

pub async fn run(args: HttpArgs) -> Result<()> {
    println!("command: {}", super::command_line());
    if args.concurrency == 0 {
        bail!("--concurrency: must be at least 1");
    }
    let method: reqwest::Method = args.method.parse().context("--method")?;
    let mut headers = reqwest::header::HeaderMap::new();
    for h in &args.headers {
        let Some((k, v)) = h.split_once('=') else { bail!("--header {h:?}: want NAME=VALUE") };
        let name: reqwest::header::HeaderName = k.trim().parse().with_context(|| format!("--header {h:?}: name"))?;
        headers.insert(name, v.parse().with_context(|| format!("--header {h:?}: value"))?);
    }
    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency {
        let client = reqwest::Client::builder().no_proxy().pool_max_idle_per_host(1).timeout(Duration::from_millis(args.timeout_ms)).build()?;
        let (next, errors, total, warmup) = (next.clone(), errors.clone(), args.requests, args.warmup);
        let (method, url, headers) = (method.clone(), args.url.clone(), headers.clone());
        tasks.push(tokio::spawn(async move {
            let send = || async {
                let r = client.request(method.clone(), &url).headers(headers.clone()).send().await?;
                let status = r.status().as_u16();
                r.bytes().await?;
                Ok::<u16, reqwest::Error>(status)
            };
            for _ in 0..warmup {
                let _ = send().await;
            }
            let mut seen = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < total {
                let t = Instant::now();
                match send().await {
                    Ok(status) => seen.push((status, t.elapsed())),
                    Err(e) => {
                        if errors.fetch_add(1, Ordering::Relaxed) == 0 {
                            eprintln!("first error: {e}");
                        }
                    }
                }
            }
            seen
        }));
    }
    let mut statuses = BTreeMap::<u16, u64>::new();
    let mut all = Vec::new();
    for t in tasks {
        for (status, d) in t.await? {
            *statuses.entry(status).or_default() += 1;
            all.push(d);
        }
    }
    let elapsed = started.elapsed();
    all.sort();
    let at = |q: f64| all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1))).map_or(0.0, |d| d.as_secs_f64() * 1000.0);
    let errors = errors.load(Ordering::Relaxed);
    let rate = all.len() as f64 / elapsed.as_secs_f64();
    let statuses_s = statuses.iter().map(|(s, n)| format!("{s}:{n}")).collect::<Vec<_>>().join(",");
    println!("{:>6} {:>8} {:>7} {:>10} {:>8} {:>8} {:>8} {:>8}  statuses", "conc", "requests", "errors", "req/s", "p50_ms", "p90_ms", "p99_ms", "max_ms");
    println!(
        "{:>6} {:>8} {:>7} {:>10.1} {:>8.3} {:>8.3} {:>8.3} {:>8.3}  {statuses_s}",
        args.concurrency,
        all.len(),
        errors,
        rate,
        at(0.5),
        at(0.9),
        at(0.99),
        at(1.0)
    );
    println!(
        "result: concurrency={} requests={} errors={errors} req_per_s={rate:.1} p50_ms={:.3} p90_ms={:.3} p99_ms={:.3} max_ms={:.3} statuses={statuses_s}",
        args.concurrency,
        all.len(),
        at(0.5),
        at(0.9),
        at(0.99),
        at(1.0)
    );
    if errors > 0 {
        bail!("{errors} requests failed");
    }
    Ok(())
}
