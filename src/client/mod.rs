//! A small REST client for the CLI, with server errors rendered for people.
//!
//! Where the CLI's settings come from ([`Access::resolve`]), first found
//! wins: `--client-config` / `LODESTAR_CONFIG`; else `./lodestar-data/client.toml`
//! (the server started in this directory); else `~/.config/lodestar/client.toml`.
//! `--server`, `--ca-file` and `--token` (or their environment variables)
//! override the file's fields. Errors about TLS and credentials name the
//! file, the server and where the CA and token came from ([`Origin`]), so a
//! stale config is found at once.
//!
//! A bare `HOST:PORT` is https. The token never goes to an `http://` server
//! (any of the listed ones) unless `--insecure` says so.
//!
//! What the CLI, the agent and the bench use to talk to replicas; knows no
//! server code (`tests/e2e/tidy.rs`).
//!
//! # Layout
//! - `config`: `client.toml` ([`ClientConfig`]).
//! - `progress`: progress lines for long operations on a terminal.

/// The request metadata key of an impersonated identity (Istio's
/// `security.ImpersonatedIdentity`): a host agent asks the CSR service for
/// a workload's certificate with it.
pub const IMPERSONATED_IDENTITY: &str = "ImpersonatedIdentity";

pub mod config;
pub mod progress;

use anyhow::{anyhow, Context, Result};
pub use config::{expand_home, ClientConfig, DEFAULT_SERVER_URL};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// How the CLI reaches a cluster (see the module doc).
#[derive(Clone, Default)]
pub struct Access {
    /// Replicas' API URLs, tried in order while one cannot be reached.
    pub servers: Vec<String>,
    /// The CA bundle (PEM) servers' certificates are checked against.
    pub ca_pem: Option<String>,
    pub token: Option<String>,
    pub origin: Origin,
    /// `--insecure`: the token may go to an `http://` server, in the clear.
    pub insecure: bool,
}

/// Where the CLI's server, CA and token came from, for error messages.
#[derive(Clone, Debug, Default)]
pub struct Origin {
    /// The client config read, if any.
    pub config: Option<PathBuf>,
    pub server: String,
    pub ca: String,
    pub token: String,
}

/// Where the CLI looks for its client config when none is named, in order.
pub fn default_config_paths() -> Vec<PathBuf> {
    vec![PathBuf::from("./lodestar-data/client.toml"), expand_home(Path::new("~/.config/lodestar/client.toml"))]
}

fn looked_for() -> String {
    default_config_paths().iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" or ")
}

impl Access {
    pub fn resolve(server: Option<String>, config: Option<PathBuf>, ca_file: Option<PathBuf>, token: Option<String>) -> Result<Access> {
        let path = config.or_else(|| default_config_paths().into_iter().find(|p| p.exists()));
        let file = path.as_deref().map(read_client_config).transpose()?.unwrap_or_default();
        let named = |p: &Path| format!("the client config {}", p.display());
        let from_file = path.as_deref().map(named).unwrap_or_default();
        let relative = |f: &Path| match path.as_deref().and_then(Path::parent) {
            Some(dir) if f.is_relative() => dir.join(f),
            _ => f.to_path_buf(),
        };
        let (ca_pem, ca) = match (ca_file, file.ca_file.as_deref()) {
            (Some(p), _) => {
                let pem = std::fs::read_to_string(&p).with_context(|| format!("reading the CA file {}", p.display()))?;
                (Some(pem), format!("--ca-file {}", p.display()))
            }
            (None, _) if !file.ca_pem.is_empty() => (Some(file.ca_pem.clone()), format!("ca_pem in {from_file}")),
            (None, Some(f)) => {
                let f = relative(f);
                let pem = std::fs::read_to_string(&f).with_context(|| format!("reading ca_file {} of {from_file}", f.display()))?;
                (Some(pem), format!("{} (ca_file in {from_file})", f.display()))
            }
            (None, None) if path.is_some() => (None, format!("none in {from_file}: the system's roots only")),
            (None, None) => (None, format!("none (no client config at {}): the system's roots only", looked_for())),
        };
        let (token, token_origin) = match (token, &file.token, file.token_file.as_deref()) {
            (Some(t), _, _) => (Some(t), "--token or LODESTAR_TOKEN".to_string()),
            (None, Some(t), _) => (Some(t.clone()), format!("token in {from_file}")),
            (None, None, Some(f)) => {
                let f = relative(f);
                let t = std::fs::read_to_string(&f).with_context(|| format!("reading token_file {} of {from_file}", f.display()))?;
                (Some(t.trim().to_string()), format!("{} (token_file in {from_file})", f.display()))
            }
            (None, None, None) => (None, "none".to_string()),
        };
        let (servers, server_origin) = match server {
            Some(s) => (vec![s], "--server or LODESTAR_SERVER".to_string()),
            None => {
                let listed: Vec<String> = std::iter::once(&file.server).chain(&file.servers).filter(|s| !s.is_empty()).cloned().collect();
                if listed.is_empty() {
                    (vec![DEFAULT_SERVER_URL.to_string()], "the default".to_string())
                } else {
                    (listed, from_file.clone())
                }
            }
        };
        let origin = Origin { config: path, server: server_origin, ca, token: token_origin };
        Ok(Access { servers, ca_pem, token, origin, insecure: false })
    }

    /// A REST client for these servers (none: the default server). A bare
    /// `HOST:PORT` is https (checked against the CA, else the system's
    /// roots); plaintext only when asked for with `http://`, and then
    /// without the token unless `insecure`.
    pub fn client(&self) -> Result<Client> {
        let mut bases: Vec<String> = self.servers.iter().map(|s| base_url(s)).collect();
        if bases.is_empty() {
            bases.push(DEFAULT_SERVER_URL.to_string());
        }
        Ok(Client {
            bases: Arc::new(bases),
            current: Arc::default(),
            http: self.http()?,
            token: self.token.clone(),
            insecure: self.insecure,
            origin: Arc::new(self.origin.clone()),
            message: None,
        })
    }

    /// An HTTP client trusting the CA (and only it) when there is one.
    pub fn http(&self) -> Result<reqwest::Client> {
        Ok(self.http_builder()?.build()?)
    }

    /// An HTTP client that also sends the token (if any) on every request.
    pub fn http_with_token(&self) -> Result<reqwest::Client> {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(t) = &self.token {
            let mut v =
                reqwest::header::HeaderValue::from_str(&format!("Bearer {t}")).map_err(|_| anyhow!("the token has characters a header cannot carry"))?;
            v.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, v);
        }
        Ok(self.http_builder()?.default_headers(headers).build()?)
    }

    /// The gRPC interceptor that sends the token (if any).
    pub fn bearer(&self) -> Result<Bearer> {
        Bearer::new(self.token.as_deref())
    }

    fn http_builder(&self) -> Result<reqwest::ClientBuilder> {
        let mut builder = reqwest::Client::builder().tcp_nodelay(true).connect_timeout(std::time::Duration::from_secs(5));
        if let Some(pem) = &self.ca_pem {
            for cert in reqwest::Certificate::from_pem_bundle(pem.as_bytes()).context("the CA bundle")? {
                builder = builder.add_root_certificate(cert);
            }
        }
        Ok(builder)
    }
}

/// A server as given (`https://host:port`, or a bare `host:port`: TLS,
/// as servers serve by default), without a trailing slash.
fn base_url(server: &str) -> String {
    let s = server.trim_end_matches('/');
    if s.contains("://") {
        s.to_string()
    } else {
        format!("https://{s}")
    }
}

/// Adds `authorization: Bearer <token>` to every gRPC request that carries
/// none (marked sensitive: HTTP/2 never indexes it).
#[derive(Clone, Default)]
pub struct Bearer(Option<tonic::metadata::AsciiMetadataValue>);

impl Bearer {
    pub fn new(token: Option<&str>) -> Result<Bearer> {
        let Some(t) = token else { return Ok(Bearer(None)) };
        let mut v: tonic::metadata::AsciiMetadataValue =
            format!("Bearer {t}").parse().map_err(|_| anyhow!("the token has characters a header cannot carry"))?;
        v.set_sensitive(true);
        Ok(Bearer(Some(v)))
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> std::result::Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            if !req.metadata().contains_key("authorization") {
                req.metadata_mut().insert("authorization", v.clone());
            }
        }
        Ok(req)
    }
}

/// The gRPC client API, sending a token.
pub type ApiClient = lodestar_proto::api::lodestar_client::LodestarClient<tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Bearer>>;

fn read_client_config(path: &Path) -> Result<ClientConfig> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading the client config {}", path.display()))?;
    ClientConfig::from_toml(&text).map_err(|e| anyhow!("the client config {}: {e}", path.display()))
}

/// A REST client of one or more replicas: a request goes to the last one
/// that answered, and on to the next when one cannot be reached.
#[derive(Clone)]
pub struct Client {
    bases: Arc<Vec<String>>,
    current: Arc<AtomicUsize>,
    http: reqwest::Client,
    token: Option<String>,
    insecure: bool,
    origin: Arc<Origin>,
    /// A change message sent with every request (`X-Lodestar-Message`).
    message: Option<String>,
}

/// Why a credential is not sent to a plaintext server.
fn plaintext_refusal(base: &str) -> anyhow::Error {
    anyhow!(
        "refusing to send the token to {base} over plaintext http (anyone on the path could read it and act as you): use https:// \
         with the cluster's CA (--ca-file, or a client config), or pass --insecure to send it in the clear anyway"
    )
}

impl Client {
    /// Another replica, reached the same way.
    pub fn with_server(&self, server: &str) -> Client {
        let scheme = self.base().split("://").next().unwrap_or("https").to_string();
        let base = if server.contains("://") { server.trim_end_matches('/').to_string() } else { format!("{scheme}://{server}") };
        Client { bases: Arc::new(vec![base]), current: Arc::default(), ..self.clone() }
    }

    /// Every server it may send requests to (base URLs).
    pub fn bases(&self) -> &[String] {
        &self.bases
    }

    /// The server requests go to now.
    pub fn base(&self) -> &str {
        &self.bases[self.current.load(Ordering::Relaxed) % self.bases.len()]
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base(), path)
    }

    /// Send to the current server, then to the others in turn while one
    /// cannot be reached (nothing was sent to it, so a write is safe to
    /// send again). Every request carries the token, if there is one; with
    /// a token and without `--insecure`, nothing is sent if any of the
    /// servers is `http://` (which one answers depends on which are up).
    async fn execute(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> Result<reqwest::Response> {
        if self.token.is_some() && !self.insecure {
            if let Some(plain) = self.bases.iter().find(|b| b.starts_with("http://")) {
                return Err(plaintext_refusal(plain));
            }
        }
        let n = self.bases.len();
        let first = self.current.load(Ordering::Relaxed);
        let mut failures = Vec::new();
        for k in 0..n {
            let i = (first + k) % n;
            let mut req = self.http.request(method.clone(), format!("{}{}", self.bases[i], path));
            if let Some(t) = &self.token {
                req = req.bearer_auth(t);
            }
            if let Some(m) = &self.message {
                req = req.header("x-lodestar-message", m);
            }
            if let Some(b) = body {
                req = req.json(b);
            }
            match self.send_showing_progress(req, &self.bases[i]).await {
                Ok(resp) => {
                    self.current.store(i, Ordering::Relaxed);
                    return Ok(resp);
                }
                Err(e) if e.is_connect() && k + 1 < n => failures.push(self.unreachable(&self.bases[i], &e)),
                Err(e) => {
                    failures.push(self.unreachable(&self.bases[i], &e));
                    break;
                }
            }
        }
        Err(anyhow!("{}", failures.join("\n")))
    }

    /// Send; on a terminal, say so while the answer takes long (a write
    /// waits for a leader while one is being elected).
    async fn send_showing_progress(&self, req: reqwest::RequestBuilder, base: &str) -> reqwest::Result<reqwest::Response> {
        let send = req.send();
        tokio::pin!(send);
        let started = std::time::Instant::now();
        let mut progress = progress::Progress::new();
        loop {
            tokio::select! {
                r = &mut send => return r,
                _ = tokio::time::sleep(std::time::Duration::from_secs(2)) => progress.show(&format!(
                    "waiting for {base}: no answer after {}s (is the cluster electing a leader?)",
                    started.elapsed().as_secs()
                )),
            }
        }
    }

    /// Why `base` could not be reached, with what to do about it.
    fn unreachable(&self, base: &str, e: &reqwest::Error) -> String {
        // reqwest puts the TLS cause (an unknown CA, a name mismatch) in
        // the source chain, not in the top message.
        let mut msg = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            msg = format!("{msg}: {s}");
            source = s.source();
        }
        let o = &self.origin;
        let hint = if msg.contains("BadSignature") || msg.contains("UnknownIssuer") || msg.contains("invalid peer certificate") {
            format!(
                "\n  The server's certificate is not signed by the CA the CLI trusts ({}).\n  A cluster started anew has a new CA: use the client config it wrote (<data_dir>/client.toml) with --client-config or LODESTAR_CONFIG, or its CA with --ca-file <data_dir>/tls/ca.pem.",
                o.ca
            )
        } else if msg.contains("invalid HTTP version") && base.starts_with("http://") {
            "\n  The server speaks TLS: use https://.".to_string()
        } else if base.starts_with("https://") && (msg.contains("corrupt message") || msg.contains("InvalidContentType")) {
            "\n  The server does not speak TLS (started with --insecure?): use http://.".to_string()
        } else {
            String::new()
        };
        format!("cannot reach {base} (server from {}): {msg}{hint}", o.server)
    }

    /// What the server said about the credential, with where it came from.
    fn auth_hint(&self, status: u16) -> String {
        match status {
            401 => format!("\n  (server {}; token: {})", self.base(), self.origin.token),
            403 => format!("\n  (server {}; token: {})", self.base(), self.origin.token),
            _ => String::new(),
        }
    }

    async fn send(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> Result<Value> {
        let (status, body) = self.any(method, path, body).await?;
        if (200..300).contains(&status) {
            return Ok(body);
        }
        Err(anyhow!("{}{}", render_error(status, &body), self.auth_hint(status)))
    }

    /// Any status: (status, JSON body, or the text as a JSON string).
    async fn any(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> Result<(u16, Value)> {
        let resp = self.execute(method, path, body).await?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| anyhow!("reading the answer of {}: {e}", self.base()))?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
    }

    /// A streaming GET (NDJSON): the response, once its status is 2xx.
    pub async fn get_stream(&self, path: &str) -> Result<reqwest::Response> {
        let r = self.execute(reqwest::Method::GET, path, None).await?;
        let status = r.status().as_u16();
        if !(200..300).contains(&status) {
            let body: Value = r.json().await.unwrap_or(Value::Null);
            anyhow::bail!("{}", render_error(status, &body));
        }
        Ok(r)
    }

    pub async fn get(&self, path: &str) -> Result<Value> {
        self.send(reqwest::Method::GET, path, None).await
    }
    /// GET a binary body (a backup file).
    pub async fn get_bytes(&self, path: &str) -> Result<Vec<u8>> {
        let resp = self.execute(reqwest::Method::GET, path, None).await?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| anyhow!("reading the answer of {}: {e}", self.base()))?;
        if status.is_success() {
            return Ok(bytes.to_vec());
        }
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Err(anyhow!("{}{}", render_error(status.as_u16(), &body), self.auth_hint(status.as_u16())))
    }
    /// GET, whatever the status: (status, JSON body).
    pub async fn get_any(&self, path: &str) -> Result<(u16, Value)> {
        self.any(reqwest::Method::GET, path, None).await
    }
    /// The token this client sends, if any.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }
    /// The same client with another token (`lodestar agent --token-file`).
    pub fn with_token(&self, token: Option<String>) -> Client {
        Client { token, ..self.clone() }
    }
    /// The same client, sending a change message with its writes
    /// (`lodestar apply --message`; `history` shows it).
    pub fn with_message(&self, message: Option<String>) -> Client {
        Client { message, ..self.clone() }
    }
    /// POST, whatever the status: (status, JSON body); Err only when no
    /// answer came. For callers that act on the status (the agent's
    /// keepalive: 404 means the lease is gone).
    pub async fn post_any(&self, path: &str, body: &Value) -> Result<(u16, Value)> {
        self.any(reqwest::Method::POST, path, Some(body)).await
    }
    pub async fn delete_any(&self, path: &str) -> Result<(u16, Value)> {
        self.any(reqwest::Method::DELETE, path, None).await
    }
    pub async fn post(&self, path: &str, body: &Value) -> Result<Value> {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }
    pub async fn delete(&self, path: &str) -> Result<Value> {
        self.send(reqwest::Method::DELETE, path, None).await
    }
}

pub fn render_error(status: u16, body: &Value) -> String {
    let Some(err) = body.get("error") else {
        return format!("server answered {status}: {body}");
    };
    let code = err.get("code").and_then(Value::as_str).unwrap_or("Error");
    let mut out = match err.get("fields").and_then(Value::as_array).filter(|f| !f.is_empty()) {
        Some(fields) => {
            let mut s = format!("Error from server ({code}): {} invalid field(s)", fields.len());
            for f in fields {
                s.push_str(&format!(
                    "\n  {}: {}",
                    f.get("field").and_then(Value::as_str).unwrap_or("?"),
                    f.get("reason").and_then(Value::as_str).unwrap_or("?")
                ));
            }
            s
        }
        None => format!("Error from server ({code}): {}", err.get("message").and_then(Value::as_str).unwrap_or("")),
    };
    if out.is_empty() {
        out = format!("server answered {status}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(servers: &[&str], token: Option<&str>, insecure: bool) -> Access {
        Access { servers: servers.iter().map(|s| s.to_string()).collect(), token: token.map(str::to_string), insecure, ..Access::default() }
    }

    #[tokio::test]
    async fn no_token_over_plaintext_without_insecure() {
        // A bare address is https, as is the default.
        assert_eq!(access(&["127.0.0.1:1"], None, false).client().unwrap().url("/x"), "https://127.0.0.1:1/x");
        assert_eq!(Access::default().client().unwrap().url(""), crate::DEFAULT_SERVER_URL);
        assert!(DEFAULT_SERVER_URL.starts_with("https://"));
        // http:// with a token: refused before anything is sent, saying how to proceed.
        let c = access(&["http://127.0.0.1:1"], Some("s3cr3t"), false).client().unwrap();
        let e = c.get("/v1/cluster").await.unwrap_err().to_string();
        assert!(e.contains("refusing to send the token") && e.contains("--insecure") && !e.contains("s3cr3t"), "{e}");
        assert!(c.with_server("127.0.0.2:1").post("/v1/apply", &serde_json::json!({})).await.unwrap_err().to_string().contains("refusing"));
        // Without a token, or with --insecure, the request is made (and fails to connect here).
        for c in [access(&["http://127.0.0.1:1"], None, false), access(&["http://127.0.0.1:1"], Some("t"), true)] {
            let e = c.client().unwrap().get("/v1/cluster").await.unwrap_err().to_string();
            assert!(e.contains("cannot reach http://127.0.0.1:1"), "{e}");
        }
    }

    #[tokio::test]
    async fn every_listed_server_is_checked_for_plaintext() {
        // A plaintext server anywhere in the list: the token is sent to none
        // of them, even though the first (down) would be tried first.
        let c = access(&["https://127.0.0.1:1", "http://127.0.0.1:2"], Some("s3cr3t"), false).client().unwrap();
        let e = c.get("/v1/cluster").await.unwrap_err().to_string();
        assert!(e.contains("refusing to send the token to http://127.0.0.1:2") && !e.contains("cannot reach"), "{e}");
        // With --insecure, failover goes through both (neither answers here).
        let c = access(&["https://127.0.0.1:1", "http://127.0.0.1:2"], Some("t"), true).client().unwrap();
        let e = c.get("/v1/cluster").await.unwrap_err().to_string();
        assert!(e.contains("cannot reach https://127.0.0.1:1") && e.contains("cannot reach http://127.0.0.1:2"), "{e}");
    }
}
