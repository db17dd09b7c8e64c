//! A small REST client for the CLI, with server errors rendered for people.

use crate::config::{expand_home, ClientConfig, DEFAULT_SERVER_URL};
use anyhow::{anyhow, Context, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// How the CLI reaches a cluster: `--server`, `--ca-file` and `--token`
/// (or their environment variables) over the client config file
/// (`--client-config`, `LODESTAR_CONFIG`, else `~/.config/lodestar/client.toml`,
/// else `./lodestar-data/client.toml`: what `lodestar server` writes on
/// its first start).
#[derive(Clone, Default)]
pub struct Access {
    pub server: Option<String>,
    /// The CA bundle (PEM) servers' certificates are checked against.
    pub ca_pem: Option<String>,
    pub token: Option<String>,
    /// `--insecure`: the token may go to an `http://` server, in the clear.
    pub insecure: bool,
}

/// Where the CLI looks for its client config when none is named.
pub fn default_config_paths() -> Vec<PathBuf> {
    vec![expand_home(Path::new("~/.config/lodestar/client.toml")), PathBuf::from("./lodestar-data/client.toml")]
}

impl Access {
    pub fn resolve(server: Option<String>, config: Option<PathBuf>, ca_file: Option<PathBuf>, token: Option<String>) -> Result<Access> {
        let file = match config {
            Some(path) => Some(read_client_config(&path)?),
            None => default_config_paths().into_iter().find(|p| p.exists()).map(|p| read_client_config(&p)).transpose()?,
        }
        .unwrap_or_default();
        let ca_pem = match ca_file {
            Some(path) => Some(std::fs::read_to_string(&path).with_context(|| format!("reading the CA file {}", path.display()))?),
            None => Some(file.ca_pem).filter(|p| !p.is_empty()),
        };
        Ok(Access { server: server.or(Some(file.server).filter(|s| !s.is_empty())), ca_pem, token: token.or(file.token), insecure: false })
    }

    /// A REST client for `server` (default: this access's server). A bare
    /// `HOST:PORT` is https (checked against the CA, else the system's
    /// roots); plaintext only when asked for with `http://`, and then
    /// without the token unless `insecure`.
    pub fn client(&self, server: Option<&str>) -> Result<Client> {
        let base = server.map(str::to_string).or_else(|| self.server.clone()).unwrap_or_else(|| DEFAULT_SERVER_URL.to_string());
        let client = Client { base: String::new(), http: self.http()?, token: self.token.clone(), insecure: self.insecure };
        Ok(client.at(&base))
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
        let mut builder = reqwest::Client::builder().tcp_nodelay(true);
        if let Some(pem) = &self.ca_pem {
            for cert in reqwest::Certificate::from_pem_bundle(pem.as_bytes()).context("the CA bundle")? {
                builder = builder.add_root_certificate(cert);
            }
        }
        Ok(builder)
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
pub type ApiClient = crate::proto::api::lodestar_client::LodestarClient<tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Bearer>>;

fn read_client_config(path: &Path) -> Result<ClientConfig> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading the client config {}", path.display()))?;
    ClientConfig::from_toml(&text).map_err(|e| anyhow!("{}: {e}", path.display()))
}

pub struct Client {
    base: String,
    http: reqwest::Client,
    token: Option<String>,
    insecure: bool,
}

/// Why a credential is not sent to a plaintext server.
fn plaintext_refusal(base: &str) -> anyhow::Error {
    anyhow!(
        "refusing to send the token to {base} over plaintext http (anyone on the path could read it and act as you): use https:// \
         with the cluster's CA (--ca-file, or a client config), or pass --insecure to send it in the clear anyway"
    )
}

impl Client {
    /// This client pointed at `server` (`https://...`, `http://...`, or a
    /// bare `HOST:PORT`, which is https).
    fn at(&self, server: &str) -> Client {
        let server = server.trim_end_matches('/');
        let base = if server.contains("://") { server.to_string() } else { format!("https://{server}") };
        Client { base, http: self.http.clone(), token: self.token.clone(), insecure: self.insecure }
    }

    /// Another replica, reached the same way (a bare address: with this
    /// client's scheme).
    pub fn with_server(&self, server: &str) -> Client {
        let scheme = self.base.split("://").next().unwrap_or("https");
        self.at(&if server.contains("://") { server.to_string() } else { format!("{scheme}://{server}") })
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Every request carries the token, if there is one; never to an
    /// http:// server without `--insecure`.
    fn request(&self, method: reqwest::Method, path: &str) -> Result<reqwest::RequestBuilder> {
        let req = self.http.request(method, self.url(path));
        match &self.token {
            Some(_) if self.base.starts_with("http://") && !self.insecure => Err(plaintext_refusal(&self.base)),
            Some(t) => Ok(req.bearer_auth(t)),
            None => Ok(req),
        }
    }

    fn unreachable(&self, e: reqwest::Error) -> anyhow::Error {
        // reqwest puts the TLS cause (an unknown CA, a name mismatch) in
        // the source chain, not in the top message.
        let mut msg = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            msg = format!("{msg}: {s}");
            source = s.source();
        }
        anyhow!("cannot reach {}: {msg}", self.base)
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<Value> {
        let resp = req.send().await.map_err(|e| self.unreachable(e))?;
        let status = resp.status();
        let text = resp.text().await?;
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status.is_success() {
            return Ok(body);
        }
        Err(anyhow!(render_error(status.as_u16(), &body)))
    }

    pub async fn get(&self, path: &str) -> Result<Value> {
        self.send(self.request(reqwest::Method::GET, path)?).await
    }
    /// GET a binary body (a backup file).
    pub async fn get_bytes(&self, path: &str) -> Result<Vec<u8>> {
        let resp = self.request(reqwest::Method::GET, path)?.send().await.map_err(|e| self.unreachable(e))?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| anyhow!("reading the answer of {}: {e}", self.base))?;
        if status.is_success() {
            return Ok(bytes.to_vec());
        }
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Err(anyhow!(render_error(status.as_u16(), &body)))
    }
    /// GET, whatever the status: (status, JSON body).
    pub async fn get_any(&self, path: &str) -> Result<(u16, Value)> {
        let resp = self.request(reqwest::Method::GET, path)?.send().await.map_err(|e| self.unreachable(e))?;
        let status = resp.status().as_u16();
        let text = resp.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
    }
    /// The token this client sends, if any.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }
    /// The same client with another token (`lodestar agent --token-file`).
    pub fn with_token(&self, token: Option<String>) -> Client {
        Client { token, ..self.at(&self.base) }
    }
    /// POST, whatever the status: (status, JSON body); Err only when no
    /// answer came. For callers that act on the status (the agent's
    /// keepalive: 404 means the lease is gone).
    pub async fn post_any(&self, path: &str, body: &Value) -> Result<(u16, Value)> {
        let resp = self.request(reqwest::Method::POST, path)?.json(body).send().await.map_err(|e| self.unreachable(e))?;
        let status = resp.status().as_u16();
        let text = resp.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
    }
    pub async fn delete_any(&self, path: &str) -> Result<(u16, Value)> {
        let resp = self.request(reqwest::Method::DELETE, path)?.send().await.map_err(|e| self.unreachable(e))?;
        let status = resp.status().as_u16();
        let text = resp.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
    }
    pub async fn post(&self, path: &str, body: &Value) -> Result<Value> {
        self.send(self.request(reqwest::Method::POST, path)?.json(body)).await
    }
    pub async fn delete(&self, path: &str) -> Result<Value> {
        self.send(self.request(reqwest::Method::DELETE, path)?).await
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

    fn access(server: &str, token: Option<&str>, insecure: bool) -> Access {
        Access { server: Some(server.into()), ca_pem: None, token: token.map(str::to_string), insecure }
    }

    #[tokio::test]
    async fn no_token_over_plaintext_without_insecure() {
        // A bare address is https, as is the default.
        assert_eq!(access("127.0.0.1:1", None, false).client(None).unwrap().url("/x"), "https://127.0.0.1:1/x");
        assert_eq!(Access::default().client(None).unwrap().url(""), crate::config::DEFAULT_SERVER_URL);
        assert!(DEFAULT_SERVER_URL.starts_with("https://"));
        // http:// with a token: refused before anything is sent, saying how to proceed.
        let c = access("http://127.0.0.1:1", Some("s3cr3t"), false).client(None).unwrap();
        let e = c.get("/v1/cluster").await.unwrap_err().to_string();
        assert!(e.contains("refusing to send the token") && e.contains("--insecure") && !e.contains("s3cr3t"), "{e}");
        assert!(c.with_server("127.0.0.2:1").post("/v1/apply", &serde_json::json!({})).await.unwrap_err().to_string().contains("refusing"));
        // Without a token, or with --insecure, the request is made (and fails to connect here).
        for c in [access("http://127.0.0.1:1", None, false), access("http://127.0.0.1:1", Some("t"), true)] {
            let e = c.client(None).unwrap().get("/v1/cluster").await.unwrap_err().to_string();
            assert!(e.contains("cannot reach http://127.0.0.1:1"), "{e}");
        }
    }
}
