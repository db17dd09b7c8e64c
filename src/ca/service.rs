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
//! **The deny list** (CertificateRevocation objects, `auth::index`): a
//! certificate it covers renews no more (UNAUTHENTICATED), and an identity
//! revoked with no `issuedBefore` gets no new certificate, by join token
//! either (PERMISSION_DENIED). Read linearizably, as join tokens are.
//!
//! **A use is idempotent per key.** The token's status records which keys
//! (a hash of the CSR's public key) its uses were granted to. A request for
//! a key already granted is answered again without consuming a use: an
//! agent whose answer was lost (it gave up waiting, the connection broke)
//! asks again with the same key and is not stranded by a single-use token.
//! This gives nothing new to anyone: a certificate for a public key is of
//! use only to the holder of its private key, who proved possession by
//! signing the CSR.
//!
//! **Admission.** At most `ca_max_in_flight` requests are worked on at once
//! per replica; the others wait in line (first come, first served) for at
//! most `ca_max_queue_wait_ms`, or half the caller's `grpc-timeout` if
//! that is shorter, then get RESOURCE_EXHAUSTED, before anything is read
//! or a token use consumed, and retry after a backoff. A queue that grew
//! past what the replica can answer within the caller's timeout would
//! make callers give up on requests the replica still completes.
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
use crate::auth::index::CertFacts;
use crate::error::{Code, Error, Result};
use crate::model::acl::{hex, AclSpec};
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
use tokio::sync::{oneshot, Semaphore};
use tonic::{Request, Response, Status};

/// How many times a batch of join-token uses is retried after losing a
/// race (to another replica's batch: on one replica, uses are combined).
const CAS_ATTEMPTS: usize = 10;

/// How many granted keys a token's status remembers (the most recent):
/// every key of a token with up to this many uses.
const GRANTS_KEPT: usize = 256;

// The metadata key is on the wire for both sides (the agent asks with it):
// it lives with the client.
pub use crate::client::IMPERSONATED_IDENTITY;

/// The service as the xDS port serves it, behind [`credential_shown`].
pub type CaServer = tonic::service::interceptor::InterceptedService<IstioCertificateServiceServer<CaService>, CredentialCheck>;

type CredentialCheck = fn(Request<()>) -> std::result::Result<Request<()>, Status>;

/// Before a request is decoded: a caller that shows no credential at all
/// (no `authorization` metadata, no client certificate) is refused, so an
/// anonymous caller never makes the replica decode a message or parse a
/// CSR. Counted as the service's other refusals are; not logged (a flood
/// of them would flood the log).
fn credential_shown(req: Request<()>) -> std::result::Result<Request<()>, Status> {
    let cert = req.extensions().get::<ConnInfo>().is_some_and(|c| c.cert.is_some());
    if cert || req.metadata().contains_key("authorization") {
        return Ok(req);
    }
    let m = crate::metrics::metrics();
    m.ca_csr.inc();
    m.ca_auth_failures.inc();
    m.ca_errors.with(&[reason(Code::Unauthenticated)]).inc();
    Err(Status::unauthenticated("a certificate needs a join token (authorization: Bearer) or the current mesh certificate as the client certificate"))
}

pub struct CaService {
    /// None: this replica has no mesh CA, and says so (UNAVAILABLE)
    /// rather than UNIMPLEMENTED.
    ca: Option<Arc<MeshCa>>,
    replica: Arc<Replica>,
    /// Join-token uses waiting to be written, by token.
    pending: Pending,
    /// Linearizable reads waiting for the next read-index.
    reads: Reads,
    /// Requests being worked on (`ca_max_in_flight` permits).
    admission: Arc<Semaphore>,
    /// The longest a request waits for a permit.
    queue_wait: Duration,
}

impl CaService {
    pub fn server(ca: Option<Arc<MeshCa>>, replica: Arc<Replica>) -> CaServer {
        if let Some(ca) = &ca {
            ca.publish_expiry();
        }
        let config = &replica.config;
        let admission = Arc::new(Semaphore::new(config.ca_max_in_flight.max(1)));
        let queue_wait = Duration::from_millis(config.ca_max_queue_wait_ms);
        let service = CaService { ca, replica, pending: Pending::default(), reads: Reads::default(), admission, queue_wait };
        IstioCertificateServiceServer::with_interceptor(service, credential_shown as CredentialCheck)
    }

    /// The caller's identity: its mesh certificate first (a renewing
    /// workload or host burns no join token), else its bearer token; and
    /// the certificate's facts when it was the credential (checked against
    /// the deny list, [`Self::check_deny_list`]).
    async fn authenticate(&self, ca: &MeshCa, conn: Option<&ConnInfo>, bearer: Option<&str>, key: KeyHash) -> Result<(MeshIdentity, Option<CertFacts>)> {
        let mut why = None;
        if let Some(cert) = conn.and_then(|c| c.cert.as_ref()) {
            match ca.verify(&cert.chain) {
                Ok(id) => match cert.chain.first().and_then(|c| super::cert_facts(c)) {
                    Some(facts) => return Ok((id, Some(facts))),
                    None => why = Some("the certificate does not parse".to_string()),
                },
                Err(e) => why = Some(e),
            }
        }
        match (bearer, conn) {
            (Some(secret), Some(conn)) => self.join(secret, conn, key).await.map(|id| (id, None)),
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
    async fn join(&self, secret: &str, conn: &ConnInfo, key: KeyHash) -> Result<MeshIdentity> {
        let hash = crate::auth::token::hash_secret(secret);
        let (tx, rx) = oneshot::channel();
        let waiter = Waiter { remote: conn.remote, key, tx };
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
        let key = key_hash(&csr);
        let (caller, cert) = self.authenticate(ca, conn, bearer, key).await?;
        let id = self.subject(caller, impersonated).await?;
        self.check_deny_list(ca, cert.as_ref(), &id).await?;
        let chain = ca.sign_parsed(&csr, &id, Some(Duration::from_secs(ttl)))?;
        tracing::debug!(identity = %id, remote = ?conn.map(|c| c.remote), "issued a mesh certificate");
        Ok(chain)
    }
}

impl CaService {
    /// The deny list, at a linearizable read (a revocation written through
    /// any replica is seen: a revoked certificate renewed on a replica
    /// behind would give a new one, signed after the revocation):
    /// UNAUTHENTICATED if the caller's certificate is revoked,
    /// PERMISSION_DENIED if every certificate of `id` is (no new one is
    /// signed, join token or not).
    async fn check_deny_list(&self, ca: &MeshCa, cert: Option<&CertFacts>, id: &MeshIdentity) -> Result<()> {
        let applied = linearizable(&self.replica, &self.reads).await?;
        let index = self.replica.acl.index_at(&applied);
        if let Some(why) = cert.and_then(|c| index.revoked(c)) {
            return Err(Error::unauthenticated(why));
        }
        if let Some(why) = index.banned(&id.spiffe(&ca.trust_domain)) {
            return Err(Error::permission_denied(why));
        }
        Ok(())
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
    /// The key it asks a certificate for.
    key: KeyHash,
    tx: oneshot::Sender<Result<MeshIdentity>>,
}

/// The first 16 bytes of the SHA-256 of a CSR's public key, as a token's
/// status records a granted use (hex).
type KeyHash = [u8; 16];

fn key_hash(csr: &rcgen::CertificateSigningRequestParams) -> KeyHash {
    use rcgen::PublicKeyData;
    let d = ring::digest::digest(&ring::digest::SHA256, csr.public_key.der_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&d.as_ref()[..16]);
    out
}

/// The waiting time a gRPC `grpc-timeout` header gives (`<digits><unit>`,
/// unit one of H M S m u n), if any.
fn grpc_timeout(metadata: &tonic::metadata::MetadataMap) -> Option<Duration> {
    let v = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
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
        let status = obj.body().pointer("/status");
        let used = status.and_then(|s| s.get("used")).and_then(serde_json::Value::as_u64).unwrap_or(0);
        let mut grants: Vec<String> = status
            .and_then(|s| s.get("grants"))
            .and_then(serde_json::Value::as_array)
            .map(|a| a.iter().filter_map(|g| g.as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        // Keys granted before (an answer that was lost): answered again,
        // no use consumed.
        let (again, fresh): (Vec<Waiter>, Vec<Waiter>) = batch.into_iter().partition(|w| grants.contains(&hex(&w.key[..])));
        answer(again, Ok(id.clone()));
        batch = fresh;
        if batch.is_empty() {
            return;
        }
        // One use per distinct key: the same key twice in a batch (a retry
        // while the first ask waits) shares it.
        let mut keys: Vec<KeyHash> = batch.iter().map(|w| w.key).collect();
        keys.sort_unstable();
        keys.dedup();
        let left = uses.saturating_sub(used) as usize;
        if left == 0 {
            return answer(batch, Err(Error::unauthenticated(format!("join token {accessor} is used up ({used} of {uses} uses)"))));
        }
        // First come, first served among the keys.
        let mut chosen: Vec<KeyHash> = Vec::new();
        for w in &batch {
            if chosen.len() < left && !chosen.contains(&w.key) {
                chosen.push(w.key);
            }
        }
        let granted = chosen.len();
        grants.extend(chosen.iter().map(|k| hex(&k[..])));
        if grants.len() > GRANTS_KEPT {
            grants.drain(..grants.len() - GRANTS_KEPT);
        }
        let op = Op::SetStatus {
            key: obj.key.clone(),
            status: serde_json::json!({ "used": used + granted as u64, "grants": grants }).to_string(),
            expected_revision: Some(obj.mod_revision),
        };
        match replica.node.write(Txn { ops: vec![op] }).await {
            Ok(_) => {
                tracing::info!(token = %accessor, identity = %id, granted, used = used + granted as u64, uses, "join token accepted");
                let (yes, no): (Vec<Waiter>, Vec<Waiter>) = batch.into_iter().partition(|w| chosen.contains(&w.key));
                answer(yes, Ok(id));
                return answer(no, Err(Error::unauthenticated(format!("join token {accessor} is used up ({uses} of {uses} uses)"))));
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
        Code::ResourceExhausted => "exhausted",
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
        // The API's parser: `Bearer` in any case; anything else is refused, not ignored.
        let bearer = match req.metadata().get("authorization").map(|v| v.to_str().ok().and_then(|v| crate::auth::parse_bearer(v).ok())) {
            None => Ok(None),
            Some(Some(secret)) => Ok(Some(secret)),
            Some(None) => Err(Error::unauthenticated("malformed authorization metadata: expected `Bearer <secret>`")),
        };
        let wait = grpc_timeout(req.metadata()).map_or(self.queue_wait, |t| (t / 2).min(self.queue_wait));
        let result = match bearer {
            Err(e) => Err(e),
            Ok(bearer) => match tokio::time::timeout(wait, self.admission.clone().acquire_owned()).await {
                Ok(Ok(_permit)) => self.create(conn.as_ref(), bearer.as_deref(), req.into_inner()).await,
                _ => Err(Error::resource_exhausted(format!(
                    "the mesh CA on this replica is busy ({} requests in progress; waited {} ms for a turn): nothing was done, no join token use was consumed; retry after a backoff",
                    self.replica.config.ca_max_in_flight,
                    wait.as_millis()
                ))),
            },
        };
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
                tracing::info!(remote = %conn.map_or_else(|| "unknown".to_string(), |c| c.remote.to_string()), error = %e.message, "certificate request refused");
                Err(Status::new(tonic::Code::from(e.code.grpc_code()), e.message))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeout_header() {
        let mut m = tonic::metadata::MetadataMap::new();
        assert_eq!(grpc_timeout(&m), None);
        for (v, want) in [
            ("10S", Some(Duration::from_secs(10))),
            ("9999m", Some(Duration::from_millis(9999))),
            ("2M", Some(Duration::from_secs(120))),
            ("5x", None),
            ("S", None),
            ("", None),
        ] {
            m.insert("grpc-timeout", v.parse().unwrap());
            assert_eq!(grpc_timeout(&m), want, "{v:?}");
        }
    }
}
