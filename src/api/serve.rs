//! The API port's HTTP server: hyper (HTTP/1.1, or HTTP/2 by the client's
//! preface) over the port's accepted connections (`tls::conn::Incoming`,
//! which caps them and closes idle ones), with a header-read timeout for
//! HTTP/1.1. axum's own `serve` sets no timer, so a client dribbling a
//! request's headers held its connection for as long as it liked.
//!
//! Each request carries its connection's `ConnInfo` (as axum's
//! `ConnectInfo`) and counts on the connection's activity until its
//! response body is done (`tls::conn::RequestGuard`).

use crate::tls::conn::{Guarded, Incoming, RequestGuard};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::time::Duration;

/// Serve `app` on `incoming` until `shutdown` resolves; then stop
/// accepting, ask every connection to finish (HTTP/2: GOAWAY; HTTP/1.1:
/// close after the response in progress) and return once they have.
/// `header_read_timeout`: HTTP/1.1 requests whose headers take longer
/// are dropped with their connection (None: no limit).
pub async fn serve(mut incoming: Incoming, app: axum::Router, header_read_timeout: Option<Duration>, shutdown: impl Future<Output = ()>) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(header_read_timeout);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let conn = tokio::select! {
            c = incoming.next() => match c {
                Some(c) => c,
                None => break,
            },
            _ = &mut shutdown => break,
        };
        let info = conn.info().clone();
        let router = TowerToHyperService::new(app.clone());
        let service = hyper::service::service_fn(move |mut req: axum::http::Request<hyper::body::Incoming>| {
            let guard = RequestGuard::new(Some(&info));
            req.extensions_mut().insert(axum::extract::ConnectInfo(info.clone()));
            let response = hyper::service::Service::call(&router, req);
            async move { response.await.map(|r| r.map(|body| Guarded::new(body, guard))) }
        });
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(conn), service).into_owned());
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                if e.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_timeout) {
                    crate::metrics::metrics().connections_closed.with(&["api", "header_timeout"]).inc();
                }
                tracing::debug!(error = %e, "API connection ended with an error");
            }
        });
    }
    drop(incoming);
    graceful.shutdown().await;
}
