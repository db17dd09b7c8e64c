//! `lodestar authz check`: which policy allows or denies a request at a
//! proxy, and why the others did not match, from the config the proxy was
//! served (the replica replays Envoy's RBAC over it: `translate::explain`).

use super::client::Client;
use anyhow::{anyhow, bail, Result};
use clap::{Args, Subcommand};
use serde_json::{json, Value};

#[derive(Subcommand)]
pub enum AuthzCommand {
    /// Explain a request at a proxy: allowed or denied, by which policy
    /// rule, and why every other rule did not match. Exits 1 when denied.
    Check(CheckArgs),
}

#[derive(Args)]
pub struct CheckArgs {
    /// The proxy (NAME.NAMESPACE, or its full node id).
    #[arg(long)]
    proxy: String,
    /// The listener port (default: the proxy's only inbound or gateway port).
    #[arg(long)]
    port: Option<u32>,
    /// Who sends it: a peer address (`ipBlocks`) or a SPIFFE id
    /// (`principals`, `namespaces`, with mutual TLS). Repeat for both.
    #[arg(long)]
    source: Vec<String>,
    /// The original client address (`remoteIpBlocks`), if not the source.
    #[arg(long)]
    remote: Option<String>,
    /// The request's method.
    #[arg(long, default_value = "GET")]
    method: String,
    /// The request's path (with its query, if any).
    #[arg(long, default_value = "/")]
    path: String,
    /// The Host / :authority header.
    #[arg(long, default_value = "")]
    host: String,
    /// A request header, NAME=VALUE (repeatable).
    #[arg(long = "header")]
    headers: Vec<String>,
    /// A verified JWT's payload, as JSON, e.g. '{"iss":"https://issuer","sub":"alice"}'.
    #[arg(long)]
    jwt_claims: Option<String>,
    /// TLS SNI.
    #[arg(long)]
    sni: Option<String>,
    /// Print the whole explanation as JSON.
    #[arg(short, long)]
    json: bool,
}

pub async fn run(client: &Client, command: AuthzCommand) -> Result<()> {
    let AuthzCommand::Check(a) = command;
    let mut req = json!({"method": a.method, "path": a.path, "host": a.host, "port": a.port, "sni": a.sni});
    for s in &a.source {
        if s.starts_with("spiffe://") {
            req["principal"] = json!(s);
        } else {
            let ip: std::net::IpAddr = s.parse().map_err(|_| anyhow!("--source {s:?}: expected an IP address or a spiffe:// id"))?;
            req["source_ip"] = json!(ip);
        }
    }
    if let Some(r) = &a.remote {
        let ip: std::net::IpAddr = r.parse().map_err(|_| anyhow!("--remote {r:?}: expected an IP address"))?;
        req["remote_ip"] = json!(ip);
    }
    let mut headers = serde_json::Map::new();
    for h in &a.headers {
        let (k, v) = h.split_once('=').ok_or_else(|| anyhow!("--header {h:?}: expected NAME=VALUE"))?;
        headers.insert(k.trim().to_ascii_lowercase(), json!(v));
    }
    req["headers"] = Value::Object(headers);
    if let Some(c) = &a.jwt_claims {
        let claims: Value = serde_json::from_str(c).map_err(|e| anyhow!("--jwt-claims: not JSON: {e}"))?;
        if !claims.is_object() {
            bail!("--jwt-claims: expected a JSON object");
        }
        req["claims"] = claims;
    }
    let (member, id) = super::proxy::find(client, &a.proxy).await?;
    let e = member.post(&format!("/debug/authz?proxyID={}", super::urlencode(&id)), &req).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&e)?);
    } else {
        print(&e);
    }
    if e["allowed"] != true {
        std::process::exit(1);
    }
    Ok(())
}

fn print(e: &Value) {
    // DELEGATED: a CUSTOM policy hands the request to an external
    // authorizer first; the summary says what follows if it allows.
    let verdict = match (e["allowed"] == true, e["delegated_to"].is_string()) {
        (true, true) => "DELEGATED",
        (true, false) => "ALLOWED",
        (false, _) => "DENIED",
    };
    println!(
        "{verdict}: {} (listener {}, {})",
        e["summary"].as_str().unwrap_or(""),
        e["listener"].as_str().unwrap_or(""),
        e["protocol"].as_str().unwrap_or("")
    );
    let mut rows = vec![["FILTER", "POLICY RULE", "RESULT"].map(String::from).to_vec()];
    for f in e["filters"].as_array().into_iter().flatten() {
        let action = f["action"].as_str().unwrap_or("");
        // CUSTOM's rules are shadow rules that trigger ext_authz, not a dry run.
        let shadow = if action == "CUSTOM" { "CUSTOM (triggers ext_authz)".to_string() } else { format!("{action} (dry run)") };
        for (list, label) in [(&f["policies"], action.to_string()), (&f["dry_run"], shadow)] {
            for p in list.as_array().into_iter().flatten() {
                let result = if p["matched"] == true { "matched".to_string() } else { format!("no match: {}", p["why"].as_str().unwrap_or("")) };
                rows.push(vec![label.clone(), p["name"].as_str().unwrap_or("").to_string(), result]);
            }
        }
    }
    if rows.len() > 1 {
        super::print_rows(rows);
    }
}
