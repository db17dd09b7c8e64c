//! Who owns a hostname, and which hostnames an object claims: the walls
//! between namespaces in the service model.
//!
//! - `NAME.NS.svc.DOMAIN` (any name depth), `NAME.NS.svc` and wildcards
//!   inside them (`*.NS.svc.DOMAIN`) belong to namespace `NS`, as a
//!   Kubernetes Service's name does: only objects in `NS` attach to them.
//! - A wildcard that reaches into several namespaces' names (`*.svc.DOMAIN`,
//!   `*.DOMAIN`, `*.local`, a partial `*b.svc.DOMAIN`) belongs to no one
//!   namespace and is claimed by nobody.
//! - Every other hostname (`api.example.com`, `db.internal`) is owned by no
//!   namespace. A ServiceEntry claims it freely (Istio's ServiceEntries
//!   name any external host); a registry Service or Instance needs a
//!   policy that grants it (`hostnames` in a Policy rule, checked by the
//!   API at write time). When several namespaces claim one, each proxy
//!   resolves it (`mesh::resolve`).
//!
//! The same rule runs at write time (the API refuses the write) and in
//! `Mesh::build` (an object stored before, or restored from an old backup,
//! attaches nothing to another namespace's hostname): pure, so the same on
//! every replica.

use crate::model::istio::{resolve_short_name, Validated};
use crate::model::{Kind, TypedSpec};

/// Who a hostname belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// Under `NS.svc.DOMAIN` (or `NS.svc`).
    Namespace(String),
    /// A wildcard covering names of every namespace: claimed by nobody.
    Namespaces,
    /// Outside the mesh's service domain.
    Nobody,
}

/// The owner of `host` (as an object names it: a short name already
/// resolved; any case, a trailing dot tolerated) in a mesh whose domain
/// suffix is `suffix`.
pub fn owner(host: &str, suffix: &str) -> Owner {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let svc = format!(".svc.{suffix}");
    if let Some(rest) = host.strip_prefix('*') {
        // A wildcard covers every name that ends with `rest`.
        return match rest.strip_suffix(svc.as_str()).or_else(|| rest.strip_suffix(".svc")) {
            // `*.NS.svc.DOMAIN`, `*x.NS.svc.DOMAIN`: NS is spelled out.
            Some(before) => match before.rsplit_once('.') {
                Some((_, ns)) if !ns.is_empty() => Owner::Namespace(ns.to_string()),
                _ => Owner::Namespaces,
            },
            // `*.svc.DOMAIN`, `*.DOMAIN`, `*c.DOMAIN`...: any namespace's.
            None if svc.ends_with(rest) || ".svc".ends_with(rest) => Owner::Namespaces,
            None => Owner::Nobody,
        };
    }
    match host.strip_suffix(svc.as_str()).or_else(|| host.strip_suffix(".svc")) {
        Some(before) if !before.is_empty() => Owner::Namespace(before.rsplit('.').next().unwrap_or(before).to_string()),
        _ => Owner::Nobody,
    }
}

/// One hostname an object claims, and the field that says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// `spec.hostname`, `spec.service`, `spec.hosts[1]`.
    pub field: String,
    pub hostname: String,
}

/// The hostnames an object claims: a registry Service its hostname, an
/// Instance its service's, a ServiceEntry its hosts (short names resolved
/// in its namespace). Nothing for other kinds.
pub fn claims(kind: Kind, namespace: &str, name: &str, typed: &TypedSpec, suffix: &str) -> Vec<Claim> {
    let claim = |field: String, hostname: String| Claim { field, hostname };
    match typed {
        TypedSpec::Service(s) => {
            vec![claim("spec.hostname".into(), s.hostname.clone().unwrap_or_else(|| format!("{name}.{namespace}.svc.{suffix}")))]
        }
        TypedSpec::Instance(i) => vec![claim("spec.service".into(), super::instance_hostname(i, namespace, suffix))],
        TypedSpec::Istio(Validated::ServiceEntry { spec, .. }) if kind == Kind::ServiceEntry => {
            spec.hosts.iter().enumerate().map(|(i, h)| claim(format!("spec.hosts[{i}]"), resolve_short_name(h, namespace, suffix))).collect()
        }
        _ => Vec::new(),
    }
}

/// Why an object in `namespace` may not claim `hostname`: another
/// namespace owns it, or it spans every namespace's names. `None`: it may
/// (a registry object still needs a grant for one no namespace owns, see
/// [`needs_grant`]).
pub fn refusal(namespace: &str, hostname: &str, suffix: &str) -> Option<String> {
    match owner(hostname, suffix) {
        Owner::Namespace(ns) if ns == namespace => None,
        Owner::Namespace(ns) => Some(format!(
            "{hostname} belongs to namespace {ns} (NAME.{ns}.svc.{suffix} names are namespace {ns}'s): an object in {namespace} may claim \
             NAME.{namespace}.svc.{suffix}, or a hostname outside svc.{suffix}"
        )),
        Owner::Namespaces => {
            Some(format!("{hostname} covers the hostnames of every namespace (svc.{suffix}): no namespace may claim it; name your own hostnames instead"))
        }
        Owner::Nobody => None,
    }
}

/// Whether claiming `hostname` from `namespace` with an object of `kind`
/// takes a policy grant (`hostnames` in a rule): a registry Service or
/// Instance naming a hostname outside its namespace's own.
pub fn needs_grant(kind: Kind, namespace: &str, hostname: &str, suffix: &str) -> bool {
    matches!(kind, Kind::Service | Kind::Instance) && owner(hostname, suffix) != Owner::Namespace(namespace.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(h: &str) -> Owner {
        owner(h, "cluster.local")
    }
    fn ns(n: &str) -> Owner {
        Owner::Namespace(n.into())
    }

    #[test]
    fn owners() {
        assert_eq!(o("reviews.team-b.svc.cluster.local"), ns("team-b"));
        assert_eq!(o("Reviews.Team-B.svc.cluster.local."), ns("team-b"));
        assert_eq!(o("a.b.team-b.svc.cluster.local"), ns("team-b"));
        assert_eq!(o("team-b.svc.cluster.local"), ns("team-b"));
        assert_eq!(o("reviews.team-b.svc"), ns("team-b"));
        assert_eq!(o("*.team-b.svc.cluster.local"), ns("team-b"));
        assert_eq!(o("*x.team-b.svc.cluster.local"), ns("team-b"));
        for every in ["*.svc.cluster.local", "*.cluster.local", "*.local", "*c.cluster.local", "*b.svc.cluster.local", "*-b.svc.cluster.local", "*.svc"] {
            assert_eq!(o(every), Owner::Namespaces, "{every}");
        }
        for nobody in ["api.example.com", "*.example.com", "db.internal", "cluster.local", "svc.cluster.local", "reviews.team-b", "*.com"] {
            assert_eq!(o(nobody), Owner::Nobody, "{nobody}");
        }
        // Another domain suffix.
        assert_eq!(owner("a.x.svc.example.org", "example.org"), ns("x"));
        assert_eq!(owner("a.x.svc.cluster.local", "example.org"), Owner::Nobody);
    }

    #[test]
    fn refusals_and_grants() {
        assert!(refusal("team-a", "reviews.team-a.svc.cluster.local", "cluster.local").is_none());
        let why = refusal("team-a", "reviews.team-b.svc.cluster.local", "cluster.local").unwrap();
        assert!(why.contains("belongs to namespace team-b") && why.contains("NAME.team-a.svc.cluster.local"), "{why}");
        assert!(refusal("team-a", "*.svc.cluster.local", "cluster.local").unwrap().contains("every namespace"));
        assert!(refusal("team-a", "api.example.com", "cluster.local").is_none());
        assert!(needs_grant(Kind::Service, "team-a", "api.example.com", "cluster.local"));
        assert!(needs_grant(Kind::Instance, "team-a", "api.example.com", "cluster.local"));
        assert!(!needs_grant(Kind::ServiceEntry, "team-a", "api.example.com", "cluster.local"));
        assert!(!needs_grant(Kind::Service, "team-a", "web.team-a.svc.cluster.local", "cluster.local"));
    }
}
