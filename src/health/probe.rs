//! HTTP and TCP probes, spread over the replicas (see the module above).

use super::{status_json, CheckStatus, Checks};
use crate::ha::HaState;
use crate::model::registry::{parse_host_port, parse_http_url, HealthCheck, HealthState, InstanceStatus};
use crate::model::{Kind, ResourceKey, TypedSpec};
use crate::node::Node;
use crate::store::types::{Op, Txn};
use crate::translate::resources::fnv1a;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How often assignments are recomputed (and peers asked if alive).
const ASSIGN_EVERY: Duration = Duration::from_secs(1);

/// The replica (among `live`) that probes `key`: rendezvous hashing, so
/// every replica agrees given the same live set, and a replica leaving
/// moves only its own checks.
pub fn owner(key: &ResourceKey, live: &[u64]) -> Option<u64> {
    live.iter().copied().max_by_key(|id| fnv1a(format!("{key}#{id}").as_bytes()))
}

/// Run this replica's share of the probes until shutdown.
pub async fn prober(node: Arc<Node>, checks: Checks, ha: Arc<HaState>, mut shutdown: watch::Receiver<bool>) {
    let mut running: HashMap<ResourceKey, (u64, JoinHandle<()>)> = HashMap::new();
    let mut tick = tokio::time::interval(ASSIGN_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => break,
            _ = tick.tick() => {}
        }
        let live = ha.live_voters(&node);
        let applied = node.reader().current();
        let mut desired: HashMap<ResourceKey, (u64, HealthCheck)> = HashMap::new();
        let lo = ResourceKey::new(Kind::Instance, "", "");
        for (key, obj) in applied.state.objects.range(lo..).take_while(|(k, _)| k.kind == Kind::Instance) {
            let Ok(typed) = obj.typed() else { continue };
            let TypedSpec::Instance(spec) = typed.as_ref() else { continue };
            let Some(check) = spec.health_check.as_ref().filter(|c| c.is_probe()) else { continue };
            if owner(key, &live) != Some(node.id) {
                continue;
            }
            let fingerprint = fnv1a(format!("{}#{}", obj.create_revision, serde_json::to_string(check).unwrap_or_default()).as_bytes());
            desired.insert(key.clone(), (fingerprint, check.clone()));
        }
        running.retain(|key, (fp, handle)| {
            let keep = desired.get(key).is_some_and(|(want, _)| want == fp) && !handle.is_finished();
            if !keep {
                handle.abort();
            }
            keep
        });
        {
            let mut g = checks.lock();
            g.live_voters = live.clone();
            g.checks.retain(|k, _| running.contains_key(k) || desired.contains_key(k));
        }
        for (key, (fp, check)) in desired {
            if running.contains_key(&key) {
                continue;
            }
            let target = check.http.clone().or(check.tcp.clone()).unwrap_or_default();
            checks.lock().checks.insert(
                key.clone(),
                CheckStatus {
                    instance: key.to_string(),
                    target,
                    interval_ms: check.interval().as_millis() as u64,
                    last_result: None,
                    last_probe_unix_ms: None,
                    consecutive_failures: 0,
                    consecutive_successes: 0,
                },
            );
            let task = tokio::spawn(run_check(node.clone(), checks.clone(), key.clone(), check, shutdown.clone()));
            running.insert(key, (fp, task));
        }
    }
    for (_, (_, handle)) in running {
        handle.abort();
    }
}

async fn run_check(node: Arc<Node>, checks: Checks, key: ResourceKey, check: HealthCheck, mut shutdown: watch::Receiver<bool>) {
    let (mut fails, mut oks) = (0u32, 0u32);
    if !check.initial_delay().is_zero() {
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(check.initial_delay()) => {}
        }
    }
    loop {
        let result = probe(&check).await;
        match &result {
            Ok(_) => (fails, oks) = (0, oks.saturating_add(1)),
            Err(_) => (fails, oks) = (fails.saturating_add(1), 0),
        }
        let text = match &result {
            Ok(s) => s.clone(),
            Err(e) => e.clone(),
        };
        if let Some(c) = checks.lock().checks.get_mut(&key) {
            c.last_result = Some(text.clone());
            c.last_probe_unix_ms = Some(super::now_unix_ms());
            c.consecutive_failures = fails;
            c.consecutive_successes = oks;
        }
        let applied = node.reader().current();
        let Some(obj) = applied.state.get(&key) else { return };
        let stored = InstanceStatus::of(obj.body()).map(|s| s.health);
        let want = if fails >= check.unhealthy_threshold() {
            Some(HealthState::Unhealthy)
        } else if oks >= check.healthy_threshold() {
            Some(HealthState::Healthy)
        } else {
            None
        };
        if let Some(want) = want.filter(|w| stored != Some(*w)) {
            let op = Op::SetStatus { key: key.clone(), status: status_json(want, text, node.id), expected_revision: None };
            match node.write(Txn { ops: vec![op] }).await {
                Ok(ok) => {
                    tracing::info!(%key, health = if want == HealthState::Healthy { "healthy" } else { "unhealthy" }, revision = ok.revision, "registry: health changed")
                }
                Err(e) => tracing::debug!(%key, error = %e, "registry: health change not committed"),
            }
        }
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(check.interval()) => {}
        }
    }
}

/// One probe: `Ok(what passed)` or `Err(why it failed)`.
pub async fn probe(check: &HealthCheck) -> Result<String, String> {
    let timeout = check.timeout();
    let work = async {
        if let Some(url) = &check.http {
            http_get(url).await
        } else if let Some(addr) = &check.tcp {
            let (host, port) = parse_host_port(addr)?;
            TcpStream::connect((host.as_str(), port)).await.map_err(|e| format!("TCP connect to {addr}: {e}"))?;
            Ok(format!("TCP connect to {addr}: ok"))
        } else {
            Err("no probe configured".into())
        }
    };
    tokio::time::timeout(timeout, work).await.unwrap_or_else(|_| Err(format!("timed out after {timeout:?}")))
}

/// GET `url` (HTTP/1.1, no body read): 2xx and 3xx pass, as in Consul.
async fn http_get(url: &str) -> Result<String, String> {
    let (host, port, path) = parse_http_url(url)?;
    let mut s = TcpStream::connect((host.as_str(), port)).await.map_err(|e| format!("GET {url}: {e}"))?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: lodestar-health-check\r\nAccept: */*\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.map_err(|e| format!("GET {url}: {e}"))?;
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 256];
    while !buf.windows(2).any(|w| w == b"\r\n") && buf.len() < 4096 {
        let n = s.read(&mut chunk).await.map_err(|e| format!("GET {url}: {e}"))?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let line = String::from_utf8_lossy(&buf);
    let line = line.lines().next().unwrap_or("");
    let code: u16 = line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| format!("GET {url}: not an HTTP response: {line:?}"))?;
    if (200..400).contains(&code) {
        Ok(format!("GET {url}: HTTP {code}"))
    } else {
        Err(format!("GET {url}: HTTP {code}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendezvous_spreads_and_moves_only_the_lost_share() {
        let keys: Vec<ResourceKey> = (0..300).map(|i| ResourceKey::new(Kind::Instance, "default", format!("i{i}"))).collect();
        let all = [1, 2, 3];
        let mut count = HashMap::new();
        for k in &keys {
            *count.entry(owner(k, &all).unwrap()).or_insert(0) += 1;
        }
        assert!(count.values().all(|c| *c > 60), "uneven spread: {count:?}");
        // Node 3 leaves: only its checks move.
        for k in &keys {
            let before = owner(k, &all).unwrap();
            let after = owner(k, &[1, 2]).unwrap();
            if before != 3 {
                assert_eq!(before, after);
            }
        }
    }
}
