//! Authorization, the pure part: who is asking ([`Principal`]) and whether
//! they may do a [`Verb`] to what the request touches ([`Target`]).
//!
//! This module (`token`, `index`) knows nothing of axum, tonic or sled: a
//! request's [`Credentials`] and the ACL objects of one applied revision
//! ([`AclIndex`]) give a principal or a [`Refusal`]; a principal and a list
//! of permissions give `Ok` or the permissions it lacks. The runtime part
//! is the root's `auth` (`auth::acl`: the cached index, the management
//! credential; `auth::audit`: the audit log writer), which re-exports this
//! module at its old paths (`auth::Principal`, `auth::token`, ...).
//!
//! Principals:
//! - a **token** (`Authorization: Bearer <secret>` on REST, metadata
//!   `authorization: Bearer <secret>` on gRPC): found by the SHA-256 of the
//!   secret among the Token objects; its policies plus its roles' policies.
//! - a verified **client-certificate identity** ([`PeerIdentity`], put in
//!   the request's extensions by the TLS layer): the policies of every Role
//!   that lists the identity in `spec.identities`. A bearer token, when
//!   present, takes precedence.
//! - the **initial management token** (`initial_management_token_file`):
//!   every permission.
//!
//! Permissions: `verb` on a kind in a namespace, or on the cluster
//! (membership, backups, ACL objects, metrics and debug endpoints), which a
//! rule grants only when it covers every kind in every namespace. `admin`
//! implies every verb. The ACL kinds are never matched by `kinds: ["*"]`:
//! every verb on them needs `admin` on the cluster, since a principal that
//! can write policies can grant itself anything.

pub mod index;
pub mod token;

pub use crate::model::acl::Verb;
pub use index::AclIndex;

use crate::model::acl::{Policy, ProxyBinding};
use crate::model::{Kind, ResourceKey};
use std::fmt;
use std::sync::Arc;

/// The verified identity of a client certificate (a SPIFFE id or subject
/// name), as the TLS layer puts it into a request's extensions.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeerIdentity(pub String);

/// What a request presents. The secret is only ever hashed.
#[derive(Clone, Default)]
pub struct Credentials {
    pub bearer: Option<String>,
    pub peer: Option<PeerIdentity>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials").field("bearer", &self.bearer.as_ref().map(|_| "<redacted>")).field("peer", &self.peer).finish()
    }
}

/// The secret of an `Authorization: Bearer <secret>` value. Anything else
/// is an error message (which never quotes the value).
pub fn parse_bearer(value: &str) -> Result<String, &'static str> {
    let (scheme, secret) = value.trim().split_once(' ').ok_or("malformed authorization: expected `Bearer <secret>`")?;
    let secret = secret.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || secret.is_empty() {
        return Err("malformed authorization: expected `Bearer <secret>`");
    }
    Ok(secret.to_string())
}

/// Which namespaces a request touches of a kind.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    Namespace(String),
    /// Every namespace (a list or watch across namespaces).
    All,
}

/// What a permission is on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    Resource {
        kind: Kind,
        scope: Scope,
    },
    /// The cluster as a whole.
    Cluster,
}

impl Target {
    /// Objects of `kind` in `namespace` (`None` or empty: every namespace).
    pub fn kind(kind: Kind, namespace: Option<&str>) -> Target {
        match namespace.filter(|n| !n.is_empty()) {
            Some(n) => Target::Resource { kind, scope: Scope::Namespace(n.to_string()) },
            None => Target::Resource { kind, scope: Scope::All },
        }
    }
    pub fn key(key: &ResourceKey) -> Target {
        Target::kind(key.kind, Some(&key.namespace))
    }
}

/// A verb on a target. ACL kinds become `admin` on the cluster.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Permission {
    pub verb: Verb,
    pub target: Target,
}

impl Permission {
    pub fn new(verb: Verb, target: Target) -> Permission {
        match target {
            Target::Resource { kind, .. } if kind.is_acl() => Permission { verb: Verb::Admin, target: Target::Cluster },
            target => Permission { verb, target },
        }
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.target {
            Target::Cluster => write!(f, "{} on the cluster", self.verb),
            Target::Resource { kind, scope: Scope::Namespace(n) } => write!(f, "{} on {} in namespace {n}", self.verb, kind.plural()),
            Target::Resource { kind, scope: Scope::All } => write!(f, "{} on {} in every namespace", self.verb, kind.plural()),
        }
    }
}

/// Who a principal is, as the audit log and error messages name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Who {
    /// ACLs are off: every request is this.
    Anonymous,
    /// The initial management token (from `initial_management_token_file`).
    InitialManagement,
    /// A stored token, by accessor id.
    Token(String),
    /// A client certificate's identity.
    Identity(String),
    /// A replica writing on its own behalf (`task`: what for, as
    /// `revert-on-nack`). No credential authenticates as this: its audit
    /// name (`replica:<id>/<task>`) cannot be a token's or a certificate's.
    Replica { id: u64, task: &'static str },
}

impl Who {
    /// `token:<accessor>`, `identity:<name>`, `replica:<id>/<task>`,
    /// `initial-management`, `anonymous`.
    pub fn audit_name(&self) -> String {
        match self {
            Who::Anonymous => "anonymous".into(),
            Who::InitialManagement => "initial-management".into(),
            Who::Token(a) => format!("token:{a}"),
            Who::Identity(i) => format!("identity:{i}"),
            Who::Replica { id, task } => format!("replica:{id}/{task}"),
        }
    }
}

impl fmt::Display for Who {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Who::Anonymous => f.write_str("anonymous"),
            Who::InitialManagement => f.write_str("the initial management token"),
            Who::Token(a) => write!(f, "token {a}"),
            Who::Identity(i) => write!(f, "certificate identity {i:?}"),
            Who::Replica { id, task } => write!(f, "replica {id} ({task})"),
        }
    }
}

#[derive(Debug, Clone)]
enum Grants {
    All,
    Policies(Vec<Arc<Policy>>),
}

/// An authenticated caller and what it may do.
#[derive(Debug, Clone)]
pub struct Principal {
    pub who: Who,
    grants: Grants,
    /// A proxy token's identity on the xDS port.
    proxy: Option<ProxyBinding>,
}

impl Principal {
    /// Everything allowed: ACLs off.
    pub fn anonymous() -> Principal {
        Principal { who: Who::Anonymous, grants: Grants::All, proxy: None }
    }

    /// Whether this principal may be the proxy that claims `namespace` and
    /// workload `name` on the xDS port: a proxy token bound to it; a
    /// client certificate whose SPIFFE id is in that namespace; or anyone
    /// with `admin` on the cluster (ACLs off, management tokens). The
    /// error says why not.
    pub fn may_be_proxy(&self, namespace: &str, name: &str) -> Result<(), String> {
        let claims = format!("the proxy claims {namespace}/{name}");
        if let Some(b) = &self.proxy {
            return if b.admits(namespace, name) { Ok(()) } else { Err(format!("{} is bound to proxy identity {b}; {claims}", self.who)) };
        }
        if self.allows(&Permission::new(Verb::Admin, Target::Cluster)) {
            return Ok(());
        }
        if let Who::Identity(id) = &self.who {
            if let Some(ns) = spiffe_namespace(id) {
                return if ns == namespace { Ok(()) } else { Err(format!("{} is in namespace {ns}; {claims}", self.who)) };
            }
        }
        Err(format!("{} is not a proxy credential (a proxy token, or a workload certificate with a SPIFFE id); {claims}", self.who))
    }

    /// Whether this principal, already allowed to be a proxy of
    /// `namespace` ([`Self::may_be_proxy`]), may be served that namespace's
    /// Secrets (the gateway certificates and keys of SDS): a proxy token
    /// created with `--gateway`, or a principal allowed to read Secrets in
    /// the namespace (a workload certificate's identity through a Role,
    /// as Istio asks the gateway's service account to be allowed to read
    /// secrets; `admin` on the cluster). The error says why not.
    pub fn may_have_secrets(&self, namespace: &str) -> Result<(), String> {
        if let Some(b) = &self.proxy {
            return if b.gateway {
                Ok(())
            } else {
                Err(format!("{} is a proxy token without --gateway: only a gateway's token is served its namespace's secrets", self.who))
            };
        }
        if self.allows(&Permission::new(Verb::Read, Target::kind(Kind::Secret, Some(namespace)))) {
            return Ok(());
        }
        Err(format!(
            "{} may not read secrets in namespace {namespace}: a gateway's credential is a proxy token made with --gateway, or a certificate identity that a Role grants read on secrets there",
            self.who
        ))
    }

    /// Whether any rule grants `verb` on anything at all (some kind in
    /// some namespace, or the cluster): a bound checked from a request's
    /// headers alone, before its body is read. A proxy or join credential
    /// and a certificate no role names grant nothing, so they never get
    /// past it.
    pub fn may_ever(&self, verb: Verb) -> bool {
        match &self.grants {
            Grants::All => true,
            Grants::Policies(p) => {
                p.iter().flat_map(|pol| &pol.rules).any(|r| r.verbs.allows(verb) && !r.namespaces.is_empty() && r.kinds.as_ref().is_none_or(|k| !k.is_empty()))
            }
        }
    }

    pub fn allows(&self, p: &Permission) -> bool {
        let policies = match &self.grants {
            Grants::All => return true,
            Grants::Policies(p) => p,
        };
        policies.iter().flat_map(|pol| &pol.rules).any(|r| {
            r.verbs.allows(p.verb)
                && match &p.target {
                    Target::Cluster => r.covers_everything(),
                    Target::Resource { kind, scope } => {
                        r.kinds.as_ref().is_none_or(|k| k.contains(kind))
                            && match scope {
                                Scope::Namespace(n) => r.namespaces.iter().any(|pat| pat.matches(n)),
                                Scope::All => r.namespaces.contains(&crate::model::acl::NamePattern::Any),
                            }
                    }
                }
        })
    }

    /// Whether it may write an object of `kind` in `namespace` that claims
    /// `hostname`, one outside the namespace's own (`mesh::hosts::needs_grant`):
    /// a rule that lets it write that kind there and whose `hostnames`
    /// cover it (Consul's `service:write` on the name). Everything, for
    /// the management credentials and with ACLs off.
    pub fn may_claim(&self, kind: Kind, namespace: &str, hostname: &str) -> bool {
        let policies = match &self.grants {
            Grants::All => return true,
            Grants::Policies(p) => p,
        };
        policies.iter().flat_map(|pol| &pol.rules).any(|r| {
            r.verbs.allows(Verb::Write)
                && r.kinds.as_ref().is_none_or(|k| k.contains(&kind))
                && r.namespaces.iter().any(|pat| pat.matches(namespace))
                && r.hostnames.iter().any(|h| crate::model::acl::hostname_pattern_covers(h, hostname))
        })
    }

    /// `Ok`, or every distinct permission it lacks, in order.
    pub fn check(&self, needed: impl IntoIterator<Item = Permission>) -> Result<(), Vec<Permission>> {
        let mut missing: Vec<Permission> = needed.into_iter().filter(|p| !self.allows(p)).collect();
        missing.sort();
        missing.dedup();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(missing)
        }
    }
}

/// The namespace of a SPIFFE id in Istio's form
/// (`spiffe://TRUST-DOMAIN/ns/NAMESPACE/sa/SERVICE-ACCOUNT`).
pub fn spiffe_namespace(id: &str) -> Option<&str> {
    let path = id.strip_prefix("spiffe://")?.split_once('/')?.1;
    match path.split('/').collect::<Vec<_>>().as_slice() {
        ["ns", ns, "sa", sa] if !ns.is_empty() && !sa.is_empty() => Some(ns),
        _ => None,
    }
}

/// Why a request is not authenticated (HTTP 401). `who` is what is known
/// of the caller: an expired token's accessor, never a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub who: String,
    pub reason: String,
}

/// The principal a request's credentials stand for at one revision of the
/// ACL objects, `now` in unix seconds.
pub fn authenticate(index: &AclIndex, management: Option<&[u8; 32]>, creds: &Credentials, now: u64) -> Result<Principal, Refusal> {
    if let Some(secret) = &creds.bearer {
        let hash = token::hash_secret(secret);
        if management == Some(&hash) {
            return Ok(Principal { who: Who::InitialManagement, grants: Grants::All, proxy: None });
        }
        let Some(t) = index.token(&hash) else {
            return Err(Refusal { who: "unknown-token".into(), reason: "the token is not valid: unknown or revoked".into() });
        };
        if t.expires_at.is_some_and(|e| e <= now) {
            let at = crate::model::acl::format_rfc3339(t.expires_at.unwrap_or_default());
            return Err(Refusal { who: Who::Token(t.accessor.clone()).audit_name(), reason: format!("token {} expired at {at}", t.accessor) });
        }
        return Ok(Principal { who: Who::Token(t.accessor.clone()), grants: Grants::Policies(index.token_policies(t)), proxy: t.proxy.clone() });
    }
    if let Some(PeerIdentity(id)) = &creds.peer {
        return Ok(Principal { who: Who::Identity(id.clone()), grants: Grants::Policies(index.identity_policies(id)), proxy: None });
    }
    Err(Refusal {
        who: Who::Anonymous.audit_name(),
        reason: "authentication required: send a token (Authorization: Bearer <secret>) or a client certificate".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{json_text, parse_resource, StoredObject};
    use serde_json::{json, Value};

    #[test]
    fn a_replica_writing_for_itself_has_a_name_no_credential_has() {
        let replica = Who::Replica { id: 1, task: "revert-on-nack" };
        assert_eq!(replica.audit_name(), "replica:1/revert-on-nack");
        // A certificate or token named like it is still itself.
        for other in [Who::Identity("replica-1/revert-on-nack".into()), Who::Identity("replica:1/revert-on-nack".into()), Who::Token("replica:1".into())] {
            assert_ne!(other.audit_name(), replica.audit_name(), "{other}");
        }
        assert_eq!(replica.to_string(), "replica 1 (revert-on-nack)");
    }

    fn object(doc: Value) -> Arc<StoredObject> {
        let r = parse_resource(doc, "default").unwrap();
        crate::model::validate_spec(&r).unwrap();
        Arc::new(StoredObject::from_text(r.key, 1, 1, 1, json_text(&r.body).into()))
    }
    fn policy(name: &str, rules: Value) -> Arc<StoredObject> {
        object(json!({"apiVersion": "acl.lodestar.io/v1", "kind": "Policy", "metadata": {"name": name}, "spec": {"rules": rules}}))
    }
    fn token(accessor: &str, secret: &str, spec: Value) -> Arc<StoredObject> {
        let mut spec = spec;
        spec["secretHash"] = json!(token::hash_text(secret));
        object(json!({"apiVersion": "acl.lodestar.io/v1", "kind": "Token", "metadata": {"name": accessor}, "spec": spec}))
    }
    fn bearer(s: &str) -> Credentials {
        Credentials { bearer: Some(s.into()), peer: None }
    }
    fn w(kind: Kind, ns: &str) -> Permission {
        Permission::new(Verb::Write, Target::kind(kind, Some(ns)))
    }

    fn index() -> AclIndex {
        AclIndex::build(
            [
                policy("team-a", json!([{"verbs": ["read", "write"], "kinds": ["*"], "namespaces": ["a", "a-*"]}])),
                policy("reader", json!([{"verbs": ["read", "watch"], "kinds": ["*"], "namespaces": ["*"]}])),
                policy("admin", json!([{"verbs": ["admin"], "kinds": ["*"], "namespaces": ["*"]}])),
                object(json!({"apiVersion": "acl.lodestar.io/v1", "kind": "Role", "metadata": {"name": "ci"},
                              "spec": {"policies": ["team-a"], "identities": ["spiffe://x/ci"]}})),
                token("t-a", "secret-a", json!({"policies": ["team-a"]})),
                token("t-r", "secret-r", json!({"roles": [], "policies": ["reader"]})),
                token("t-old", "secret-old", json!({"policies": ["admin"], "expiresAt": "2020-01-01T00:00:00Z"})),
                token("t-ci", "secret-ci", json!({"roles": ["ci", "missing"]})),
            ]
            .into_iter(),
        )
    }

    #[test]
    fn namespaces_kinds_and_verbs() {
        let idx = index();
        let now = 1_800_000_000;
        let a = authenticate(&idx, None, &bearer("secret-a"), now).unwrap();
        assert_eq!(a.who, Who::Token("t-a".into()));
        assert!(a.allows(&w(Kind::VirtualService, "a")) && a.allows(&w(Kind::Instance, "a-2")));
        // An atomic write touching b is refused whole, naming what is missing.
        let missing = a.check([w(Kind::VirtualService, "a"), w(Kind::VirtualService, "b"), w(Kind::DestinationRule, "b")]).unwrap_err();
        assert_eq!(
            missing.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
            ["write on virtualservices in namespace b", "write on destinationrules in namespace b"]
        );
        assert!(!a.allows(&Permission::new(Verb::Delete, Target::kind(Kind::VirtualService, Some("a")))));
        assert!(!a.allows(&Permission::new(Verb::Read, Target::kind(Kind::VirtualService, None))), "every namespace needs *");
        assert!(!a.allows(&Permission::new(Verb::Read, Target::Cluster)));

        assert!(a.may_ever(Verb::Write) && a.may_ever(Verb::Read) && !a.may_ever(Verb::Delete) && !a.may_ever(Verb::Watch));

        let r = authenticate(&idx, None, &bearer("secret-r"), now).unwrap();
        assert!(r.may_ever(Verb::Watch) && !r.may_ever(Verb::Write) && !r.may_ever(Verb::Delete));
        assert!(r.allows(&Permission::new(Verb::Read, Target::kind(Kind::Gateway, None))));
        assert!(r.allows(&Permission::new(Verb::Read, Target::Cluster)), "a rule over everything covers the cluster");
        assert!(!r.allows(&w(Kind::VirtualService, "a")));
        // ACL kinds are not in "*": reading tokens is admin on the cluster.
        let p = Permission::new(Verb::Read, Target::kind(Kind::Token, None));
        assert_eq!(p.to_string(), "admin on the cluster");
        assert!(!r.allows(&p));
    }

    #[test]
    fn refusals() {
        let idx = index();
        let now = 1_800_000_000;
        let e = authenticate(&idx, None, &Credentials::default(), now).unwrap_err();
        assert_eq!(e.who, "anonymous");
        let e = authenticate(&idx, None, &bearer("nope"), now).unwrap_err();
        assert!(e.reason.contains("unknown or revoked") && !e.reason.contains("nope"), "{e:?}");
        let e = authenticate(&idx, None, &bearer("secret-old"), now).unwrap_err();
        assert_eq!(e.who, "token:t-old");
        assert!(e.reason.contains("expired at 2020-01-01T00:00:00Z"), "{e:?}");
        // Before its expiry it was an admin.
        assert!(authenticate(&idx, None, &bearer("secret-old"), 1_500_000_000).unwrap().allows(&Permission::new(Verb::Admin, Target::Cluster)));
    }

    #[test]
    fn management_roles_and_identities() {
        let idx = index();
        let m = token::hash_secret("the-file-secret");
        let p = authenticate(&idx, Some(&m), &bearer("the-file-secret"), 0).unwrap();
        assert_eq!(p.who, Who::InitialManagement);
        assert!(p.allows(&Permission::new(Verb::Admin, Target::Cluster)));
        // A token through a role (a missing role grants nothing, and is no error).
        let ci = authenticate(&idx, None, &bearer("secret-ci"), 0).unwrap();
        assert!(ci.allows(&w(Kind::Service, "a")) && !ci.allows(&w(Kind::Service, "b")));
        // A certificate identity through the roles that list it.
        let id = Credentials { bearer: None, peer: Some(PeerIdentity("spiffe://x/ci".into())) };
        let p = authenticate(&idx, None, &id, 0).unwrap();
        assert_eq!(p.who.audit_name(), "identity:spiffe://x/ci");
        assert!(p.allows(&w(Kind::Service, "a")));
        let nobody = Credentials { bearer: None, peer: Some(PeerIdentity("CN=nobody".into())) };
        assert!(!authenticate(&idx, None, &nobody, 0).unwrap().allows(&Permission::new(Verb::Read, Target::kind(Kind::Service, Some("a")))));
    }

    #[test]
    fn proxy_identities() {
        let idx = AclIndex::build(
            [
                policy("admin", json!([{"verbs": ["admin"], "kinds": ["*"], "namespaces": ["*"]}])),
                token("t-ns", "secret-ns", json!({"type": "proxy", "proxy": {"namespace": "shop"}})),
                token("t-wl", "secret-wl", json!({"type": "proxy", "proxy": {"namespace": "shop", "name": "cart"}})),
                token("t-gw", "secret-gw", json!({"type": "proxy", "proxy": {"namespace": "shop", "name": "ingress", "gateway": true}})),
                policy("shop-secrets", json!([{"verbs": ["read"], "kinds": ["secrets"], "namespaces": ["shop"]}])),
                object(json!({"apiVersion": "acl.lodestar.io/v1", "kind": "Role", "metadata": {"name": "shop-gateway"},
                              "spec": {"policies": ["shop-secrets"], "identities": ["spiffe://cluster.local/ns/shop/sa/ingress"]}})),
                token("t-admin", "secret-admin", json!({"policies": ["admin"]})),
                token("t-a", "secret-a", json!({"policies": ["admin"], "expiresAt": "2020-01-01T00:00:00Z"})),
            ]
            .into_iter(),
        );
        let ns = authenticate(&idx, None, &bearer("secret-ns"), 0).unwrap();
        assert!(ns.may_be_proxy("shop", "cart").is_ok() && ns.may_be_proxy("shop", "web").is_ok());
        let e = ns.may_be_proxy("bank", "cart").unwrap_err();
        assert!(e.contains("bound to proxy identity shop") && e.contains("claims bank/cart"), "{e}");
        // A proxy token grants nothing on the API: not even a body is read.
        assert!(!ns.allows(&Permission::new(Verb::Read, Target::kind(Kind::Service, Some("shop")))));
        assert!(Verb::ALL.iter().all(|v| !ns.may_ever(*v)));
        let wl = authenticate(&idx, None, &bearer("secret-wl"), 0).unwrap();
        assert!(wl.may_be_proxy("shop", "cart").is_ok() && wl.may_be_proxy("shop", "web").is_err());
        // Secrets: a gateway token; not a plain proxy token.
        assert!(ns.may_have_secrets("shop").unwrap_err().contains("without --gateway"));
        assert!(authenticate(&idx, None, &bearer("secret-gw"), 0).unwrap().may_have_secrets("shop").is_ok());
        assert!(authenticate(&idx, None, &bearer("secret-admin"), 0).unwrap().may_be_proxy("any", "thing").is_ok());
        let cert = |id: &str| authenticate(&idx, None, &Credentials { bearer: None, peer: Some(PeerIdentity(id.into())) }, 0).unwrap();
        assert!(cert("spiffe://cluster.local/ns/shop/sa/cart").may_be_proxy("shop", "x").is_ok());
        assert!(cert("spiffe://cluster.local/ns/shop/sa/cart").may_be_proxy("bank", "x").is_err());
        // A certificate identity is a gateway of the namespaces a Role lets it read secrets in.
        assert!(cert("spiffe://cluster.local/ns/shop/sa/ingress").may_have_secrets("shop").is_ok());
        assert!(cert("spiffe://cluster.local/ns/shop/sa/ingress").may_have_secrets("bank").is_err());
        assert!(cert("spiffe://cluster.local/ns/shop/sa/cart").may_have_secrets("shop").unwrap_err().contains("may not read secrets"));
        assert!(cert("member-1.lodestar").may_be_proxy("shop", "x").is_err());
        assert_eq!(spiffe_namespace("spiffe://td/ns/a/sa/b"), Some("a"));
        assert_eq!(spiffe_namespace("spiffe://td/ns//sa/b"), None);
        assert_eq!(spiffe_namespace("spiffe://td/x/a/sa/b"), None);
        // The model refuses a proxy token without an identity, and a client token with one.
        let bad = |spec: Value| crate::model::acl::validate(Kind::Token, &spec).unwrap_err()[0].field.clone();
        let h = token::hash_text("x");
        assert_eq!(bad(json!({"type": "proxy", "secretHash": h})), "spec.proxy");
        assert_eq!(bad(json!({"policies": ["p"], "proxy": {"namespace": "a"}, "secretHash": h})), "spec.proxy");
        assert_eq!(bad(json!({"type": "proxy", "proxy": {"namespace": "Bad_NS"}, "secretHash": h})), "spec.proxy");
    }

    #[test]
    fn hostname_claims_need_a_grant() {
        let idx = AclIndex::build(
            [
                policy("team-a", json!([{"verbs": ["read", "write"], "kinds": ["*"], "namespaces": ["team-a"]}])),
                policy("pay", json!([{"verbs": ["write"], "kinds": ["services"], "namespaces": ["team-a"], "hostnames": ["*.pay.example.com"]}])),
                token("t-a", "secret-a", json!({"policies": ["team-a"]})),
                token("t-pay", "secret-pay", json!({"policies": ["team-a", "pay"]})),
            ]
            .into_iter(),
        );
        let a = authenticate(&idx, None, &bearer("secret-a"), 0).unwrap();
        assert!(!a.may_claim(Kind::Service, "team-a", "api.pay.example.com"), "write on the namespace is not a grant");
        let pay = authenticate(&idx, None, &bearer("secret-pay"), 0).unwrap();
        assert!(pay.may_claim(Kind::Service, "team-a", "api.pay.example.com"));
        assert!(!pay.may_claim(Kind::Instance, "team-a", "api.pay.example.com"), "the grant is for services only");
        assert!(!pay.may_claim(Kind::Service, "team-b", "api.pay.example.com"), "and in team-a only");
        assert!(!pay.may_claim(Kind::Service, "team-a", "api.example.com"));
        assert!(Principal::anonymous().may_claim(Kind::Instance, "x", "anything.example"));
    }

    #[test]
    fn bearer_header() {
        assert_eq!(parse_bearer("Bearer abc").as_deref(), Ok("abc"));
        assert_eq!(parse_bearer("bearer  abc ").as_deref(), Ok("abc"));
        assert!(parse_bearer("Basic abc").is_err());
        assert!(parse_bearer("abc").is_err());
        assert!(!format!("{:?}", bearer("s3cr3t")).contains("s3cr3t"));
    }

    #[test]
    fn the_deny_list_by_identity_time_and_serial() {
        use crate::access::index::CertFacts;
        let revocation = |name: &str, spec: Value| {
            object(json!({"apiVersion": "acl.lodestar.io/v1", "kind": "CertificateRevocation", "metadata": {"name": name}, "spec": spec}))
        };
        let at = |t: &str| crate::model::acl::parse_rfc3339(t).unwrap() as i64;
        let idx = AclIndex::build(
            [
                revocation("cart", json!({"spiffeId": "spiffe://td/ns/shop/sa/cart", "issuedBefore": "2026-06-01T00:00:00Z", "reason": "key leaked"})),
                revocation("bank", json!({"spiffeId": "spiffe://td/ns/bank/sa/teller"})),
                revocation("one", json!({"serial": "0A:0B"})),
            ]
            .into_iter(),
        );
        let cert = |id: &str, serial: &str, issued: &str| CertFacts { spiffe_id: id.into(), serial: serial.into(), issued_at: at(issued), not_after: i64::MAX };
        let why = idx.revoked(&cert("spiffe://td/ns/shop/sa/cart", "1", "2026-05-31T23:59:59Z")).unwrap();
        assert!(why.contains("CertificateRevocation cart: key leaked"), "{why}");
        assert!(idx.revoked(&cert("spiffe://td/ns/shop/sa/cart", "2", "2026-06-01T00:00:00Z")).is_some(), "signed in the revocation's second");
        assert_eq!(idx.revoked(&cert("spiffe://td/ns/shop/sa/cart", "2", "2026-06-01T00:00:01Z")), None, "signed after: a new join");
        assert!(idx.revoked(&cert("spiffe://td/ns/bank/sa/teller", "3", "2030-01-01T00:00:00Z")).is_some(), "every certificate");
        assert!(idx.revoked(&cert("spiffe://td/ns/shop/sa/web", "a0b", "2030-01-01T00:00:00Z")).is_some(), "by serial");
        assert_eq!(idx.revoked(&cert("spiffe://td/ns/shop/sa/web", "a0c", "2020-01-01T00:00:00Z")), None);
        assert!(idx.banned("spiffe://td/ns/bank/sa/teller").is_some());
        assert_eq!(idx.banned("spiffe://td/ns/shop/sa/cart"), None, "a time-bound revocation lets new certificates through");
    }
}
