//! The REST API (`/v1/...`), health endpoints, and the error → HTTP mapping.
//!
//! Every route but `/healthz` and `/readyz` takes a [`Caller`] (the
//! request's credentials, authenticated before anything else is extracted)
//! and authorizes what it touches; the verb of each route is in the README
//! ("Tokens and policies").

use super::views::{ClusterStatusView, NodeStatusView, WaitReportView};
use super::{ApplyItem, Caller, DeleteItem, Precheck, WriteResult};
use crate::auth::{Acl, PeerIdentity, Target, Verb};
use crate::error::{Code, Error};
use crate::model::documents::parse_documents;
use crate::node::{Consistency, Node};
use crate::replica::Replica;
use crate::store::types::NodeInfo;
use crate::store::watch::{check_start, watch, WatchFilter};
use crate::xds::status::{SyncRegistry, SyncStatus};
use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::sync::Arc;

pub const REVISION_HEADER: &str = "x-lodestar-revision";
/// On `/v1/snapshot`: how many objects the backup holds.
pub const OBJECTS_HEADER: &str = "x-lodestar-objects";

/// The routes: those that only read or write the store take the `Node`;
/// those about the replica's helpers (status, readiness, heartbeats,
/// proxies) or its settings (body limits, the secrets key, the mesh's
/// names) take the `Replica`.
pub fn router(replica: Arc<Replica>) -> Router {
    let helpers = Router::new()
        .route("/v1/resources/{kind}/{namespace}/{name}/heartbeat", post(heartbeat))
        .route("/v1/wait", get(wait_for_proxies))
        .route("/v1/cluster", get(cluster_status))
        .route("/v1/node", get(node_status))
        .route("/v1/cluster/members", post(add_member))
        .route("/v1/cluster/members/{id}", delete(remove_member))
        .route("/readyz", get(readyz))
        .route("/v1/acl/tokens", post(create_token))
        .route("/v1/acl/bootstrap", post(acl_bootstrap))
        .route("/v1/acl/token/self", get(token_self))
        .route("/v1/apply", post(apply))
        .route("/v1/validate", post(validate))
        .route("/v1/delete", post(delete_many))
        .route("/v1/registry/services", get(registry_services))
        .route("/v1/topology", get(topology))
        .route("/v1/analyze", get(analyze_live).post(analyze_with))
        .route("/v1/history", get(history_list))
        .route("/v1/diff", get(diff_revisions))
        .route("/v1/rollback", post(rollback))
        .route("/v1/nacks", get(nacks))
        .route("/v1/nacks/recent", get(recent_nacks))
        .with_state(replica.clone());
    Router::new()
        .route("/v1/resources/{kind}", get(list))
        .route("/v1/resources/{kind}/{namespace}/{name}", get(get_one).delete(delete_one))
        .route("/v1/watch", get(watch_changes))
        .route("/v1/snapshot", get(snapshot))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(replica.node.clone())
        .merge(helpers)
        .merge(observe(&replica))
        .merge(super::console::router(replica.clone()))
        .layer(axum::middleware::from_fn_with_state(replica.clone(), super::console::cors))
        .layer(axum::Extension(replica.acl.clone()))
}

/// `/metrics` and `/debug/*`: read-only, `read` on the cluster on the API
/// port.
fn observe(replica: &Arc<Replica>) -> Router {
    let sync = Router::new()
        .route("/debug/syncz", get(syncz))
        .route("/debug/config_dump", get(config_dump))
        .route("/debug/authz", axum::routing::post(authz_check))
        .with_state(replica.sync.clone());
    let node = Router::new().route("/debug/configz", get(configz)).route("/metrics", get(metrics)).with_state(replica.node.clone());
    Router::new()
        .route("/debug/checks", get(debug_checks))
        .route("/debug/push_status", get(push_status))
        .route("/debug/registryz", get(registryz))
        .with_state(replica.clone())
        .merge(sync)
        .merge(node)
}

/// The same read-only routes for the local observer address
/// (`metrics_addr`, loopback only): plaintext, no token.
pub fn observer_router(replica: Arc<Replica>) -> Router {
    observe(&replica).layer(axum::Extension(replica.acl.observer()))
}

/// The caller of a request: its bearer token and client-certificate
/// identity, authenticated (401 when that fails) before the handler runs.
impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Reply;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Caller> {
        let acl = parts.extensions.get::<Arc<Acl>>().cloned().ok_or_else(|| Error::internal("the router has no ACL state"))?;
        let op = format!("{} {}", parts.method, parts.extensions.get::<axum::extract::MatchedPath>().map_or(parts.uri.path(), |p| p.as_str()));
        let conn = parts.extensions.get::<axum::extract::ConnectInfo<crate::tls::conn::ConnInfo>>().map(|c| &c.0);
        let peer = super::peer_identity(conn, parts.extensions.get::<PeerIdentity>());
        let message = match parts.headers.get("x-lodestar-message") {
            None => None,
            Some(v) => Some(v.to_str().map_err(|_| Error::field("X-Lodestar-Message", "a change message is printable ASCII text"))?),
        };
        Ok(Caller::of_request(&acl, &op, parts.headers.get(header::AUTHORIZATION).map(|v| v.as_bytes()), peer)?.with_message(message, "X-Lodestar-Message")?)
    }
}

/// A handler's error as its REST answer: the code's HTTP status and the
/// body `{"error": {"code", "message", "fields"}}`. A newtype because
/// `Error` is the model crate's and `IntoResponse` axum's; `?` converts.
#[derive(Debug)]
pub struct Reply(pub Error);

/// What handlers return: any `Error` becomes its REST answer.
pub type Result<T, E = Reply> = std::result::Result<T, E>;

impl From<Error> for Reply {
    fn from(e: Error) -> Reply {
        Reply(e)
    }
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        let Reply(this) = self;
        let status = StatusCode::from_u16(this.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = json!({ "error": error_json(&this) });
        if this.code == Code::Unauthenticated {
            return (status, [(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"))], Json(body)).into_response();
        }
        (status, Json(body)).into_response()
    }
}

/// An error as the API answers it: `{"code", "message", "fields"}`.
fn error_json(e: &Error) -> Value {
    json!({"code": e.code.as_str(), "message": e.message, "fields": e.fields})
}

/// A path the API port does not serve: gRPC's UNIMPLEMENTED to a gRPC
/// client (as tonic answers), a 404 in the REST error vocabulary to
/// everyone else, so a typo in a URL is not mistaken for a success.
pub async fn unrouted(req: axum::extract::Request) -> Response {
    let path = req.uri().path().to_string();
    let grpc = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|ct| ct.starts_with("application/grpc"));
    if grpc {
        return tonic::Status::unimplemented(format!("no method {path}")).into_http();
    }
    Reply(Error::not_found(format!("no API at {path}"))).into_response()
}

/// Read a body with the configured size limit; over it is a 400 that says so.
async fn read_body(replica: &Replica, body: Body) -> crate::error::Result<Bytes> {
    let limit = replica.config.max_body_bytes;
    axum::body::to_bytes(body, limit).await.map_err(|_| Error::field("body", format!("request body is larger than the limit of {limit} bytes")))
}

fn is_yaml(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|ct| ct.contains("yaml") || ct.starts_with("text/"))
}

fn body_text(bytes: &[u8]) -> crate::error::Result<&str> {
    std::str::from_utf8(bytes).map_err(|e| Error::field("body", format!("not UTF-8: {e}")))
}

/// The body of `/v1/apply` and `/v1/delete`: `{"resources": [...]}` in JSON,
/// or a YAML/JSON stream of resource documents.
fn documents(yaml: bool, bytes: &[u8]) -> crate::error::Result<(Vec<Value>, Value)> {
    let text = body_text(bytes)?;
    if yaml {
        let docs = parse_documents(text, "body").map_err(|e| Error::invalid_fields(vec![e]))?;
        return Ok((docs, Value::Null));
    }
    let v: Value = serde_json::from_str(text).map_err(|e| Error::field("body", format!("malformed JSON: {e}")))?;
    match v {
        Value::Object(ref m) if m.contains_key("resources") => match m.get("resources") {
            Some(Value::Array(items)) => Ok((items.clone(), v)),
            _ => Err(Error::field("resources", "expected a list")),
        },
        Value::Object(ref m) if m.contains_key("kind") => Ok((vec![v], Value::Null)),
        Value::Array(items) => Ok((items, Value::Null)),
        _ => Err(Error::field("body", "expected {\"resources\": [...]} or resource documents")),
    }
}

fn revision_headers(revision: u64) -> [(header::HeaderName, HeaderValue); 1] {
    [(header::HeaderName::from_static(REVISION_HEADER), HeaderValue::from(revision))]
}

/// `?dryRun=true`: preview, write nothing; `?expectedRevision=N`: only if
/// nothing the body names changed after revision N (`api::dryrun`).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ApplyQuery {
    #[serde(default)]
    dry_run: bool,
    expected_revision: Option<u64>,
    /// `Warn` (default: unknown fields dropped, with a warning) or
    /// `Strict` (refused), as Kubernetes' `fieldValidation`.
    field_validation: Option<String>,
}

impl ApplyQuery {
    fn fields(&self) -> crate::error::Result<crate::model::FieldValidation> {
        match &self.field_validation {
            None => Ok(Default::default()),
            Some(v) => crate::model::FieldValidation::parse(v).ok_or_else(|| Error::field("fieldValidation", format!("{v:?}: expected Warn or Strict"))),
        }
    }
}

async fn apply(State(replica): State<Arc<Replica>>, caller: Caller, Query(q): Query<ApplyQuery>, headers: HeaderMap, body: Body) -> Result<Response> {
    caller.precheck(Precheck::Any(Verb::Write))?;
    let bytes = read_body(&replica, body).await?;
    let (txn, warnings) = apply_body(is_yaml(&headers), &bytes, q.fields()?)?;
    Ok(outcome(super::apply_authorized(&caller, &replica, txn, warnings, q.dry_run, q.expected_revision).await?))
}

/// `fieldValidation`, as an apply takes it.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ValidateQuery {
    field_validation: Option<String>,
}

/// `POST /v1/validate`: the body of an apply, checked as the apply would
/// check it (same body limit, parser, validation and authorization), and
/// nothing else (`api::validate_authorized`). A body the apply would
/// refuse as invalid is answered 200 with `valid: false` and the error the
/// apply would give (its `fields` name each path); any other refusal
/// (401, 403, 409...) is answered as the apply answers it.
async fn validate(State(replica): State<Arc<Replica>>, caller: Caller, Query(q): Query<ValidateQuery>, headers: HeaderMap, body: Body) -> Result<Response> {
    caller.precheck(Precheck::Any(Verb::Write))?;
    let fields = ApplyQuery { field_validation: q.field_validation, ..Default::default() }.fields()?;
    let checked = async {
        let bytes = read_body(&replica, body).await?;
        let (txn, warnings) = apply_body(is_yaml(&headers), &bytes, fields)?;
        super::validate_authorized(&caller, &replica, txn, warnings).await
    };
    match checked.await {
        Ok((revision, warnings)) => Ok((revision_headers(revision), Json(json!({"valid": true, "revision": revision, "warnings": warnings}))).into_response()),
        Err(e) if e.code == Code::InvalidArgument => Ok(Json(json!({"valid": false, "error": error_json(&e)})).into_response()),
        Err(e) => Err(e.into()),
    }
}

/// An apply's (or a rollback's) answer: the write at its revision, or the
/// preview at its base revision.
fn outcome(o: super::ApplyOutcome) -> Response {
    match o {
        super::ApplyOutcome::Written(result) => (revision_headers(result.revision), Json(result)).into_response(),
        super::ApplyOutcome::Preview(p) => (revision_headers(p.base_revision), Json(p)).into_response(),
    }
}

/// The body of `/v1/apply` (YAML when `yaml`, else JSON), parsed and
/// validated into the transaction it asks for, with its warnings: all the
/// handler does before authorizing and proposing it. Public for the fuzz
/// target (`fuzz/fuzz_targets/rest.rs`).
pub fn apply_body(yaml: bool, bytes: &[u8], fields: crate::model::FieldValidation) -> crate::error::Result<(crate::store::types::Txn, Vec<String>)> {
    let (docs, _) = documents(yaml, bytes)?;
    // `{"resource": {...}, "expectedRevision": N}` wraps a resource with a
    // precondition; a bare resource has none.
    let items = docs
        .into_iter()
        .enumerate()
        .map(|(i, d)| match d {
            Value::Object(mut m) if m.contains_key("resource") && !m.contains_key("kind") => {
                let expected_revision = match m.remove("expectedRevision") {
                    None | Some(Value::Null) => None,
                    Some(v) => Some(v.as_u64().ok_or_else(|| Error::field(format!("resources[{i}].expectedRevision"), "expected a non-negative integer"))?),
                };
                Ok(ApplyItem { resource: m.remove("resource").unwrap_or(Value::Null), expected_revision })
            }
            other => Ok(ApplyItem { resource: other, expected_revision: None }),
        })
        .collect::<crate::error::Result<Vec<_>>>()?;
    super::apply_txn(items, fields)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeleteRef {
    kind: String,
    namespace: Option<String>,
    name: String,
    expected_revision: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct DeleteQuery {
    ignore_not_found: Option<bool>,
    expected_revision: Option<u64>,
}

async fn delete_many(State(replica): State<Arc<Replica>>, caller: Caller, Query(q): Query<DeleteQuery>, headers: HeaderMap, body: Body) -> Result<Response> {
    let node = &replica.node;
    caller.precheck(Precheck::Any(Verb::Delete))?;
    let bytes = read_body(&replica, body).await?;
    let txn = delete_body(is_yaml(&headers), &bytes, q.ignore_not_found)?;
    caller.authorize_txn(Verb::Delete, &txn)?;
    let ok = caller.write(node, Verb::Delete, txn).await?;
    Ok((revision_headers(ok.revision), Json(WriteResult::new(ok, Vec::new()))).into_response())
}

/// The body of `/v1/delete` into its transaction (as [`apply_body`]);
/// `ignore_not_found`: the query parameter, which wins over the body's.
pub fn delete_body(yaml: bool, bytes: &[u8], ignore_not_found: Option<bool>) -> crate::error::Result<crate::store::types::Txn> {
    let (docs, envelope) = documents(yaml, bytes)?;
    let ignore = ignore_not_found.or_else(|| envelope.get("ignoreNotFound").and_then(Value::as_bool)).unwrap_or(false);
    let items = if docs.iter().all(|d| d.get("metadata").is_none() && d.get("name").is_some()) {
        docs.into_iter()
            .enumerate()
            .map(|(i, d)| {
                let r: DeleteRef = serde_json::from_value(d).map_err(|e| Error::field(format!("resources[{i}]"), e.to_string()))?;
                Ok(DeleteItem { kind: r.kind, namespace: r.namespace, name: r.name, expected_revision: r.expected_revision })
            })
            .collect::<crate::error::Result<Vec<_>>>()?
    } else {
        super::delete_items_from_documents(docs)?
    };
    super::delete_txn(items, ignore)
}

async fn delete_one(
    State(node): State<Arc<Node>>,
    caller: Caller,
    Path((kind, namespace, name)): Path<(String, String, String)>,
    Query(q): Query<DeleteQuery>,
) -> Result<Response> {
    let item = DeleteItem { kind, namespace: Some(namespace), name, expected_revision: q.expected_revision };
    let txn = super::delete_txn(vec![item], q.ignore_not_found.unwrap_or(false))?;
    caller.authorize_txn(Verb::Delete, &txn)?;
    let ok = caller.write(&node, Verb::Delete, txn).await?;
    Ok((revision_headers(ok.revision), Json(WriteResult::new(ok, Vec::new()))).into_response())
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ReadQuery {
    namespace: Option<String>,
    label_selector: Option<String>,
    consistency: Option<String>,
}

fn consistency(q: Option<&str>) -> crate::error::Result<Consistency> {
    match q {
        None | Some("") | Some("linearizable") => Ok(Consistency::Linearizable),
        Some("stale") => Ok(Consistency::Stale),
        Some(other) => Err(Error::field("consistency", format!("{other:?}: expected linearizable or stale"))),
    }
}

async fn list(State(node): State<Arc<Node>>, caller: Caller, Path(kind): Path<String>, Query(q): Query<ReadQuery>) -> Result<Response> {
    let kind = super::parse_kind(&kind)?;
    caller.authorize(Verb::Read, [Target::kind(kind, q.namespace.as_deref())])?;
    let selector = super::parse_selector(q.label_selector.as_deref())?;
    let applied = node.read(consistency(q.consistency.as_deref())?).await?;
    let objects = super::list(&applied, kind, q.namespace.as_deref(), &selector);
    let revision = applied.revision();
    // Written straight from the stored bodies (no JSON tree per object).
    #[derive(Serialize)]
    struct Listed<T> {
        revision: u64,
        items: Vec<T>,
    }
    let items = objects.iter().map(|o| o.json_view()).collect();
    Ok((revision_headers(revision), Json(Listed { revision, items })).into_response())
}

async fn get_one(
    State(node): State<Arc<Node>>,
    caller: Caller,
    Path((kind, namespace, name)): Path<(String, String, String)>,
    Query(q): Query<ReadQuery>,
) -> Result<Response> {
    let key = super::key_of(&kind, Some(&namespace), &name)?;
    caller.authorize(Verb::Read, [Target::key(&key)])?;
    let applied = node.read(consistency(q.consistency.as_deref())?).await?;
    let obj = super::get(&applied, &key)?;
    let view = obj.to_json();
    Ok((revision_headers(applied.revision()), Json(view)).into_response())
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct WatchQuery {
    from_revision: Option<u64>,
    kind: Option<String>,
    namespace: Option<String>,
}

/// Newline-delimited JSON events, one per line, until the client hangs up.
async fn watch_changes(State(node): State<Arc<Node>>, caller: Caller, Query(q): Query<WatchQuery>) -> Result<Response> {
    let mut filter =
        WatchFilter { kind: q.kind.as_deref().map(super::parse_kind).transpose()?, namespace: q.namespace.filter(|n| !n.is_empty()), skip_acl: false };
    caller.authorize_watch(&mut filter)?;
    // History already compacted: 410 now, not a 200 whose first line says so.
    check_start(node.reader(), q.from_revision)?;
    let stream = watch(node.reader().clone(), q.from_revision, filter).map(|item| {
        let line = match item {
            Ok(e) => json!({"revision": e.revision, "type": e.kind.as_str(), "object": e.object.to_json()}),
            Err(e) => json!({"error": {"code": e.code.as_str(), "message": e.message}}),
        };
        Ok::<_, std::convert::Infallible>(format!("{line}\n"))
    });
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(stream)).into_response())
}

/// A backup file of the applied state at one revision (`lodestar snapshot
/// save`); linearizable unless `?consistency=stale`.
async fn snapshot(State(node): State<Arc<Node>>, caller: Caller, Query(q): Query<ReadQuery>) -> Result<Response> {
    // Every object, token hashes included: the management privilege.
    caller.authorize(Verb::Admin, [Target::Cluster])?;
    let backup = node.backup(consistency(q.consistency.as_deref())?).await?;
    let disposition = format!("attachment; filename=\"lodestar-{}.snapshot\"", backup.revision);
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream")),
        (header::CONTENT_DISPOSITION, HeaderValue::from_str(&disposition).map_err(|e| Error::internal(e.to_string()))?),
        (header::HeaderName::from_static(OBJECTS_HEADER), HeaderValue::from(backup.objects)),
    ];
    Ok((revision_headers(backup.revision), headers, backup.bytes).into_response())
}

/// This replica alone: id, raft state, term, leader, applied index, revision.
async fn node_status(State(replica): State<Arc<Replica>>, caller: Caller) -> Result<Json<NodeStatusView>> {
    caller.authorize(Verb::Read, [Target::Cluster])?;
    Ok(Json((&replica.local_status()).into()))
}

async fn cluster_status(State(replica): State<Arc<Replica>>, caller: Caller) -> Result<Json<ClusterStatusView>> {
    caller.authorize(Verb::Read, [Target::Cluster])?;
    Ok(Json((&replica.cluster_status().await).into()))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AddMember {
    id: u64,
    raft_addr: String,
    api_addr: String,
    xds_addr: String,
}

async fn add_member(State(replica): State<Arc<Replica>>, caller: Caller, body: Body) -> Result<Json<ClusterStatusView>> {
    caller.precheck(Precheck::Cluster(Verb::Admin))?;
    let bytes = read_body(&replica, body).await?;
    let m: AddMember = serde_json::from_slice(&bytes).map_err(|e| Error::field("body", e.to_string()))?;
    let result = replica.node.add_node(m.id, NodeInfo { raft_addr: m.raft_addr, api_addr: m.api_addr, xds_addr: m.xds_addr }).await;
    caller.audit_result(Verb::Admin, vec![format!("members/{}", m.id)], result.as_ref().map(|_| None));
    result?;
    Ok(Json((&replica.cluster_status().await).into()))
}

async fn remove_member(State(replica): State<Arc<Replica>>, caller: Caller, Path(id): Path<u64>) -> Result<Json<ClusterStatusView>> {
    caller.authorize(Verb::Admin, [Target::Cluster])?;
    let result = replica.node.remove_node(id).await;
    caller.audit_result(Verb::Admin, vec![format!("members/{id}")], result.as_ref().map(|_| None));
    result?;
    Ok(Json((&replica.cluster_status().await).into()))
}

async fn readyz(State(replica): State<Arc<Replica>>) -> Response {
    match replica.readiness() {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")).into_response(),
    }
}

/// Every connected proxy on this replica and how far it is in sync.
async fn syncz(State(sync): State<SyncRegistry>, caller: Caller) -> Result<Json<SyncStatus>> {
    caller.authorize(Verb::Read, [Target::Cluster])?;
    Ok(Json(sync.snapshot()))
}

async fn metrics(caller: Caller) -> Result<Response> {
    caller.authorize(Verb::Read, [Target::Cluster])?;
    Ok(([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], crate::metrics::metrics().render()).into_response())
}

/// Create a token (`admin` on the cluster); the answer holds its secret,
/// shown this once.
async fn create_token(State(replica): State<Arc<Replica>>, caller: Caller, body: Body) -> Result<Response> {
    caller.precheck(Precheck::Cluster(Verb::Admin))?;
    let bytes = read_body(&replica, body).await?;
    let req: super::TokenRequest = serde_json::from_slice(&bytes).map_err(|e| Error::field("body", e.to_string()))?;
    Ok(Json(super::create_token(&caller, &replica, req).await?).into_response())
}

/// Who the request's credential stands for (any valid credential may ask).
async fn token_self(caller: Caller) -> Json<Value> {
    Json(caller.describe())
}

/// The first management token, once; needs no credentials.
async fn acl_bootstrap(State(replica): State<Arc<Replica>>) -> Result<Response> {
    Ok(Json(super::acl_bootstrap(&replica, "POST /v1/acl/bootstrap").await?).into_response())
}

/// Renew an Instance's TTL or a Lease (keepalive).
async fn heartbeat(State(replica): State<Arc<Replica>>, caller: Caller, Path((kind, namespace, name)): Path<(String, String, String)>) -> Result<Response> {
    let key = super::heartbeat_key(&kind, &namespace, &name)?;
    caller.authorize(Verb::Write, [Target::key(&key)])?;
    let ttl = replica.heartbeat(key).await?;
    Ok(Json(json!({"ttlSeconds": ttl.as_secs_f64()})).into_response())
}

#[derive(Deserialize, Default)]
struct NamespaceQuery {
    namespace: Option<String>,
    consistency: Option<String>,
}

async fn registry_services(State(replica): State<Arc<Replica>>, caller: Caller, Query(q): Query<NamespaceQuery>) -> Result<Response> {
    let node = &replica.node;
    let ns = q.namespace.as_deref();
    caller.authorize(Verb::Read, [Target::kind(crate::model::Kind::Service, ns), Target::kind(crate::model::Kind::Instance, ns)])?;
    let applied = node.read(consistency(q.consistency.as_deref())?).await?;
    Ok(Json(json!({"revision": applied.revision(), "services": super::registry_services(&applied, &replica.config, q.namespace.as_deref())})).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TopologyQuery {
    namespace: Option<String>,
    consistency: Option<String>,
    /// At most this many edges (default and most: 10,000).
    limit: Option<usize>,
}

/// The most edges `/v1/topology` answers with.
const TOPOLOGY_LIMIT: usize = 10_000;

/// `lodestar topology`: who may call whom, from config and registry
/// (`analyze::topology`), as far as the caller may read it.
async fn topology(State(replica): State<Arc<Replica>>, caller: Caller, Query(q): Query<TopologyQuery>) -> Result<Response> {
    caller.precheck(Precheck::Any(Verb::Read))?;
    let limit = match q.limit {
        Some(0) => return Err(Error::field("limit", "must be at least 1").into()),
        Some(n) => n.min(TOPOLOGY_LIMIT),
        None => TOPOLOGY_LIMIT,
    };
    let applied = replica.node.read(consistency(q.consistency.as_deref())?).await?;
    let mesh = crate::translate::mesh::Mesh::build(&applied, Arc::new(replica.config.mesh_config()));
    let answer = crate::analyze::topology::topology(&mesh, |k| caller.may_read(k), q.namespace.as_deref().filter(|n| !n.is_empty()), limit);
    Ok((revision_headers(answer.revision), Json(answer)).into_response())
}

/// `lodestar analyze`: the findings on the live store, those the caller
/// may read (`api::analyze`).
async fn analyze_live(State(replica): State<Arc<Replica>>, caller: Caller, Query(q): Query<NamespaceQuery>) -> Result<Response> {
    caller.precheck(Precheck::Any(Verb::Read))?;
    let applied = replica.node.read(consistency(q.consistency.as_deref())?).await?;
    let answer = super::analyze::analyze(&caller, &applied, &replica.config, q.namespace.as_deref(), None);
    Ok((revision_headers(answer.revision), Json(answer)).into_response())
}

/// `lodestar analyze FILE --live`: the body's resources (as `/v1/apply`
/// takes them) laid over the live store, nothing written.
async fn analyze_with(
    State(replica): State<Arc<Replica>>,
    caller: Caller,
    Query(q): Query<NamespaceQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    caller.precheck(Precheck::Any(Verb::Read))?;
    let bytes = read_body(&replica, body).await?;
    let (docs, _) = documents(is_yaml(&headers), &bytes)?;
    let applied = replica.node.read(consistency(q.consistency.as_deref())?).await?;
    let answer = super::analyze::analyze(&caller, &applied, &replica.config, q.namespace.as_deref(), Some(docs));
    Ok((revision_headers(answer.revision), Json(answer)).into_response())
}

async fn debug_checks(State(replica): State<Arc<Replica>>, caller: Caller) -> Result<Response> {
    caller.authorize(Verb::Read, [Target::Cluster])?;
    Ok(Json(replica.checks.view(replica.node.id)).into_response())
}

/// Request metrics (`lodestar_api_requests_total`, `..._duration_seconds`)
/// for REST and gRPC: labelled by route pattern (or gRPC method), never by
/// raw path, so the series stay bounded.
pub async fn track(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    // Labels come from bounded sets only, whatever the client sends: this
    // runs before authentication, and every new label value is a series
    // kept for the life of the process.
    let route = route_label(req.extensions().get::<axum::extract::MatchedPath>().map(|p| p.as_str()), req.uri().path()).to_string();
    let method = method_label(req.method());
    let started = std::time::Instant::now();
    let resp = next.run(req).await;
    let m = crate::metrics::metrics();
    m.api_duration.with(&[method, &route]).observe(started.elapsed());
    m.api_requests.with(&[method, &route, resp.status().as_str()]).inc();
    resp
}

/// How long the answer waits for an unread HTTP/2 request body, and how
/// long the rest of it is read after the answer (see [`drain_unread_body`]).
const DRAIN_BEFORE_ANSWER: std::time::Duration = std::time::Duration::from_secs(2);
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(10);

/// An HTTP/2 request whose body the handler leaves unread (a 401 or 403
/// answered before the body, a body over the limit): the rest of its body
/// is read and dropped BEFORE the answer goes out (up to `max_body_bytes`,
/// for at most 2 s; a body still coming then is read for 10 s more after
/// the answer), so the stream ends cleanly and a client still sending (curl
/// `-d @file`) sees the status.
///
/// Both other orders fail some clients. Dropped unread, hyper resets the
/// stream (RST_STREAM, as RFC 9113 8.1 allows) and curl reports `(92)
/// HTTP/2 stream 1 was not closed cleanly` instead of the 401. Read after
/// the answer, curl (7.88) stops its upload when the answer is complete and
/// ends the stream short of its content-length; h2 then resets the stream
/// with PROTOCOL_ERROR (a malformed request, RFC 9113 8.1.1), and when that
/// reset reaches curl before curl has closed the stream, curl fails the
/// same way (measured: 1 in about 1,000 requests under load).
///
/// The body is discarded as it is read (nothing is kept), as it would have
/// been after the answer. A request with `expect: 100-continue` is answered
/// at once: its client sends no body before an answer. HTTP/1.1 closes the
/// connection instead, which clients read fine; gRPC reads its own.
pub async fn drain_unread_body(State(max_bytes): State<usize>, req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let grpc = req.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    let expects_continue = req.headers().get(header::EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if req.version() != axum::http::Version::HTTP_2 || grpc || expects_continue || http_body::Body::is_end_stream(req.body()) {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let left = Arc::new(std::sync::Mutex::new(Unread::Waiting));
    let req = axum::extract::Request::from_parts(parts, Body::new(Drained { body: Some(body), max_bytes, left: left.clone() }));
    let response = next.run(req).await;
    let unread = std::mem::replace(&mut *left.lock().unwrap_or_else(|e| e.into_inner()), Unread::Answered);
    if let Unread::Body(body) = unread {
        drain(body, max_bytes).await;
    }
    response
}

/// What became of a [`Drained`] body, for [`drain_unread_body`].
enum Unread {
    /// The handler is still running.
    Waiting,
    /// Dropped before its end while the handler ran: read before the answer.
    Body(Body),
    /// The answer is on its way: a body dropped now is read in a task.
    Answered,
}

/// A request body that, dropped before its end, is handed back to
/// [`drain_unread_body`] to be read to its end (bounded) before the answer.
struct Drained {
    body: Option<Body>,
    max_bytes: usize,
    left: Arc<std::sync::Mutex<Unread>>,
}

impl http_body::Body for Drained {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<std::result::Result<http_body::Frame<Bytes>, axum::Error>>> {
        match self.get_mut().body.as_mut() {
            Some(b) => std::pin::Pin::new(b).poll_frame(cx),
            None => std::task::Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(http_body::Body::is_end_stream)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.as_ref().map(http_body::Body::size_hint).unwrap_or_default()
    }
}

impl Drop for Drained {
    fn drop(&mut self) {
        let Some(body) = self.body.take().filter(|b| !http_body::Body::is_end_stream(b)) else { return };
        let mut left = self.left.lock().unwrap_or_else(|e| e.into_inner());
        if let Unread::Waiting = *left {
            *left = Unread::Body(body);
            return;
        }
        drop(left);
        // Kept by the handler past its answer (no handler does today).
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        runtime.spawn(drain(body, self.max_bytes));
    }
}

/// Reads `body` to its end and drops what it reads, at most `max_bytes`:
/// for [`DRAIN_BEFORE_ANSWER`], then (if it has not ended) in a task of its
/// own for [`DRAIN_TIME`].
async fn drain(body: Body, max_bytes: usize) {
    let mut data = body.into_data_stream();
    let mut left = max_bytes;
    if tokio::time::timeout(DRAIN_BEFORE_ANSWER, discard(&mut data, &mut left)).await.is_err() {
        tokio::spawn(async move {
            let _ = tokio::time::timeout(DRAIN_TIME, discard(&mut data, &mut left)).await;
        });
    }
}

/// Reads `data` until it ends, fails or would pass `left` bytes.
async fn discard(data: &mut axum::body::BodyDataStream, left: &mut usize) {
    while let Some(Ok(chunk)) = data.next().await {
        match left.checked_sub(chunk.len()) {
            Some(l) => *left = l,
            None => return,
        }
    }
}

/// A request's `route` label: the route template it matched (`/v1/resources/{kind}`);
/// for a gRPC call, its method (`/lodestar.api.v1.Lodestar/Apply`) if the API
/// has that method; anything else, `unmatched`.
fn route_label<'a>(matched: Option<&'a str>, path: &str) -> &'a str {
    const UNMATCHED: &str = "unmatched";
    match matched {
        // A gRPC service's route (tonic's `/{service}/{*rest}`): any method
        // name matches it.
        Some(m) if m.ends_with("/{*rest}") => crate::proto::GRPC_METHODS.iter().copied().find(|g| *g == path).unwrap_or(UNMATCHED),
        Some(m) => m,
        None => UNMATCHED,
    }
}

/// A request's `method` label: the HTTP method if it is a standard one
/// (HTTP allows any token as a method), else `other`.
fn method_label(method: &axum::http::Method) -> &'static str {
    const STANDARD: [&str; 9] = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE"];
    STANDARD.into_iter().find(|m| *m == method.as_str()).unwrap_or("other")
}

#[derive(Deserialize)]
struct WaitQuery {
    revision: u64,
    /// A duration (`30s`, `500ms`); default 30s.
    timeout: Option<String>,
    /// Stream the report (NDJSON, 200) each time it changes, the last
    /// line the outcome (`converged`, or NACKed, or the timeout passed).
    #[serde(default)]
    progress: bool,
}

/// How often a progress stream asks the replicas again.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_millis(200);
/// The longest a progress stream runs, whatever `timeout` asks.
const PROGRESS_MAX: std::time::Duration = std::time::Duration::from_secs(600);

/// Until every connected proxy (on every replica) has ACKed `revision` or
/// newer: 200 with the report; 409 if a proxy rejected it (the NACKs are
/// listed); 503 if the timeout passed first (the pending proxies listed).
async fn wait_for_proxies(State(replica): State<Arc<Replica>>, caller: Caller, Query(q): Query<WaitQuery>) -> Result<Response> {
    caller.authorize(Verb::Read, [Target::Cluster])?;
    let timeout = match q.timeout.as_deref() {
        None => std::time::Duration::from_secs(30),
        Some(t) => crate::model::istio::duration::parse_duration(t).map_err(|e| Error::field("timeout", e))?,
    };
    if q.progress {
        let timeout = timeout.min(PROGRESS_MAX);
        return Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(progress(replica, q.revision, timeout))).into_response());
    }
    let report = replica.wait_for_proxies(q.revision, timeout).await;
    let status = if report.converged {
        StatusCode::OK
    } else if !report.nacked.is_empty() {
        StatusCode::CONFLICT
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    Ok((status, Json(WaitReportView::from(report))).into_response())
}

/// `/v1/wait?progress=true`: the report as it changes (the console's
/// "N of M proxies ACKed" after a write), until it is final.
fn progress(
    replica: Arc<Replica>,
    revision: u64,
    timeout: std::time::Duration,
) -> impl futures::Stream<Item = std::result::Result<String, std::convert::Infallible>> {
    async_stream::stream! {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = None;
        loop {
            let report = WaitReportView::from(replica.wait_for_proxies(revision, std::time::Duration::ZERO).await);
            let done = report.converged || !report.nacked.is_empty() || tokio::time::Instant::now() >= deadline;
            let line = serde_json::to_string(&report).unwrap_or_default();
            if last.as_ref() != Some(&line) || done {
                yield Ok(format!("{line}\n"));
                last = Some(line);
            }
            if done {
                break;
            }
            tokio::time::sleep(PROGRESS_EVERY).await;
        }
    }
}

#[derive(Deserialize)]
struct ConfigDumpQuery {
    #[serde(rename = "proxyID")]
    proxy_id: String,
    /// cluster, endpoint, listener, route or extension_config (default: all).
    #[serde(rename = "type")]
    kind: Option<String>,
}

/// The largest `/debug/authz` request (one request's method, path,
/// headers and claims).
const AUTHZ_BODY_LIMIT: usize = 1024 * 1024;

#[derive(Deserialize)]
struct AuthzQuery {
    #[serde(rename = "proxyID")]
    proxy_id: String,
}

/// Why a request would be allowed or denied at a connected proxy: Envoy's
/// RBAC evaluation replayed over the config this replica serves it
/// (`translate::explain`). The body is the request (JSON).
async fn authz_check(State(sync): State<SyncRegistry>, caller: Caller, Query(q): Query<AuthzQuery>, body: Body) -> Result<Response> {
    caller.precheck(Precheck::Cluster(Verb::Read))?;
    let body = axum::body::to_bytes(body, AUTHZ_BODY_LIMIT)
        .await
        .map_err(|_| Error::field("body", format!("request body is larger than the limit of {AUTHZ_BODY_LIMIT} bytes")))?;
    let req: crate::translate::explain::Request = serde_json::from_slice(&body).map_err(|e| Error::field("body", e.to_string()))?;
    let config = sync.config_of(&q.proxy_id).ok_or_else(|| Error::not_found(format!("proxy {:?} is not connected to this replica", q.proxy_id)))?;
    let explanation = crate::translate::explain::explain(&config, &req).map_err(|e| Error::field("port", e))?;
    Ok(Json(explanation).into_response())
}

/// The config this replica serves a connected proxy, as proto-JSON.
async fn config_dump(State(sync): State<SyncRegistry>, caller: Caller, Query(q): Query<ConfigDumpQuery>) -> Result<Response> {
    caller.authorize(Verb::Read, [Target::Cluster])?;
    use crate::translate::resources::ResourceType;
    let config = sync.config_of(&q.proxy_id).ok_or_else(|| Error::not_found(format!("proxy {:?} is not connected to this replica", q.proxy_id)))?;
    let wanted = match q.kind.as_deref() {
        None | Some("") | Some("all") => None,
        Some(k) => Some(match k.trim_end_matches('s') {
            "cluster" => ResourceType::Cluster,
            "endpoint" => ResourceType::Endpoint,
            "listener" => ResourceType::Listener,
            "route" => ResourceType::Route,
            "extension_config" | "extensionconfig" => ResourceType::ExtensionConfig,
            other => return Err(Error::field("type", format!("{other:?}: expected cluster, endpoint, listener, route or extension_config")).into()),
        }),
    };
    let mut out = serde_json::Map::new();
    out.insert("proxy".into(), json!(q.proxy_id));
    out.insert("revision".into(), json!(config.revision));
    // Secrets (private keys) are never dumped; the config kept for this
    // endpoint holds none anyway (`xds::server::generate`).
    for t in ResourceType::PUSH_ORDER.into_iter().filter(|t| *t != ResourceType::Secret && wanted.is_none_or(|w| w == *t)) {
        let items: Vec<Value> = config
            .of(t)
            .into_iter()
            .flat_map(|m| m.values())
            .map(|r| json!({"name": r.name, "version": r.version, "resource": crate::translate::json::any_to_json(&r.any).unwrap_or_else(|e| json!({"error": e}))}))
            .collect();
        let key = match t {
            ResourceType::Cluster => "clusters",
            ResourceType::Endpoint => "endpoints",
            ResourceType::Listener => "listeners",
            ResourceType::Route => "routes",
            ResourceType::Secret => continue,
            ResourceType::NameTable => "nameTable",
            ResourceType::ExtensionConfig => "extensionConfigs",
        };
        out.insert(key.into(), Value::Array(items));
    }
    Ok(Json(Value::Object(out)).into_response())
}

/// The registry as translation sees it: every service with its ports and
/// instances (health, locality, weight), at the local revision.
async fn registryz(State(replica): State<Arc<Replica>>, caller: Caller) -> Result<Response> {
    let node = &replica.node;
    caller.authorize(Verb::Read, [Target::Cluster])?;
    let applied = node.reader().current();
    let mesh = crate::translate::mesh::Mesh::build(&applied, Arc::new(replica.config.mesh_config()));
    let services: Vec<Value> = mesh
        .all_services()
        .map(|s| {
            json!({
                "hostname": s.hostname, "namespace": s.namespace, "resolution": format!("{:?}", s.resolution), "meshExternal": s.mesh_external,
                "exportTo": s.export_to, "creationRevision": s.created,
                "ports": s.ports.iter().map(|p| json!({"name": p.name, "number": p.number, "protocol": format!("{:?}", p.protocol)})).collect::<Vec<_>>(),
                "instances": s.instances.iter().map(|i| json!({"address": i.address, "ports": i.ports, "port": i.default_port, "labels": i.labels,
                    "locality": i.locality, "weight": i.weight, "health": format!("{:?}", i.health), "source": i.source.as_ref().map(|k| k.to_string())})).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(Json(json!({"revision": applied.revision(), "services": services, "skipped": mesh.skipped.iter().map(|(k, why)| json!({"resource": k.to_string(), "reason": why})).collect::<Vec<_>>()})).into_response())
}

/// Every traffic rule at the local revision (kind, namespace, name, revisions).
async fn configz(State(node): State<Arc<Node>>, caller: Caller) -> Result<Response> {
    caller.authorize(Verb::Read, [Target::Cluster])?;
    let applied = node.reader().current();
    let items: Vec<Value> = applied
        .state
        .objects
        .values()
        .filter(|o| o.key.kind.is_istio())
        .map(|o| json!({"kind": o.key.kind.name(), "namespace": o.key.namespace, "name": o.key.name, "creationRevision": o.create_revision, "modRevision": o.mod_revision}))
        .collect();
    Ok(Json(json!({"revision": applied.revision(), "configs": items})).into_response())
}

/// The push engine: what was pushed, to how many, how the streams stand.
async fn push_status(State(replica): State<Arc<Replica>>, caller: Caller) -> Result<Response> {
    caller.authorize(Verb::Read, [Target::Cluster])?;
    let (m, node) = (crate::metrics::metrics(), &replica.node);
    let snapshot = replica.sync.snapshot();
    let mut by_revision: std::collections::BTreeMap<u64, usize> = std::collections::BTreeMap::new();
    for p in &snapshot.proxies {
        *by_revision.entry(p.revision.unwrap_or(0)).or_default() += 1;
    }
    let pushes: serde_json::Map<String, Value> = ["cds", "eds", "lds", "rds"].iter().map(|t| (t.to_string(), json!(m.xds_pushes.with(&[t]).get()))).collect();
    Ok(Json(json!({
        "appliedRevision": node.reader().current().revision(),
        "debounceMs": replica.config.push_debounce_ms,
        "pushTriggers": m.push_triggers.get(),
        "pushes": pushes,
        "connectedProxies": snapshot.proxies.len(),
        "proxiesByRevision": by_revision,
        "streamsShed": m.streams_shed.get(),
    }))
    .into_response())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct HistoryQuery {
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    limit: Option<usize>,
}

/// `lodestar history`: the revisions that touched the mesh or the objects
/// named, newest first (`api::history`).
async fn history_list(State(replica): State<Arc<Replica>>, caller: Caller, Query(q): Query<HistoryQuery>) -> Result<Response> {
    caller.precheck(Precheck::Any(Verb::Read))?;
    let (applied, events) = super::history::read(&replica.node).await?;
    let filter = super::history::Filter { kind: q.kind, namespace: q.namespace, name: q.name };
    let authors = super::history::authors(&replica.node, &applied).await?;
    let answer = super::history::history(&caller, &applied, &events, &authors, &filter, q.limit.unwrap_or(100).clamp(1, 10_000))?;
    Ok((revision_headers(answer.revision), Json(answer)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DiffQuery {
    from: u64,
    to: Option<u64>,
}

/// `lodestar diff REV1 [REV2]`: what changed between two revisions.
async fn diff_revisions(State(replica): State<Arc<Replica>>, caller: Caller, Query(q): Query<DiffQuery>) -> Result<Response> {
    caller.precheck(Precheck::Any(Verb::Read))?;
    let (applied, events) = super::history::read(&replica.node).await?;
    let answer = super::history::diff_revisions(&caller, &applied, &events, q.from, q.to)?;
    Ok((revision_headers(applied.revision()), Json(answer)).into_response())
}

/// `lodestar rollback REV`: one write restoring the objects to their state
/// at REV, previewed with `?dryRun=true` like an apply.
async fn rollback(State(replica): State<Arc<Replica>>, caller: Caller, Query(q): Query<ApplyQuery>, body: Body) -> Result<Response> {
    caller.precheck(Precheck::Any(Verb::Write))?;
    if q.expected_revision.is_some() {
        return Err(Error::field("expectedRevision", "a rollback guards every object it restores by its current revision already").into());
    }
    let bytes = read_body(&replica, body).await?;
    let req: super::history::RollbackRequest = serde_json::from_slice(&bytes).map_err(|e| Error::field("body", e.to_string()))?;
    let (applied, events) = super::history::read(&replica.node).await?;
    let (txn, warnings) = super::history::rollback_txn(&applied, &events, &req)?;
    if txn.ops.is_empty() {
        let r = applied.revision();
        let answer = json!({"dryRun": q.dry_run, "baseRevision": r, "revision": r, "items": [], "changes": [], "warnings": warnings});
        return Ok((revision_headers(applied.revision()), Json(answer)).into_response());
    }
    Ok(outcome(super::apply_authorized(&caller, &replica, txn, warnings, q.dry_run, None).await?))
}

/// `lodestar nacks`: every NACK this replica's proxies send from now on,
/// as NDJSON lines, the moment it arrives (`xds::status::NackEvent`); a
/// listener too slow to keep up is told how many it missed. Who may read
/// the cluster (as `/debug/syncz`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecentNacksQuery {
    /// How far back (a duration, default and at most 1h).
    since: Option<String>,
}

/// The NACKs this replica's proxies sent lately (the last hour by default;
/// at most the last 256), connected still or not: the console asks every
/// member and shows them together.
async fn recent_nacks(State(replica): State<Arc<Replica>>, caller: Caller, Query(q): Query<RecentNacksQuery>) -> Result<Response> {
    caller.authorize(Verb::Read, [Target::Cluster])?;
    let hour = std::time::Duration::from_secs(3600);
    let since = match q.since.as_deref() {
        None => hour,
        Some(t) => crate::model::istio::duration::parse_duration(t).map_err(|e| Error::field("since", e))?.min(hour),
    };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let from = u64::try_from(now.saturating_sub(since).as_millis()).unwrap_or(0);
    Ok(Json(json!({"replica": replica.node.id, "sinceUnixMs": from, "nacks": replica.sync.recent_nacks(from)})).into_response())
}

async fn nacks(State(replica): State<Arc<Replica>>, caller: Caller) -> Result<Response> {
    caller.authorize(Verb::Read, [Target::Cluster])?;
    let mut rx = replica.sync.subscribe_nacks();
    // What `revert_on_nack` did about them (`api::revert`).
    let mut reverts = super::revert::events().subscribe();
    let id = replica.node.id;
    let stream = async_stream::stream! {
        use tokio::sync::broadcast::error::RecvError;
        // The first line says the watch is on (a client can then act).
        yield Ok::<_, std::convert::Infallible>(format!("{}\n", json!({"watching": true, "replica": id})));
        loop {
            let line = tokio::select! {
                e = rx.recv() => match e {
                    Ok(e) => json!({"replica": id, "nack": e}),
                    Err(RecvError::Lagged(n)) => {
                        json!({"error": {"code": "ResourceExhausted", "message": format!("{n} NACK events missed: this listener fell behind")}})
                    }
                    Err(RecvError::Closed) => break,
                },
                r = reverts.recv() => match r {
                    Ok(r) => json!({"replica": id, "revert": r}),
                    Err(RecvError::Lagged(n)) => {
                        json!({"error": {"code": "ResourceExhausted", "message": format!("{n} revert events missed: this listener fell behind")}})
                    }
                    Err(RecvError::Closed) => break,
                },
            };
            yield Ok(format!("{line}\n"));
        }
    };
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(stream)).into_response())
}
