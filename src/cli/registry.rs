//! Registry commands: `register`, `deregister`, `heartbeat`, `lease`, and
//! the registry view of `get services` / `get instances`.

use super::client::Client;
use anyhow::{anyhow, bail, Result};
use clap::{Args, Subcommand};
use serde_json::{json, Map, Value};
use std::time::Duration;

#[derive(Args)]
pub struct RegisterArgs {
    /// The service: a registry Service name in the namespace, or a hostname.
    pub service: String,
    /// Instance name (default SERVICE-ADDRESS-PORT, dots as dashes).
    #[arg(long)]
    pub name: Option<String>,
    /// Its namespace (default: default).
    #[arg(short, long)]
    pub namespace: Option<String>,
    /// The address clients connect to (its Envoy's, on bare metal).
    #[arg(long)]
    pub address: String,
    /// `PORT` (every service port) or `NAME=PORT`; repeatable.
    #[arg(long = "port", required = true)]
    pub ports: Vec<String>,
    /// `KEY=VALUE`, repeatable (subsets select on labels).
    #[arg(long = "label")]
    pub labels: Vec<String>,
    /// `region/zone/subzone`.
    #[arg(long)]
    pub locality: Option<String>,
    /// Its load-balancing weight (default 1).
    #[arg(long)]
    pub weight: Option<u32>,
    /// TTL check: heartbeat within this (`lodestar heartbeat`), e.g. 10s.
    #[arg(long, conflicts_with_all = ["http", "tcp"])]
    pub ttl: Option<String>,
    /// HTTP check: a replica GETs this URL.
    #[arg(long, conflicts_with = "tcp")]
    pub http: Option<String>,
    /// TCP check: a replica connects to HOST:PORT.
    #[arg(long)]
    pub tcp: Option<String>,
    /// Probe interval (HTTP/TCP), e.g. 5s.
    #[arg(long)]
    pub interval: Option<String>,
    /// How long one probe may take (HTTP/TCP), e.g. 1s.
    #[arg(long)]
    pub timeout: Option<String>,
    /// Delete the instance once unhealthy this long.
    #[arg(long)]
    pub deregister_after: Option<String>,
    /// The Lease that owns this instance.
    #[arg(long)]
    pub lease: Option<String>,
    /// The workload's service account (its identity with `lodestar
    /// agent`): clients then speak mutual TLS to it (auto-mTLS).
    #[arg(long)]
    pub service_account: Option<String>,
}

/// What to renew (an instance's TTL, a lease), once or repeatedly.
#[derive(Args)]
pub struct Renew {
    /// The instance's or lease's name.
    pub name: String,
    /// Its namespace (default: default).
    #[arg(short, long)]
    pub namespace: Option<String>,
    /// Keep renewing at this interval (e.g. 2s) instead of once.
    #[arg(long)]
    pub every: Option<String>,
    /// With --every: stop after this many.
    #[arg(long)]
    pub count: Option<u64>,
}

#[derive(Subcommand)]
pub enum LeaseCommand {
    /// Create a lease (instances name it with `register --lease`).
    Grant {
        /// The lease's name.
        name: String,
        /// How long it lives without a keepalive, e.g. 15s.
        #[arg(long)]
        ttl: String,
        /// Its namespace (default: default).
        #[arg(short, long)]
        namespace: Option<String>,
    },
    /// Keep a lease alive: once, or every INTERVAL (COUNT times, or until stopped).
    Keepalive(Renew),
    /// Revoke a lease: it and every instance it owns go, in one write.
    Revoke {
        /// The lease's name.
        name: String,
        /// Its namespace (default: default).
        #[arg(short, long)]
        namespace: Option<String>,
    },
}

fn ns(n: &Option<String>) -> &str {
    n.as_deref().unwrap_or(crate::model::DEFAULT_NAMESPACE)
}

fn kv(s: &str, what: &str) -> Result<(String, String)> {
    s.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).ok_or_else(|| anyhow!("--{what} {s:?}: expected KEY=VALUE"))
}

/// The Instance resource `register` applies.
pub fn instance_document(a: &RegisterArgs) -> Result<Value> {
    let mut spec = Map::new();
    spec.insert("service".into(), json!(a.service));
    spec.insert("address".into(), json!(a.address));
    let mut named = Map::new();
    let mut first_port = None;
    for p in &a.ports {
        match p.split_once('=') {
            Some((name, n)) => {
                let n: u32 = n.parse().map_err(|_| anyhow!("--port {p:?}: {n:?} is not a port number"))?;
                named.insert(name.to_string(), json!(n));
                first_port.get_or_insert(n);
            }
            None => {
                let n: u32 = p.parse().map_err(|_| anyhow!("--port {p:?}: expected PORT or NAME=PORT"))?;
                spec.insert("port".into(), json!(n));
                first_port.get_or_insert(n);
            }
        }
    }
    if !named.is_empty() {
        spec.insert("ports".into(), Value::Object(named));
    }
    for (k, v) in [
        ("locality", a.locality.as_ref().map(|v| json!(v))),
        ("weight", a.weight.map(|v| json!(v))),
        ("lease", a.lease.as_ref().map(|v| json!(v))),
        ("serviceAccount", a.service_account.as_ref().map(|v| json!(v))),
    ] {
        if let Some(v) = v {
            spec.insert(k.into(), v);
        }
    }
    let mut check = Map::new();
    for (k, v) in
        [("ttl", &a.ttl), ("http", &a.http), ("tcp", &a.tcp), ("interval", &a.interval), ("timeout", &a.timeout), ("deregisterAfter", &a.deregister_after)]
    {
        if let Some(v) = v {
            check.insert(k.into(), json!(v));
        }
    }
    if !check.is_empty() {
        spec.insert("healthCheck".into(), Value::Object(check));
    }
    let name = a.name.clone().unwrap_or_else(|| format!("{}-{}-{}", a.service.replace('.', "-"), a.address.replace(['.', ':'], "-"), first_port.unwrap_or(0)));
    let labels: Map<String, Value> = a.labels.iter().map(|l| kv(l, "label").map(|(k, v)| (k, json!(v)))).collect::<Result<_>>()?;
    let mut metadata = json!({"name": name, "namespace": ns(&a.namespace)});
    if !labels.is_empty() {
        metadata["labels"] = Value::Object(labels);
    }
    Ok(json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Instance", "metadata": metadata, "spec": spec}))
}

pub async fn register(client: &Client, a: RegisterArgs) -> Result<()> {
    let doc = instance_document(&a)?;
    let result = client.post("/v1/apply", &json!({"resources": [doc]})).await?;
    super::print_write_result(&result);
    Ok(())
}

pub async fn deregister(client: &Client, name: &str, namespace: &Option<String>) -> Result<()> {
    let result = client.delete(&format!("/v1/resources/instances/{}/{name}", ns(namespace))).await?;
    super::print_write_result(&result);
    Ok(())
}

/// Heartbeat once, or every `every` (`count` times, or forever). A failed
/// heartbeat is reported and retried at the next tick (another replica may
/// be leader by then); the command fails only if a one-shot fails.
pub async fn heartbeat(client: &Client, kind: &str, r: &Renew) -> Result<()> {
    let (name, count) = (&r.name, r.count);
    let path = format!("/v1/resources/{kind}/{}/{name}/heartbeat", ns(&r.namespace));
    let Some(every) = r.every.as_deref() else {
        let r = client.post(&path, &json!({})).await?;
        println!("{kind}/{name} renewed for {}s", r["ttlSeconds"]);
        return Ok(());
    };
    let every: Duration = crate::model::istio::duration::parse_duration(every).map_err(|e| anyhow!("--every: {e}"))?;
    if every.is_zero() {
        bail!("--every must be greater than 0");
    }
    let times = count.map_or_else(|| "until stopped".to_string(), |c| format!("{c} times"));
    eprintln!("renewing {kind}/{name} every {}, {times}", r.every.as_deref().unwrap_or_default());
    // On a terminal, a line that says it is alive; a failure is always said.
    let mut progress = crate::client::progress::Progress::new();
    let (mut sent, mut renewed) = (0u64, 0u64);
    loop {
        match client.post(&path, &json!({})).await {
            Ok(r) => {
                renewed += 1;
                let at = crate::auth::audit::now_text();
                progress.show(&format!("{kind}/{name}: renewed {renewed} times, last at {} UTC for {}s", &at[11..19], r["ttlSeconds"]));
            }
            Err(e) => {
                progress.clear();
                eprintln!("heartbeat {kind}/{name}: {e}");
            }
        }
        sent += 1;
        if count.is_some_and(|c| sent >= c) {
            progress.clear();
            eprintln!("{kind}/{name}: renewed {renewed} of {sent} times");
            return Ok(());
        }
        tokio::time::sleep(every).await;
    }
}

pub async fn lease(client: &Client, command: LeaseCommand) -> Result<()> {
    match command {
        LeaseCommand::Grant { name, ttl, namespace } => {
            let doc = json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Lease",
                             "metadata": {"name": name, "namespace": ns(&namespace)}, "spec": {"ttl": ttl}});
            super::print_write_result(&client.post("/v1/apply", &json!({"resources": [doc]})).await?);
            Ok(())
        }
        LeaseCommand::Keepalive(r) => heartbeat(client, "leases", &r).await,
        LeaseCommand::Revoke { name, namespace } => {
            super::print_write_result(&client.delete(&format!("/v1/resources/leases/{}/{name}", ns(&namespace))).await?);
            Ok(())
        }
    }
}

/// An instance's health as shown: its status, or what an unset status means.
pub fn instance_health(item: &Value) -> String {
    if let Some(h) = item["status"]["health"].as_str() {
        return h.to_string();
    }
    let check = &item["spec"]["healthCheck"];
    if check["http"].is_string() || check["tcp"].is_string() {
        "Unknown".into()
    } else {
        "Healthy".into()
    }
}

/// `get services`: the registry's view (declared and implied services).
pub async fn services_table(client: &Client, namespace: Option<&str>) -> Result<()> {
    let q = super::query(&[("namespace", namespace)]);
    let view = client.get(&format!("/v1/registry/services{q}")).await?;
    let services = view["services"].as_array().cloned().unwrap_or_default();
    if services.is_empty() {
        eprintln!("No resources found.");
        return Ok(());
    }
    let mut rows = vec![["NAMESPACE", "HOSTNAME", "DECLARED", "PORTS", "INSTANCES", "HEALTHY"].map(String::from).to_vec()];
    for s in services {
        let ports = s["ports"].as_array().map(|p| p.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(",")).unwrap_or_default();
        rows.push(vec![
            s["namespace"].as_str().unwrap_or("").into(),
            s["hostname"].as_str().unwrap_or("").into(),
            if s["declared"].as_bool() == Some(true) { "yes" } else { "implied" }.into(),
            ports,
            s["instances"].to_string(),
            s["healthy"].to_string(),
        ]);
    }
    super::print_rows(rows);
    Ok(())
}

/// `lodestar topology`: `/v1/topology` as a table (or its JSON).
pub async fn topology_table(client: &Client, namespace: Option<&str>, json: bool) -> Result<()> {
    let q = super::query(&[("namespace", namespace)]);
    let t = client.get(&format!("/v1/topology{q}")).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&t).unwrap_or_default());
        return Ok(());
    }
    let edges = t["edges"].as_array().cloned().unwrap_or_default();
    if edges.is_empty() {
        eprintln!("No workload calls another (or none this token may read).");
        return Ok(());
    }
    let mut rows = vec![["CALLER", "CALLEE", "VERDICT", "VIA"].map(String::from).to_vec()];
    for e in &edges {
        let via: Vec<String> = e["via"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| format!("{} {}/{}", v["kind"].as_str().unwrap_or(""), v["namespace"].as_str().unwrap_or(""), v["name"].as_str().unwrap_or("")))
            .collect();
        let callee = match e["host"].as_str() {
            Some(h) => format!("{} (as {h})", e["to"].as_str().unwrap_or("")),
            None => e["to"].as_str().unwrap_or("").into(),
        };
        rows.push(vec![
            e["from"].as_str().unwrap_or("").into(),
            callee,
            e["verdict"].as_str().unwrap_or("").into(),
            if via.is_empty() { "-".into() } else { via.join(", ") },
        ]);
    }
    super::print_rows(rows);
    if t["truncated"].as_bool() == Some(true) {
        eprintln!("(only the first {} edges: narrow with --namespace)", edges.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: RegisterArgs,
    }

    #[test]
    fn register_carries_the_service_account() {
        let cli = Cli::parse_from(["register", "reviews", "--address", "10.0.0.21", "--port", "9080", "--service-account", "reviews"]);
        let doc = instance_document(&cli.args).unwrap();
        assert_eq!(doc["spec"]["serviceAccount"], "reviews", "{doc}");
        let spec = crate::model::registry::validate_instance(&doc["spec"]).unwrap();
        assert_eq!(spec.service_account.as_deref(), Some("reviews"));
        assert!(crate::model::registry::validate_instance(&json!({"service": "r", "address": "10.0.0.1", "port": 1, "serviceAccount": "Bad_SA"})).is_err());
    }
}
