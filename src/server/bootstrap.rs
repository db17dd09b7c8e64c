//! A replica's first start, secure by default (as k3s and Elasticsearch 8):
//! a CA and certificate when none were supplied, and the CLI's client
//! config. Each step happens once: files that exist are used as they are.

use crate::config::{expand_home, ClientConfig, ServerConfig};
use crate::tls::pki::{self, PkiError};
use crate::tls::TlsFiles;
use std::net::SocketAddr;
use std::path::PathBuf;

pub fn tls_dir(config: &ServerConfig) -> PathBuf {
    config.data_dir.join("tls")
}

/// The certificate files this replica serves, creating what is missing:
/// operator-supplied files are used as given; else `<data_dir>/tls/`
/// holds the certificate, issued on first start from the cluster CA
/// (`tls_ca_file` + `tls_ca_key_file`), or from a CA generated there when
/// this is a single-node cluster.
pub fn ensure_files(config: &ServerConfig) -> Result<TlsFiles, PkiError> {
    let dir = tls_dir(config);
    let ca = config.tls_ca_file.clone().unwrap_or_else(|| dir.join(pki::CA_CERT));
    if let (Some(cert), Some(key)) = (&config.tls_cert_file, &config.tls_key_file) {
        return Ok(TlsFiles { ca, cert: cert.clone(), key: key.clone() });
    }
    let files = TlsFiles { ca: ca.clone(), cert: dir.join(pki::CERT), key: dir.join(pki::KEY) };
    if files.cert.exists() && files.key.exists() {
        return Ok(files);
    }
    let ca_key = config.tls_ca_key_file.clone().unwrap_or_else(|| dir.join(pki::CA_KEY));
    if !ca.exists() || !ca_key.exists() {
        let alone = config.initial_members.len() <= 1 && !config.join;
        if !alone || config.tls_ca_file.is_some() || config.tls_ca_key_file.is_some() {
            return Err(PkiError::File {
                path: ca_key,
                msg: "no cluster CA to issue this replica's certificate: the members of a cluster share one. Make it once with \
                      `lodestar tls ca create --dir DIR` and give every member tls_ca_file = DIR/ca.pem and tls_ca_key_file = DIR/ca-key.pem \
                      (or its own tls_cert_file and tls_key_file)"
                    .into(),
            });
        }
        pki::create_ca_dir(&dir, "Lodestar cluster CA")?;
        tracing::info!(ca = %ca.display(), "generated a new cluster CA (first start)");
    }
    let (cert_pem, key_pem) = pki::issue_member(&pki::read_file(&ca)?, &pki::read_file(&ca_key)?, config.id, &hosts(config))?;
    pki::write_file(&files.key, &key_pem, true)?;
    pki::write_file(&files.cert, &cert_pem, false)?;
    tracing::info!(cert = %files.cert.display(), member = config.id, "issued this replica's certificate (first start)");
    Ok(files)
}

/// The names the generated certificate is valid for besides the member
/// name and localhost: the listening IPs (a wildcard address stands for
/// none) and `tls_hosts`.
fn hosts(config: &ServerConfig) -> Vec<String> {
    let mut hosts: Vec<String> = [&config.api_addr, &config.raft_addr, &config.xds_addr]
        .iter()
        .filter_map(|a| a.parse::<SocketAddr>().ok())
        .map(|a| a.ip())
        .filter(|ip| !ip.is_unspecified())
        .map(|ip| ip.to_string())
        .collect();
    hosts.push("127.0.0.1".into());
    hosts.extend(config.tls_hosts.iter().cloned());
    hosts
}

/// The first line of every client config a replica writes: how a later
/// first start knows the file is its to replace.
const WRITTEN_BY: &str = "# Written by lodestar server";

/// Write the CLI's client config on first start: `<data_dir>/client.toml`,
/// and `user_client_config` unless a person wrote that file (a file an
/// earlier cluster's first start wrote is replaced: the CLI would
/// otherwise trust a CA that is gone). Returns the paths written.
pub fn write_client_config(config: &ServerConfig, files: &TlsFiles, token: Option<String>) -> Result<Vec<PathBuf>, PkiError> {
    let own = config.data_dir.join("client.toml");
    if own.exists() {
        return Ok(Vec::new());
    }
    let host = match config.api_addr.parse::<SocketAddr>() {
        Ok(a) if a.ip().is_unspecified() => format!("127.0.0.1:{}", a.port()),
        _ => config.api_addr.clone(),
    };
    let client = ClientConfig { server: format!("https://{host}"), ca_pem: pki::read_file(&files.ca)?, token, ..Default::default() };
    let data_dir = std::fs::canonicalize(&config.data_dir).unwrap_or_else(|_| config.data_dir.clone());
    let text = format!(
        "{WRITTEN_BY} (replica {}, data dir {}) on its first start: the CLI's server, CA and credential.\n{}",
        config.id,
        data_dir.display(),
        client.to_toml()
    );
    pki::write_file(&own, &text, true)?;
    let mut written = vec![own];
    if let Some(user) = config.user_client_config.as_deref().filter(|p| !p.as_os_str().is_empty()).map(expand_home) {
        match std::fs::read_to_string(&user) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                pki::write_file(&user, &text, true)?;
                written.push(user);
            }
            Ok(old) if old.starts_with(WRITTEN_BY) => {
                let was = old.lines().next().unwrap_or_default().trim_start_matches(WRITTEN_BY).trim().to_string();
                pki::write_file(&user, &text, true)?;
                tracing::info!(path = %user.display(), was = %was, "replaced the client config an earlier cluster's first start wrote");
                written.push(user);
            }
            _ => tracing::warn!(
                path = %user.display(),
                "left this client config alone (not written by lodestar server); the CLI reads ./lodestar-data/client.toml first when run in the directory the server was started in, or pass --client-config"
            ),
        }
    }
    Ok(written)
}

/// With ACLs on, the management credential the client config carries: the
/// secret in `initial_management_token_file` when one is given (every
/// member of a cluster gets the same file, as they share a CA); else, on a
/// single-node cluster, one generated on first start into
/// `<data_dir>/management.token` (0600), which `initial_management_token_file`
/// then names. A cluster of several members generates none (they would not
/// agree): give them a file, or use `lodestar acl bootstrap`.
pub fn ensure_management_token(config: &mut ServerConfig) -> Result<Option<String>, PkiError> {
    if let Some(path) = &config.initial_management_token_file {
        return Ok(Some(pki::read_file(path)?.trim().to_string()));
    }
    if config.initial_members.len() > 1 || config.join {
        return Ok(None);
    }
    let path = config.data_dir.join("management.token");
    if !path.exists() {
        let secret: String = rand::random::<[u8; 32]>().iter().map(|b| format!("{b:02x}")).collect();
        pki::write_file(&path, &format!("{secret}\n"), true)?;
        tracing::info!(file = %path.display(), "generated the management token (first start); the client config carries it");
    }
    let secret = pki::read_file(&path)?.trim().to_string();
    config.initial_management_token_file = Some(path);
    Ok(Some(secret))
}
