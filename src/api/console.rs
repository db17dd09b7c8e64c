//! The web console (issue 36): the static files of `ui/dist/` (built by
//! `ui/build.sh` and checked in, so a build needs no Node), embedded in
//! the binary and served on the API port at `/ui/`.
//!
//! Loading it takes no credential: it is the same public code for
//! everyone. Every data call it makes is an ordinary REST request with the
//! user's bearer token. The pages are locked down by their headers: a
//! Content-Security-Policy that allows only this origin (no inline script
//! or style, no framing; the one exception is below), `nosniff`, no
//! referrer; the page itself is never cached (a new binary serves a new
//! console).
//!
//! Failover: a console keeps working when the replica that served it
//! stops, by calling another member's API (`ui/src/api.ts`). So the page's
//! CSP lets it connect to the cluster's members' API origins (and only
//! those), and the REST routes answer CORS requests from those origins
//! ([`cors`]): bearer tokens only, never cookies (no
//! `Access-Control-Allow-Credentials`), so another origin gains nothing a
//! token would not already give it.

use crate::replica::Replica;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use std::sync::Arc;

const INDEX: &str = include_str!("../../ui/dist/index.html");
const APP_JS: &str = include_str!("../../ui/dist/app.js");
const APP_CSS: &str = include_str!("../../ui/dist/app.css");
const ICON: &str = include_str!("../../ui/dist/icon.svg");

/// Only this origin, for everything; nothing inline, no frames, no forms
/// posted elsewhere. The page's own adds the members' API origins to
/// `connect-src` ([`page_csp`]).
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
                       frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'";

pub fn router(replica: Arc<Replica>) -> Router {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(index))
        .with_state(replica)
        .route("/ui/app.js", get(|| async { asset(APP_JS, "text/javascript; charset=utf-8", "no-cache") }))
        .route("/ui/app.css", get(|| async { asset(APP_CSS, "text/css; charset=utf-8", "no-cache") }))
        .route("/ui/icon.svg", get(|| async { asset(ICON, "image/svg+xml", "no-cache") }))
        // Anything else under /ui/ is not a file of the console (the port's
        // fallback is gRPC's, which answers every path).
        .route("/ui/{*rest}", get(|| async { (StatusCode::NOT_FOUND, "no such file in the console\n") }))
}

async fn index(State(replica): State<Arc<Replica>>) -> Response {
    let mut page = asset(INDEX, "text/html; charset=utf-8", "no-store");
    if let Ok(csp) = HeaderValue::from_str(&page_csp(&member_origins(&replica))) {
        page.headers_mut().insert(header::CONTENT_SECURITY_POLICY, csp);
    }
    page
}

/// [`CSP`], with `connect-src` open to `origins` too.
pub fn page_csp(origins: &[String]) -> String {
    let connect: String = origins.iter().map(|o| format!(" {o}")).collect();
    CSP.replace("connect-src 'self'", &format!("connect-src 'self'{connect}"))
}

/// The origins of the members' API ports (this replica's among them), as
/// a browser names them; addresses that are not a plain `host:port` are
/// left out.
pub fn member_origins(replica: &Replica) -> Vec<String> {
    let scheme = if replica.config.insecure { "http" } else { "https" };
    replica
        .node
        .members()
        .into_iter()
        .map(|(_, info, _)| info.api_addr)
        .filter(|a| !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || ".:-[]".contains(c)))
        .map(|a| format!("{scheme}://{a}"))
        .collect()
}

/// CORS for the REST routes, for the members' origins only: a preflight
/// is answered here (204), and every answer to such an origin says it may
/// read it. Other origins get no CORS header (the browser then refuses
/// them the answer, as before).
pub async fn cors(State(replica): State<Arc<Replica>>, req: Request, next: Next) -> Response {
    let origin = req.headers().get(header::ORIGIN).and_then(|o| o.to_str().ok()).map(str::to_owned);
    let allowed = origin.filter(|o| member_origins(&replica).iter().any(|m| m == o)).and_then(|o| HeaderValue::from_str(&o).ok());
    let Some(origin) = allowed else { return next.run(req).await };
    if req.method() == Method::OPTIONS && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD) {
        let mut answer = StatusCode::NO_CONTENT.into_response();
        let h = answer.headers_mut();
        allow(h, origin);
        h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, DELETE"));
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, HeaderValue::from_static("authorization, content-type, x-lodestar-message"));
        h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
        return answer;
    }
    let mut answer = next.run(req).await;
    allow(answer.headers_mut(), origin);
    answer.headers_mut().insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, HeaderValue::from_static(super::rest::REVISION_HEADER));
    answer
}

fn allow(h: &mut HeaderMap, origin: HeaderValue) {
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    h.append(header::VARY, HeaderValue::from_static("origin"));
}

fn asset(body: &'static str, content_type: &'static str, cache: &'static str) -> Response {
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (header::CACHE_CONTROL, HeaderValue::from_static(cache)),
        (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP)),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
    ];
    (StatusCode::OK, headers, body).into_response()
}
