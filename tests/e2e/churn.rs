//! `lodestar-bench churn` end to end, with tiny numbers, against a replica
//! process: every change is acknowledged and reaches every simulated
//! proxy, and at the end every proxy's endpoints are the store's instances
//! (as the bench compares them; the store is also read here through the
//! REST API, not from the bench). No timing checks.

use crate::kit;

use kit::{number, results};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Run the bench; its one `result:` line and its whole output.
async fn run(api: &str, args: &[&str]) -> (BTreeMap<String, String>, String) {
    let mut all = vec!["churn"];
    all.extend(args);
    let out = kit::bench(api, &all).await;
    let mut res = results(&out);
    assert_eq!(res.len(), 1, "{out}");
    (res.remove(0), out)
}

/// The store's instances: service → addresses.
async fn store(cluster: &kit::Cluster, api: &str) -> BTreeMap<String, BTreeSet<String>> {
    let (status, body) = kit::get_json(&cluster.http, &format!("{api}/v1/resources/instances?namespace=default")).await;
    assert_eq!(status, 200, "{body}");
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for i in body["items"].as_array().unwrap() {
        out.entry(i["spec"]["service"].as_str().unwrap().to_string()).or_default().insert(i["spec"]["address"].as_str().unwrap().to_string());
    }
    out
}

fn check(r: &BTreeMap<String, String>, out: &str, want: &BTreeMap<String, BTreeSet<String>>) {
    let n = |k: &str| number(r, k);
    assert!(n("attempted") > 10.0, "the churn made changes: {out}");
    assert_eq!((n("acknowledged"), n("failed")), (n("attempted"), 0.0), "every change acknowledged: {out}");
    assert!(n("registers") > 0.0 && n("deletes") > 0.0, "{out}");
    assert_eq!(n("not_converged"), 0.0, "every acknowledged change reached every proxy: {out}");
    assert_eq!(n("propagated"), n("acknowledged"), "{out}");
    assert_eq!(n("proxy_errors"), 0.0, "{out}");
    assert_eq!(want.len(), 2, "two services with instances: {want:?}");
    let instances: usize = want.values().map(BTreeSet::len).sum();
    assert_eq!(n("store_instances"), instances as f64, "the bench compared with the store's instances: {want:?}\n{out}");
    assert_eq!((n("proxies"), n("matching_proxies")), (5.0, 5.0), "every proxy ends with the store's instances: {out}");
    assert!(n("eds_responses") >= 5.0, "the proxies received EDS during the churn: {out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_bench_converges_and_proxies_match_the_store() {
    let cluster = kit::Cluster::start(1, "").await;
    let r = cluster.replica(1);
    let (api, xds) = (r.api(), r.xds_addr());
    let pid = r.child.as_ref().unwrap().id().to_string();
    let tiny = ["--proxies", "5", "--services", "2", "--instances", "2", "--rate", "50", "--duration", "2", "--concurrency", "4", "--pid", &pid];

    let mut delta: Vec<&str> = tiny.to_vec();
    delta.extend(["--protocol", "delta", "--xds", &xds]);
    let (report, out) = run(&api, &delta).await;
    check(&report, &out, &store(&cluster, &api).await);
    number(&report, "replica_cpu_pct"); // the replica's CPU was read from /proc

    // Again, state of the world, xDS addresses from the cluster: the first
    // run's instances are replaced.
    let mut sotw: Vec<&str> = tiny.to_vec();
    sotw.extend(["--protocol", "sotw"]);
    let (report, out) = run(&api, &sotw).await;
    check(&report, &out, &store(&cluster, &api).await);
    let names: BTreeSet<String> = kit::get_json(&cluster.http, &format!("{api}/v1/resources/instances?namespace=default")).await.1["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i: &Value| i["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert!(names.iter().all(|n| n.starts_with("churn-")), "{names:?}");
}
