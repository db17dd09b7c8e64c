//! Cluster-wide revert on NACK (issue 35, `revert_on_nack`): a revision a
//! real Envoy rejects is rolled back by a new revision, written as the
//! replica's revert (author and change message in `history`), announced on
//! `GET /v1/nacks`, logged and counted; the Envoy then ACKs the revert.
//!
//! The rejected config: an EnvoyFilter MERGE of `connect_timeout: 0s` into
//! a cluster, which passes validation and which Envoy refuses (its proto
//! constraint wants a timeout above zero), as a real mistake would.

use crate::kit;

use kit::envoy::EnvoyOptions;
use kit::mesh::*;
use kit::Cluster;
use serde_json::Value;

const MESH: &str = r#"
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {name: reviews, namespace: default}
spec:
  ports: [{name: http, number: 9080, protocol: HTTP}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: reviews-1, namespace: default, labels: {app: reviews}}
spec: {service: reviews, address: ${reviews.ip}, port: ${reviews.port}}
"#;

const ZERO_TIMEOUT: &str = r#"
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: zero-timeout, namespace: default}
spec:
  workloadSelector: {labels: {app: a}}
  configPatches:
  - applyTo: CLUSTER
    match:
      context: SIDECAR_OUTBOUND
      cluster: {service: reviews.default.svc.cluster.local, portNumber: 9080}
    patch:
      operation: MERGE
      value: {connect_timeout: 0s}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revision_a_real_envoy_rejects_is_reverted_cluster_wide() {
    let fx = Fixture::around(Cluster::start(1, "revert_on_nack = true\nrevert_on_nack_window_s = 60\n").await);
    let api = fx.api(1);
    let reviews = fx.upstream(20, "reviews-v1").await;
    let rev = fx.apply(&render(MESH, &[("reviews", &reviews)])).await;
    let mut o = EnvoyOptions::new("a", &fx.ip(42));
    o.labels = vec![("app".into(), "a".into())];
    let a = fx.proxy_of_types(o, 1, rev, &TYPES).await;

    // Listen on /v1/nacks before the bad write.
    let mut events = fx.cluster.http.get(format!("{api}/v1/nacks")).send().await.unwrap();
    assert_eq!(events.status(), 200);
    let first = events.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("watching"));

    let bad = fx.apply(ZERO_TIMEOUT).await;
    // The NACK, then the revert's event: the revision that restores.
    let mut lines = String::new();
    let revert: Value = tokio::time::timeout(BOUND, async {
        loop {
            let chunk = events.chunk().await.unwrap().expect("the NACK stream ended");
            lines.push_str(&String::from_utf8_lossy(&chunk));
            if let Some(l) = lines.lines().find(|l| l.contains("\"revert\"")) {
                return serde_json::from_str::<Value>(l).unwrap();
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no revert event within {BOUND:?}; events so far:\n{lines}"));
    assert!(lines.contains("\"nack\"") && lines.contains(&format!("\"rejectedVersion\":\"{bad}\"")), "the NACK came first:\n{lines}");
    let r = &revert["revert"];
    assert_eq!((r["revision"].as_u64(), r["result"].as_str()), (Some(bad), Some("reverted")), "{revert}");
    let by = r["revertedBy"].as_u64().unwrap();
    assert!(by > bad, "{revert}");

    // The revert: a new revision without the filter, which the Envoy ACKs.
    let (status, body) = kit::get_json(&fx.cluster.http, &format!("{api}/v1/resources/envoyfilter/default/zero-timeout")).await;
    assert_eq!(status, 404, "created by the rejected revision, deleted by the revert: {body}");
    // (`lodestar wait` fails on a NACK of the revision it waits for, or a
    // later one: not on the rejected one before it.)
    let (ok, out, err) = kit::cli(&api, &["wait", "--revision", &by.to_string(), "--timeout", "20s"]);
    assert!(ok, "every proxy ACKs the revert: {out}{err}");
    // The revert's config is the one the Envoy kept (its accepted version
    // may stay older: nothing in it changed), the cluster's own timeout.
    let dump = a.envoy.config_dump().await.to_string();
    assert!(dump.contains("outbound|9080||reviews.default.svc.cluster.local") && !dump.contains("\"connect_timeout\":\"0s\""), "{dump}");
    // Audited as such: its author and change message in the history, the
    // audit log, a log line, the metric.
    let (_, h) = kit::get_json(&fx.cluster.http, &format!("{api}/v1/history?limit=1")).await;
    assert_eq!(h["revisions"][0]["revision"].as_u64(), Some(by), "{h}");
    assert_eq!(h["revisions"][0]["author"], "replica:1/revert-on-nack", "{h}");
    let message = h["revisions"][0]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with(&format!("revert of revision {bad}: a.default rejected it (CDS)")), "{h}");
    let log = fx.cluster.replica(1).log();
    assert!(log.lines().any(|l| l.contains("\"op\":\"revert-on-nack\"") && l.contains("\"outcome\":\"ok\"")), "the audit line:\n{log}");
    assert!(log.contains(&format!("revision {bad} was rejected; revision {by} restores what it changed")), "{log}");
    let metrics = fx.cluster.http.get(format!("{api}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("lodestar_nack_reverts_total{result=\"reverted\"} 1"), "{metrics}");
}
