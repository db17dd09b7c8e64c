//! The client's configuration: `client.toml`, and where the CLI goes when
//! nothing names a server.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Where the CLI goes with no server named anywhere: the API of `lodestar
/// server` started with no flags, which serves TLS (`--insecure` servers
/// need `--server http://...`).
pub const DEFAULT_SERVER_URL: &str = "https://127.0.0.1:8470";

/// What the CLI needs to reach a cluster: `client.toml`, written by a
/// replica on first start (`<data_dir>/client.toml`, 0600) and read by the
/// CLI (`--client-config`, `LODESTAR_CONFIG`, else `./lodestar-data/client.toml`,
/// else `~/.config/lodestar/client.toml`: `client::config_path`).
/// Copy it to another machine and change `server` to use it from there.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientConfig {
    /// Any replica's API, `https://HOST:PORT`.
    pub server: String,
    /// More replicas' APIs: the CLI tries them in order (after `server`)
    /// while one cannot be reached.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<String>,
    /// The CA bundle (PEM) the server's certificate is checked against.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub ca_pem: String,
    /// Or the file holding it (relative to this file's directory).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// A credential for the API (the admin token on first start).
    pub token: Option<String>,
    /// Or the file holding it (relative to this file's directory).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
}

impl ClientConfig {
    pub fn from_toml(text: &str) -> Result<ClientConfig, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a client config serialises")
    }
}

/// `~/x` as the home directory's `x`.
pub fn expand_home(path: &std::path::Path) -> PathBuf {
    match (path.strip_prefix("~"), std::env::var_os("HOME")) {
        (Ok(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => path.to_path_buf(),
    }
}
