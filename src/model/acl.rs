//! ACL kinds (`acl.lodestar.io/v1`): `Policy`, `Role`, `Token`, their specs
//! and validation (every error with its field path). Cluster-scoped: they
//! all live in [`CLUSTER_NAMESPACE`](super::kinds::CLUSTER_NAMESPACE).
//! What they allow at request time is `auth`'s business; this module only
//! says what a valid one looks like.
//!
//! ```yaml
//! apiVersion: acl.lodestar.io/v1
//! kind: Policy
//! metadata: {name: team-a}
//! spec:
//!   rules:
//!   - verbs: [read, watch, write, delete]   # read | write | delete | watch | admin | *
//!     kinds: ["*"]                          # kind names (vs, VirtualService, ...) or *
//!     namespaces: [team-a, "team-a-*"]      # names, prefixes ending in *, or *
//!   - verbs: [write]                        # registry Services and Instances in team-a
//!     kinds: [services, instances]          # may also claim these hostnames (beyond
//!     namespaces: [team-a]                  # NAME.team-a.svc.DOMAIN, always theirs)
//!     hostnames: ["*.team-a.example.com"]
//! ---
//! apiVersion: acl.lodestar.io/v1
//! kind: Role
//! metadata: {name: deployer}
//! spec:
//!   policies: [team-a]
//!   identities: ["spiffe://example.org/ci"]  # client-certificate identities
//! ```

use super::kinds::Kind;
use super::resource::check_dns_subdomain;
use crate::error::FieldError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;

/// The field of a Token's spec that holds the SHA-256 of its secret. Left
/// out of every rendering of the object (`StoredObject::to_json`).
pub const SECRET_HASH_FIELD: &str = "secretHash";
/// The policy `acl bootstrap` creates: every verb on everything.
pub const GLOBAL_MANAGEMENT: &str = "global-management";
/// How a secret hash is written: `sha256:` and 64 lowercase hex digits.
pub const HASH_PREFIX: &str = "sha256:";

/// What a request does to what it touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verb {
    Read,
    Write,
    Delete,
    Watch,
    /// Implies every other verb; on the cluster, the management privilege.
    Admin,
}

impl Verb {
    pub const ALL: [Verb; 5] = [Verb::Read, Verb::Write, Verb::Delete, Verb::Watch, Verb::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Read => "read",
            Verb::Write => "write",
            Verb::Delete => "delete",
            Verb::Watch => "watch",
            Verb::Admin => "admin",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Verbs(u8);

impl Verbs {
    pub fn all() -> Verbs {
        Verbs(Verb::ALL.iter().fold(0, |b, v| b | v.bit()))
    }
    pub fn with(self, v: Verb) -> Verbs {
        Verbs(self.0 | v.bit())
    }
    /// `admin` implies every verb.
    pub fn allows(self, v: Verb) -> bool {
        self.0 & (v.bit() | Verb::Admin.bit()) != 0
    }
}

/// A namespace pattern of a rule: `*`, a prefix ending in `*`, or a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamePattern {
    Any,
    Prefix(String),
    Exact(String),
}

impl NamePattern {
    pub fn matches(&self, name: &str) -> bool {
        match self {
            NamePattern::Any => true,
            NamePattern::Prefix(p) => name.starts_with(p.as_str()),
            NamePattern::Exact(n) => n == name,
        }
    }
}

/// One rule of a policy, validated: these verbs on these kinds (`None`:
/// every kind but the ACL kinds) in these namespaces; and the hostnames
/// that registry Services and Instances it lets its holder write there may
/// claim besides their namespace's own (`mesh::hosts`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub verbs: Verbs,
    pub kinds: Option<BTreeSet<Kind>>,
    pub namespaces: Vec<NamePattern>,
    /// `*` (any hostname no namespace owns), `*.example.com` (its
    /// subdomains) or an exact hostname; lower case.
    pub hostnames: Vec<String>,
}

impl Rule {
    /// Every kind in every namespace: what makes a rule count for the
    /// cluster as a whole (membership, backups, ACLs, metrics).
    pub fn covers_everything(&self) -> bool {
        self.kinds.is_none() && self.namespaces.contains(&NamePattern::Any)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RuleSpec {
    pub verbs: Vec<String>,
    pub kinds: Vec<String>,
    pub namespaces: Vec<String>,
    /// Hostnames the registry objects this rule lets its holder write may
    /// claim (none: only their namespace's own).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hostnames: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PolicySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub rules: Vec<RuleSpec>,
}

/// A validated policy: its rules, ready to evaluate.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RoleSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub policies: Vec<String>,
    /// Verified client-certificate identities (exact strings, e.g. a SPIFFE
    /// id or a subject common name) that hold this role.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub identities: Vec<String>,
}

/// What a token is for. Only API tokens exist today; workload join tokens
/// (`join`: namespace/service account, uses, source CIDRs) and Envoy proxy
/// tokens for the xDS port (`proxy`: namespace, service, node) are planned
/// as further variants with their own optional fields in `TokenSpec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenType {
    /// A client of the API (REST, gRPC, the CLI).
    #[default]
    Client,
    /// An Envoy on the xDS port, bound to the identity in `proxy`.
    Proxy,
    /// A workload's first certificate from the mesh CA (`spec.join`); no
    /// use on the API.
    Join,
}

/// The identity a proxy token stands for on the xDS port: a proxy whose
/// node claims another namespace (or, when set, another workload name) is
/// refused. The namespace is the proxy's own (`NAME.NAMESPACE` in its
/// node id, or its `NAMESPACE` metadata).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProxyBinding {
    pub namespace: String,
    /// The workload name (`NAME` in the node id or metadata); none: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The proxy may be a gateway of the namespace: it is served the
    /// namespace's Secrets over SDS (`lodestar token create --gateway`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gateway: bool,
}

impl ProxyBinding {
    /// `NS` or `NS/NAME`.
    pub fn parse(s: &str) -> Result<ProxyBinding, String> {
        let (ns, name) = match s.split_once('/') {
            Some((ns, name)) => (ns, Some(name.to_string())),
            None => (s, None),
        };
        let b = ProxyBinding { namespace: ns.to_string(), name, gateway: false };
        b.check().map(|_| b)
    }

    fn check(&self) -> Result<(), String> {
        super::resource::check_dns_label(&self.namespace).map_err(|e| format!("namespace {:?}: {e}", self.namespace))?;
        if let Some(n) = &self.name {
            check_dns_subdomain(n).map_err(|e| format!("name {n:?}: {e}"))?;
        }
        Ok(())
    }

    /// Whether a proxy claiming `namespace` and workload `name` is this.
    pub fn admits(&self, namespace: &str, name: &str) -> bool {
        self.namespace == namespace && self.name.as_deref().is_none_or(|n| n == name)
    }
}

impl std::fmt::Display for ProxyBinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.name {
            Some(n) => write!(f, "{}/{n}", self.namespace),
            None => f.write_str(&self.namespace),
        }
    }
}

/// A Token as stored. The object's name is the accessor id (shown, safe to
/// log); the secret itself is never stored, only its SHA-256.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TokenSpec {
    #[serde(rename = "type", default)]
    pub token_type: TokenType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
    /// A proxy token's identity (type `proxy` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxyBinding>,
    /// RFC 3339 UTC, set by the replica that created it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// RFC 3339 UTC; none: never expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// `sha256:` + 64 hex digits.
    pub secret_hash: String,
    /// Type `join`: what the token obtains (boxed: most tokens have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join: Option<Box<JoinBinding>>,
}

/// A join token's binding (`spec.join`): the workload identity it obtains
/// a certificate for, how many times, and from where. Uses are counted in
/// the token's `status.used`, written by the replica that accepts a use
/// with the token's revision as its precondition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JoinBinding {
    /// A workload's namespace and service account (empty for a host).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_account: String,
    /// A host agent's host name instead (`lodestar token create --host`):
    /// the token obtains the host's certificate, with which it asks for
    /// those of the workloads registered on it (`ca::hosts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// How many certificates it obtains; none: any number until it expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uses: Option<u64>,
    /// Source addresses it is accepted from (CIDRs); empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cidrs: Vec<String>,
}

impl JoinBinding {
    /// Whether `ip` is one of the allowed sources (the CIDRs validated).
    pub fn allows(&self, ip: std::net::IpAddr) -> bool {
        // IPv4 clients on a dual-stack socket arrive as ::ffff:a.b.c.d.
        let ip = match ip {
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
            v4 => v4,
        };
        self.cidrs.is_empty() || self.cidrs.iter().filter_map(|c| c.parse::<ipnet::IpNet>().ok()).any(|n| n.contains(&ip))
    }
}

fn validate_join(spec: &TokenSpec, errors: &mut Vec<FieldError>) {
    match (spec.token_type, &spec.join) {
        (TokenType::Join, None) => errors.push(FieldError::new("spec.join", "required for a join token: namespace and serviceAccount, or host")),
        (TokenType::Client | TokenType::Proxy, Some(_)) => errors.push(FieldError::new("spec.join", "only a token of type join has one")),
        (TokenType::Client | TokenType::Proxy, None) => {}
        (TokenType::Join, Some(j)) => {
            if !spec.policies.is_empty() || !spec.roles.is_empty() {
                errors.push(FieldError::new("spec.policies", "a join token grants no API permissions: no policies or roles"));
            }
            match &j.host {
                Some(h) => {
                    if let Err(e) = super::registry::check_host_name(h) {
                        errors.push(FieldError::new("spec.join.host", e));
                    }
                    if !j.namespace.is_empty() || !j.service_account.is_empty() {
                        errors.push(FieldError::new("spec.join.host", "a join token is for a workload (namespace, serviceAccount) or a host, not both"));
                    }
                }
                None => {
                    if let Err(e) = super::resource::check_dns_label(&j.namespace) {
                        errors.push(FieldError::new("spec.join.namespace", e));
                    }
                    if let Err(e) = check_dns_subdomain(&j.service_account) {
                        errors.push(FieldError::new("spec.join.serviceAccount", e));
                    }
                }
            }
            if j.uses == Some(0) {
                errors.push(FieldError::new("spec.join.uses", "must be at least 1 (omit it for any number)"));
            }
            for (i, c) in j.cidrs.iter().enumerate() {
                if let Err(e) = c.parse::<ipnet::IpNet>() {
                    errors.push(FieldError::new(format!("spec.join.cidrs[{i}]"), format!("{c:?}: {e} (expected a CIDR such as 10.0.0.0/8)")));
                }
            }
        }
    }
}

/// A validated token.
#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    pub spec: TokenSpec,
    /// Unix seconds.
    pub expires_at: Option<u64>,
    pub secret_hash: [u8; 32],
}

/// A CertificateRevocation: an entry of the mesh CA's deny list. A
/// certificate it covers renews no more (`CreateCertificate` with it as
/// client certificate) and opens no xDS stream; an open one ends.
///
/// ```yaml
/// apiVersion: acl.lodestar.io/v1
/// kind: CertificateRevocation
/// metadata: {name: cart-key-leak}
/// spec:
///   spiffeId: spiffe://cluster.local/ns/shop/sa/cart
///   issuedBefore: "2026-11-30T10:00:00Z"  # certificates signed before; omitted: every one, new ones too
///   reason: the key leaked
/// # or
///   serial: "6e:b2:26:f9"                  # one certificate (any case, colons or not)
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RevocationSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spiffe_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// RFC 3339 UTC; only with `spiffeId`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issued_before: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A validated revocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Revocation {
    /// Certificates naming this SPIFFE id, signed before this time (unix
    /// seconds; in its second too); none: all of them.
    Identity { spiffe_id: String, issued_before: Option<u64> },
    /// The certificate with this serial ([`normalize_serial`]).
    Serial(String),
}

/// A serial as the deny list compares them: lowercase hex, no colons or
/// spaces, no leading zeros (`openssl x509 -serial` prints
/// `serial=0A1B...`, the agent's log `0a:1b:...`). None if it is not hex.
pub fn normalize_serial(s: &str) -> Option<String> {
    let digits: String = s.trim().trim_start_matches("serial=").chars().filter(|c| *c != ':' && *c != ' ').collect::<String>().to_ascii_lowercase();
    if digits.is_empty() || digits.len() > 64 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let trimmed = digits.trim_start_matches('0');
    Some(if trimmed.is_empty() { "0".to_string() } else { trimmed.to_string() })
}

pub fn validate_revocation(spec: &RevocationSpec) -> Result<Revocation, Vec<FieldError>> {
    let mut errors = Vec::new();
    if spec.reason.as_ref().is_some_and(|r| r.len() > 1024 || r.chars().any(char::is_control)) {
        errors.push(FieldError::new("spec.reason", "at most 1024 characters, none of them control characters"));
    }
    let revocation = match (&spec.spiffe_id, &spec.serial) {
        (Some(id), None) => {
            let shape = id.strip_prefix("spiffe://").and_then(|rest| rest.split_once('/')).is_some_and(|(td, path)| !td.is_empty() && !path.is_empty());
            if !shape || id.len() > 2048 || id.chars().any(|c| c.is_whitespace() || c.is_control()) {
                errors.push(FieldError::new("spec.spiffeId", format!("{id:?} is not a SPIFFE id (spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/SERVICE_ACCOUNT)")));
            }
            let issued_before = match spec.issued_before.as_deref().map(parse_rfc3339) {
                None => None,
                Some(Ok(t)) => Some(t),
                Some(Err(e)) => {
                    errors.push(FieldError::new("spec.issuedBefore", e));
                    None
                }
            };
            Revocation::Identity { spiffe_id: id.clone(), issued_before }
        }
        (None, Some(serial)) => {
            if spec.issued_before.is_some() {
                errors.push(FieldError::new("spec.issuedBefore", "only with spiffeId: a serial names one certificate"));
            }
            match normalize_serial(serial) {
                Some(s) => Revocation::Serial(s),
                None => {
                    errors.push(FieldError::new("spec.serial", format!("{serial:?} is not a certificate serial (hex digits, colons allowed)")));
                    Revocation::Serial(String::new())
                }
            }
        }
        (Some(_), Some(_)) => {
            errors.push(FieldError::new("spec.serial", "a revocation names a spiffeId or a serial, not both"));
            Revocation::Serial(String::new())
        }
        (None, None) => {
            errors.push(FieldError::new("spec.spiffeId", "a revocation needs a spiffeId or a serial"));
            Revocation::Serial(String::new())
        }
    };
    if errors.is_empty() {
        Ok(revocation)
    } else {
        Err(errors)
    }
}

/// A validated ACL object's spec.
#[derive(Debug, Clone, PartialEq)]
pub enum AclSpec {
    Policy(Policy),
    Role(RoleSpec),
    Token(Token),
    Revocation(Revocation),
}

pub fn validate(kind: Kind, spec: &serde_json::Value) -> Result<AclSpec, Vec<FieldError>> {
    match kind {
        Kind::Policy => validate_policy(&super::parse_spec(spec)?).map(AclSpec::Policy),
        Kind::Role => validate_role(&super::parse_spec(spec)?).map(AclSpec::Role),
        Kind::Token => validate_token(super::parse_spec(spec)?).map(AclSpec::Token),
        Kind::CertificateRevocation => validate_revocation(&super::parse_spec(spec)?).map(AclSpec::Revocation),
        other => Err(vec![FieldError::new("kind", format!("{other} is not an ACL kind"))]),
    }
}

pub fn validate_policy(spec: &PolicySpec) -> Result<Policy, Vec<FieldError>> {
    let mut errors = Vec::new();
    if spec.rules.is_empty() {
        errors.push(FieldError::new("spec.rules", "a policy needs at least one rule"));
    }
    let mut rules = Vec::new();
    for (i, r) in spec.rules.iter().enumerate() {
        let path = format!("spec.rules[{i}]");
        let mut verbs = Verbs::default();
        for (j, v) in r.verbs.iter().enumerate() {
            match v.as_str() {
                "*" => verbs = Verbs::all(),
                v => match Verb::ALL.iter().find(|x| x.as_str() == v) {
                    Some(x) => verbs = verbs.with(*x),
                    None => errors
                        .push(FieldError::new(format!("{path}.verbs[{j}]"), format!("unknown verb {v:?}; expected read, write, delete, watch, admin or *"))),
                },
            }
        }
        let mut kinds = Some(BTreeSet::new());
        for (j, k) in r.kinds.iter().enumerate() {
            if k == "*" {
                kinds = None;
                continue;
            }
            match Kind::from_cli_name(k) {
                Some(kind) if kind.is_acl() => errors.push(FieldError::new(
                    format!("{path}.kinds[{j}]"),
                    format!("{kind} objects are governed by admin on the cluster: a rule with verbs [admin], kinds [\"*\"] and namespaces [\"*\"]"),
                )),
                Some(kind) => {
                    if let Some(set) = kinds.as_mut() {
                        set.insert(kind);
                    }
                }
                None => errors.push(FieldError::new(format!("{path}.kinds[{j}]"), format!("unknown kind {k:?}; known kinds: {}", Kind::cli_names_help()))),
            }
        }
        let mut namespaces = Vec::new();
        for (j, n) in r.namespaces.iter().enumerate() {
            match parse_name_pattern(n) {
                Ok(p) => namespaces.push(p),
                Err(e) => errors.push(FieldError::new(format!("{path}.namespaces[{j}]"), e)),
            }
        }
        for (field, empty) in [("verbs", r.verbs.is_empty()), ("kinds", r.kinds.is_empty()), ("namespaces", r.namespaces.is_empty())] {
            if empty {
                errors.push(FieldError::new(format!("{path}.{field}"), "required: at least one (\"*\" for all)"));
            }
        }
        for (j, h) in r.hostnames.iter().enumerate() {
            if let Err(e) = check_hostname_pattern(h) {
                errors.push(FieldError::new(format!("{path}.hostnames[{j}]"), e));
            }
        }
        let writes_registry = verbs.allows(Verb::Write) && kinds.as_ref().is_none_or(|k| k.contains(&Kind::Service) || k.contains(&Kind::Instance));
        if !r.hostnames.is_empty() && !writes_registry {
            errors.push(FieldError::new(
                format!("{path}.hostnames"),
                "hostnames are claimed by registry services and instances: the rule must grant write on services or instances (or kinds [\"*\"])",
            ));
        }
        rules.push(Rule { verbs, kinds, namespaces, hostnames: r.hostnames.clone() });
    }
    if errors.is_empty() {
        Ok(Policy { rules })
    } else {
        Err(errors)
    }
}

/// A `hostnames` entry: `*`, `*.` and a DNS subdomain, or a DNS subdomain.
fn check_hostname_pattern(h: &str) -> Result<(), String> {
    if h == "*" {
        return Ok(());
    }
    check_dns_subdomain(h.strip_prefix("*.").unwrap_or(h))
        .map_err(|e| format!("{h:?}: {e} (expected a lower-case hostname, *.DOMAIN for its subdomains, or * for any hostname no namespace owns)"))
}

/// Whether a `hostnames` entry covers `hostname` (an exact name, or a
/// wildcard no broader than the entry).
pub fn hostname_pattern_covers(pattern: &str, hostname: &str) -> bool {
    super::istio::host_matches(pattern, hostname.trim_end_matches('.'))
}

fn parse_name_pattern(n: &str) -> Result<NamePattern, String> {
    if n == "*" {
        return Ok(NamePattern::Any);
    }
    if let Some(prefix) = n.strip_suffix('*') {
        let ok = !prefix.is_empty() && prefix.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') && !prefix.starts_with('-');
        return if ok {
            Ok(NamePattern::Prefix(prefix.to_string()))
        } else {
            Err(format!("{n:?}: a wildcard is *, or a namespace prefix (lower case alphanumerics and '-') followed by *"))
        };
    }
    super::resource::check_dns_label(n)?;
    Ok(NamePattern::Exact(n.to_string()))
}

fn check_names(field: &str, names: &[String], errors: &mut Vec<FieldError>) {
    for (i, n) in names.iter().enumerate() {
        if let Err(e) = check_dns_subdomain(n) {
            errors.push(FieldError::new(format!("{field}[{i}]"), e));
        }
    }
}

pub fn validate_role(spec: &RoleSpec) -> Result<RoleSpec, Vec<FieldError>> {
    let mut errors = Vec::new();
    if spec.policies.is_empty() {
        errors.push(FieldError::new("spec.policies", "a role needs at least one policy"));
    }
    check_names("spec.policies", &spec.policies, &mut errors);
    for (i, id) in spec.identities.iter().enumerate() {
        if id.is_empty() || id.len() > 1024 || id.chars().any(char::is_control) {
            errors.push(FieldError::new(format!("spec.identities[{i}]"), "must be 1 to 1024 characters, none of them control characters"));
        }
    }
    if errors.is_empty() {
        Ok(spec.clone())
    } else {
        Err(errors)
    }
}

pub fn validate_token(spec: TokenSpec) -> Result<Token, Vec<FieldError>> {
    let mut errors = Vec::new();
    match (spec.token_type, &spec.proxy) {
        (TokenType::Proxy, None) => errors.push(FieldError::new("spec.proxy", "a proxy token needs the identity it stands for (namespace, optionally name)")),
        (TokenType::Proxy, Some(b)) => {
            if let Err(e) = b.check() {
                errors.push(FieldError::new("spec.proxy", e));
            }
        }
        (_, Some(_)) => errors.push(FieldError::new("spec.proxy", "only a token of type proxy is bound to a proxy identity")),
        (TokenType::Client, None) if spec.policies.is_empty() && spec.roles.is_empty() => {
            errors.push(FieldError::new("spec.policies", "a token needs at least one policy or role"))
        }
        _ => {}
    }
    validate_join(&spec, &mut errors);
    check_names("spec.policies", &spec.policies, &mut errors);
    check_names("spec.roles", &spec.roles, &mut errors);
    let mut expires_at = None;
    for (field, value) in [("spec.createdAt", &spec.created_at), ("spec.expiresAt", &spec.expires_at)] {
        if let Some(v) = value {
            match parse_rfc3339(v) {
                Ok(t) if field == "spec.expiresAt" => expires_at = Some(t),
                Ok(_) => {}
                Err(e) => errors.push(FieldError::new(field, e)),
            }
        }
    }
    let hash = spec.secret_hash.strip_prefix(HASH_PREFIX).and_then(parse_hex32);
    if hash.is_none() {
        // Never echo the value: it is a secret's hash.
        errors.push(FieldError::new(format!("spec.{SECRET_HASH_FIELD}"), format!("expected {HASH_PREFIX} and 64 lowercase hex digits")));
    }
    match (errors.is_empty(), hash) {
        (true, Some(secret_hash)) => Ok(Token { spec, expires_at, secret_hash }),
        _ => Err(errors),
    }
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

// Civil dates (proleptic Gregorian, UTC), after Howard Hinnant's
// days_from_civil / civil_from_days.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `2026-11-23T10:00:00Z` for unix seconds.
pub fn format_rfc3339(secs: u64) -> String {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

/// Unix seconds of a UTC RFC 3339 time (`Z`; fractions of a second ignored).
pub fn parse_rfc3339(s: &str) -> Result<u64, String> {
    let err = || format!("{s:?}: expected an RFC 3339 UTC time, e.g. 2026-01-31T12:00:00Z");
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' || b[16] != b':' || !s.ends_with('Z') {
        return Err(err());
    }
    let frac = &s[19..s.len() - 1];
    if !(frac.is_empty() || (frac.starts_with('.') && frac.len() > 1 && frac[1..].bytes().all(|c| c.is_ascii_digit()))) {
        return Err(err());
    }
    let num = |r: std::ops::Range<usize>| s.get(r).filter(|t| t.bytes().all(|c| c.is_ascii_digit())).and_then(|t| t.parse::<i64>().ok()).ok_or_else(err);
    let (y, mo, d, h, mi, se) = (num(0..4)?, num(5..7)?, num(8..10)?, num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 || y < 1970 {
        return Err(err());
    }
    let days = days_from_civil(y, mo, d);
    if civil_from_days(days) != (y, mo, d) {
        return Err(err());
    }
    Ok((days * 86_400 + h * 3600 + mi * 60 + se) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn times_round_trip() {
        assert_eq!(format_rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_rfc3339(1_795_000_000), "2026-11-18T11:06:40Z");
        for t in [0, 951_782_400, 1_795_000_000, 4_102_444_799] {
            assert_eq!(parse_rfc3339(&format_rfc3339(t)), Ok(t));
        }
        assert_eq!(parse_rfc3339("2026-11-18T11:06:40.250Z"), Ok(1_795_000_000));
        for bad in ["2026-02-30T00:00:00Z", "2026-11-18 07:06:40Z", "2026-11-18T07:06:40+01:00", "x", "2026-13-01T00:00:00Z"] {
            assert!(parse_rfc3339(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn policy_errors_name_the_field() {
        let spec = json!({"rules": [{"verbs": ["read", "wrte"], "kinds": ["vs", "pods", "Token"], "namespaces": ["a", "b-*", "-*", "B"]}, {"verbs": [], "kinds": ["*"], "namespaces": ["*"]}]});
        let errs = match validate(Kind::Policy, &spec) {
            Err(e) => e,
            Ok(p) => panic!("{p:?}"),
        };
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.rules[0].verbs[1]",
                "spec.rules[0].kinds[1]",
                "spec.rules[0].kinds[2]",
                "spec.rules[0].namespaces[2]",
                "spec.rules[0].namespaces[3]",
                "spec.rules[1].verbs"
            ]
        );
        assert!(validate(Kind::Policy, &json!({"rules": [{"verbs": ["read"], "kinds": ["*"], "namespaces": ["*"]}], "extra": 1})).is_err());
    }

    #[test]
    fn rules_compile() {
        let Ok(AclSpec::Policy(p)) = validate(
            Kind::Policy,
            &json!({"rules": [{"verbs": ["*"], "kinds": ["*"], "namespaces": ["*"]}, {"verbs": ["read"], "kinds": ["vs", "dr"], "namespaces": ["team-*"]}]}),
        ) else {
            panic!()
        };
        assert!(p.rules[0].covers_everything() && p.rules[0].verbs.allows(Verb::Delete));
        assert!(!p.rules[1].covers_everything());
        assert!(p.rules[1].verbs.allows(Verb::Read) && !p.rules[1].verbs.allows(Verb::Write));
        assert!(p.rules[1].namespaces[0].matches("team-x") && !p.rules[1].namespaces[0].matches("other"));
        assert_eq!(p.rules[1].kinds.as_ref().map(|k| k.len()), Some(2));
    }

    #[test]
    fn hostname_grants() {
        let rule = |hostnames: serde_json::Value, verbs: serde_json::Value, kinds: serde_json::Value| json!({"rules": [{"verbs": verbs, "kinds": kinds, "namespaces": ["a"], "hostnames": hostnames}]});
        let Ok(AclSpec::Policy(p)) = validate(Kind::Policy, &rule(json!(["*.a.example.com", "api.example.com", "*"]), json!(["write"]), json!(["services"])))
        else {
            panic!()
        };
        assert_eq!(p.rules[0].hostnames, ["*.a.example.com", "api.example.com", "*"]);
        assert!(hostname_pattern_covers("*.a.example.com", "pay.a.example.com") && !hostname_pattern_covers("*.a.example.com", "a.example.com"));
        assert!(hostname_pattern_covers("api.example.com", "api.example.com.") && !hostname_pattern_covers("api.example.com", "x.api.example.com"));
        assert!(hostname_pattern_covers("*", "anything.example"));
        // Bad patterns, and a rule that writes no registry objects.
        let errs = validate(Kind::Policy, &rule(json!(["API.example.com", "*foo.com", "a*.b", ""]), json!(["write"]), json!(["*"]))).unwrap_err();
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["spec.rules[0].hostnames[0]", "spec.rules[0].hostnames[1]", "spec.rules[0].hostnames[2]", "spec.rules[0].hostnames[3]"]);
        for (verbs, kinds) in [(json!(["read"]), json!(["services"])), (json!(["write"]), json!(["vs"]))] {
            let errs = validate(Kind::Policy, &rule(json!(["api.example.com"]), verbs, kinds)).unwrap_err();
            assert_eq!(errs[0].field, "spec.rules[0].hostnames", "{errs:?}");
        }
        // Stored policies without the field read as before.
        let Ok(AclSpec::Policy(p)) = validate(Kind::Policy, &json!({"rules": [{"verbs": ["*"], "kinds": ["*"], "namespaces": ["*"]}]})) else { panic!() };
        assert!(p.rules[0].hostnames.is_empty());
    }

    #[test]
    fn tokens() {
        let hash = format!("{HASH_PREFIX}{}", "ab".repeat(32));
        let ok = json!({"policies": ["p"], "expiresAt": "2030-01-01T00:00:00Z", "secretHash": hash});
        let Ok(AclSpec::Token(t)) = validate(Kind::Token, &ok) else { panic!() };
        assert_eq!(t.expires_at, Some(1_893_456_000));
        assert_eq!(t.secret_hash, [0xab; 32]);
        let errs = validate(Kind::Token, &json!({"secretHash": "md5:x"})).unwrap_err();
        assert_eq!(errs.iter().map(|e| e.field.as_str()).collect::<Vec<_>>(), ["spec.policies", "spec.secretHash"]);
        assert!(!errs.iter().any(|e| e.reason.contains("md5:x")));
        let errs = validate(Kind::Token, &json!({"type": "bogus", "policies": ["p"], "secretHash": hash})).unwrap_err();
        assert_eq!(errs[0].field, "spec.type");
    }

    #[test]
    fn join_tokens() {
        let hash = format!("{HASH_PREFIX}{}", "ab".repeat(32));
        let ok =
            json!({"type": "join", "join": {"namespace": "shop", "serviceAccount": "cart", "uses": 2, "cidrs": ["10.0.0.0/8", "::1/128"]}, "secretHash": hash});
        let Ok(AclSpec::Token(t)) = validate(Kind::Token, &ok) else { panic!() };
        let j = t.spec.join.unwrap();
        assert!(j.allows("10.1.2.3".parse().unwrap()));
        assert!(j.allows("::ffff:10.1.2.3".parse().unwrap()));
        assert!(!j.allows("11.0.0.1".parse().unwrap()));
        assert!(JoinBinding { cidrs: vec![], ..(*j).clone() }.allows("11.0.0.1".parse().unwrap()));
        let bad = json!({"type": "join", "policies": ["p"], "join": {"namespace": "Shop", "serviceAccount": "cart", "uses": 0, "cidrs": ["10.0.0.0/33"]}, "secretHash": hash});
        let errs = validate(Kind::Token, &bad).unwrap_err();
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["spec.policies", "spec.join.namespace", "spec.join.uses", "spec.join.cidrs[0]"]);
        let errs = validate(Kind::Token, &json!({"type": "join", "secretHash": hash})).unwrap_err();
        assert_eq!(errs[0].field, "spec.join");
        // A host's join token; not both; a bad host name.
        let host = json!({"type": "join", "join": {"host": "node-a.example", "uses": 1}, "secretHash": hash});
        let Ok(AclSpec::Token(t)) = validate(Kind::Token, &host) else { panic!() };
        assert_eq!(t.spec.join.unwrap().host.as_deref(), Some("node-a.example"));
        let both = json!({"type": "join", "join": {"host": "a", "namespace": "shop", "serviceAccount": "cart"}, "secretHash": hash});
        assert_eq!(validate(Kind::Token, &both).unwrap_err()[0].field, "spec.join.host");
        let bad = json!({"type": "join", "join": {"host": "Node_A"}, "secretHash": hash});
        assert_eq!(validate(Kind::Token, &bad).unwrap_err()[0].field, "spec.join.host");
        // A workload token without its namespace (and no host) names the field.
        let none = json!({"type": "join", "join": {"uses": 1}, "secretHash": hash});
        assert_eq!(validate(Kind::Token, &none).unwrap_err()[0].field, "spec.join.namespace");
        let errs = validate(Kind::Token, &json!({"policies": ["p"], "join": {"namespace": "a", "serviceAccount": "b"}, "secretHash": hash})).unwrap_err();
        assert_eq!(errs[0].field, "spec.join");
    }

    #[test]
    fn revocations_name_an_identity_or_a_serial() {
        let ok = |spec: serde_json::Value| match validate(Kind::CertificateRevocation, &spec) {
            Ok(AclSpec::Revocation(r)) => r,
            other => panic!("{spec}: {other:?}"),
        };
        let id = "spiffe://cluster.local/ns/shop/sa/cart";
        assert_eq!(
            ok(json!({"spiffeId": id, "issuedBefore": "2026-01-01T00:00:00Z", "reason": "leaked"})),
            Revocation::Identity { spiffe_id: id.into(), issued_before: Some(parse_rfc3339("2026-01-01T00:00:00Z").unwrap()) }
        );
        assert_eq!(ok(json!({"spiffeId": id})), Revocation::Identity { spiffe_id: id.into(), issued_before: None });
        assert_eq!(ok(json!({"serial": "00:6E:B2:26"})), Revocation::Serial("6eb226".into()));
        assert_eq!(normalize_serial("serial=0A1B"), Some("a1b".into()));
        assert_eq!(normalize_serial("00"), Some("0".into()));
        assert_eq!(normalize_serial("xyz"), None);
        let field = |spec: serde_json::Value| validate(Kind::CertificateRevocation, &spec).unwrap_err()[0].field.clone();
        assert_eq!(field(json!({})), "spec.spiffeId");
        assert_eq!(field(json!({"spiffeId": id, "serial": "01"})), "spec.serial");
        assert_eq!(field(json!({"spiffeId": "cluster.local/ns/a/sa/b"})), "spec.spiffeId");
        assert_eq!(field(json!({"spiffeId": id, "issuedBefore": "yesterday"})), "spec.issuedBefore");
        assert_eq!(field(json!({"serial": "01", "issuedBefore": "2026-01-01T00:00:00Z"})), "spec.issuedBefore");
        assert_eq!(field(json!({"serial": "not hex"})), "spec.serial");
        assert_eq!(field(json!({"serial": "01", "extra": 1})), "spec.extra");
    }
}
