//! SDS for the local Envoy on a Unix socket (0600): the workload
//! certificate as the secret `default` and the mesh root as `ROOTCA`
//! (Istio's and SPIRE's names). A stream answers the names it asks for,
//! and again whenever the certificate changes: Envoy swaps the secret in
//! place, so listeners and clusters stay as they are and connections stay
//! open.
//!
//! State of the world only, one response per change; the version is the
//! leaf's serial. Names other than these two get no resource (Envoy keeps
//! waiting for them), as Istio's agent does for unknown names.

use super::Identity;
use anyhow::{Context, Result};
use envoy_types::pb::envoy::config::core::v3::{data_source::Specifier, DataSource};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{secret, CertificateValidationContext, Secret, TlsCertificate};
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::envoy::service::secret::v3::secret_discovery_service_server::{SecretDiscoveryService, SecretDiscoveryServiceServer};
use envoy_types::pb::google::protobuf::Any;
use futures::Stream;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status, Streaming};

/// The workload certificate and key.
pub const CERT_SECRET: &str = "default";
/// The mesh root, to validate peers.
pub const ROOT_SECRET: &str = "ROOTCA";
/// The static cluster that reaches the agent's socket.
pub const SDS_CLUSTER: &str = "sds-grpc";

const SECRET_TYPE: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";

fn inline(text: &str) -> Option<DataSource> {
    Some(DataSource { specifier: Some(Specifier::InlineBytes(text.as_bytes().to_vec())), ..Default::default() })
}

/// The secret `name` from `id`, if it is one this agent serves.
pub fn secret(name: &str, id: &Identity) -> Option<Secret> {
    let r#type = match name {
        CERT_SECRET => {
            secret::Type::TlsCertificate(TlsCertificate { certificate_chain: inline(&id.chain_pem), private_key: inline(&id.key_pem), ..Default::default() })
        }
        ROOT_SECRET => secret::Type::ValidationContext(CertificateValidationContext { trusted_ca: inline(&id.root_pem), ..Default::default() }),
        _ => return None,
    };
    Some(Secret { name: name.to_string(), r#type: Some(r#type) })
}

fn response(names: &BTreeSet<String>, id: &Identity, nonce: u64) -> DiscoveryResponse {
    let resources =
        names.iter().filter_map(|n| secret(n, id)).map(|s| Any { type_url: SECRET_TYPE.into(), value: prost::Message::encode_to_vec(&s) }).collect();
    DiscoveryResponse { version_info: id.serial.clone(), resources, type_url: SECRET_TYPE.into(), nonce: nonce.to_string(), ..Default::default() }
}

pub struct Sds {
    identity: watch::Receiver<Option<Arc<Identity>>>,
    shutdown: watch::Receiver<bool>,
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl SecretDiscoveryService for Sds {
    type DeltaSecretsStream = BoxStream<DeltaDiscoveryResponse>;
    type StreamSecretsStream = BoxStream<DiscoveryResponse>;

    async fn delta_secrets(&self, _req: Request<Streaming<DeltaDiscoveryRequest>>) -> Result<Response<Self::DeltaSecretsStream>, Status> {
        Err(Status::unimplemented("delta SDS is not served; use state of the world"))
    }

    async fn stream_secrets(&self, req: Request<Streaming<DiscoveryRequest>>) -> Result<Response<Self::StreamSecretsStream>, Status> {
        let mut requests = req.into_inner();
        let mut identity = self.identity.clone();
        let mut shutdown = self.shutdown.clone();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut names = BTreeSet::new();
            let mut sent: Option<(BTreeSet<String>, String)> = None;
            let mut nonce = 0u64;
            loop {
                // Answer when what is asked for, or what there is, changed.
                let current = identity.borrow_and_update().clone();
                if let Some(id) = current.filter(|_| !names.is_empty()) {
                    if sent.as_ref() != Some(&(names.clone(), id.serial.clone())) {
                        nonce += 1;
                        if tx.send(Ok(response(&names, &id, nonce))).await.is_err() {
                            return;
                        }
                        sent = Some((names.clone(), id.serial.clone()));
                    }
                }
                tokio::select! {
                    _ = shutdown.wait_for(|s| *s) => return,
                    changed = identity.changed() => if changed.is_err() { return },
                    msg = requests.message() => match msg {
                        Ok(Some(r)) => {
                            if let Some(e) = &r.error_detail {
                                tracing::warn!(version = %r.version_info, error = %e.message, "Envoy rejected a secret");
                            }
                            names = r.resource_names.into_iter().collect();
                        }
                        _ => return,
                    },
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn fetch_secrets(&self, req: Request<DiscoveryRequest>) -> Result<Response<DiscoveryResponse>, Status> {
        let names: BTreeSet<String> = req.into_inner().resource_names.into_iter().collect();
        let id = self.identity.borrow().clone().ok_or_else(|| Status::unavailable("no certificate yet"))?;
        Ok(Response::new(response(&names, &id, 0)))
    }
}

/// Serve SDS on `path` (replacing a stale socket file) until shutdown;
/// `owner` (uid, gid): the socket is theirs (Envoy run under the proxy's
/// uid), else the agent's.
pub async fn serve(path: PathBuf, identity: watch::Receiver<Option<Arc<Identity>>>, shutdown: watch::Receiver<bool>, owner: Option<(u32, u32)>) -> Result<()> {
    let listener = bind_private_socket(&path)?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(&path, Some(uid), Some(gid)).with_context(|| format!("chown {uid}:{gid} {}", path.display()))?;
    }
    tracing::info!(socket = %path.display(), "SDS: serving secrets default and ROOTCA");
    let mut stop = shutdown.clone();
    let service = SecretDiscoveryServiceServer::new(Sds { identity, shutdown });
    tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await
        .context("the SDS server")?;
    let _ = std::fs::remove_file(&path);
    Ok(())
}

/// Bind a Unix socket only its owner may use (0600): it hands out secrets,
/// or a workload's identity. A socket left by a previous run is replaced.
pub fn bind_private_socket(path: &std::path::Path) -> Result<tokio::net::UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if std::fs::symlink_metadata(path).is_ok_and(|m| {
        use std::os::unix::fs::FileTypeExt;
        m.file_type().is_socket()
    }) {
        std::fs::remove_file(path).with_context(|| format!("removing the old socket {}", path.display()))?;
    }
    let listener = tokio::net::UnixListener::bind(path).with_context(|| format!("binding the socket {}", path.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).with_context(|| format!("chmod {}", path.display()))?;
    Ok(listener)
}
