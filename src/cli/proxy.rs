//! `lodestar proxy-status` and `lodestar proxy-config`: what every replica
//! serves every connected proxy (istioctl's commands of the same names).

use super::client::Client;
use anyhow::{anyhow, bail, Result};
use clap::ValueEnum;
use serde_json::Value;

#[derive(Clone, Copy, ValueEnum)]
pub enum ConfigType {
    Cluster,
    Endpoint,
    Listener,
    Route,
}

/// Every member's API client, with its id.
async fn members(client: &Client) -> Result<Vec<(u64, Client)>> {
    let status = client.get("/v1/cluster").await?;
    let members = status["members"].as_array().ok_or_else(|| anyhow!("no members in the cluster status"))?;
    Ok(members.iter().filter_map(|m| Some((m["id"].as_u64()?, client.with_server(m["info"]["api_addr"].as_str()?)))).collect())
}

/// One type's state on a stream, as istioctl shows it.
fn state(t: &Value) -> &'static str {
    if t.is_null() || t["sent_nonce"].is_null() {
        return "NOT SENT";
    }
    if t["last_nack"]["nonce"] == t["sent_nonce"] {
        return "NACKED";
    }
    if t["in_sync"] == true {
        "SYNCED"
    } else {
        "STALE"
    }
}

pub async fn status(client: &Client) -> Result<()> {
    let mut rows = vec![["NAME", "REPLICA", "CDS", "LDS", "EDS", "RDS", "REVISION", "PROTOCOL"].map(String::from).to_vec()];
    let mut refused = vec![["REFUSED", "REPLICA", "WHEN", "WHY"].map(String::from).to_vec()];
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    for (id, member) in members(client).await? {
        let syncz = match member.get("/debug/syncz").await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("replica {id}: {e}");
                continue;
            }
        };
        for p in syncz["proxies"].as_array().into_iter().flatten() {
            let t = &p["types"];
            rows.push(vec![
                p["id"].as_str().unwrap_or("").to_string(),
                id.to_string(),
                state(&t["CDS"]).into(),
                state(&t["LDS"]).into(),
                state(&t["EDS"]).into(),
                state(&t["RDS"]).into(),
                p["revision"].as_u64().map_or("-".into(), |r| r.to_string()),
                p["protocol"].as_str().unwrap_or("").to_string(),
            ]);
        }
        for r in syncz["refused"].as_array().into_iter().flatten() {
            let who = r["proxy"].as_str().or(r["remote"].as_str()).unwrap_or("?");
            let ago = now_ms.saturating_sub(r["at_ms"].as_u64().unwrap_or(now_ms)) / 1000;
            refused.push(vec![who.to_string(), id.to_string(), format!("{ago}s ago"), format!("{}: {}", s(&r["code"]), s(&r["reason"]))]);
        }
    }
    if rows.len() == 1 {
        eprintln!("No proxies connected.");
    } else {
        super::print_rows(rows);
    }
    // Streams refused for their credentials: a proxy that never shows up
    // above is usually here, with the reason.
    if refused.len() > 1 {
        println!();
        super::print_rows(refused);
    }
    Ok(())
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// Whether a proxy (NAME.NAMESPACE or the full node id) is connected to a
/// replica; else whether it was refused (the newest reason), or, since
/// `since_ms` (Unix ms), any stream was refused before it said who it is
/// (no credential: refused before its first request); else neither.
pub enum Presence {
    Connected,
    Refused(String),
    Absent,
}

fn names(id: &str, proxy: &str) -> bool {
    id == proxy || id.split('~').nth(2) == Some(proxy)
}

pub(super) async fn presence(client: &Client, proxy: &str, since_ms: u64) -> Result<Presence> {
    let mut refused: Option<(u64, String)> = None;
    for (id, member) in members(client).await? {
        let Ok(syncz) = member.get("/debug/syncz").await else { continue };
        if syncz["proxies"].as_array().into_iter().flatten().filter_map(|p| p["id"].as_str()).any(|i| names(i, proxy)) {
            return Ok(Presence::Connected);
        }
        for r in syncz["refused"].as_array().into_iter().flatten() {
            let at = r["at_ms"].as_u64().unwrap_or(0);
            let about = match r["proxy"].as_str() {
                Some(p) if names(p, proxy) => format!("{} by replica {id}: {}", s(&r["code"]), s(&r["reason"])),
                None if at >= since_ms => format!("a stream from {} was refused by replica {id} ({}: {})", s(&r["remote"]), s(&r["code"]), s(&r["reason"])),
                _ => continue,
            };
            if refused.as_ref().is_none_or(|(t, _)| at >= *t) {
                refused = Some((at, about));
            }
        }
    }
    Ok(refused.map_or(Presence::Absent, |(_, why)| Presence::Refused(why)))
}

/// The replica serving `proxy` (NAME.NAMESPACE or the full node id), and
/// the proxy's node id.
pub(super) async fn find(client: &Client, proxy: &str) -> Result<(Client, String)> {
    for (_, member) in members(client).await? {
        let Ok(syncz) = member.get("/debug/syncz").await else { continue };
        // By full node id, or by the NAME.NAMESPACE part istioctl users type.
        let id = syncz["proxies"].as_array().into_iter().flatten().filter_map(|p| p["id"].as_str()).find(|id| names(id, proxy));
        if let Some(id) = id {
            return Ok((member, id.to_string()));
        }
    }
    bail!("proxy {proxy:?} is not connected to any replica")
}

pub async fn config(client: &Client, kind: ConfigType, proxy: &str, json: bool) -> Result<()> {
    let t = match kind {
        ConfigType::Cluster => "cluster",
        ConfigType::Endpoint => "endpoint",
        ConfigType::Listener => "listener",
        ConfigType::Route => "route",
    };
    let (member, id) = find(client, proxy).await?;
    let dump = member.get(&format!("/debug/config_dump?proxyID={}&type={t}", super::urlencode(&id))).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&dump)?);
        return Ok(());
    }
    let key = format!("{t}s");
    let mut rows = vec![["NAME", "VERSION", "SUMMARY"].map(String::from).to_vec()];
    for r in dump[&key].as_array().into_iter().flatten() {
        let res = &r["resource"];
        let summary = match kind {
            ConfigType::Cluster => res["type"].as_str().or(res["clusterDiscoveryType"].as_str()).unwrap_or("EDS").to_string(),
            ConfigType::Endpoint => {
                let eps: Vec<String> = res["endpoints"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|l| l["lbEndpoints"].as_array().cloned().unwrap_or_default())
                    .filter_map(|e| {
                        let a = &e["endpoint"]["address"]["socketAddress"];
                        Some(format!("{}:{}", a["address"].as_str()?, a["portValue"]))
                    })
                    .collect();
                eps.join(",")
            }
            ConfigType::Listener => {
                let a = &res["address"]["socketAddress"];
                format!("{}:{}", a["address"].as_str().unwrap_or(""), a["portValue"])
            }
            ConfigType::Route => format!("{} virtual hosts", res["virtualHosts"].as_array().map_or(0, |v| v.len())),
        };
        rows.push(vec![r["name"].as_str().unwrap_or("").to_string(), r["version"].as_str().unwrap_or("").to_string(), summary]);
    }
    println!("proxy {id} at revision {}", dump["revision"]);
    super::print_rows(rows);
    Ok(())
}
