//! Fixtures for tests that send real traffic through real Envoys: replicas,
//! a loopback prefix for proxies and upstreams, Envoys bootstrapped to one
//! replica and waited on until in sync, and request helpers. Waits are
//! bounded polls; every load loop is bounded in count and time.

use super::envoy::{loopback_prefix, Envoy, EnvoyOptions, Upstream};
use super::Cluster;
use futures::StreamExt;
use reqwest::header::HeaderMap;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A client with no credentials and no proxy: what a workload outside the
/// mesh would use.
pub fn plain() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(5)).pool_max_idle_per_host(0).build().unwrap()
}

/// GET through a client workload's Envoy (its egress listener for
/// reviews:9080, at `client_ip`): (status, body), or the transport error.
pub async fn via_client(client_ip: &str, path: &str) -> Result<(u16, String), String> {
    let r =
        plain().get(format!("http://{client_ip}:9080{path}")).header("host", "reviews.shop.svc.cluster.local").send().await.map_err(|e| format!("{e:?}"))?;
    let status = r.status().as_u16();
    Ok((status, r.text().await.unwrap_or_default()))
}

pub const BOUND: Duration = Duration::from_secs(20);
/// The four types every proxy here receives.
pub const TYPES: [&str; 4] = ["CDS", "EDS", "LDS", "RDS"];

// ---------------------------------------------------------------------------
// The fixture: replicas, a loopback prefix for proxies and upstreams, and a
// client that neither follows redirects nor uses a proxy from the
// environment.

pub struct Fixture {
    pub cluster: Cluster,
    /// `127.A.B`: proxies and upstreams listen on `127.A.B.n`.
    pub prefix: String,
    pub tmp: tempfile::TempDir,
    pub client: reqwest::Client,
}

impl Fixture {
    pub async fn start(replicas: u64) -> Fixture {
        super::envoy::envoy_binary();
        Fixture::around(Cluster::start(replicas, "").await)
    }

    /// The fixture around a cluster the test started itself (e.g. on
    /// another binary).
    pub fn around(cluster: Cluster) -> Fixture {
        super::envoy::envoy_binary();
        let client = super::http_builder().no_proxy().redirect(reqwest::redirect::Policy::none()).build().unwrap();
        Fixture { cluster, prefix: loopback_prefix(), tmp: tempfile::tempdir().unwrap(), client }
    }

    pub fn ip(&self, n: u8) -> String {
        format!("{}.{n}", self.prefix)
    }

    pub fn api(&self, replica: u64) -> String {
        self.cluster.replica(replica).api()
    }

    pub async fn upstream(&self, n: u8, identity: &str) -> Upstream {
        Upstream::start(&self.ip(n), identity).await
    }

    /// Apply a YAML stream through replica 1's REST API; its revision.
    pub async fn apply(&self, yaml: &str) -> u64 {
        self.apply_via(1, yaml).await
    }

    pub async fn apply_via(&self, replica: u64, yaml: &str) -> u64 {
        super::applied(&self.client, &self.api(replica), yaml).await
    }

    /// A sidecar at `127.A.B.n` served by `replica`, ready and in sync at
    /// `revision`.
    pub async fn sidecar(&self, name: &str, n: u8, replica: u64, delta: bool, revision: u64) -> Proxy {
        let mut o = EnvoyOptions::new(name, &self.ip(n));
        o.labels = vec![("app".into(), name.into())];
        o.delta = delta;
        self.proxy(o, replica, revision).await
    }

    /// Start an Envoy bootstrapped (by `lodestar bootstrap`) to `replica`
    /// only, so the test knows which replica serves it.
    pub async fn proxy(&self, o: EnvoyOptions, replica: u64, revision: u64) -> Proxy {
        self.proxy_of_types(o, replica, revision, &TYPES).await
    }

    /// As `proxy`, for a proxy that gets only `types` (a gateway with no
    /// HTTP server has no RDS, say).
    pub async fn proxy_of_types(&self, mut o: EnvoyOptions, replica: u64, revision: u64, types: &[&str]) -> Proxy {
        o.xds_servers = vec![self.cluster.replica(replica).xds_addr()];
        let id = o.node_id();
        let ip = o.ip.clone();
        let mut envoy = Envoy::start(&self.tmp.path().join(&o.name), o);
        envoy.wait_ready(BOUND).await;
        let p = Proxy { envoy, id, ip, api: self.api(replica), client: self.client.clone() };
        p.wait_synced_types(revision, types).await;
        p
    }
}

/// One Envoy, its node id and the replica API that serves it.
pub struct Proxy {
    pub envoy: Envoy,
    pub id: String,
    pub ip: String,
    pub api: String,
    pub client: reqwest::Client,
}

impl Proxy {
    pub fn url(&self, port: u16, path: &str) -> String {
        format!("http://{}:{port}{path}", self.ip)
    }

    /// Until the proxy has ACKed `revision` (or newer) and every type is in
    /// sync on its replica. Panics at once on a NACK or generation error.
    ///
    /// The stream records a round's responses before it reads the next
    /// ACK, so once some type is ACKed at `revision`, "all in sync" covers
    /// every response of that round.
    pub async fn wait_synced(&self, revision: u64) -> Value {
        self.wait_synced_types(revision, &TYPES).await
    }

    /// As `wait_synced`, for the given types only.
    pub async fn wait_synced_types(&self, revision: u64, types: &[&str]) -> Value {
        let deadline = Instant::now() + BOUND;
        loop {
            let s = syncz(&self.client, &self.api).await;
            if let Some(p) = s["proxies"].as_array().and_then(|ps| ps.iter().find(|p| p["id"] == self.id.as_str())) {
                for t in types {
                    let nack = &p["types"][t]["last_nack"];
                    assert!(nack.is_null(), "{} NACKed {t}: {nack:#}", self.id);
                }
                assert!(p["generate_error"].is_null(), "{}: generation failed: {}", self.id, p["generate_error"]);
                let version = |t: &str| p["types"][t]["acked_version"].as_str().and_then(|v| v.parse::<u64>().ok());
                let synced = p["revision"].as_u64().is_some_and(|r| r >= revision)
                    && types.iter().all(|t| p["types"][t]["in_sync"] == true)
                    && types.iter().any(|t| version(t).is_some_and(|v| v >= revision));
                if synced {
                    return p.clone();
                }
            }
            if Instant::now() > deadline {
                self.envoy.dump_log();
                panic!("{} not in sync at revision {revision} within {BOUND:?}; syncz: {s:#}", self.id);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The version of the route configuration `name` Envoy is using.
    pub async fn route_version(&self, name: &str) -> Option<String> {
        let dump = self.envoy.config_dump().await;
        dump["configs"]
            .as_array()?
            .iter()
            .flat_map(|c| c["dynamic_route_configs"].as_array().into_iter().flatten())
            .find(|r| r["route_config"]["name"] == name)
            .and_then(|r| r["version_info"].as_str().map(String::from))
    }

    pub async fn stat(&self, name: &str) -> u64 {
        self.envoy.stat(name).await.unwrap_or(0)
    }
}

/// `/debug/syncz` of the replica at `api`.
pub async fn syncz(http: &reqwest::Client, api: &str) -> Value {
    let (status, body) = super::get_json(http, &format!("{api}/debug/syncz")).await;
    assert_eq!(status, 200, "syncz: {body}");
    body
}

/// Poll `/debug/syncz` until `pred` holds (within [`BOUND`]): that document.
pub async fn wait_syncz(http: &reqwest::Client, api: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    super::eventually_or(&format!("syncz: {what}"), BOUND, || async {
        let s = syncz(http, api).await;
        if pred(&s) {
            Ok(s)
        } else {
            Err(format!("{s:#}"))
        }
    })
    .await
}

/// `${name.ip}` and `${name.port}` → each upstream's address.
pub fn render(template: &str, upstreams: &[(&str, &Upstream)]) -> String {
    let mut out = template.to_string();
    for (name, u) in upstreams {
        out = out.replace(&format!("${{{name}.ip}}"), &u.addr.ip().to_string()).replace(&format!("${{{name}.port}}"), &u.addr.port().to_string());
    }
    assert!(!out.contains("${"), "unfilled placeholder in:\n{out}");
    out
}

// ---------------------------------------------------------------------------
// Requests.

#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: String,
    pub headers: HeaderMap,
    pub elapsed: Duration,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

pub async fn send(client: &reqwest::Client, url: &str, host: &str, headers: &[(&str, &str)]) -> Result<Reply, String> {
    let mut req = client.get(url).header("host", host).timeout(Duration::from_secs(10));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let start = Instant::now();
    let resp = req.send().await.map_err(|e| format!("{url} (Host {host}): {e:?}"))?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.text().await.map_err(|e| format!("{url} (Host {host}) body: {e:?}"))?;
    Ok(Reply { status, body, headers, elapsed: start.elapsed() })
}

/// One request that must get an answer (any status).
pub async fn get(client: &reqwest::Client, url: &str, host: &str, headers: &[(&str, &str)]) -> Reply {
    send(client, url, host, headers).await.unwrap_or_else(|e| panic!("request failed: {e}"))
}

/// `n` requests, `concurrency` at a time; every one must get an answer.
pub async fn load(client: &reqwest::Client, url: &str, host: &str, headers: &[(&str, &str)], n: usize, concurrency: usize) -> Vec<Reply> {
    let started = Instant::now();
    let replies: Vec<Result<Reply, String>> =
        futures::stream::iter(0..n).map(|_| send(client, url, host, headers)).buffer_unordered(concurrency).collect().await;
    assert!(started.elapsed() < Duration::from_secs(60), "load of {n} took {:?}", started.elapsed());
    replies.into_iter().map(|r| r.unwrap_or_else(|e| panic!("request failed: {e}"))).collect()
}

/// How many replies per `STATUS BODY`.
pub fn tally(replies: &[Reply]) -> BTreeMap<String, usize> {
    let mut t = BTreeMap::new();
    for r in replies {
        *t.entry(format!("{} {}", r.status, r.body.trim())).or_insert(0) += 1;
    }
    t
}

/// Poll a request until `ok` accepts the reply (Envoy applies an ACKed
/// update on its workers just after the ACK).
pub async fn wait_for(client: &reqwest::Client, url: &str, host: &str, headers: &[(&str, &str)], what: &str, ok: impl Fn(&Reply) -> bool) -> Reply {
    super::eventually_or(what, BOUND, || async {
        match send(client, url, host, headers).await {
            Ok(r) if ok(&r) => Ok(r),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}
