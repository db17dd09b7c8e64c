//! The agent's local xDS socket: ADS on a Unix socket, forwarded to a
//! replica over mutual TLS with the workload certificate, as Istio's
//! pilot-agent proxies xDS for its Envoy.
//!
//! It exists for clients that cannot do TLS to the xDS port themselves:
//! Node's `@grpc/grpc-js-xds` takes only `insecure` and `google_default`
//! channel credentials. Such a client dials `unix://…/xds.sock` in the
//! clear, on its own host, through a socket only the agent's user may open
//! (0600, like the SDS socket); every hop over the network is TLS, and the
//! credential the replica sees is the agent's certificate, so the client
//! may claim only a node in the certificate's namespace (the xDS port's
//! usual check).
//!
//! Forwarding is at the HTTP/2 level, byte for byte: the request stream
//! goes up as it comes and the response stream comes back as it goes, so
//! nothing is decoded here and both protocols (SotW and delta) pass alike.
//! Each stream dials a replica with the certificate current at that
//! moment (a rotation applies to the next stream); the replicas are tried
//! in turn, so a client whose replica died reconnects through another.

use super::{CaClient, Identity};
use anyhow::{Context as _, Result};
use std::convert::Infallible;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::watch;
use tonic::codegen::{http, Body, Service, StdError};
use tonic::server::NamedService;
use tonic::Status;

const SERVICE: &str = "envoy.service.discovery.v3.AggregatedDiscoveryService";

/// The forwarding service (ADS methods only: tonic's router sends nothing
/// else here, and nothing else is forwarded).
#[derive(Clone)]
struct Forward {
    upstream: Arc<CaClient>,
    identity: watch::Receiver<Option<Arc<Identity>>>,
}

impl NamedService for Forward {
    const NAME: &'static str = SERVICE;
}

impl<B> Service<http::Request<B>> for Forward
where
    B: Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send + 'static>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let (upstream, current) = (self.upstream.clone(), self.identity.borrow().clone());
        Box::pin(async move {
            let Some(current) = current else { return Ok(Status::unavailable("the agent has no certificate yet").into_http()) };
            let mut last = Status::unavailable("no xDS servers");
            for server in &upstream.servers {
                match upstream.channel(server, Some(&current), None).await {
                    Ok(mut channel) => {
                        if let Err(e) = std::future::poll_fn(|cx| channel.poll_ready(cx)).await {
                            last = Status::unavailable(format!("{server}: {e}"));
                            continue;
                        }
                        let req = req.map(tonic::body::Body::new);
                        return Ok(match channel.call(req).await {
                            Ok(resp) => resp,
                            Err(e) => Status::unavailable(format!("{server}: {e}")).into_http(),
                        });
                    }
                    Err(status) => {
                        tracing::debug!(%server, error = %status.message(), "xDS proxy: replica unreachable");
                        last = status;
                    }
                }
            }
            Ok(last.into_http())
        })
    }
}

/// Serve the xDS socket at `path` until `shutdown`.
pub async fn serve(path: PathBuf, upstream: CaClient, identity: watch::Receiver<Option<Arc<Identity>>>, shutdown: watch::Receiver<bool>) -> Result<()> {
    let listener = super::sds::bind_private_socket(&path)?;
    tracing::info!(socket = %path.display(), servers = %upstream.servers.join(", "), "xDS proxy: forwarding ADS over mutual TLS");
    let mut stop = shutdown;
    tonic::transport::Server::builder()
        .add_service(Forward { upstream: Arc::new(upstream), identity })
        .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await
        .context("the xDS proxy")?;
    let _ = std::fs::remove_file(&path);
    Ok(())
}
