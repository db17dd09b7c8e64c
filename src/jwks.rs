//! The key sets of RequestAuthentication `jwksUri`s, fetched by each
//! replica on its own (not replicated: every replica fetches the same
//! URLs and, with the same answers, serves the same bytes).
//!
//! Translation stays pure: what was fetched is an input to it, like the
//! store's objects (`Mesh::jwks`, read from a shared `KeyCell`). This task
//! is the only writer:
//!
//! - It watches the applied store state; the URIs wanted are those named
//!   by a RequestAuthentication rule without an inline `jwks`. A new URI is
//!   fetched at once; one no policy names any more is dropped.
//! - Each URI is fetched again every `refresh` (Istio's 20 minutes,
//!   `jwks_refresh_interval_s`). A failed fetch (network, HTTP status, a
//!   body that is not a key set Envoy can load) keeps the last good set and
//!   is retried with backoff (1 s doubling, at most `refresh`). A URI never
//!   fetched has no set: translation serves `translate::jwt::UNFETCHED_JWKS`,
//!   which verifies nothing, so that issuer's tokens get 401 (fail closed).
//! - When a set changes (first fetch, rotation, a URI dropped) the cell is
//!   replaced and the epoch channel bumped; every xDS stream then asks its
//!   generator again at the same revision, which re-translates only the
//!   proxies whose config holds a changed set (`Translator::generate`), and
//!   the streams push only resources whose versions changed.
//!
//! https is verified against `jwks_ca_file`, or the system's CA bundle;
//! a redirect from https to http is refused.

use crate::metrics::metrics;
use crate::model::istio::request_authentication::check_jwks;
use crate::model::istio::Validated;
use crate::model::{Kind, ResourceKey, TypedSpec};
use crate::state::Objects;
use crate::store::Applied;
use crate::translate::jwt::{FetchedKeys, KeyCell};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Istio's default `timeout` of a jwtRule's fetch.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// A key set larger than this is refused (they are a few kilobytes).
const MAX_BODY: usize = 1 << 20;
const SYSTEM_BUNDLES: [&str; 2] = ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"];

#[derive(Debug, Clone)]
pub struct Options {
    pub refresh: Duration,
    /// PEM bundle of CAs for https; `None`: the system's.
    pub ca_file: Option<PathBuf>,
}

/// The HTTP client: rustls, verifying against the given or the system
/// roots, no https → http redirects.
pub fn client(ca_file: Option<&std::path::Path>) -> Result<reqwest::Client, String> {
    let file = match ca_file {
        Some(f) => Some(f.to_path_buf()),
        None => SYSTEM_BUNDLES.iter().map(PathBuf::from).find(|p| p.exists()),
    };
    let mut builder = reqwest::Client::builder().tcp_nodelay(true).redirect(reqwest::redirect::Policy::custom(|attempt| {
        let downgraded = attempt.previous().iter().any(|u| u.scheme() == "https") && attempt.url().scheme() != "https";
        if downgraded {
            attempt.error("redirect from https to plaintext http refused")
        } else if attempt.previous().len() > 5 {
            attempt.error("too many redirects")
        } else {
            attempt.follow()
        }
    }));
    match file {
        Some(f) => {
            let pem = std::fs::read(&f).map_err(|e| format!("jwks_ca_file {}: {e}", f.display()))?;
            for cert in reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| format!("jwks_ca_file {}: {e}", f.display()))? {
                builder = builder.add_root_certificate(cert);
            }
        }
        None => tracing::info!("no CA bundle for https jwksUris (set jwks_ca_file): fetches from https issuers will fail and their tokens be rejected"),
    }
    builder.build().map_err(|e| format!("the jwksUri HTTP client: {e}"))
}

/// One fetch: a 2xx answer whose body is a key set Envoy can load.
pub async fn fetch(client: &reqwest::Client, uri: &str, timeout: Duration) -> Result<String, String> {
    let mut resp = client.get(uri).timeout(timeout).send().await.map_err(|e| format!("GET {uri}: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("GET {uri}: HTTP {}", resp.status()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| format!("GET {uri}: {e}"))? {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_BODY {
            return Err(format!("GET {uri}: the key set is larger than {MAX_BODY} bytes"));
        }
    }
    let text = String::from_utf8(body).map_err(|_| format!("GET {uri}: the body is not UTF-8"))?;
    check_jwks(&text).map_err(|e| format!("GET {uri}: not a usable key set: {e}"))?;
    Ok(text)
}

/// The URIs the store's RequestAuthentications want fetched, with the
/// longest `timeout` any rule naming it gives.
pub fn wanted(objects: &Objects) -> BTreeMap<String, Duration> {
    let mut out: BTreeMap<String, Duration> = BTreeMap::new();
    let start = ResourceKey::new(Kind::RequestAuthentication, "", "");
    for (_, o) in objects.range(start..).take_while(|(k, _)| k.kind == Kind::RequestAuthentication) {
        let Ok(typed) = o.typed() else { continue };
        let TypedSpec::Istio(Validated::RequestAuthentication { spec, .. }) = typed.as_ref() else { continue };
        for rule in spec.jwt_rules.iter().filter(|r| r.jwks.is_none()) {
            let Some(uri) = &rule.jwks_uri else { continue };
            let timeout = rule.timeout.as_ref().and_then(|t| t.to_std().ok()).unwrap_or(DEFAULT_TIMEOUT);
            let e = out.entry(uri.clone()).or_insert(timeout);
            *e = (*e).max(timeout);
        }
    }
    out
}

struct Entry {
    timeout: Duration,
    due: Instant,
    failures: u32,
    /// A fetch is in flight.
    fetching: bool,
}

/// Start the fetcher. The returned channel's value changes whenever the
/// key sets in `keys` do.
pub fn spawn(
    mut applied: watch::Receiver<Arc<Applied>>,
    keys: Arc<KeyCell>,
    options: Options,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(watch::Receiver<u64>, tokio::task::JoinHandle<()>), String> {
    let client = client(options.ca_file.as_deref())?;
    let (epoch_tx, epoch_rx) = watch::channel(0u64);
    let task = tokio::spawn(async move {
        let mut entries: BTreeMap<String, Entry> = BTreeMap::new();
        let mut sets: BTreeMap<String, Arc<str>> = BTreeMap::new();
        let mut seen: Option<Objects> = None;
        // Fetches run on their own tasks, so a slow issuer (up to its
        // rule's timeout) holds back neither the others nor new policies.
        let mut fetching: JoinSet<Result<String, String>> = JoinSet::new();
        let mut fetching_uri: HashMap<tokio::task::Id, String> = HashMap::new();
        let publish = |sets: &BTreeMap<String, Arc<str>>| {
            keys.set(FetchedKeys { sets: sets.clone() });
            epoch_tx.send_modify(|e| *e += 1);
        };
        loop {
            // What the store wants, when a RequestAuthentication changed.
            let current = applied.borrow_and_update().clone();
            let objects = &current.state.objects;
            let touched = match &seen {
                None => true,
                Some(before) => before.diff(objects).any(|d| d.key().kind == Kind::RequestAuthentication),
            };
            if touched {
                let want = wanted(objects);
                entries.retain(|uri, _| want.contains_key(uri));
                for (uri, timeout) in &want {
                    entries.entry(uri.clone()).or_insert(Entry { timeout: *timeout, due: Instant::now(), failures: 0, fetching: false }).timeout = *timeout;
                }
                let before = sets.len();
                sets.retain(|uri, _| want.contains_key(uri));
                if sets.len() != before {
                    publish(&sets);
                }
                metrics().jwks_uris.set(entries.len() as i64);
            }
            seen = Some(objects.clone());
            drop(current);

            // Start the fetches that are due.
            let now = Instant::now();
            for (uri, e) in entries.iter_mut().filter(|(_, e)| e.due <= now && !e.fetching) {
                e.fetching = true;
                let (client, u, timeout) = (client.clone(), uri.clone(), e.timeout);
                let handle = fetching.spawn(async move { fetch(&client, &u, timeout).await });
                fetching_uri.insert(handle.id(), uri.clone());
            }
            let next = entries.values().filter(|e| !e.fetching).map(|e| e.due).min();
            let sleep = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let (id, result) = tokio::select! {
                _ = shutdown.wait_for(|s| *s) => return,
                changed = applied.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    continue;
                }
                _ = sleep => continue,
                Some(done) = fetching.join_next_with_id(), if !fetching.is_empty() => match done {
                    Ok((id, result)) => (id, result),
                    Err(e) => (e.id(), Err(format!("the fetch task failed: {e}"))),
                },
            };
            let Some(uri) = fetching_uri.remove(&id) else { continue };
            // Dropped meanwhile (no policy names it any more): forget it.
            let Some(entry) = entries.get_mut(&uri) else { continue };
            entry.fetching = false;
            match result {
                Ok(text) => {
                    metrics().jwks_fetch_success.inc();
                    entry.failures = 0;
                    entry.due = Instant::now() + options.refresh;
                    if sets.get(&uri).is_none_or(|old| **old != *text) {
                        tracing::info!(uri, "jwksUri: new key set");
                        sets.insert(uri, Arc::from(text));
                        publish(&sets);
                    }
                }
                Err(e) => {
                    metrics().jwks_fetch_fail.inc();
                    let backoff = Duration::from_secs(1u64 << entry.failures.min(16)).min(options.refresh);
                    entry.failures += 1;
                    entry.due = Instant::now() + backoff;
                    let kept = if sets.contains_key(&uri) { "keeping the last good key set" } else { "never fetched: its tokens are rejected" };
                    tracing::warn!(uri, error = e, retry_in = ?backoff, "jwksUri fetch failed; {kept}");
                }
            }
        }
    });
    Ok((epoch_rx, task))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const KEYS: &str = r#"{"keys":[{"kty":"EC","crv":"P-256","kid":"k","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}"#;

    /// An HTTPS server on 127.0.0.1 with a certificate from a CA made
    /// here, answering every request with `response`; the CA's PEM.
    async fn https_server(response: String) -> (std::net::SocketAddr, String) {
        let (ca_cert, ca_key) = crate::tls::pki::new_ca("jwks test CA").unwrap();
        let (cert, key) = crate::tls::pki::issue_member(&ca_cert, &ca_key, 1, &["127.0.0.1".to_string()]).unwrap();
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes()).collect::<Result<_, _>>().unwrap();
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            // Bounded: the tests make a handful of connections.
            for _ in 0..16 {
                let Ok((tcp, _)) = listener.accept().await else { return };
                let (acceptor, response) = (acceptor.clone(), response.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                    let mut buf = vec![0u8; 4096];
                    let _ = tls.read(&mut buf).await;
                    let _ = tls.write_all(response.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        (addr, ca_cert)
    }

    fn ok(body: &str) -> String {
        format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len())
    }

    #[tokio::test]
    async fn https_is_verified_against_the_configured_ca() {
        let (addr, ca) = https_server(ok(KEYS)).await;
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, ca).unwrap();
        let uri = format!("https://127.0.0.1:{}/jwks.json", addr.port());
        let trusted = client(Some(&ca_file)).unwrap();
        assert_eq!(fetch(&trusted, &uri, DEFAULT_TIMEOUT).await.unwrap(), KEYS);
        // Another CA (here: the system's, or none): the handshake fails.
        let (_, other_ca) = https_server(ok(KEYS)).await;
        let other_file = dir.path().join("other.pem");
        std::fs::write(&other_file, other_ca).unwrap();
        let untrusted = client(Some(&other_file)).unwrap();
        let err = fetch(&untrusted, &uri, DEFAULT_TIMEOUT).await.unwrap_err();
        assert!(err.starts_with(&format!("GET {uri}")), "{err}");
    }

    #[tokio::test]
    async fn bad_answers_and_downgrades_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.pem");
        // Not a key set.
        let (addr, ca) = https_server(ok(r#"{"keys": []}"#)).await;
        std::fs::write(&ca_file, ca).unwrap();
        let c = client(Some(&ca_file)).unwrap();
        let err = fetch(&c, &format!("https://127.0.0.1:{}/", addr.port()), DEFAULT_TIMEOUT).await.unwrap_err();
        assert!(err.contains("not a usable key set"), "{err}");
        // An error status.
        let (addr, ca) = https_server("HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".into()).await;
        std::fs::write(&ca_file, ca).unwrap();
        let c = client(Some(&ca_file)).unwrap();
        let err = fetch(&c, &format!("https://127.0.0.1:{}/", addr.port()), DEFAULT_TIMEOUT).await.unwrap_err();
        assert!(err.contains("HTTP 404"), "{err}");
        // A redirect from https to plaintext http.
        let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let to = format!("http://127.0.0.1:{}/jwks.json", plain.local_addr().unwrap().port());
        let (addr, ca) = https_server(format!("HTTP/1.1 302 Found\r\nlocation: {to}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")).await;
        std::fs::write(&ca_file, ca).unwrap();
        let c = client(Some(&ca_file)).unwrap();
        let err = fetch(&c, &format!("https://127.0.0.1:{}/", addr.port()), DEFAULT_TIMEOUT).await.unwrap_err();
        assert!(err.contains("redirect"), "{err}");
    }
}
