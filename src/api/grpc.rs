//! The gRPC client API (`proto/lodestar/api/v1/api.proto`) and the error →
//! gRPC status mapping. Same operations, semantics and authorization as
//! REST: each method first makes its [`Caller`] from the metadata
//! `authorization: Bearer <secret>` and the request's [`PeerIdentity`].

use super::{ApplyItem, Caller, DeleteItem};
use crate::auth::{PeerIdentity, Target, Verb};
use crate::error::Error;
use crate::node::Consistency;
use crate::proto::api::lodestar_server::{Lodestar, LodestarServer};
use crate::proto::api::*;
use crate::replica::ClusterStatus;
use crate::replica::Replica;
use crate::store::types::NodeInfo;
use crate::store::watch::{check_start, watch, WatchFilter};
use futures::{Stream, StreamExt};
use std::pin::Pin;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The gRPC status of an error (its code's number, `Code::grpc_code`).
pub fn status_of(e: Error) -> Status {
    Status::new(tonic::Code::from(e.code.grpc_code()), e.message)
}

pub struct GrpcApi {
    replica: Arc<Replica>,
}

impl GrpcApi {
    pub fn server(replica: Arc<Replica>) -> LodestarServer<GrpcApi> {
        let limit = replica.config.max_body_bytes;
        LodestarServer::new(GrpcApi { replica }).max_decoding_message_size(limit)
    }

    /// The service as routes of the API port, behind [`precheck`]: every
    /// method's caller is authenticated and held to the method's
    /// [`Precheck`] before tonic decodes the request message.
    pub fn router(replica: Arc<Replica>) -> axum::Router {
        let acl = replica.acl.clone();
        tonic::service::Routes::new(GrpcApi::server(replica)).into_axum_router().layer(axum::middleware::from_fn_with_state(acl, precheck))
    }

    /// The caller of `method`: the one [`precheck`] authenticated, or
    /// authenticated now (UNAUTHENTICATED otherwise).
    fn caller<T>(&self, req: &Request<T>, method: &str) -> Result<Caller, Status> {
        if let Some(caller) = req.extensions().get::<Caller>() {
            return Ok(caller.clone());
        }
        let op = format!("{SERVICE_PATH}{method}");
        let authorization = req.metadata().get("authorization").map(|v| v.as_bytes());
        Caller::of_request(&self.replica.acl, &op, authorization, peer(req.extensions())).map_err(status_of)
    }
}

/// The path prefix of the client API's methods.
const SERVICE_PATH: &str = "/lodestar.api.v1.Lodestar/";

/// The client-certificate identity of a request's connection.
fn peer(ext: &axum::http::Extensions) -> Option<PeerIdentity> {
    let conn = ext.get::<axum::extract::ConnectInfo<crate::tls::conn::ConnInfo>>().map(|c| &c.0).or_else(|| ext.get::<crate::tls::conn::ConnInfo>());
    super::peer_identity(conn, ext.get::<PeerIdentity>())
}

/// Before a request message is decoded: its caller authenticated and held
/// to the method's [`Precheck`] (gRPC status in a trailers-only answer
/// otherwise), then passed on to the handler in the request's extensions.
/// A credential that may do nothing of the kind (an Envoy's proxy token,
/// say) never makes the replica decode a message.
async fn precheck(
    axum::extract::State(acl): axum::extract::State<Arc<crate::auth::Acl>>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let Some((method, need)) = req.uri().path().strip_prefix(SERVICE_PATH).and_then(|m| Some((m.to_string(), super::grpc_precheck(m)?))) else {
        return next.run(req).await;
    };
    let op = format!("{SERVICE_PATH}{method}");
    let authorization = req.headers().get(axum::http::header::AUTHORIZATION).map(|v| v.as_bytes());
    let checked = Caller::of_request(&acl, &op, authorization, peer(req.extensions())).and_then(|c| c.precheck(need).map(|()| c));
    match checked {
        Ok(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        Err(e) => status_of(e).into_http(),
    }
}

fn consistency(c: i32) -> Consistency {
    if c == crate::proto::api::Consistency::Stale as i32 {
        Consistency::Stale
    } else {
        Consistency::Linearizable
    }
}

fn cluster_response(s: ClusterStatus) -> ClusterStatusResponse {
    ClusterStatusResponse {
        leader_id: s.leader.unwrap_or(0),
        term: s.term,
        members: s
            .members
            .iter()
            .map(|m| Member {
                id: m.id,
                api_addr: m.info.api_addr.clone(),
                raft_addr: m.info.raft_addr.clone(),
                xds_addr: m.info.xds_addr.clone(),
                role: m.role.clone(),
                min_version: m.versions.map_or(0, |v| v.min),
                max_version: m.versions.map_or(0, |v| v.max),
            })
            .collect(),
        cluster_version: s.version.version,
        nodes: s
            .members
            .into_iter()
            .map(|m| match m.status {
                Some(st) => {
                    NodeStatus { id: m.id, state: st.state, term: st.term, applied_index: st.applied_index, revision: st.revision, error: String::new() }
                }
                None => NodeStatus { id: m.id, state: "unreachable".into(), error: m.error.unwrap_or_default(), ..Default::default() },
            })
            .collect(),
    }
}

fn token_response(t: super::TokenCreated) -> CreateTokenResponse {
    CreateTokenResponse { accessor_id: t.accessor_id, secret: t.secret, expires_at: t.expires_at.unwrap_or_default(), revision: t.revision }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, Status>> + Send>>;
type SnapshotStream = Pin<Box<dyn Stream<Item = Result<SnapshotChunk, Status>> + Send>>;

/// Largest `SnapshotChunk`: well under every client's default 4 MiB limit.
const SNAPSHOT_CHUNK: usize = 1024 * 1024;

#[tonic::async_trait]
impl Lodestar for GrpcApi {
    async fn apply(&self, req: Request<ApplyRequest>) -> Result<Response<WriteResponse>, Status> {
        let caller = self.caller(&req, "Apply")?;
        let req = req.into_inner();
        let caller = caller.with_message(Some(req.message.as_str()), "message").map_err(status_of)?;
        let (dry_run, expected_revision) = (req.dry_run, req.expected_revision);
        let fields = match req.field_validation.as_str() {
            "" => Default::default(),
            v => {
                crate::model::FieldValidation::parse(v).ok_or_else(|| status_of(Error::field("field_validation", format!("{v:?}: expected Warn or Strict"))))?
            }
        };
        let items = req
            .items
            .into_iter()
            .enumerate()
            .map(|(i, it)| {
                let resource =
                    serde_json::from_str(&it.resource_json).map_err(|e| Error::field(format!("items[{i}].resource_json"), format!("malformed JSON: {e}")))?;
                Ok(ApplyItem { resource, expected_revision: it.expected_revision })
            })
            .collect::<Result<Vec<_>, Error>>()
            .map_err(status_of)?;
        let (txn, warnings) = super::apply_txn(items, fields).map_err(status_of)?;
        outcome(super::apply_authorized(&caller, &self.replica, txn, warnings, dry_run, expected_revision).await.map_err(status_of)?)
    }

    async fn delete(&self, req: Request<DeleteRequest>) -> Result<Response<WriteResponse>, Status> {
        let caller = self.caller(&req, "Delete")?;
        let items = req
            .into_inner()
            .items
            .into_iter()
            .map(|r| DeleteItem { kind: r.kind, namespace: Some(r.namespace), name: r.name, expected_revision: r.expected_revision })
            .collect();
        let txn = super::delete_txn(items, false).map_err(status_of)?;
        caller.authorize_txn(Verb::Delete, &txn).map_err(status_of)?;
        let ok = caller.write(&self.replica.node, Verb::Delete, txn).await.map_err(status_of)?;
        outcome(super::ApplyOutcome::Written(super::WriteResult::new(ok, Vec::new())))
    }

    async fn get(&self, req: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let caller = self.caller(&req, "Get")?;
        let r = req.into_inner();
        let key = super::key_of(&r.kind, Some(&r.namespace), &r.name).map_err(status_of)?;
        caller.authorize(Verb::Read, [Target::key(&key)]).map_err(status_of)?;
        let applied = self.replica.node.read(consistency(r.consistency)).await.map_err(status_of)?;
        let obj = super::get(&applied, &key).map_err(status_of)?;
        let view = obj.to_json();
        Ok(Response::new(GetResponse { revision: applied.revision(), resource_json: crate::model::json_text(&view) }))
    }

    async fn wait(&self, req: Request<WaitRequest>) -> Result<Response<WaitResponse>, Status> {
        self.caller(&req, "Wait")?.authorize(Verb::Read, [Target::Cluster]).map_err(status_of)?;
        let r = req.into_inner();
        let timeout = std::time::Duration::from_millis(if r.timeout_ms == 0 { 30_000 } else { r.timeout_ms });
        let w = self.replica.wait_for_proxies(r.revision, timeout).await;
        Ok(Response::new(WaitResponse {
            revision: w.revision,
            converged: w.converged,
            proxies: w.proxies as u64,
            synced: w.synced as u64,
            pending: w.pending,
            nacked: w.nacked,
            unreachable: w.unreachable,
        }))
    }

    async fn heartbeat(&self, req: Request<HeartbeatRequest>) -> Result<Response<HeartbeatResponse>, Status> {
        let caller = self.caller(&req, "Heartbeat")?;
        let r = req.into_inner();
        let key = super::heartbeat_key(&r.kind, &r.namespace, &r.name).map_err(status_of)?;
        caller.authorize(Verb::Write, [Target::key(&key)]).map_err(status_of)?;
        let ttl = self.replica.heartbeat(key).await.map_err(status_of)?;
        Ok(Response::new(HeartbeatResponse { ttl_seconds: ttl.as_secs_f64() }))
    }

    async fn list(&self, req: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        let caller = self.caller(&req, "List")?;
        let r = req.into_inner();
        let kind = super::parse_kind(&r.kind).map_err(status_of)?;
        caller.authorize(Verb::Read, [Target::kind(kind, Some(&r.namespace))]).map_err(status_of)?;
        let selector = super::parse_selector(Some(&r.label_selector)).map_err(status_of)?;
        let applied = self.replica.node.read(consistency(r.consistency)).await.map_err(status_of)?;
        let items = super::list(&applied, kind, Some(&r.namespace), &selector);
        let resources_json = items.iter().map(|o| serde_json::to_string(&o.json_view()).expect("a JSON value serializes")).collect();
        Ok(Response::new(ListResponse { revision: applied.revision(), resources_json }))
    }

    type WatchStream = WatchStream;

    async fn watch(&self, req: Request<WatchRequest>) -> Result<Response<WatchStream>, Status> {
        let caller = self.caller(&req, "Watch")?;
        let r = req.into_inner();
        let kind = if r.kind.is_empty() { None } else { Some(super::parse_kind(&r.kind).map_err(status_of)?) };
        let mut filter = WatchFilter { kind, namespace: Some(r.namespace).filter(|n| !n.is_empty()), skip_acl: false };
        caller.authorize_watch(&mut filter).map_err(status_of)?;
        // History already compacted: OUT_OF_RANGE as the call's status.
        check_start(self.replica.node.reader(), r.from_revision).map_err(status_of)?;
        let stream = watch(self.replica.node.reader().clone(), r.from_revision, filter).map(|item| {
            item.map(|e| WatchEvent {
                revision: e.revision,
                r#type: e.kind.as_str().into(),
                kind: e.object.key.kind.name().into(),
                namespace: e.object.key.namespace.to_string(),
                name: e.object.key.name.to_string(),
                resource_json: crate::model::json_text(&e.object.to_json()),
            })
            .map_err(status_of)
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn cluster_status(&self, req: Request<ClusterStatusRequest>) -> Result<Response<ClusterStatusResponse>, Status> {
        self.caller(&req, "ClusterStatus")?.authorize(Verb::Read, [Target::Cluster]).map_err(status_of)?;
        Ok(Response::new(cluster_response(self.replica.cluster_status().await)))
    }

    async fn add_node(&self, req: Request<AddNodeRequest>) -> Result<Response<ClusterStatusResponse>, Status> {
        let caller = self.caller(&req, "AddNode")?;
        caller.authorize(Verb::Admin, [Target::Cluster]).map_err(status_of)?;
        let r = req.into_inner();
        let result = self.replica.node.add_node(r.id, NodeInfo { raft_addr: r.raft_addr, api_addr: r.api_addr, xds_addr: r.xds_addr }).await;
        caller.audit_result(Verb::Admin, vec![format!("members/{}", r.id)], result.as_ref().map(|_| None));
        result.map_err(status_of)?;
        Ok(Response::new(cluster_response(self.replica.cluster_status().await)))
    }

    type SnapshotStream = SnapshotStream;

    async fn snapshot(&self, req: Request<SnapshotRequest>) -> Result<Response<SnapshotStream>, Status> {
        self.caller(&req, "Snapshot")?.authorize(Verb::Admin, [Target::Cluster]).map_err(status_of)?;
        let backup = self.replica.node.backup(consistency(req.into_inner().consistency)).await.map_err(status_of)?;
        let revision = backup.revision;
        let chunks: Vec<Result<SnapshotChunk, Status>> =
            backup.bytes.chunks(SNAPSHOT_CHUNK).map(|c| Ok(SnapshotChunk { revision, data: c.to_vec() })).collect();
        Ok(Response::new(Box::pin(futures::stream::iter(chunks))))
    }

    async fn remove_node(&self, req: Request<RemoveNodeRequest>) -> Result<Response<ClusterStatusResponse>, Status> {
        let caller = self.caller(&req, "RemoveNode")?;
        caller.authorize(Verb::Admin, [Target::Cluster]).map_err(status_of)?;
        let id = req.into_inner().id;
        let result = self.replica.node.remove_node(id).await;
        caller.audit_result(Verb::Admin, vec![format!("members/{id}")], result.as_ref().map(|_| None));
        result.map_err(status_of)?;
        Ok(Response::new(cluster_response(self.replica.cluster_status().await)))
    }

    async fn create_token(&self, req: Request<CreateTokenRequest>) -> Result<Response<CreateTokenResponse>, Status> {
        let caller = self.caller(&req, "CreateToken")?;
        let r = req.into_inner();
        let ttl = Some(r.ttl).filter(|t| !t.is_empty());
        let description = Some(r.description).filter(|d| !d.is_empty());
        let proxy = Some(r.proxy).filter(|p| !p.is_empty());
        let created = super::create_token(
            &caller,
            &self.replica,
            super::TokenRequest { description, policies: r.policies, roles: r.roles, ttl, proxy, gateway: r.gateway, ..Default::default() },
        )
        .await
        .map_err(status_of)?;
        Ok(Response::new(token_response(created)))
    }

    async fn acl_bootstrap(&self, _req: Request<AclBootstrapRequest>) -> Result<Response<CreateTokenResponse>, Status> {
        let created = super::acl_bootstrap(&self.replica, "/lodestar.api.v1.Lodestar/AclBootstrap").await.map_err(status_of)?;
        Ok(Response::new(token_response(created)))
    }

    async fn analyze(&self, req: Request<AnalyzeRequest>) -> Result<Response<AnalyzeResponse>, Status> {
        let caller = self.caller(&req, "Analyze")?;
        let r = req.into_inner();
        let overlay = (!r.resources_json.is_empty())
            .then(|| {
                r.resources_json
                    .iter()
                    .enumerate()
                    .map(|(i, j)| serde_json::from_str(j).map_err(|e| Error::field(format!("resources_json[{i}]"), format!("malformed JSON: {e}"))))
                    .collect::<Result<Vec<serde_json::Value>, Error>>()
            })
            .transpose()
            .map_err(status_of)?;
        let node = &self.replica.node;
        let applied = node.read(consistency(r.consistency)).await.map_err(status_of)?;
        let answer = super::analyze::analyze(&caller, &applied, &self.replica.config, Some(&r.namespace), overlay);
        Ok(Response::new(AnalyzeResponse {
            revision: answer.revision,
            messages: answer.messages.into_iter().map(analysis_message).collect(),
            notes: answer.notes,
        }))
    }
    async fn history(&self, req: Request<HistoryRequest>) -> Result<Response<JsonResponse>, Status> {
        let caller = self.caller(&req, "History")?;
        let r = req.into_inner();
        let (applied, events) = super::history::read(&self.replica.node).await.map_err(status_of)?;
        let filter = super::history::Filter { kind: Some(r.kind), namespace: Some(r.namespace), name: Some(r.name) };
        let limit = if r.limit == 0 { 100 } else { (r.limit as usize).min(10_000) };
        let authors = super::history::authors(&self.replica.node, &applied).await.map_err(status_of)?;
        let answer = super::history::history(&caller, &applied, &events, &authors, &filter, limit).map_err(status_of)?;
        json_response(answer.revision, &answer)
    }

    async fn diff(&self, req: Request<DiffRequest>) -> Result<Response<JsonResponse>, Status> {
        let caller = self.caller(&req, "Diff")?;
        let r = req.into_inner();
        let (applied, events) = super::history::read(&self.replica.node).await.map_err(status_of)?;
        let answer = super::history::diff_revisions(&caller, &applied, &events, r.from, (r.to != 0).then_some(r.to)).map_err(status_of)?;
        json_response(applied.revision(), &answer)
    }

    async fn rollback(&self, req: Request<RollbackRequest>) -> Result<Response<WriteResponse>, Status> {
        let caller = self.caller(&req, "Rollback")?;
        let r = req.into_inner();
        let resources =
            r.resources.into_iter().map(|x| super::history::Filter { kind: Some(x.kind), namespace: Some(x.namespace), name: Some(x.name) }).collect();
        let request = super::history::RollbackRequest { revision: r.revision, resources };
        let (applied, events) = super::history::read(&self.replica.node).await.map_err(status_of)?;
        let (txn, warnings) = super::history::rollback_txn(&applied, &events, &request).map_err(status_of)?;
        if txn.ops.is_empty() {
            return Ok(Response::new(WriteResponse { revision: applied.revision(), items: Vec::new(), warnings, preview_json: String::new() }));
        }
        outcome(super::apply_authorized(&caller, &self.replica, txn, warnings, r.dry_run, None).await.map_err(status_of)?)
    }
}

/// An apply's (or a rollback's) answer: the write, or its preview as JSON.
fn outcome(o: super::ApplyOutcome) -> Result<Response<WriteResponse>, Status> {
    Ok(Response::new(match o {
        super::ApplyOutcome::Written(w) => WriteResponse {
            revision: w.revision,
            items: w
                .items
                .into_iter()
                .map(|i| ItemResult { kind: i.kind, namespace: i.namespace, name: i.name, action: i.action, mod_revision: i.mod_revision })
                .collect(),
            warnings: w.warnings,
            preview_json: String::new(),
        },
        super::ApplyOutcome::Preview(p) => WriteResponse {
            revision: p.base_revision,
            items: Vec::new(),
            warnings: Vec::new(),
            preview_json: serde_json::to_string(&p).map_err(|e| status_of(Error::internal(e.to_string())))?,
        },
    }))
}

fn json_response(revision: u64, answer: &impl serde::Serialize) -> Result<Response<JsonResponse>, Status> {
    let json = serde_json::to_string(answer).map_err(|e| status_of(Error::internal(e.to_string())))?;
    Ok(Response::new(JsonResponse { revision, json }))
}

fn analysis_message(m: crate::analyze::Message) -> AnalysisMessage {
    let r = m.resource.clone().unwrap_or(crate::analyze::Resource { kind: String::new(), namespace: String::new(), name: String::new() });
    AnalysisMessage {
        documentation_url: crate::analyze::documentation_url(&m.code),
        code: m.code,
        level: m.level.as_str().into(),
        kind: r.kind,
        namespace: r.namespace,
        name: r.name,
        message: m.message,
        field: m.field.unwrap_or_default(),
        related: m.related.iter().map(|r| r.to_string()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::status_of;
    use crate::error::{Code, Error};

    /// Each error code's gRPC status, as the API has always answered
    /// (`Code::grpc_code` holds the numbers so `error` knows no tonic).
    #[test]
    fn status_codes() {
        let expected = [
            (Code::InvalidArgument, tonic::Code::InvalidArgument),
            (Code::NotFound, tonic::Code::NotFound),
            (Code::Conflict, tonic::Code::Aborted),
            (Code::Compacted, tonic::Code::OutOfRange),
            (Code::Unavailable, tonic::Code::Unavailable),
            (Code::Internal, tonic::Code::Internal),
            (Code::Unauthenticated, tonic::Code::Unauthenticated),
            (Code::PermissionDenied, tonic::Code::PermissionDenied),
            (Code::ResourceExhausted, tonic::Code::ResourceExhausted),
            (Code::FailedPrecondition, tonic::Code::FailedPrecondition),
        ];
        for (code, want) in expected {
            let status = status_of(Error::new(code, "why"));
            assert_eq!((status.code(), status.message()), (want, "why"), "{code:?}");
        }
    }
}
