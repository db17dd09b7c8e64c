//! A small mesh of two namespaces: a VirtualService splitting a host, a
//! Sidecar narrowing a namespace's egress, and ALLOW, DENY and
//! request-dependent policies; then the same mesh as a token that reads
//! one namespace sees it.

use super::*;
use crate::analyze::files::{load, Source};
use crate::translate::mesh::MeshConfig;

const MESH: &str = r#"
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {name: web, namespace: shop}
spec: {ports: [{name: http, number: 8000}]}
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: web-1, namespace: shop, labels: {app: web}}
spec: {service: web, address: 127.0.0.1, port: 8000, serviceAccount: web}
---
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {name: reviews, namespace: shop}
spec: {ports: [{name: http, number: 9080}]}
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: reviews-1, namespace: shop, labels: {app: reviews, version: v1}}
spec: {service: reviews, address: 127.0.0.2, port: 9080, serviceAccount: reviews}
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: reviews-2, namespace: shop, labels: {app: reviews, version: v2}}
spec: {service: reviews, address: 127.0.0.3, port: 9080, serviceAccount: reviews}
---
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {name: canary, namespace: shop}
spec: {ports: [{name: http, number: 9080}]}
---
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {name: ratings, namespace: shop}
spec: {ports: [{name: http, number: 9090}]}
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: ratings-1, namespace: shop, labels: {app: ratings}}
spec: {service: ratings, address: 127.0.0.4, port: 9090, serviceAccount: ratings}
---
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {name: payments, namespace: billing}
spec: {ports: [{name: http, number: 7000}]}
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: payments-1, namespace: billing, labels: {app: payments}}
spec: {service: payments, address: 127.0.0.5, port: 7000, serviceAccount: payments}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: shop}
spec:
  hosts: [reviews]
  http:
  - route:
    - {destination: {host: reviews}, weight: 90}
    - {destination: {host: canary}, weight: 10}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: billing}
spec:
  egress: [{hosts: ["./*"]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: payments-from-web, namespace: billing}
spec:
  selector: {matchLabels: {app: payments}}
  action: ALLOW
  rules: [{from: [{source: {principals: [cluster.local/ns/shop/sa/web]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-reviews, namespace: shop}
spec:
  selector: {matchLabels: {app: ratings}}
  action: DENY
  rules: [{from: [{source: {principals: ["*/sa/reviews"]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: reviews-get, namespace: shop}
spec:
  selector: {matchLabels: {app: reviews}}
  action: ALLOW
  rules: [{to: [{operation: {methods: [GET]}}]}]
"#;

fn mesh() -> Mesh {
    mesh_with("")
}

/// [`MESH`] with `more` documents.
fn mesh_with(more: &str) -> Mesh {
    let loaded = load(&[Source { name: "mesh.yaml".into(), text: format!("{MESH}{more}") }], "default");
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    Mesh::build(&loaded.state, Arc::new(MeshConfig::default()))
}

fn short(host: &str) -> &str {
    host.trim_end_matches(".svc.cluster.local")
}

/// Each edge as one line: `from -> to (host) verdict via ...`.
fn lines(t: &Topology) -> Vec<String> {
    t.edges
        .iter()
        .map(|e| {
            let via: Vec<String> = e.via.iter().map(|v| format!("{} {}/{} ({})", v.kind, v.namespace, v.name, v.role)).collect();
            let host = e.host.as_deref().map(|h| format!(" (as {})", short(h))).unwrap_or_default();
            format!("{} -> {}{host}: {:?}; {}", short(&e.from), short(&e.to), e.verdict, via.join(", "))
        })
        .collect()
}

#[test]
fn edges_follow_routes_sidecars_and_policies() {
    let t = topology(&mesh(), |_| true, None, 1000);
    assert_eq!(
        lines(&t),
        [
            // Each caller in hostname order, each host it can reach in turn;
            // payments' Sidecar admits its own namespace only: it calls nothing.
            "ratings.shop -> canary.shop: Allowed; ",
            "ratings.shop -> payments.billing: Denied; AuthorizationPolicy billing/payments-from-web (allow)",
            // The host reviews is routed: to canary and reviews.
            "ratings.shop -> canary.shop (as reviews.shop): Allowed; VirtualService shop/reviews (route)",
            "ratings.shop -> reviews.shop: Conditional; VirtualService shop/reviews (route), AuthorizationPolicy shop/reviews-get (allow)",
            "ratings.shop -> web.shop: Allowed; ",
            "reviews.shop -> canary.shop: Allowed; ",
            "reviews.shop -> payments.billing: Denied; AuthorizationPolicy billing/payments-from-web (allow)",
            "reviews.shop -> ratings.shop: Denied; AuthorizationPolicy shop/no-reviews (deny)",
            // (not to itself)
            "reviews.shop -> canary.shop (as reviews.shop): Allowed; VirtualService shop/reviews (route)",
            "reviews.shop -> web.shop: Allowed; ",
            "web.shop -> canary.shop: Allowed; ",
            "web.shop -> payments.billing: Allowed; AuthorizationPolicy billing/payments-from-web (allow)",
            "web.shop -> ratings.shop: Allowed; ",
            "web.shop -> canary.shop (as reviews.shop): Allowed; VirtualService shop/reviews (route)",
            "web.shop -> reviews.shop: Conditional; VirtualService shop/reviews (route), AuthorizationPolicy shop/reviews-get (allow)",
        ]
    );
    let web_reviews = t.edges.iter().find(|e| e.from.starts_with("web.") && e.to.starts_with("reviews.")).unwrap();
    assert_eq!(web_reviews.reason, "allowed for some requests by shop/reviews-get");
    let payments = t.services.iter().find(|n| n.hostname.starts_with("payments.")).unwrap();
    assert_eq!(payments.sidecar.as_ref().map(|s| (s.name.as_str(), s.role)), Some(("default", "egress")));
    // What applies to each service: its routes, rules and policies.
    let applies = |host: &str| {
        let n = t.services.iter().find(|n| n.hostname.starts_with(host)).unwrap();
        n.applies.iter().map(|v| format!("{} {}/{} ({})", v.kind, v.namespace, v.name, v.role)).collect::<Vec<_>>()
    };
    assert_eq!(applies("reviews."), ["VirtualService shop/reviews (route)", "AuthorizationPolicy shop/reviews-get (allow)"]);
    assert_eq!(applies("ratings."), ["AuthorizationPolicy shop/no-reviews (deny)"]);
    assert_eq!(applies("payments."), ["AuthorizationPolicy billing/payments-from-web (allow)"]);
    assert!(applies("canary.").is_empty());
}

/// A service of another namespace that no policy or Sidecar governs.
const AUDIT: &str = r#"
---
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {name: audit, namespace: ops}
spec: {ports: [{name: http, number: 7100}]}
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: audit-1, namespace: ops, labels: {app: audit}}
spec: {service: audit, address: 127.0.0.6, port: 7100}
"#;

#[test]
fn a_reader_of_one_namespace_sees_only_it() {
    let t = topology(&mesh_with(AUDIT), |k| k.namespace.as_str() == "shop", None, 1000);
    assert!(t.services.iter().all(|n| n.namespace == "shop" && n.applies.iter().all(|v| v.namespace == "shop")), "{:?}", t.services);
    assert!(t.edges.iter().all(|e| e.from_namespace == "shop" && e.to_namespace == "shop"), "{:?}", lines(&t));
    assert!(lines(&t).contains(&"web.shop -> ratings.shop: Allowed; ".to_string()));
    // A namespace asked for: edges with an end there (and not the others').
    let billing = topology(&mesh(), |_| true, Some("billing"), 1000);
    assert!(billing.edges.iter().all(|e| e.from_namespace == "billing" || e.to_namespace == "billing"), "{:?}", lines(&billing));
    assert_eq!(billing.edges.len(), 3, "{:?}", lines(&billing));
}

#[test]
fn the_limit_bounds_the_edges() {
    let t = topology(&mesh(), |_| true, None, 2);
    assert_eq!((t.edges.len(), t.truncated), (2, true));
}

#[test]
fn a_deny_for_some_requests_makes_an_edge_conditional() {
    let more = r#"
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-web-posts, namespace: shop}
spec:
  selector: {matchLabels: {app: ratings}}
  action: DENY
  rules: [{from: [{source: {namespaces: [shop]}}], to: [{operation: {methods: [POST]}}]}]
"#;
    let t = topology(&mesh_with(more), |_| true, None, 1000);
    let e = t.edges.iter().find(|e| e.from.starts_with("web.") && e.to.starts_with("ratings.")).unwrap();
    assert_eq!((e.verdict, e.reason.as_str()), (Verdict::Conditional, "some requests denied by shop/no-web-posts"));
    assert_eq!(e.via.iter().map(|v| (v.name.as_str(), v.role)).collect::<Vec<_>>(), [("no-web-posts", "deny")]);
    // The DENY for every request from reviews still wins over it.
    let e = t.edges.iter().find(|e| e.from.starts_with("reviews.") && e.to.starts_with("ratings.")).unwrap();
    assert_eq!(e.verdict, Verdict::Denied);
}

#[test]
fn a_caller_scoped_by_a_sidecar_it_may_not_read_is_left_out() {
    // Every object readable but the Sidecar: payments' calls cannot be
    // told, so none is shown (not the calls it would make without it).
    let t = topology(&mesh(), |k| k.kind != crate::model::Kind::Sidecar, None, 1000);
    assert!(t.edges.iter().all(|e| !e.from.starts_with("payments.")), "{:?}", lines(&t));
    assert!(t.services.iter().all(|n| n.sidecar.is_none()));
}
