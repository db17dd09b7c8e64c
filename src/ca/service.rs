//! Istio's `istio.v1.auth.IstioCertificateService/CreateCertificate` on the
//! xDS port: who the caller is decides the certificate's identity.
//!
//! A caller is authenticated, on the replica it reached, by
//! - its current mesh certificate (a workload's or a host's), shown as its
//!   TLS client certificate and verified against the mesh root (renewal:
//!   the identity it names), or
//! - a join token, `authorization: Bearer <secret>`: the identity the token
//!   is bound to (a workload, or a host), from an allowed source address,
//!   before it expires, while it has uses left. A use is consumed by a
//!   replicated write made before signing, conditional on the token's
//!   revision (compare-and-set): two replicas cannot both accept the last
//!   use; the loser re-reads and sees the token used up. Concurrent uses
//!   of one token on one replica are counted in one such write.
//!
//! Anything else is UNAUTHENTICATED. The CSR gives only its public key.
//!
//! Impersonation (Istio's `ImpersonatedIdentity` request metadata, which
//! ztunnel sends for the pods of its node): a caller authenticated as host
//! `H` may ask for the certificate of workload `spiffe://TD/ns/NS/sa/SA`
//! when a workload with that identity is registered on `H` (`hosts`), at a
//! linearizable read (a registration deleted through any replica is seen).
//! Otherwise PERMISSION_DENIED, saying why in terms of the caller's own
//! host only. A workload may never impersonate. Istio answers these
//! refusals with an opaque UNAUTHENTICATED and logs the reason; here the
//! caller is authenticated, so it is told what it lacks.

use super::{HostId, MeshCa, MeshIdentity, WorkloadId};
use crate::error::{Code, Error, Result};
use crate::model::acl::AclSpec;
use crate::model::TypedSpec;
use crate::node::Consistency;
use crate::proto::istio_ca::istio_certificate_service_server::{IstioCertificateService, IstioCertificateServiceServer};
use crate::proto::istio_ca::{IstioCertificateRequest, IstioCertificateResponse};
use crate::replica::Replica;
use crate::store::state_machine::Applied;
use crate::store::types::{Op, Txn};
use crate::tls::conn::ConnInfo;
use envoy_types::pb::google::protobuf as prost_struct;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

/// How many times a batch of join-token uses is retried after losing a
/// race (to another replica's batch: on one replica, uses are combined).
const CAS_ATTEMPTS: usize = 10;

/// The request metadata key of an impersonated identity (Istio's
/// `security.ImpersonatedIdentity`).
pub const IMPERSONATED_IDENTITY: &str = "ImpersonatedIdentity";

pub struct CaService {
    /// None: this replica has no mesh CA, and says so (UNAVAILABLE)
    /// rather than UNIMPLEMENTED.
    ca: Option<Arc<MeshCa>>,
    replica: Arc<Replica>,
    /// Join-token uses waiting to be written, by token.
    pending: Pending,
    /// Linearizable reads waiting for the next read-index.
    reads: Reads,
}

impl CaService {
    pub fn server(ca: Option<Arc<MeshCa>>, replica: Arc<Replica>) -> IstioCertificateServiceServer<CaService> {
        if let Some(ca) = &ca {
            let m = crate::metrics::metrics();
            m.ca_root_expiry.set(ca.root_expiry);
            m.ca_cert_chain_expiry.set(ca.ca_expiry);
        }
        IstioCertificateServiceServer::new(CaService { ca, replica, pending: Pending::default(), reads: Reads::default() })
    }

    /// The caller's identity: its mesh certificate first (a renewing
    /// workload or host burns no join token), else its bearer token.
    async fn authenticate(&self, ca: &MeshCa, conn: Option<&ConnInfo>, bearer: Option<&str>) -> Result<MeshIdentity> {
        let mut why = None;
        if let Some(cert) = conn.and_then(|c| c.cert.as_ref()) {
            match ca.verify(&cert.chain) {
                Ok(id) => return Ok(id),
                Err(e) => why = Some(e),
            }
        }
        match (bearer, conn) {
            (Some(secret), Some(conn)) => self.join(secret, conn).await,
            (Some(_), None) => Err(Error::internal("no connection information for this request")),
            (None, _) => Err(Error::unauthenticated(match why {
                Some(e) => format!("the client certificate is no mesh identity ({e}), and no join token (authorization: Bearer) was given"),
                None => "a certificate needs a join token (authorization: Bearer) or the current mesh certificate as the client certificate".into(),
            })),
        }
    }

    /// Accept a join token: consume a use (a replicated compare-and-set)
    /// and give its identity. Concurrent uses of one token on this replica
    /// share one read and one write ([`decide`]): every use of a token is
    /// a compare-and-set on the same object, so uses written one by one
    /// would lose to each other (one winner per round through raft) when
    /// many agents start at once with the same token.
    async fn join(&self, secret: &str, conn: &ConnInfo) -> Result<MeshIdentity> {
        let hash = crate::auth::token::hash_secret(secret);
        let (tx, rx) = oneshot::channel();
        let waiter = Waiter { remote: conn.remote, tx };
        let first = {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            match pending.entry(hash) {
                Entry::Occupied(mut e) => {
                    e.get_mut().push(waiter);
                    false
                }
                Entry::Vacant(e) => {
                    e.insert(vec![waiter]);
                    true
                }
            }
        };
        if first {
            // Its own task: a caller that goes away must not strand the
            // uses queued behind it.
            tokio::spawn(flush(self.replica.clone(), self.reads.clone(), self.pending.clone(), hash));
        }
        rx.await.unwrap_or_else(|_| Err(Error::unavailable("join token: the use was not decided; try again")))
    }

    /// The identity to sign for `caller`: its own, or the one it
    /// impersonates if it is a host that may.
    async fn subject(&self, caller: MeshIdentity, impersonated: Option<WorkloadId>) -> Result<MeshIdentity> {
        let Some(wanted) = impersonated else { return Ok(caller) };
        let host = match caller {
            MeshIdentity::Host(h) => h,
            MeshIdentity::Workload(w) => {
                return Err(Error::permission_denied(format!(
                    "{IMPERSONATED_IDENTITY}: only a host agent may ask for another identity; the caller is workload {w}"
                )))
            }
        };
        // Linearizable: a registration (or its deletion) through any
        // replica is seen.
        let applied = linearizable(&self.replica, &self.reads).await?;
        if !super::hosts::registered_on(&applied.state, &host, &wanted) {
            return Err(Error::permission_denied(format!(
                "{IMPERSONATED_IDENTITY}: no workload with identity {wanted} is registered on {host} (an Instance in namespace {} with spec.host {} and spec.serviceAccount {}, or a WorkloadEntry there labelled {}={} with that serviceAccount)",
                wanted.namespace, host.0, wanted.service_account, super::hosts::HOST_LABEL, host.0
            )));
        }
        tracing::debug!(%host, workload = %wanted, "host impersonates a workload registered on it");
        Ok(MeshIdentity::Workload(wanted))
    }

    async fn create(&self, conn: Option<&ConnInfo>, bearer: Option<&str>, req: IstioCertificateRequest) -> Result<Vec<String>> {
        let Some(ca) = &self.ca else {
            return Err(Error::new(
                Code::Unavailable,
                "this replica has no mesh CA: give every member the same mesh_ca_dir (`lodestar tls ca create --mesh --dir DIR`)",
            ));
        };
        // The request is checked first: a bad one costs no join token use.
        let csr = MeshCa::parse_csr(&req.csr)?;
        let ttl = u64::try_from(req.validity_duration).map_err(|_| Error::field("validity_duration", "must not be negative"))?;
        let impersonated = impersonated(req.metadata.as_ref(), &ca.trust_domain)?;
        let caller = self.authenticate(ca, conn, bearer).await?;
        let id = self.subject(caller, impersonated).await?;
        let chain = ca.sign_parsed(&csr, &id, Some(Duration::from_secs(ttl)))?;
        tracing::debug!(identity = %id, remote = ?conn.map(|c| c.remote), "issued a mesh certificate");
        Ok(chain)
    }
}

/// The workload named by the request's `ImpersonatedIdentity`, if any: a
/// string, the SPIFFE id of a workload of this trust domain.
fn impersonated(metadata: Option<&prost_struct::Struct>, trust_domain: &str) -> Result<Option<WorkloadId>> {
    let field = format!("metadata.{IMPERSONATED_IDENTITY}");
    let Some(value) = metadata.and_then(|m| m.fields.get(IMPERSONATED_IDENTITY)) else { return Ok(None) };
    let uri = match &value.kind {
        Some(prost_struct::value::Kind::StringValue(s)) => s.as_str(),
        _ => return Err(Error::field(field, "must be a string: a workload's SPIFFE id")),
    };
    if uri.is_empty() {
        return Ok(None);
    }
    WorkloadId::from_spiffe(uri, trust_domain).map(Some).ok_or_else(|| {
        Error::field(field, format!("{uri:?} is no workload identity of this mesh: expected spiffe://{trust_domain}/ns/NAMESPACE/sa/SERVICE_ACCOUNT"))
    })
}

/// Callers waiting for a linearizable read, and whether a round runs.
type Reads = Arc<Mutex<(Vec<oneshot::Sender<Result<Arc<Applied>>>>, bool)>>;

/// A linearizable read of this replica's state, shared with every caller
/// that asked while no read-index was in flight (etcd's batching of
/// linearizable reads): one read-index round to the quorum per batch, not
/// per certificate, which thousands of agents starting at once would turn
/// into thousands of heartbeat rounds. A caller that arrives while a round
/// is in flight waits for the next, which starts after it asked, so what
/// it reads is at least as new as anything committed before it asked.
async fn linearizable(replica: &Arc<Replica>, reads: &Reads) -> Result<Arc<Applied>> {
    let (tx, rx) = oneshot::channel();
    let start = {
        let mut r = reads.lock().unwrap_or_else(|p| p.into_inner());
        r.0.push(tx);
        !std::mem::replace(&mut r.1, true)
    };
    if start {
        let (replica, reads) = (replica.clone(), reads.clone());
        tokio::spawn(async move {
            loop {
                let batch = {
                    let mut r = reads.lock().unwrap_or_else(|p| p.into_inner());
                    if r.0.is_empty() {
                        r.1 = false;
                        return;
                    }
                    std::mem::take(&mut r.0)
                };
                let result = replica.node.read(Consistency::Linearizable).await;
                for tx in batch {
                    let _ = tx.send(result.clone());
                }
            }
        });
    }
    rx.await.unwrap_or_else(|_| Err(Error::unavailable("the read was not answered; try again")))
}

/// A join-token use waiting for its answer.
struct Waiter {
    remote: std::net::SocketAddr,
    tx: oneshot::Sender<Result<MeshIdentity>>,
}

/// Uses waiting on this replica, by the token's hash. An entry exists
/// while a [`flush`] task runs for that token.
type Pending = Arc<Mutex<HashMap<[u8; 32], Vec<Waiter>>>>;

/// Decide the uses queued for one token, batch after batch, until none is
/// left.
async fn flush(replica: Arc<Replica>, reads: Reads, pending: Pending, hash: [u8; 32]) {
    loop {
        let batch = {
            let mut p = pending.lock().unwrap_or_else(|p| p.into_inner());
            match p.get_mut(&hash) {
                Some(q) if !q.is_empty() => std::mem::take(q),
                _ => {
                    p.remove(&hash);
                    return;
                }
            }
        };
        decide(&replica, &reads, &hash, batch).await;
    }
}

/// One batch of uses of one token: one linearizable read, then (for a
/// token with a number of uses) one compare-and-set that counts every use
/// granted, re-read and retried when another replica wrote the token first.
/// Uses beyond what is left are told the token is used up.
async fn decide(replica: &Arc<Replica>, reads: &Reads, hash: &[u8; 32], mut batch: Vec<Waiter>) {
    fn answer(batch: Vec<Waiter>, result: Result<MeshIdentity>) {
        for w in batch {
            let _ = w.tx.send(result.clone());
        }
    }
    for _ in 0..CAS_ATTEMPTS {
        // Linearizable: a token created through another replica just now
        // is found, and a use counted anywhere is seen.
        let applied = match linearizable(replica, reads).await {
            Ok(a) => a,
            Err(e) => return answer(batch, Err(e)),
        };
        let index = replica.acl.index_at(&applied);
        let Some(obj) = index.join_token(hash).cloned() else { return answer(batch, Err(Error::unauthenticated("unknown join token"))) };
        let accessor = obj.key.name.to_string();
        let Ok(TypedSpec::Acl(AclSpec::Token(token))) = obj.typed().map(|t| t.as_ref()) else {
            return answer(batch, Err(Error::internal(format!("join token {accessor} does not validate"))));
        };
        let Some(binding) = &token.spec.join else { return answer(batch, Err(Error::unauthenticated("unknown join token"))) };
        if token.expires_at.is_some_and(|t| t <= crate::auth::acl::unix_now()) {
            return answer(batch, Err(Error::unauthenticated(format!("join token {accessor} expired"))));
        }
        let (allowed, refused): (Vec<Waiter>, Vec<Waiter>) = batch.into_iter().partition(|w| binding.allows(w.remote.ip()));
        for w in refused {
            let _ = w.tx.send(Err(Error::permission_denied(format!("join token {accessor} is not accepted from {}", w.remote.ip()))));
        }
        batch = allowed;
        if batch.is_empty() {
            return;
        }
        let id = match &binding.host {
            Some(h) => MeshIdentity::Host(HostId(h.clone())),
            None => MeshIdentity::Workload(WorkloadId { namespace: binding.namespace.clone(), service_account: binding.service_account.clone() }),
        };
        let Some(uses) = binding.uses else { return answer(batch, Ok(id)) };
        let used = obj.body().pointer("/status/used").and_then(serde_json::Value::as_u64).unwrap_or(0);
        let used_up = || Error::unauthenticated(format!("join token {accessor} is used up ({uses} of {uses} uses)"));
        let granted = uses.saturating_sub(used).min(batch.len() as u64) as usize;
        if granted == 0 {
            return answer(batch, Err(Error::unauthenticated(format!("join token {accessor} is used up ({used} of {uses} uses)"))));
        }
        let op = Op::SetStatus {
            key: obj.key.clone(),
            status: serde_json::json!({ "used": used + granted as u64 }).to_string(),
            expected_revision: Some(obj.mod_revision),
        };
        match replica.node.write(Txn { ops: vec![op] }).await {
            Ok(_) => {
                tracing::info!(token = %accessor, identity = %id, granted, used = used + granted as u64, uses, "join token accepted");
                let rest = batch.split_off(granted);
                answer(batch, Ok(id));
                return answer(rest, Err(used_up()));
            }
            // Another replica wrote the token first: look again.
            Err(e) if e.code == Code::Conflict => continue,
            Err(e) => return answer(batch, Err(e)),
        }
    }
    answer(batch, Err(Error::unavailable("join token: too many concurrent uses; try again")))
}

fn reason(code: Code) -> &'static str {
    match code {
        Code::Unauthenticated => "unauthenticated",
        Code::PermissionDenied => "denied",
        Code::InvalidArgument => "invalid",
        Code::Unavailable => "unavailable",
        _ => "internal",
    }
}

#[tonic::async_trait]
impl IstioCertificateService for CaService {
    async fn create_certificate(&self, req: Request<IstioCertificateRequest>) -> std::result::Result<Response<IstioCertificateResponse>, Status> {
        let started = Instant::now();
        let m = crate::metrics::metrics();
        m.ca_csr.inc();
        let conn = req.extensions().get::<ConnInfo>().cloned();
        let bearer = req.metadata().get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).map(|s| s.trim().to_string());
        let result = self.create(conn.as_ref(), bearer.as_deref(), req.into_inner()).await;
        m.ca_sign_duration.observe(started.elapsed());
        match result {
            Ok(cert_chain) => {
                m.ca_issued.inc();
                Ok(Response::new(IstioCertificateResponse { cert_chain }))
            }
            Err(e) => {
                if matches!(e.code, Code::Unauthenticated | Code::PermissionDenied) {
                    m.ca_auth_failures.inc();
                }
                m.ca_errors.with(&[reason(e.code)]).inc();
                tracing::info!(remote = ?conn.map(|c| c.remote), error = %e.message, "certificate request refused");
                Err(crate::api::grpc::status_of(e))
            }
        }
    }
}
