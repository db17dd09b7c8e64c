//! A small REST client for the CLI, with server errors rendered for people.

use crate::config::DEFAULT_SERVER_URL;
use anyhow::{anyhow, Result};
use serde_json::Value;

pub struct Client {
    base: String,
    http: reqwest::Client,
    /// Sent as `Authorization: Bearer` with every request (ACLs).
    token: Option<String>,
}

impl Client {
    pub fn new(server: Option<String>) -> Client {
        let base = server.unwrap_or_else(|| DEFAULT_SERVER_URL.to_string()).trim_end_matches('/').to_string();
        let base = if base.contains("://") { base } else { format!("http://{base}") };
        Client { base, http: reqwest::Client::new(), token: None }
    }

    /// The same client, sending this token (`cli::credential`).
    pub fn with_token(mut self, token: Option<String>) -> Client {
        self.token = token;
        self
    }

    /// A client for another replica, with the same credential.
    pub fn at(&self, server: String) -> Client {
        Client::new(Some(server)).with_token(self.token.clone())
    }

    fn authed(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<Value> {
        let resp = self.authed(req).send().await.map_err(|e| anyhow!("cannot reach {}: {e}", self.base))?;
        let status = resp.status();
        let text = resp.text().await?;
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status.is_success() {
            return Ok(body);
        }
        Err(anyhow!(render_error(status.as_u16(), &body)))
    }

    pub async fn get(&self, path: &str) -> Result<Value> {
        self.send(self.http.get(self.url(path))).await
    }
    /// GET a binary body (a backup file).
    pub async fn get_bytes(&self, path: &str) -> Result<Vec<u8>> {
        let resp = self.authed(self.http.get(self.url(path))).send().await.map_err(|e| anyhow!("cannot reach {}: {e}", self.base))?;
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
        let resp = self.authed(self.http.get(self.url(path))).send().await.map_err(|e| anyhow!("cannot reach {}: {e}", self.base))?;
        let status = resp.status().as_u16();
        let text = resp.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
    }
    pub async fn post(&self, path: &str, body: &Value) -> Result<Value> {
        self.send(self.http.post(self.url(path)).json(body)).await
    }
    pub async fn delete(&self, path: &str) -> Result<Value> {
        self.send(self.http.delete(self.url(path))).await
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
