//! Client-facing APIs. `rest` (axum) and `grpc` (tonic) are thin: both turn
//! requests into the calls below and [`Node`](crate::node::Node) methods,
//! and map [`Error`] codes to statuses in one function each. `serve` is the
//! port's HTTP server (both share it).
//!
//! Both authorize through [`Caller`]: authenticated first (401 before the
//! body is even read), then held to a [`Precheck`] from the headers alone
//! (403 before the body is read: a caller who may write nothing never makes
//! a replica parse an apply), then authorized for every resource the
//! request touches, on the replica that received it, before anything is
//! proposed to raft. The apply path never sees a token.

pub mod analyze;
pub mod console;
pub mod dryrun;
pub mod grpc;
pub mod history;
pub mod meshconfig;
pub mod rest;
pub mod revert;
pub mod serve;
pub mod views;

use crate::auth::audit::AuditEvent;
use crate::auth::token::{self, Minted, NewToken};
use crate::auth::{Acl, AclIndex, Credentials, PeerIdentity, Permission, Principal, Target, Verb};
use crate::error::{Code, Error, FieldError, Result};
use crate::model::acl::{ProxyBinding, GLOBAL_MANAGEMENT};
use crate::model::kinds::CLUSTER_NAMESPACE;
use crate::model::{self, Kind, ResourceKey, Selector, StoredObject};
use crate::node::{Consistency, Node};
use crate::replica::Replica;
use crate::state::txn::MAX_MESSAGE_BYTES;
use crate::store::types::{Author, ItemResult, Op, Txn, TxnOk};
use crate::store::watch::WatchFilter;
use crate::store::Applied;
use crate::translate::mesh::hosts as mesh_hosts;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::sync::Arc;

/// The verified client-certificate identity of a request: the one the TLS
/// layer found on its connection (`ConnInfo`, in the request's extensions;
/// its first URI SAN, else DNS SAN), or a `PeerIdentity` put there directly.
pub fn peer_identity(conn: Option<&crate::tls::conn::ConnInfo>, explicit: Option<&PeerIdentity>) -> Option<PeerIdentity> {
    conn.and_then(|c| c.cert.as_ref()).map(|c| PeerIdentity(c.identity())).or_else(|| explicit.cloned())
}

/// Who is asking, once authenticated; checks each permission a request
/// needs and writes the audit log. With ACLs off every check passes and
/// nothing is audited.
#[derive(Clone)]
pub struct Caller {
    acl: Arc<Acl>,
    principal: Principal,
    /// The route or gRPC method, for the audit log.
    op: String,
    /// The change message the client gave (`X-Lodestar-Message`), recorded
    /// with the revision its write makes (`Op::Author`).
    message: Option<String>,
}

impl Caller {
    /// 401 (audited) unless the credentials stand for a principal now.
    pub fn authenticate(acl: &Arc<Acl>, creds: &Credentials, op: &str) -> Result<Caller> {
        match acl.authenticate(creds) {
            Ok(principal) => Ok(Caller { acl: acl.clone(), principal, op: op.to_string(), message: None }),
            Err(r) => {
                crate::metrics::metrics().acl_refusals.with(&["unauthenticated"]).inc();
                acl.audit(AuditEvent { reason: Some(r.reason.clone()), ..AuditEvent::new(r.who, op, "unauthenticated") });
                Err(Error::unauthenticated(r.reason))
            }
        }
    }

    /// The caller of a request from its `authorization` header (REST) or
    /// metadata (gRPC), raw, and its connection's client-certificate
    /// identity: 401 (audited) when they stand for nobody or the header is
    /// not `Bearer <secret>`. With ACLs off the header is not even read.
    pub fn of_request(acl: &Arc<Acl>, op: &str, authorization: Option<&[u8]>, peer: Option<PeerIdentity>) -> Result<Caller> {
        let mut creds = Credentials { bearer: None, peer };
        if let (Some(v), true) = (authorization, acl.enabled) {
            let secret = std::str::from_utf8(v).ok().and_then(|v| crate::auth::parse_bearer(v).ok());
            creds.bearer = Some(secret.ok_or_else(|| Caller::refuse(acl, op, "malformed authorization: expected `Bearer <secret>`"))?);
        }
        Caller::authenticate(acl, &creds, op)
    }

    /// The bound a request is held to before its body is read: 403
    /// (audited) when no policy of the caller could allow what it asks.
    pub fn precheck(&self, need: Precheck) -> Result<()> {
        match need {
            Precheck::Cluster(verb) => self.authorize(verb, [Target::Cluster]),
            Precheck::Any(verb) if !self.acl.enabled || self.principal.may_ever(verb) => Ok(()),
            Precheck::Any(verb) => {
                let reason = format!("lacks {verb} on any kind in any namespace (no policy grants it {verb} on anything)");
                crate::metrics::metrics().acl_refusals.with(&["denied"]).inc();
                let event = AuditEvent::new(self.principal.who.audit_name(), &self.op, "denied");
                self.acl.audit(AuditEvent { verb: Some(verb.as_str()), reason: Some(reason.clone()), ..event });
                Err(Error::permission_denied(format!("permission denied: {} {reason}; the request was refused before its body was read", self.principal.who)))
            }
        }
    }

    /// A request whose credentials could not even be read (a malformed
    /// `Authorization`): 401, audited.
    pub fn refuse(acl: &Arc<Acl>, op: &str, reason: &str) -> Error {
        crate::metrics::metrics().acl_refusals.with(&["unauthenticated"]).inc();
        acl.audit(AuditEvent { reason: Some(reason.into()), ..AuditEvent::new("anonymous".into(), op, "unauthenticated") });
        Error::unauthenticated(reason)
    }

    /// `GET /v1/acl/token/self`: who the caller is and whether it may
    /// read and administer the cluster (what the console shows and offers);
    /// never a secret.
    pub fn describe(&self) -> Value {
        let may = |verb| !self.acl.enabled || self.principal.allows(&Permission::new(verb, Target::Cluster));
        json!({"who": self.principal.who.to_string(), "clusterRead": may(Verb::Read), "management": may(Verb::Admin)})
    }

    /// Whether the caller may read `key` (true with ACLs off): what it
    /// may be shown of history, diffs and analysis, without a refusal.
    pub fn may_read(&self, key: &ResourceKey) -> bool {
        !self.acl.enabled || self.principal.allows(&Permission::new(Verb::Read, Target::key(key)))
    }

    /// `verb` on every target, or 403 naming what is missing (audited).
    pub fn authorize(&self, verb: Verb, targets: impl IntoIterator<Item = Target>) -> Result<()> {
        let needed: Vec<Permission> = targets.into_iter().map(|t| Permission::new(verb, t)).collect();
        self.check(Some(verb), needed, |missing| missing.iter().map(|p| p.to_string()).collect())
    }

    /// `watch` on every kind the filter lets through. A watch of every kind
    /// leaves the ACL objects out unless the caller may see them (`admin`
    /// on the cluster): `*` never covers them, and a reader's unfiltered
    /// watch is not refused for their sake.
    pub fn authorize_watch(&self, filter: &mut WatchFilter) -> Result<()> {
        if filter.kind.is_none() && self.acl.enabled && !self.principal.allows(&Permission::new(Verb::Admin, Target::Cluster)) {
            filter.skip_acl = true;
        }
        self.authorize(Verb::Watch, watch_targets(filter))
    }

    /// Everything a transaction touches: write for a put, delete for a
    /// delete (and for the instances a deleted Lease takes with it).
    pub fn authorize_txn(&self, verb: Verb, txn: &Txn) -> Result<()> {
        let mut needed = Vec::with_capacity(txn.ops.len());
        for op in &txn.ops {
            let Some(key) = op.key() else { continue };
            match op {
                Op::Delete { .. } => {
                    needed.push(Permission::new(Verb::Delete, Target::key(key)));
                    if key.kind == Kind::Lease {
                        needed.push(Permission::new(Verb::Delete, Target::kind(Kind::Instance, Some(&key.namespace))));
                    }
                }
                Op::Put { .. } | Op::SetStatus { .. } | Op::Status { .. } => needed.push(Permission::new(Verb::Write, Target::key(key))),
                Op::Author(_) => {}
            }
        }
        self.check(Some(verb), needed, |_| keys(txn))?;
        self.authorize_claims(txn)
    }

    /// The hostnames the transaction's registry Services, Instances and
    /// ServiceEntries claim (`mesh::hosts`): another namespace's is
    /// refused for everyone (400: it never takes effect), and one outside
    /// the object's namespace's own, on a registry object, needs a policy
    /// that grants it (403).
    fn authorize_claims(&self, txn: &Txn) -> Result<()> {
        let suffix = &self.acl.domain_suffix;
        let claims = hostname_claims(txn, suffix)?;
        owned_hostnames(&claims, suffix)?;
        if !self.acl.enabled {
            return Ok(());
        }
        let ungranted: Vec<&(usize, ResourceKey, mesh_hosts::Claim)> = claims
            .iter()
            .filter(|(_, key, c)| mesh_hosts::needs_grant(key.kind, &key.namespace, &c.hostname, suffix))
            .filter(|(_, key, c)| !self.principal.may_claim(key.kind, &key.namespace, &c.hostname))
            .collect();
        let Some((_, key, _)) = ungranted.first() else { return Ok(()) };
        let lacks = ungranted.iter().map(|(i, _, c)| format!("the hostname {} (resources[{i}].{})", c.hostname, c.field)).collect::<Vec<_>>().join(", ");
        let message = format!(
            "permission denied: {} may not claim {lacks}: a {} in {ns} uses NAME.{ns}.svc.{suffix}; any other hostname needs a policy rule that grants it \
             (`hostnames`, with write on {} in {ns})",
            self.principal.who,
            key.kind.name(),
            key.kind.plural(),
            ns = key.namespace,
        );
        let resources = ungranted.iter().map(|(_, k, _)| k.to_string()).collect();
        Err(self.deny(Some(Verb::Write), resources, format!("may not claim {lacks}"), message))
    }

    fn check(&self, verb: Option<Verb>, needed: Vec<Permission>, resources: impl FnOnce(&[Permission]) -> Vec<String>) -> Result<()> {
        if !self.acl.enabled {
            return Ok(());
        }
        let Err(missing) = self.principal.check(needed) else { return Ok(()) };
        let lacks = missing.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ");
        let message = format!("permission denied: {} lacks {lacks}", self.principal.who);
        Err(self.deny(verb, resources(&missing), format!("lacks {lacks}"), message))
    }

    /// A refusal (403): counted and audited.
    fn deny(&self, verb: Option<Verb>, resources: Vec<String>, reason: String, message: String) -> Error {
        crate::metrics::metrics().acl_refusals.with(&["denied"]).inc();
        let event = AuditEvent::new(self.principal.who.audit_name(), &self.op, "denied");
        self.acl.audit(AuditEvent { verb: verb.map(Verb::as_str), resources, reason: Some(reason), ..event });
        Error::permission_denied(message)
    }

    /// With the change message `message` (checked: at most
    /// [`MAX_MESSAGE_BYTES`], printable text), given in `field` (REST's
    /// `X-Lodestar-Message` header, gRPC's `message`).
    pub fn with_message(mut self, message: Option<&str>, field: &str) -> Result<Caller> {
        if let Some(m) = message {
            if m.len() > MAX_MESSAGE_BYTES || m.chars().any(char::is_control) {
                return Err(Error::field(field, format!("a change message is at most {MAX_MESSAGE_BYTES} bytes of printable ASCII text")));
            }
        }
        self.message = message.filter(|m| !m.is_empty()).map(str::to_string);
        Ok(self)
    }

    /// `txn` with its author (`Op::Author`: the caller's audit name, never
    /// a secret, and its change message) once the cluster runs a version
    /// that records authors; before, as it is. A change message is always
    /// added, so that the gate (`node::version`) refuses it until then.
    fn authored(&self, node: &Node, mut txn: Txn) -> Txn {
        let (_, since) = crate::node::version::feature_since(crate::node::version::Feature::Author);
        if self.message.is_some() || node.cluster_version().version >= since {
            txn.ops.push(Op::Author(Author { name: self.principal.who.audit_name(), message: self.message.clone() }));
        }
        txn
    }

    /// Propose an authorized transaction; audit its outcome.
    pub async fn write(&self, node: &Node, verb: Verb, txn: Txn) -> Result<TxnOk> {
        let resources = if self.acl.enabled { keys(&txn) } else { Vec::new() };
        let txn = self.authored(node, txn);
        let result = node.write(txn).await;
        self.audit_result(verb, resources, result.as_ref().map(|ok| Some(ok.revision)));
        result
    }

    /// Audit an allowed operation that is not a store write (membership).
    pub fn audit_result(&self, verb: Verb, resources: Vec<String>, result: Result<Option<u64>, &Error>) {
        if !self.acl.enabled {
            return;
        }
        self.acl
            .audit(outcome(AuditEvent { verb: Some(verb.as_str()), resources, ..AuditEvent::new(self.principal.who.audit_name(), &self.op, "ok") }, result));
    }
}

/// What a request must at least be allowed, checked from its headers
/// before its body is read or decoded ([`Caller::precheck`]); the handler
/// then checks every resource the body names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precheck {
    /// `verb` on some kind in some namespace.
    Any(Verb),
    /// `verb` on the cluster.
    Cluster(Verb),
}

/// The precheck of a gRPC method of the client API (`Lodestar/{method}`);
/// None for `AclBootstrap`, which needs no credential, and for names the
/// service does not have (tonic answers UNIMPLEMENTED without reading them).
pub fn grpc_precheck(method: &str) -> Option<Precheck> {
    Some(match method {
        "Apply" | "Heartbeat" => Precheck::Any(Verb::Write),
        "Delete" => Precheck::Any(Verb::Delete),
        "Get" | "List" | "Analyze" | "History" | "Diff" => Precheck::Any(Verb::Read),
        "Rollback" => Precheck::Any(Verb::Write),
        "Watch" => Precheck::Any(Verb::Watch),
        "ClusterStatus" | "Wait" => Precheck::Cluster(Verb::Read),
        "AddNode" | "RemoveNode" | "Snapshot" | "CreateToken" => Precheck::Cluster(Verb::Admin),
        _ => return None,
    })
}

/// The event with the outcome of an allowed operation: its revision, or
/// why it failed.
fn outcome(event: AuditEvent, result: Result<Option<u64>, &Error>) -> AuditEvent {
    match result {
        Ok(revision) => AuditEvent { revision, ..event },
        Err(e) => AuditEvent { outcome: "failed", reason: Some(format!("{}: {}", e.code.as_str(), e.message)), ..event },
    }
}

fn keys(txn: &Txn) -> Vec<String> {
    txn.ops.iter().filter_map(|o| o.key().map(|k| k.to_string())).collect()
}

/// What a watch with this filter touches: every kind it may deliver.
fn watch_targets(filter: &WatchFilter) -> Vec<Target> {
    let namespace = filter.namespace.as_deref().filter(|n| !n.is_empty());
    let kinds: Vec<Kind> = filter.kind.map_or_else(|| Kind::ALL.to_vec(), |k| vec![k]);
    kinds
        .into_iter()
        .filter(|k| !(filter.skip_acl && k.is_acl()))
        // Cluster-scoped objects are all in one namespace: another filter excludes them.
        .filter(|k| !(k.is_cluster_scoped() && namespace.is_some_and(|n| n != CLUSTER_NAMESPACE)))
        .map(|k| Target::kind(k, namespace))
        .collect()
}

/// `POST /v1/acl/tokens` / gRPC `CreateToken`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TokenRequest {
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub policies: Vec<String>,
    #[serde(default)]
    pub roles: Vec<String>,
    /// A duration (`1h`, `30m`); none: never expires.
    #[serde(default)]
    pub ttl: Option<String>,
    /// `NAMESPACE` or `NAMESPACE/NAME`: a proxy token for the xDS port.
    #[serde(default)]
    pub proxy: Option<String>,
    /// With `proxy`: a gateway's token, served its namespace's Secrets.
    #[serde(default)]
    pub gateway: bool,
    /// A workload join token (mesh CA) for `NAMESPACE/SERVICE_ACCOUNT`
    /// instead of an API token: no policies or roles.
    #[serde(default)]
    pub workload: Option<String>,
    /// A host agent's join token for host `NAME` instead (its first host
    /// certificate): no policies or roles.
    #[serde(default)]
    pub host: Option<String>,
    /// A join token's number of uses (default 1).
    #[serde(default)]
    pub uses: Option<u64>,
    /// Source addresses a join token is accepted from; empty: any.
    #[serde(default)]
    pub cidrs: Vec<String>,
}

/// A token just created. The secret appears here and nowhere else, ever.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenCreated {
    pub accessor_id: String,
    pub secret: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    pub revision: u64,
}

impl TokenCreated {
    fn new(m: Minted, revision: u64) -> TokenCreated {
        TokenCreated { accessor_id: m.accessor, secret: m.secret, expires_at: m.expires_at, revision }
    }
}

/// Check a token request against the ACL objects (its policies and roles
/// must exist) and build the transaction that stores the new token.
pub fn token_txn(req: TokenRequest, index: &AclIndex) -> Result<(Txn, Minted)> {
    let mut errors = Vec::new();
    let proxy = match req.proxy.as_deref().filter(|p| !p.is_empty()).map(ProxyBinding::parse) {
        None => None,
        Some(Ok(b)) => Some(ProxyBinding { gateway: req.gateway, ..b }),
        Some(Err(e)) => {
            errors.push(FieldError::new("proxy", e));
            None
        }
    };
    if req.gateway && req.proxy.as_deref().is_none_or(str::is_empty) {
        errors.push(FieldError::new("gateway", "only a proxy token (proxy NAMESPACE[/NAME]) is a gateway's"));
    }
    let join = join_binding(&req, &mut errors);
    if proxy.is_some() && join.is_some() {
        errors.push(FieldError::new("proxy", "a token is a proxy token or a join token (workload or host), not both"));
    }
    if join.is_none() && req.policies.is_empty() && req.roles.is_empty() && req.proxy.is_none() {
        errors.push(FieldError::new("policies", "a token needs at least one policy or role (or a proxy identity, a workload or a host)"));
    }
    for (i, p) in req.policies.iter().enumerate() {
        if !index.has_policy(p) {
            errors.push(FieldError::new(format!("policies[{i}]"), format!("policy {p:?} not found")));
        }
    }
    for (i, r) in req.roles.iter().enumerate() {
        if !index.has_role(r) {
            errors.push(FieldError::new(format!("roles[{i}]"), format!("role {r:?} not found")));
        }
    }
    if req.description.as_ref().is_some_and(|d| d.len() > 1024) {
        errors.push(FieldError::new("description", "at most 1024 bytes"));
    }
    let ttl_secs = match req.ttl.as_deref().filter(|t| !t.is_empty()) {
        None => None,
        Some(t) => match model::istio::duration::parse_duration(t) {
            Ok(d) if d.as_secs() >= 1 => Some(d.as_secs()),
            Ok(_) => {
                errors.push(FieldError::new("ttl", "must be at least 1s"));
                None
            }
            Err(e) => {
                errors.push(FieldError::new("ttl", e));
                None
            }
        },
    };
    if !errors.is_empty() {
        return Err(Error::invalid_fields(errors));
    }
    let minted =
        token::mint(NewToken { description: req.description, policies: req.policies, roles: req.roles, ttl_secs, proxy, join }, crate::auth::acl::unix_now());
    let op = create_op(minted.document.clone())?;
    Ok((Txn { ops: vec![op] }, minted))
}

/// A join token's binding from the request (`workload` or `host`, `uses`,
/// `cidrs`), its errors added to `errors`.
fn join_binding(req: &TokenRequest, errors: &mut Vec<FieldError>) -> Option<model::acl::JoinBinding> {
    let (workload, host) = (req.workload.as_deref().filter(|w| !w.is_empty()), req.host.as_deref().filter(|h| !h.is_empty()));
    if workload.is_none() && host.is_none() {
        if req.uses.is_some() || !req.cidrs.is_empty() {
            errors.push(FieldError::new("workload", "uses and cidrs belong to a join token: give its workload (NAMESPACE/SERVICE_ACCOUNT) or host"));
        }
        return None;
    }
    if workload.is_some() && host.is_some() {
        errors.push(FieldError::new("host", "a join token is for a workload or a host, not both"));
        return None;
    }
    if !req.policies.is_empty() || !req.roles.is_empty() {
        errors.push(FieldError::new("policies", "a join token (workload or host) grants no API permissions: give no policies or roles"));
    }
    if req.uses == Some(0) {
        errors.push(FieldError::new("uses", "must be at least 1"));
    }
    for (i, c) in req.cidrs.iter().enumerate() {
        if let Err(e) = c.parse::<ipnet::IpNet>() {
            errors.push(FieldError::new(format!("cidrs[{i}]"), format!("{c:?}: {e} (expected a CIDR such as 10.0.0.0/8)")));
        }
    }
    let (uses, cidrs) = (Some(req.uses.unwrap_or(1)), req.cidrs.clone());
    match (workload, host) {
        (Some(w), _) => {
            let id = crate::ca::WorkloadId::parse(w).map_err(|e| errors.push(FieldError::new("workload", e))).ok()?;
            Some(model::acl::JoinBinding { namespace: id.namespace, service_account: id.service_account, host: None, uses, cidrs })
        }
        (None, Some(h)) => {
            let id = crate::ca::HostId::parse(h).map_err(|e| errors.push(FieldError::new("host", e))).ok()?;
            Some(model::acl::JoinBinding { namespace: String::new(), service_account: String::new(), host: Some(id.0), uses, cidrs })
        }
        (None, None) => None,
    }
}

/// A create-only put of a document the server wrote, validated like any
/// other so that what is stored always passes its own checks.
fn create_op(doc: Value) -> Result<Op> {
    let res = model::parse_resource(doc, model::DEFAULT_NAMESPACE).map_err(|e| Error::internal(format!("a generated ACL object is invalid: {e:?}")))?;
    model::validate_spec(&res).map_err(|e| Error::internal(format!("a generated ACL object is invalid: {e:?}")))?;
    Ok(Op::Put { body: model::json_text(&res.body).into(), key: res.key, expected_revision: Some(0) })
}

/// `POST /v1/acl/tokens` and gRPC `CreateToken`: needs `admin` on the cluster.
/// Policies and roles are checked at a linearizable read, so one created
/// through any replica just before is found.
pub async fn create_token(caller: &Caller, replica: &Replica, req: TokenRequest) -> Result<TokenCreated> {
    caller.authorize(Verb::Admin, [Target::Cluster])?;
    let applied = replica.node.read(Consistency::Linearizable).await?;
    let (txn, minted) = token_txn(req, &replica.acl.index_at(&applied))?;
    let ok = caller.write(&replica.node, Verb::Write, txn).await?;
    Ok(TokenCreated::new(minted, ok.revision))
}

/// The file in a replica's data directory that allows one more ACL
/// bootstrap through that replica: it must hold the reset index the
/// refusal named (Consul's `acl-bootstrap-reset`).
pub const BOOTSTRAP_RESET_FILE: &str = "acl-bootstrap-reset";

/// The reset index of the ACL objects of a revision, or None when there are
/// none. Any policy, role, token or certificate revocation bars an
/// anonymous bootstrap: each took `admin` on the cluster to create, so
/// someone holds a management credential. The index is the newest of them:
/// a token's creation (a join token's uses rewrite the object), another's
/// last change. A
/// bootstrap rewrites `global-management`, which cannot be deleted
/// ([`delete_txn`]), so the index only moves forward and a reset file is
/// good for one bootstrap.
pub fn bootstrap_reset_index(applied: &Applied) -> Option<u64> {
    crate::auth::acl::acl_objects(applied).map(|o| if o.key.kind == Kind::Token { o.create_revision } else { o.mod_revision }).max()
}

/// `POST /v1/acl/bootstrap` and gRPC `AclBootstrap`: no credentials
/// needed. Creates the `global-management` policy and a token holding it,
/// once, on a cluster no one administers yet: refused (409, audited as
/// denied) when the replica that receives it has a management token
/// (`initial_management_token_file`, or a single node's generated
/// `management.token`), and when the store holds any ACL object, unless
/// `<data_dir>/acl-bootstrap-reset` on this replica holds the reset index
/// (the operator's deliberate reset: the file is consumed). Two racing
/// bootstraps: the policy's precondition lets one through.
pub async fn acl_bootstrap(replica: &Replica, op: &str) -> Result<TokenCreated> {
    let acl = &replica.acl;
    let event = AuditEvent { verb: Some(Verb::Admin.as_str()), ..AuditEvent::new("anonymous".into(), op, "ok") };
    let deny = |reason: String, message: String| {
        crate::metrics::metrics().acl_refusals.with(&["denied"]).inc();
        acl.audit(AuditEvent { outcome: "denied", reason: Some(reason), ..event.clone() });
        Err(Error::conflict(message))
    };
    if acl.has_management_token() {
        return deny(
            "this replica has a management token".into(),
            "ACL bootstrap is disabled: this replica has a management token (initial_management_token_file; a single node generates \
             <data_dir>/management.token): use it instead"
                .into(),
        );
    }
    let applied = replica.node.read(Consistency::Linearizable).await?;
    let policy_key = ResourceKey::new(Kind::Policy, CLUSTER_NAMESPACE, GLOBAL_MANAGEMENT);
    if let Some(index) = bootstrap_reset_index(&applied) {
        let reset = replica.config.data_dir.join(BOOTSTRAP_RESET_FILE);
        if let Err(why) = consume_reset_file(&reset, index).await {
            return deny(
                format!("bootstrapped already (reset index {index}): {why}"),
                format!(
                    "ACL bootstrap no longer allowed: ACLs are bootstrapped already, the store holds ACL objects (reset index: {index}). \
                     To bootstrap again, write {index} into the file {BOOTSTRAP_RESET_FILE} in the data directory of the replica you send it to"
                ),
            );
        }
        tracing::warn!(index, file = %reset.display(), "ACL bootstrap reset: the reset file held the reset index (consumed); bootstrapping again");
    }
    let expected = applied.state.get(&policy_key).map_or(0, |p| p.mod_revision);
    let policy = json!({
        "apiVersion": "acl.lodestar.io/v1", "kind": "Policy",
        "metadata": {"name": GLOBAL_MANAGEMENT, "namespace": CLUSTER_NAMESPACE},
        "spec": {"description": "Every verb on everything (created by acl bootstrap).", "rules": [{"verbs": ["admin"], "kinds": ["*"], "namespaces": ["*"]}]},
    });
    let minted = token::mint(
        NewToken { description: Some("Bootstrap management token".into()), policies: vec![GLOBAL_MANAGEMENT.into()], ..Default::default() },
        crate::auth::acl::unix_now(),
    );
    let Op::Put { body, key, .. } = create_op(policy)? else { return Err(Error::internal("a generated policy is no put")) };
    let txn = Txn { ops: vec![Op::Put { body, key, expected_revision: Some(expected) }, create_op(minted.document.clone())?] };
    let event = AuditEvent { resources: keys(&txn), ..event.clone() };
    let result = replica.node.write(txn).await;
    acl.audit(outcome(event, result.as_ref().map(|ok| Some(ok.revision))));
    match result {
        Ok(ok) => Ok(TokenCreated::new(minted, ok.revision)),
        Err(e) if e.code == Code::Conflict => Err(Error::conflict("ACL bootstrap no longer allowed: another bootstrap got there first")),
        Err(e) => Err(e),
    }
}

/// Take the reset file if it holds `index` (removing it: one file, one
/// bootstrap; two requests racing on this replica cannot both remove it);
/// else why not, for the audit log.
async fn consume_reset_file(path: &std::path::Path, index: u64) -> std::result::Result<(), String> {
    let text = match tokio::fs::read_to_string(path).await {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(format!("no {BOOTSTRAP_RESET_FILE} file")),
        Err(e) => return Err(format!("{BOOTSTRAP_RESET_FILE}: {e}")),
    };
    if text.trim().parse::<u64>() != Ok(index) {
        tracing::warn!(file = %path.display(), index, "ACL bootstrap refused: the reset file does not hold the reset index");
        return Err(format!("{BOOTSTRAP_RESET_FILE} does not hold the reset index"));
    }
    tokio::fs::remove_file(path).await.map_err(|e| format!("{BOOTSTRAP_RESET_FILE} could not be consumed: {e}"))
}

/// One resource to apply, with an optional optimistic-concurrency check.
#[derive(Debug, Clone)]
pub struct ApplyItem {
    pub resource: Value,
    pub expected_revision: Option<u64>,
}

/// Validate every resource (reporting every bad field of every resource,
/// each path prefixed `resources[i]`) and build one atomic transaction.
pub fn apply_txn(items: Vec<ApplyItem>, fields: model::FieldValidation) -> Result<(Txn, Vec<String>)> {
    if items.is_empty() {
        return Err(Error::field("resources", "no resources given"));
    }
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let mut ops = Vec::with_capacity(items.len());
    // Where each object's op is: an object given twice is applied as kubectl
    // applies a file, in order, so the last document wins.
    let mut seen: std::collections::BTreeMap<ResourceKey, (usize, usize)> = std::collections::BTreeMap::new();
    for (i, item) in items.into_iter().enumerate() {
        let path = format!("resources[{i}]");
        match model::parse_resource(item.resource, model::DEFAULT_NAMESPACE) {
            Err(errs) => errors.extend(errs.into_iter().map(|e| e.under(&path))),
            Ok(res) if res.key.kind == Kind::Token => errors.push(FieldError::new(
                format!("{path}.kind"),
                "tokens cannot be applied: create them with `lodestar token create` (POST /v1/acl/tokens), which generates the secret",
            )),
            Ok(mut res) => {
                for f in model::drop_unknown_fields(&mut res, fields) {
                    warnings.push(format!("{path} ({}): unknown field {f} dropped (fieldValidation=Strict refuses it)", res.key));
                }
                match model::validate_spec(&res) {
                    Err(errs) => errors.extend(errs.into_iter().map(|e| e.under(&path))),
                    Ok(w) => warnings.extend(w.into_iter().map(|w| format!("{path} ({}): {w}", res.key))),
                }
                let op = Op::Put { body: model::json_text(&res.body).into(), key: res.key.clone(), expected_revision: item.expected_revision };
                match seen.get(&res.key) {
                    Some(&(first, at)) => {
                        warnings
                            .push(format!("{path} ({}): replaces resources[{first}], the same object earlier in this request (the last one wins)", res.key));
                        ops[at] = op;
                    }
                    None => {
                        seen.insert(res.key, (i, ops.len()));
                        ops.push(op);
                    }
                }
            }
        }
    }
    if errors.is_empty() {
        Ok((Txn { ops }, warnings))
    } else {
        Err(Error::invalid_fields(errors))
    }
}

/// Every hostname claimed by the puts of `txn` (`mesh::hosts::claims`),
/// with the index of its op and its object's key.
pub fn hostname_claims(txn: &Txn, suffix: &str) -> Result<Vec<(usize, ResourceKey, mesh_hosts::Claim)>> {
    let mut out = Vec::new();
    for (i, op) in txn.ops.iter().enumerate() {
        let Op::Put { key, body, .. } = op else { continue };
        if !matches!(key.kind, Kind::Service | Kind::Instance | Kind::ServiceEntry) {
            continue;
        }
        let body: Value = serde_json::from_str(body).map_err(|e| Error::internal(format!("a validated body does not parse: {e}")))?;
        let typed = model::parse_typed(key.kind, body.get("spec").unwrap_or(&Value::Null))
            .map_err(|e| Error::internal(format!("a validated spec does not parse: {e:?}")))?;
        out.extend(mesh_hosts::claims(key.kind, &key.namespace, &key.name, &typed, suffix).into_iter().map(|c| (i, key.clone(), c)));
    }
    Ok(out)
}

/// 400 naming every claim of a hostname another namespace owns (or one
/// spanning every namespace's): what `Mesh::build` would leave out.
pub fn owned_hostnames(claims: &[(usize, ResourceKey, mesh_hosts::Claim)], suffix: &str) -> Result<()> {
    let invalid: Vec<FieldError> = claims
        .iter()
        .filter_map(|(i, key, c)| Some(FieldError::new(format!("resources[{i}].{}", c.field), mesh_hosts::refusal(&key.namespace, &c.hostname, suffix)?)))
        .collect();
    if invalid.is_empty() {
        Ok(())
    } else {
        Err(Error::invalid_fields(invalid))
    }
}

/// Apply-time warnings for a write that claims a hostname no namespace
/// owns that another object claims too: legal, and resolved per proxy (its
/// own namespace's, else the oldest), which the warning spells out. Checks
/// the ServiceEntries and registry Services stored at `applied` (an
/// Instance's claim of such a hostname is rare and granted); a write that
/// claims none (an Instance of its namespace's service) costs nothing.
pub fn claim_warnings(txn: &Txn, applied: &Applied, suffix: &str) -> Vec<String> {
    let Ok(mut claims) = hostname_claims(txn, suffix) else { return Vec::new() };
    claims.retain(|(_, _, c)| mesh_hosts::owner(&c.hostname, suffix) == mesh_hosts::Owner::Nobody);
    if claims.is_empty() {
        return Vec::new();
    }
    let written: std::collections::BTreeSet<&ResourceKey> = txn.ops.iter().filter_map(|o| o.key()).collect();
    let mut stored: std::collections::BTreeMap<String, Vec<(&ResourceKey, u64)>> = std::collections::BTreeMap::new();
    for kind in [Kind::Service, Kind::ServiceEntry] {
        let lo = ResourceKey::new(kind, "", "");
        for (key, obj) in applied.state.objects.range(lo..).take_while(|(k, _)| k.kind == kind).filter(|(k, _)| !written.contains(k)) {
            let Ok(typed) = obj.typed() else { continue };
            for c in mesh_hosts::claims(kind, &key.namespace, &key.name, typed, suffix)
                .into_iter()
                .filter(|c| claims.iter().any(|(_, _, w)| w.hostname == c.hostname))
            {
                stored.entry(c.hostname).or_default().push((key, obj.create_revision));
            }
        }
    }
    let mut out = Vec::new();
    for (i, key, c) in &claims {
        let Some(others) = stored.get(&c.hostname) else { continue };
        // The written object keeps its age if it exists; a new one is the newest.
        let age = applied.state.get(key).map_or(u64::MAX, |o| o.create_revision);
        let oldest = others.iter().copied().chain([(key, age)]).min_by_key(|(k, rev)| (*rev, (*k).clone())).map_or(key, |(k, _)| k);
        let list = others.iter().map(|(k, _)| k.to_string()).collect::<Vec<_>>().join(", ");
        out.push(format!(
            "resources[{i}] ({key}): {} {} is also claimed by {list}; each proxy uses its own namespace's (a registry Service's, else the oldest \
             ServiceEntry's), else the oldest ({oldest})",
            c.field, c.hostname
        ));
    }
    out
}

/// Apply-time warnings for AuthorizationPolicies that cannot do what they
/// seem to (`AuthorizationPolicy::lint`): no workload the store knows (at
/// `applied`, or written by `txn` itself) is selected, or a rule can never
/// match on the selected workloads' inbound ports.
pub fn policy_warnings(txn: &Txn, applied: &crate::store::Applied, root_ns: &str) -> Vec<String> {
    use crate::model::istio::authorization_policy::Workload;
    use crate::model::istio::common::Protocol;
    use crate::model::istio::Validated;
    use crate::model::TypedSpec;
    let puts: Vec<(ResourceKey, Value)> = txn
        .ops
        .iter()
        .filter_map(|op| match op {
            Op::Put { key, body, .. } => serde_json::from_str(body).ok().map(|v| (key.clone(), v)),
            _ => None,
        })
        .collect();
    if !puts.iter().any(|(k, _)| k.kind == Kind::AuthorizationPolicy) {
        return Vec::new();
    }
    let workload = |ns: &str, body: &Value, typed: &TypedSpec| -> Option<Workload> {
        let object_labels = || crate::model::resource::labels_of(body).into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Some(match typed {
            TypedSpec::Istio(Validated::Sidecar { spec, .. }) => Workload {
                namespace: ns.into(),
                labels: spec.workload_selector.as_ref().map(|s| s.labels.clone()).unwrap_or_default(),
                ports: spec.ingress.iter().map(|i| (i.port.number(), Protocol::parse(&i.port.protocol).is_some_and(|p| p.is_http()))).collect(),
            },
            TypedSpec::Istio(Validated::WorkloadEntry { spec, .. }) => Workload { namespace: ns.into(), labels: spec.labels.clone(), ports: Vec::new() },
            TypedSpec::Istio(Validated::Gateway { spec, .. }) => Workload { namespace: ns.into(), labels: spec.selector.clone(), ports: Vec::new() },
            TypedSpec::Instance(_) => Workload { namespace: ns.into(), labels: object_labels(), ports: Vec::new() },
            _ => return None,
        })
    };
    let mut workloads: Vec<Workload> = Vec::new();
    for (key, obj) in applied.state.objects.iter() {
        if matches!(key.kind, Kind::Sidecar | Kind::WorkloadEntry | Kind::Gateway | Kind::Instance) && !puts.iter().any(|(k, _)| k == key) {
            if let Ok(t) = obj.typed() {
                workloads.extend(workload(&key.namespace, obj.body(), t));
            }
        }
    }
    for (key, body) in &puts {
        if matches!(key.kind, Kind::Sidecar | Kind::WorkloadEntry | Kind::Gateway | Kind::Instance) {
            if let Ok(t) = crate::model::parse_typed(key.kind, body.get("spec").unwrap_or(&Value::Null)) {
                workloads.extend(workload(&key.namespace, body, &t));
            }
        }
    }
    let mut out = Vec::new();
    for (key, body) in puts.iter().filter(|(k, _)| k.kind == Kind::AuthorizationPolicy) {
        if let Ok(TypedSpec::Istio(Validated::AuthorizationPolicy { spec, .. })) = crate::model::parse_typed(key.kind, body.get("spec").unwrap_or(&Value::Null))
        {
            out.extend(spec.lint(&key.namespace, root_ns, &workloads).into_iter().map(|w| format!("{key}: {w}")));
        }
    }
    out
}

/// Apply-time warnings for a host that is both a registry service's (a
/// Service, or the service of an Instance) and a ServiceEntry's in the
/// same namespace: the registry's instances are served for it
/// (`Mesh::build` keeps one service per hostname and namespace, the
/// registry's first), and the ServiceEntry's endpoints are not. Claims
/// from different namespaces are resolved per proxy: [`claim_warnings`]
/// says so. Only for hosts the transaction puts:
/// the ServiceEntries and Services are few (a kind's range of the store);
/// Instances are read only when the transaction puts a ServiceEntry.
pub fn host_warnings(txn: &Txn, applied: &crate::store::Applied, suffix: &str) -> Vec<String> {
    use crate::model::istio::Validated;
    use crate::model::TypedSpec;
    use std::collections::BTreeSet;
    let touched: BTreeSet<&ResourceKey> = txn
        .ops
        .iter()
        .filter_map(|op| match op {
            Op::Put { key, .. } | Op::Delete { key, .. } => Some(key),
            _ => None,
        })
        .collect();
    let puts: Vec<(ResourceKey, TypedSpec)> = txn
        .ops
        .iter()
        .filter_map(|op| match op {
            Op::Put { key, body, .. } if matches!(key.kind, Kind::Service | Kind::Instance | Kind::ServiceEntry) => {
                let body: Value = serde_json::from_str(body).ok()?;
                Some((key.clone(), crate::model::parse_typed(key.kind, body.get("spec").unwrap_or(&Value::Null)).ok()?))
            }
            _ => None,
        })
        .collect();
    if puts.is_empty() {
        return Vec::new();
    }
    // Every host an object stands for, as the mesh names it.
    let hosts = |key: &ResourceKey, typed: &TypedSpec| -> Vec<String> {
        match typed {
            TypedSpec::Service(spec) => vec![spec.hostname.clone().unwrap_or_else(|| format!("{}.{}.svc.{suffix}", key.name, key.namespace))],
            TypedSpec::Instance(spec) => vec![crate::translate::mesh::instance_hostname(spec, &key.namespace, suffix)],
            TypedSpec::Istio(Validated::ServiceEntry { spec, .. }) => {
                spec.hosts.iter().map(|h| crate::model::istio::resolve_short_name(h, &key.namespace, suffix)).collect()
            }
            _ => Vec::new(),
        }
    };
    // The stored objects of `kind` the transaction leaves in place, and
    // those it puts.
    let of_kind = |kind: Kind| -> Vec<(ResourceKey, Vec<String>)> {
        let stored = applied.state.objects.range(ResourceKey::new(kind, "", "")..).take_while(|(k, _)| k.kind == kind).filter(|(k, _)| !touched.contains(k));
        let stored = stored.filter_map(|(k, o)| Some((k.clone(), hosts(k, o.typed().ok()?))));
        stored.chain(puts.iter().filter(|(k, _)| k.kind == kind).map(|(k, t)| (k.clone(), hosts(k, t)))).collect()
    };
    let mut out = BTreeSet::new();
    let registry_put = puts.iter().any(|(k, _)| k.kind != Kind::ServiceEntry);
    let entries = if registry_put { of_kind(Kind::ServiceEntry) } else { Vec::new() };
    for (key, typed) in puts.iter().filter(|(k, _)| k.kind != Kind::ServiceEntry) {
        for host in hosts(key, typed) {
            for (se, _) in entries.iter().filter(|(se, h)| se.namespace == key.namespace && h.contains(&host)) {
                out.insert(format!(
                    "{key}: {host} is also the host of ServiceEntry {}/{}: the registry's instances are served for it, not the ServiceEntry's endpoints",
                    se.namespace, se.name
                ));
            }
        }
    }
    if puts.iter().any(|(k, _)| k.kind == Kind::ServiceEntry) {
        let registry: Vec<(ResourceKey, Vec<String>)> = of_kind(Kind::Service).into_iter().chain(of_kind(Kind::Instance)).collect();
        for (key, typed) in puts.iter().filter(|(k, _)| k.kind == Kind::ServiceEntry) {
            for host in hosts(key, typed) {
                if let Some((r, _)) = registry.iter().find(|(r, h)| r.namespace == key.namespace && h.contains(&host)) {
                    out.insert(format!(
                        "{key}: {host} is also a registry service's ({} {}/{}): its instances are served for it, not this ServiceEntry's endpoints",
                        r.kind, r.namespace, r.name
                    ));
                }
            }
        }
    }
    out.into_iter().collect()
}

/// A resource named for deletion.
#[derive(Debug, Clone)]
pub struct DeleteItem {
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    pub expected_revision: Option<u64>,
}

pub fn delete_txn(items: Vec<DeleteItem>, ignore_missing: bool) -> Result<Txn> {
    if items.is_empty() {
        return Err(Error::field("resources", "no resources given"));
    }
    let mut errors = Vec::new();
    let mut ops = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        let path = format!("resources[{i}]");
        match key_of(&item.kind, item.namespace.as_deref(), &item.name) {
            Ok(key) if key.kind == Kind::Policy && key.name == GLOBAL_MANAGEMENT => errors.push(FieldError::new(
                path,
                "the global-management policy cannot be deleted: it records that ACLs were bootstrapped (it may be changed; \
                 to bootstrap again, see the reset procedure)",
            )),
            Ok(key) => ops.push(Op::Delete { key, expected_revision: item.expected_revision, ignore_missing }),
            Err(e) => errors.extend(e.fields.into_iter().map(|f| f.under(&path))),
        }
    }
    if errors.is_empty() {
        Ok(Txn { ops })
    } else {
        Err(Error::invalid_fields(errors))
    }
}

/// A delete request from whole resource documents (`delete -f`).
pub fn delete_items_from_documents(docs: Vec<Value>) -> Result<Vec<DeleteItem>> {
    let mut errors = Vec::new();
    let mut items = Vec::new();
    for (i, doc) in docs.into_iter().enumerate() {
        let path = format!("resources[{i}]");
        let s = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
        match (s(doc.get("kind")), s(doc.pointer("/metadata/name"))) {
            (Some(kind), Some(name)) => {
                // `kind: Gateway` is Istio's or the Gateway API's by its apiVersion.
                let kind = Kind::from_kind_and_api_version(&kind, doc.get("apiVersion").and_then(Value::as_str)).map_or(kind, |k| k.plural().to_string());
                items.push(DeleteItem { kind, name, namespace: s(doc.pointer("/metadata/namespace")), expected_revision: None })
            }
            (None, _) => errors.push(FieldError::new(format!("{path}.kind"), "required")),
            (_, None) => errors.push(FieldError::new(format!("{path}.metadata.name"), "required")),
        }
    }
    if errors.is_empty() {
        Ok(items)
    } else {
        Err(Error::invalid_fields(errors))
    }
}

pub fn parse_kind(kind: &str) -> Result<Kind> {
    Kind::from_cli_name(kind).ok_or_else(|| Error::field("kind", format!("unknown kind {kind:?}; known kinds: {}", Kind::cli_names_help())))
}

pub fn key_of(kind: &str, namespace: Option<&str>, name: &str) -> Result<ResourceKey> {
    let kind = parse_kind(kind)?;
    let namespace = namespace.filter(|n| !n.is_empty()).unwrap_or(kind.default_namespace());
    if kind.is_cluster_scoped() && namespace != CLUSTER_NAMESPACE {
        return Err(Error::field("namespace", format!("{} are cluster-scoped: leave the namespace out (it is always {CLUSTER_NAMESPACE})", kind.plural())));
    }
    model::resource::check_dns_label(namespace).map_err(|r| Error::field("namespace", r))?;
    model::resource::check_dns_subdomain(name).map_err(|r| Error::field("name", r))?;
    Ok(ResourceKey::new(kind, namespace, name))
}

/// The object a heartbeat renews: an Instance (its TTL) or a Lease.
pub fn heartbeat_key(kind: &str, namespace: &str, name: &str) -> Result<ResourceKey> {
    let key = key_of(kind, Some(namespace), name)?;
    if !matches!(key.kind, Kind::Instance | Kind::Lease) {
        return Err(Error::field("kind", format!("only instances and leases take heartbeats, not {}", key.kind.plural())));
    }
    Ok(key)
}

pub fn get(applied: &Applied, key: &ResourceKey) -> Result<Arc<StoredObject>> {
    applied.state.get(key).cloned().ok_or_else(|| Error::not_found(format!("{key} not found")))
}

/// Objects of one kind, optionally in one namespace and matching a selector,
/// in key order.
pub fn list(applied: &Applied, kind: Kind, namespace: Option<&str>, selector: &Selector) -> Vec<Arc<StoredObject>> {
    let namespace = namespace.filter(|n| !n.is_empty());
    let lo = ResourceKey::new(kind, namespace.unwrap_or(""), "");
    applied
        .state
        .objects
        .range(lo..)
        .take_while(|(k, _)| k.kind == kind && namespace.is_none_or(|ns| k.namespace == ns))
        .filter(|(_, o)| selector.is_empty() || selector.matches(&o.labels()))
        .map(|(_, o)| o.clone())
        .collect()
}

pub fn parse_selector(s: Option<&str>) -> Result<Selector> {
    Selector::parse(s.unwrap_or("")).map_err(|e| Error::invalid_fields(vec![e]))
}

/// What an apply answered: the write, or its preview.
pub enum ApplyOutcome {
    Written(WriteResult),
    Preview(dryrun::Preview),
}

/// An apply's transaction, validated, on to the store: authorized (write on
/// everything it touches), pinned to `expected_revision` if given, sealed,
/// then previewed (`dry_run`: nothing proposed) or written; with the
/// write's warnings either way. REST and gRPC share it.
pub async fn apply_authorized(
    caller: &Caller,
    replica: &crate::replica::Replica,
    mut txn: Txn,
    mut warnings: Vec<String>,
    dry_run: bool,
    expected_revision: Option<u64>,
) -> Result<ApplyOutcome> {
    let linearizable = dry_run || expected_revision.is_some();
    let applied = checked(caller, replica, &mut txn, &mut warnings, linearizable, expected_revision).await?;
    let node = &replica.node;
    if dry_run {
        // Translation for every connected proxy, twice: off the runtime.
        let scope = dryrun::ProxyScope::of(caller, replica);
        let (caller, state) = (caller.clone(), applied.state.clone());
        let preview = tokio::task::spawn_blocking(move || dryrun::preview(&caller, &state, &txn, warnings, &scope));
        return preview.await.map_err(|e| Error::internal(format!("dry run: {e}")))?.map(ApplyOutcome::Preview);
    }
    let ok = caller.write(node, Verb::Write, txn).await?;
    Ok(ApplyOutcome::Written(WriteResult::new(ok, warnings)))
}

/// What an apply does to its transaction before writing or previewing it:
/// authorized (write on everything it touches), the server's own settings
/// refused, pinned to `expected_revision` if given, sealed (a preview and a
/// validation seal too: they show what would be stored, never a value),
/// and the write's warnings added; at the state it was checked against
/// (read linearizably when `linearizable`, else this replica's latest).
async fn checked(
    caller: &Caller,
    replica: &crate::replica::Replica,
    txn: &mut Txn,
    warnings: &mut Vec<String>,
    linearizable: bool,
    expected_revision: Option<u64>,
) -> Result<Arc<Applied>> {
    caller.authorize_txn(Verb::Write, txn)?;
    let (node, config) = (&replica.node, &replica.config);
    meshconfig::check_server_settings(txn, &config.root_namespace, &config.trust_domain)?;
    let applied = if linearizable { node.read(crate::node::Consistency::Linearizable).await? } else { node.reader().current() };
    if let Some(base) = expected_revision {
        dryrun::pin(txn, &applied.state, base)?;
    }
    crate::secrets::seal_txn(replica.secrets.as_deref(), txn, &applied)?;
    warnings.extend(policy_warnings(txn, &applied, &config.root_namespace));
    warnings.extend(claim_warnings(txn, &applied, &config.domain_suffix));
    warnings.extend(host_warnings(txn, &applied, &config.domain_suffix));
    warnings.extend(analyze::write_warnings(caller, txn, &applied, config));
    Ok(applied)
}

/// `POST /v1/validate` (`lodestar validate`): an apply's transaction
/// checked exactly as [`apply_authorized`] checks it, then run on a copy
/// of this replica's latest state (the store's own preconditions), and no
/// further: no linearizable read, no translation of proxies, nothing
/// proposed. Cheap enough for an editor to ask at each pause in typing.
/// The answer: the revision it was checked at and the write's warnings.
pub async fn validate_authorized(caller: &Caller, replica: &crate::replica::Replica, mut txn: Txn, mut warnings: Vec<String>) -> Result<(u64, Vec<String>)> {
    let applied = checked(caller, replica, &mut txn, &mut warnings, false, None).await?;
    let mut after = applied.state.clone();
    after.apply_txn(&txn).0?;
    Ok((applied.revision(), warnings))
}

/// The JSON shape of a write result, shared by REST and the CLI.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteResult {
    pub revision: u64,
    pub items: Vec<WriteItem>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteItem {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub action: String,
    pub mod_revision: u64,
}

impl WriteResult {
    pub fn new(ok: TxnOk, warnings: Vec<String>) -> Self {
        WriteResult { revision: ok.revision, items: ok.items.into_iter().map(WriteItem::from).collect(), warnings }
    }
}

impl From<ItemResult> for WriteItem {
    fn from(i: ItemResult) -> Self {
        WriteItem {
            kind: i.key.kind.name().to_string(),
            namespace: i.key.namespace.into(),
            name: i.key.name.into(),
            action: i.action.as_str().to_string(),
            mod_revision: i.mod_revision,
        }
    }
}

/// One registry service as `lodestar get services` shows it: declared by a
/// `Service` or implied by its instances, with instance counts by health.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceView {
    pub hostname: String,
    pub namespace: String,
    pub declared: bool,
    pub ports: Vec<String>,
    pub instances: usize,
    pub healthy: usize,
    pub unhealthy: usize,
    pub unknown: usize,
}

/// The registry's services at one snapshot (ServiceEntries excluded).
pub fn registry_services(applied: &Applied, config: &crate::config::ServerConfig, namespace: Option<&str>) -> Vec<ServiceView> {
    use crate::translate::mesh::{Health, Mesh};
    let mesh = Mesh::build(applied, Arc::new(config.mesh_config()));
    mesh.all_services()
        .filter(|s| s.sources.iter().any(|(k, _)| matches!(k.kind, Kind::Service | Kind::Instance)))
        .filter(|s| namespace.is_none_or(|ns| ns.is_empty() || s.namespace == ns))
        .map(|s| {
            let count = |h: Health| s.instances.iter().filter(|i| i.health == h).count();
            ServiceView {
                hostname: s.hostname.clone(),
                namespace: s.namespace.clone(),
                declared: s.sources.iter().any(|(k, _)| k.kind == Kind::Service),
                ports: s.ports.iter().map(|p| format!("{}:{}/{:?}", p.name, p.number, p.protocol)).collect(),
                instances: s.instances.len(),
                healthy: count(Health::Healthy),
                unhealthy: count(Health::Unhealthy),
                unknown: count(Health::Unknown),
            }
        })
        .collect()
}
