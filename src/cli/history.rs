//! `lodestar history`, `diff` and `rollback` (`api::history`).

use super::{print_write_result, query, Output};
use crate::client::Client;
use anyhow::{bail, Result};
use clap::Args;
use serde_json::{json, Value};

#[derive(Args)]
pub struct HistoryArgs {
    /// Only revisions that touched this kind (as `get` takes it).
    kind: Option<String>,
    /// ... and this name.
    name: Option<String>,
    /// ... in this namespace (default: every namespace).
    #[arg(short, long)]
    namespace: Option<String>,
    /// At most this many revisions, newest first.
    #[arg(long, default_value_t = 20)]
    limit: usize,
    /// json: the API's answer (default: a table).
    #[arg(short, long)]
    output: Option<Output>,
}

#[derive(Args)]
pub struct DiffArgs {
    /// From this revision's state...
    from: u64,
    /// ... to this one's (default: now).
    to: Option<u64>,
    /// json: the API's answer (default: a summary).
    #[arg(short, long)]
    output: Option<Output>,
}

#[derive(Args)]
pub struct RollbackArgs {
    /// Restore the objects to their state at this revision, as one new
    /// revision (`lodestar history` lists them).
    revision: u64,
    /// Only these objects, as KIND NAME pairs (default: every object that
    /// changed after REVISION).
    objects: Vec<String>,
    /// Namespace of the objects named.
    #[arg(short, long, default_value = "default")]
    namespace: String,
    /// Preview: what would change, nothing written.
    #[arg(long)]
    dry_run: bool,
    /// With --dry-run: json for pipelines.
    #[arg(short, long, requires = "dry_run")]
    output: Option<Output>,
}

pub async fn history(client: &Client, a: HistoryArgs) -> Result<()> {
    let limit = a.limit.to_string();
    let q = query(&[("kind", a.kind.as_deref()), ("name", a.name.as_deref()), ("namespace", a.namespace.as_deref()), ("limit", Some(&limit))]);
    let answer = client.get(&format!("/v1/history{q}")).await?;
    if matches!(a.output, Some(Output::Json)) {
        println!("{}", serde_json::to_string_pretty(&answer)?);
        return Ok(());
    }
    println!("{:<9} {:<7} {:<24} {:<40} AUTHOR", "REVISION", "ACTION", "KIND", "OBJECT");
    for r in answer["revisions"].as_array().into_iter().flatten() {
        // No author: made before the cluster recorded them (version 2).
        let author = match (r["author"].as_str(), r["message"].as_str()) {
            (Some(a), Some(m)) => format!("{a} ({m})"),
            (Some(a), None) => a.to_string(),
            _ => "-".to_string(),
        };
        for c in r["changes"].as_array().into_iter().flatten() {
            let object = format!("{}/{}", c["namespace"].as_str().unwrap_or(""), c["name"].as_str().unwrap_or(""));
            println!("{:<9} {:<7} {:<24} {object:<40} {author}", r["revision"], c["action"].as_str().unwrap_or(""), c["kind"].as_str().unwrap_or(""));
        }
    }
    eprintln!("revision {}; history kept from revision {}", answer["revision"], answer["oldest"]);
    Ok(())
}

pub async fn diff(client: &Client, a: DiffArgs) -> Result<()> {
    let to = a.to.map(|t| t.to_string());
    let q = query(&[("from", Some(&a.from.to_string())), ("to", to.as_deref())]);
    let answer = client.get(&format!("/v1/diff{q}")).await?;
    if matches!(a.output, Some(Output::Json)) {
        println!("{}", serde_json::to_string_pretty(&answer)?);
        return Ok(());
    }
    let changes = answer["changes"].as_array().map(Vec::as_slice).unwrap_or_default();
    eprintln!("revision {} to {}: {} resource(s) differ", answer["from"], answer["to"], changes.len());
    print!("{}", crate::api::dryrun::render_changes(changes));
    Ok(())
}

pub async fn rollback(client: &Client, a: RollbackArgs) -> Result<Option<u64>> {
    if !a.objects.len().is_multiple_of(2) {
        bail!("objects are KIND NAME pairs: {:?} has no name", a.objects.last().unwrap_or(&String::new()));
    }
    let resources: Vec<Value> = a.objects.chunks(2).map(|p| json!({"kind": p[0], "namespace": a.namespace, "name": p[1]})).collect();
    let q = query(&[("dryRun", a.dry_run.then_some("true"))]);
    let body = json!({"revision": a.revision, "resources": resources});
    if a.dry_run {
        let answer = super::dry_run_everywhere(client, &format!("/v1/rollback{q}"), &body).await?;
        match a.output {
            Some(Output::Json) => println!("{}", serde_json::to_string_pretty(&answer)?),
            _ => print!("{}", crate::api::dryrun::render(&answer)),
        }
        return Ok(None);
    }
    let answer = client.post(&format!("/v1/rollback{q}"), &body).await?;
    print_write_result(&answer);
    Ok(answer["revision"].as_u64())
}
