//! The per-proxy preview of a dry run (issue 35), against real Envoys on a
//! three-replica cluster: for a series of changes, `lodestar apply
//! --dry-run -o json` (which asks every replica) names exactly the proxies
//! whose config then changes, and for each exactly the resources Envoy's
//! own config_dump shows changing once the change is applied; a proxy the
//! change cannot reach (a Sidecar scope) is counted, not listed; a cluster
//! removed while routes still use it is called out first.

use crate::kit;
use kit::envoy::EnvoyOptions;
use kit::mesh::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Envoy's dynamic resources by (type, name), each as its JSON.
fn resources(dump: &Value) -> BTreeMap<(String, String), Value> {
    let mut out = BTreeMap::new();
    for c in dump["configs"].as_array().into_iter().flatten() {
        for x in c["dynamic_active_clusters"].as_array().into_iter().flatten() {
            out.insert(("CDS".into(), x["cluster"]["name"].as_str().unwrap_or_default().into()), x["cluster"].clone());
        }
        for x in c["dynamic_listeners"].as_array().into_iter().flatten() {
            out.insert(("LDS".into(), x["name"].as_str().unwrap_or_default().into()), x["active_state"]["listener"].clone());
        }
        for x in c["dynamic_route_configs"].as_array().into_iter().flatten() {
            out.insert(("RDS".into(), x["route_config"]["name"].as_str().unwrap_or_default().into()), x["route_config"].clone());
        }
        for x in c["dynamic_endpoint_configs"].as_array().into_iter().flatten() {
            out.insert(("EDS".into(), x["endpoint_config"]["cluster_name"].as_str().unwrap_or_default().into()), x["endpoint_config"].clone());
        }
    }
    out
}

/// What differs between two dumps: (type, name).
fn changed(before: &BTreeMap<(String, String), Value>, after: &BTreeMap<(String, String), Value>) -> BTreeSet<(String, String)> {
    before.keys().chain(after.keys()).filter(|k| before.get(*k) != after.get(*k)).cloned().collect()
}

/// Until `p`'s stream serves from `revision` (or newer) with every type
/// in sync: whether or not its config changed there (one whose config did
/// not change gets no new version to ACK).
async fn settled(p: &Proxy, revision: u64) {
    wait_syncz(&p.client, &p.api, &format!("{} at revision {revision}", p.id), |s| {
        s["proxies"].as_array().into_iter().flatten().any(|x| {
            x["id"] == p.id.as_str() && x["revision"].as_u64().is_some_and(|r| r >= revision) && TYPES.iter().all(|t| x["types"][t]["in_sync"] == true)
        })
    })
    .await;
}

const BASE: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews, namespace: default}
spec:
  hosts: [reviews.default.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http, protocol: HTTP}]
  endpoints:
  - {address: 127.0.0.1, ports: {http: 1}, labels: {version: v1}}
  - {address: 127.0.0.2, ports: {http: 1}, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec:
  host: reviews
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: echo, namespace: iso}
spec:
  hosts: [echo.iso.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 8080, name: http, protocol: HTTP}]
  endpoints: [{address: 127.0.0.6, ports: {http: 1}}]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: iso}
spec:
  egress: [{hosts: ["./*"]}]
"#;

/// The changes previewed then applied, in order: (what, YAML to apply or
/// `delete KIND/NAME`).
const CHANGES: &[(&str, &str)] = &[
    (
        "a split for reviews",
        r#"{apiVersion: networking.istio.io/v1, kind: VirtualService, metadata: {name: reviews, namespace: default},
            spec: {hosts: [reviews], http: [{route: [{destination: {host: reviews, subset: v1}, weight: 80}, {destination: {host: reviews, subset: v2}, weight: 20}]}]}}"#,
    ),
    (
        "its weights",
        r#"{apiVersion: networking.istio.io/v1, kind: VirtualService, metadata: {name: reviews, namespace: default},
            spec: {hosts: [reviews], http: [{route: [{destination: {host: reviews, subset: v1}, weight: 60}, {destination: {host: reviews, subset: v2}, weight: 40}]}]}}"#,
    ),
    (
        "a subset removed that the split still uses",
        r#"{apiVersion: networking.istio.io/v1, kind: DestinationRule, metadata: {name: reviews, namespace: default},
            spec: {host: reviews, subsets: [{name: v1, labels: {version: v1}}]}}"#,
    ),
    (
        "the subset back, with a connection pool",
        r#"{apiVersion: networking.istio.io/v1, kind: DestinationRule, metadata: {name: reviews, namespace: default},
            spec: {host: reviews, trafficPolicy: {connectionPool: {tcp: {maxConnections: 7}}},
                   subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]}}"#,
    ),
    (
        "an endpoint moved",
        r#"{apiVersion: networking.istio.io/v1, kind: ServiceEntry, metadata: {name: reviews, namespace: default},
            spec: {hosts: [reviews.default.svc.cluster.local], location: MESH_INTERNAL, resolution: STATIC, ports: [{number: 9080, name: http, protocol: HTTP}],
                   endpoints: [{address: 127.0.0.1, ports: {http: 1}, labels: {version: v1}}, {address: 127.0.0.3, ports: {http: 1}, labels: {version: v2}}]}}"#,
    ),
    (
        "a new service in iso, seen by both",
        r#"{apiVersion: networking.istio.io/v1, kind: ServiceEntry, metadata: {name: db, namespace: iso},
            spec: {hosts: [db.iso.svc.cluster.local], location: MESH_INTERNAL, resolution: STATIC, ports: [{number: 5432, name: tcp, protocol: TCP}],
                   endpoints: [{address: 127.0.0.4, ports: {tcp: 1}}]}}"#,
    ),
    (
        "a timeout on the split",
        r#"{apiVersion: networking.istio.io/v1, kind: VirtualService, metadata: {name: reviews, namespace: default},
            spec: {hosts: [reviews], http: [{timeout: 3s, route: [{destination: {host: reviews, subset: v1}, weight: 60}, {destination: {host: reviews, subset: v2}, weight: 40}]}]}}"#,
    ),
    ("the split deleted", "delete vs/default/reviews"),
    (
        "a new HTTP service in default only",
        r#"{apiVersion: networking.istio.io/v1, kind: ServiceEntry, metadata: {name: ratings, namespace: default},
            spec: {hosts: [ratings.default.svc.cluster.local], location: MESH_INTERNAL, resolution: STATIC, ports: [{number: 9081, name: http, protocol: HTTP}],
                   endpoints: [{address: 127.0.0.5, ports: {http: 1}}]}}"#,
    ),
    ("nothing at all (the same DestinationRule again)", ""),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_names_exactly_the_proxies_and_resources_envoy_then_changes() {
    let fx = Fixture::start(3).await;
    let base = fx.apply(BASE).await;
    let mut revision = base;
    fx.cluster.wait_for_revision(revision, BOUND).await;
    let web = fx.sidecar("web", 1, 1, false, revision).await;
    let mut o = EnvoyOptions::new("iso", &fx.ip(2));
    o.namespace = "iso".into();
    let iso = fx.proxy(o, 2, revision).await;
    let proxies = [&web, &iso];
    let dir = tempfile::tempdir().unwrap();
    let api = fx.api(3); // a replica with no proxy of its own: the CLI asks the others
    let mut last_dr = String::new();

    for (i, (what, change)) in CHANGES.iter().enumerate() {
        let before: Vec<_> = futures::future::join_all(proxies.iter().map(|p| p.envoy.config_dump())).await.iter().map(resources).collect();
        let (file, delete) = match change.strip_prefix("delete ") {
            Some(d) => (None, Some(d)),
            None => {
                let yaml = if change.is_empty() { last_dr.clone() } else { change.to_string() };
                if yaml.contains("kind: DestinationRule") {
                    last_dr = yaml.clone();
                }
                let f = dir.path().join(format!("{i}.yaml"));
                std::fs::write(&f, format!("---\n{yaml}\n")).unwrap();
                (Some(f), None)
            }
        };
        // Preview (deletes have no dry run: their effect is checked by the
        // next change's preview baseline only).
        let predicted: Option<Value> = file.as_ref().map(|f| {
            let (ok, out, err) = kit::cli(&api, &["apply", "-f", f.to_str().unwrap(), "--dry-run", "-o", "json"]);
            assert!(ok, "{what}: dry run: {err}");
            serde_json::from_str(&out).unwrap()
        });
        // The human summary, for the change that loses a cluster.
        let human = match (&file, *what) {
            (Some(f), "a subset removed that the split still uses") => kit::cli(&api, &["apply", "-f", f.to_str().unwrap(), "--dry-run"]).1,
            _ => String::new(),
        };
        if let Some(p) = &predicted {
            let replicas: BTreeSet<u64> = p["proxies"]["replicas"].as_array().unwrap().iter().filter_map(Value::as_u64).collect();
            assert_eq!(replicas, BTreeSet::from([1, 2, 3]), "{what}: every replica previewed: {p:#}");
            assert_eq!(p["proxies"]["changed"].as_array().unwrap().len() + p["proxies"]["unchanged"].as_u64().unwrap() as usize, 2, "{what}: {p:#}");
        }
        // Apply it for real; wait until both proxies have it.
        revision = match (&file, delete) {
            (Some(f), _) => fx.apply_via(3, &std::fs::read_to_string(f).unwrap()).await,
            (None, Some(path)) => {
                let (status, body) = kit::call(fx.client.delete(format!("{api}/v1/resources/{path}"))).await;
                assert_eq!(status, 200, "{what}: {body}");
                body["revision"].as_u64().unwrap_or_else(|| panic!("{what}: {body}"))
            }
            _ => unreachable!(),
        };
        fx.cluster.wait_for_revision(revision, BOUND).await;
        for p in proxies {
            settled(p, revision).await;
        }
        let Some(predicted) = predicted else { continue };
        let after: Vec<_> = futures::future::join_all(proxies.iter().map(|p| p.envoy.config_dump())).await.iter().map(resources).collect();
        for (n, p) in proxies.iter().enumerate() {
            let actual = changed(&before[n], &after[n]);
            let listed = predicted["proxies"]["changed"].as_array().unwrap().iter().find(|c| c["proxy"] == p.id.as_str());
            let said: BTreeSet<(String, String)> = listed
                .into_iter()
                .flat_map(|c| c["changes"].as_array().unwrap())
                .map(|r| (r["type"].as_str().unwrap().to_string(), r["name"].as_str().unwrap().to_string()))
                .collect();
            assert_eq!(said, actual, "{what}: {}: the preview's resources vs Envoy's config_dump\npreview: {predicted:#}", p.id);
        }
        match *what {
            "a subset removed that the split still uses" => {
                let first = &predicted["proxies"]["changed"][0];
                assert_eq!(first["proxy"], web.id.as_str(), "{predicted:#}");
                let lost = first["lostClusters"].as_array().unwrap_or_else(|| panic!("{predicted:#}"));
                assert!(lost.iter().any(|c| c.as_str().is_some_and(|c| c.contains("|v2|"))), "{predicted:#}");
                assert!(human.contains("would lose cluster(s) its routes still use"), "{human}");
            }
            "a split for reviews" | "a new HTTP service in default only" => {
                assert_eq!(predicted["proxies"]["unchanged"], 1, "iso's Sidecar scope keeps it out: {predicted:#}");
            }
            "nothing at all (the same DestinationRule again)" => {
                assert_eq!(predicted["proxies"]["unchanged"], 2, "{predicted:#}");
            }
            _ => {}
        }
    }
    // A rollback previews the same way: the DestinationRule back to the
    // base revision drops its connection pool from web's clusters only.
    let (ok, out, err) = kit::cli(&api, &["rollback", &base.to_string(), "destinationrule", "reviews", "--dry-run", "-o", "json"]);
    assert!(ok, "rollback --dry-run: {err}");
    let r: Value = serde_json::from_str(&out).unwrap();
    let changed = r["proxies"]["changed"].as_array().unwrap_or_else(|| panic!("{r:#}"));
    assert_eq!((changed.len(), r["proxies"]["unchanged"].as_u64()), (1, Some(1)), "{r:#}");
    assert_eq!(changed[0]["proxy"], web.id.as_str());
    assert!(changed[0]["changes"].as_array().unwrap().iter().all(|c| c["type"] == "CDS" && c["action"] == "changed"), "{r:#}");
    assert!(changed[0]["changes"][0]["diff"].to_string().contains("maxConnections"), "{r:#}");
    for p in proxies {
        p.envoy.assert_no_rejections().await;
    }
}
