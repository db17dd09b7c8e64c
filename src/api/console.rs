//! The web console (issue 36): the static files of `ui/dist/` (built by
//! `ui/build.sh` and checked in, so a build needs no Node), embedded in
//! the binary and served on the API port at `/ui/`.
//!
//! Loading it takes no credential: it is the same public code for
//! everyone. Every data call it makes is an ordinary REST request with the
//! user's bearer token. The pages are locked down by their headers: a
//! Content-Security-Policy that allows only this origin (no inline script
//! or style, no other host, no framing), `nosniff`, no referrer; the page
//! itself is never cached (a new binary serves a new console).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

const INDEX: &str = include_str!("../../ui/dist/index.html");
const APP_JS: &str = include_str!("../../ui/dist/app.js");
const APP_CSS: &str = include_str!("../../ui/dist/app.css");
const ICON: &str = include_str!("../../ui/dist/icon.svg");

/// Only this origin, for everything; nothing inline, no frames, no forms
/// posted elsewhere.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
                       frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'";

pub fn router() -> Router {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(|| async { asset(INDEX, "text/html; charset=utf-8", "no-store") }))
        .route("/ui/app.js", get(|| async { asset(APP_JS, "text/javascript; charset=utf-8", "no-cache") }))
        .route("/ui/app.css", get(|| async { asset(APP_CSS, "text/css; charset=utf-8", "no-cache") }))
        .route("/ui/icon.svg", get(|| async { asset(ICON, "image/svg+xml", "no-cache") }))
        // Anything else under /ui/ is not a file of the console (the port's
        // fallback is gRPC's, which answers every path).
        .route("/ui/{*rest}", get(|| async { (StatusCode::NOT_FOUND, "no such file in the console\n") }))
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
