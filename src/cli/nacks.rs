//! `lodestar nacks`: every NACK as it arrives, from every replica's
//! `GET /v1/nacks` (each streams its own proxies'), merged.

use super::Output;
use crate::client::Client;
use anyhow::{anyhow, Result};
use clap::Args;
use serde_json::Value;

#[derive(Args)]
pub struct NacksArgs {
    /// Stop after this long, e.g. 30s (default: until interrupted).
    #[arg(long)]
    timeout: Option<String>,
    /// Stop after this many NACKs.
    #[arg(long)]
    count: Option<usize>,
    /// Only the replica the CLI talks to (default: every member).
    #[arg(long)]
    this_replica: bool,
    /// json: one event per line, as the API streams them.
    #[arg(short, long)]
    output: Option<Output>,
    /// The NACKs of the last hour instead (each replica keeps its own
    /// proxies' last 256, connected still or not), oldest first; then exit.
    #[arg(long)]
    recent: bool,
}

/// One NACK event (`{"replica", "nack"}`), as a line.
fn print_nack(v: &Value, json: bool) {
    if json {
        println!("{v}");
        return;
    }
    let e = &v["nack"];
    println!(
        "replica {}: {} rejected {} version {}: {}",
        v["replica"],
        e["proxy"].as_str().unwrap_or(""),
        e["type"].as_str().unwrap_or(""),
        e["rejectedVersion"].as_str().unwrap_or(""),
        e["error"].as_str().unwrap_or("")
    );
}

/// `--recent`: every replica's `/v1/nacks/recent`, merged by time.
async fn recent(replicas: Vec<Client>, json: bool) -> Result<()> {
    let mut all: Vec<Value> = Vec::new();
    for r in replicas {
        match r.get("/v1/nacks/recent").await {
            Ok(answer) => {
                for n in answer["nacks"].as_array().into_iter().flatten() {
                    all.push(serde_json::json!({"replica": answer["replica"], "nack": n}));
                }
            }
            Err(e) => eprintln!("warning: {}: {e}", r.base()),
        }
    }
    all.sort_by_key(|v| v["nack"]["atUnixMs"].as_u64().unwrap_or(0));
    if all.is_empty() && !json {
        eprintln!("No NACK in the last hour.");
    }
    for v in &all {
        print_nack(v, json);
    }
    Ok(())
}

/// One replica's stream, line by line, into `tx` (ends with the stream).
async fn follow(replica: Client, tx: tokio::sync::mpsc::Sender<Result<Value, String>>) {
    let mut r = match replica.get_stream("/v1/nacks").await {
        Ok(r) => r,
        Err(e) => {
            let _ = tx.send(Err(format!("{}: {e}", replica.base()))).await;
            return;
        }
    };
    let mut buf = Vec::new();
    loop {
        match r.chunk().await {
            Ok(Some(bytes)) => {
                buf.extend_from_slice(&bytes);
                while let Some(i) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=i).collect();
                    let v = serde_json::from_slice(&line).map_err(|e| format!("{}: an unreadable line: {e}", replica.base()));
                    if tx.send(v).await.is_err() {
                        return;
                    }
                }
            }
            Ok(None) => return,
            Err(e) => {
                let _ = tx.send(Err(format!("{}: {e}", replica.base()))).await;
                return;
            }
        }
    }
}

pub async fn run(client: &Client, a: NacksArgs) -> Result<()> {
    let replicas: Vec<Client> =
        if a.this_replica { vec![client.clone()] } else { super::members(client).await?.into_iter().map(|(_, addr)| client.with_server(&addr)).collect() };
    if a.recent {
        return recent(replicas, matches!(a.output, Some(Output::Json))).await;
    }
    let n = replicas.len();
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    for r in replicas {
        tokio::spawn(follow(r, tx.clone()));
    }
    drop(tx);
    let limit = a.timeout.as_deref().map(crate::model::istio::duration::parse_duration).transpose().map_err(|e| anyhow!("--timeout: {e}"))?;
    let deadline = tokio::time::Instant::now() + limit.unwrap_or(std::time::Duration::from_secs(100 * 365 * 24 * 3600));
    let (mut watching, mut seen) = (0, 0);
    loop {
        let msg = tokio::select! {
            m = rx.recv() => m,
            _ = tokio::time::sleep_until(deadline) => break,
        };
        match msg {
            None => break,
            Some(Err(e)) => eprintln!("warning: {e}"),
            Some(Ok(v)) if v.get("watching").is_some() => {
                watching += 1;
                if watching == n {
                    eprintln!("watching NACKs on {n} replica(s)");
                }
            }
            Some(Ok(v)) if v.get("revert").is_some() => {
                let r = &v["revert"];
                match (a.output, r["revertedBy"].as_u64()) {
                    (Some(Output::Json), _) => println!("{v}"),
                    (_, Some(by)) => println!("replica {}: revision {} reverted by revision {by} (revert_on_nack)", v["replica"], r["revision"]),
                    (_, None) => println!(
                        "replica {}: revision {} {} (revert_on_nack): {}",
                        v["replica"],
                        r["revision"],
                        if r["result"] == "failed" { "could not be reverted" } else { "not reverted" },
                        r["reason"].as_str().unwrap_or("")
                    ),
                }
            }
            Some(Ok(v)) if v.get("nack").is_some() => {
                print_nack(&v, matches!(a.output, Some(Output::Json)));
                seen += 1;
                if a.count.is_some_and(|c| seen >= c) {
                    break;
                }
            }
            Some(Ok(v)) => eprintln!("warning: {v}"),
        }
    }
    Ok(())
}
