//! `lodestar bench churn` end to end, with tiny numbers, against a replica
//! process: every change is acknowledged and reaches every simulated
//! proxy, and at the end each proxy's endpoints are the store's instances
//! (read here through the REST API, not from the bench). No timing checks.

mod common;

use lodestar::cli::churn::{self, ChurnArgs, ChurnReport, PORT};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

async fn run(args: &[&str], api: &str) -> ChurnReport {
    let mut a = ChurnArgs::from_args(args).expect("churn flags");
    a.servers = vec![api.to_string()];
    let report = churn::run(a).await.expect("the churn bench runs");
    report.print();
    report
}

/// The store's instances, as the proxies' EDS clusters should have them.
async fn store(cluster: &common::Cluster, api: &str) -> BTreeMap<String, BTreeSet<SocketAddr>> {
    let (status, body) = common::get_json(&cluster.http, &format!("{api}/v1/resources/instances?namespace=default")).await;
    assert_eq!(status, 200, "{body}");
    let mut out: BTreeMap<String, BTreeSet<SocketAddr>> = BTreeMap::new();
    for i in body["items"].as_array().unwrap() {
        let service = i["spec"]["service"].as_str().unwrap();
        let addr: SocketAddr = format!("{}:{PORT}", i["spec"]["address"].as_str().unwrap()).parse().unwrap();
        out.entry(format!("outbound|{PORT}||{service}.default.svc.cluster.local")).or_default().insert(addr);
    }
    out
}

fn check(report: &ChurnReport, want: &BTreeMap<String, BTreeSet<SocketAddr>>) {
    assert!(report.attempted > 10, "the churn made changes: {}", report.attempted);
    assert_eq!((report.acknowledged, report.failed), (report.attempted, 0), "first error: {:?}", report.first_error);
    assert!(report.registers > 0 && report.deletes > 0);
    assert_eq!(report.not_converged, 0, "every acknowledged change reached every proxy");
    assert_eq!(report.propagation.count as u64, report.acknowledged);
    assert_eq!(report.proxy_errors, 0, "{:?}", report.first_proxy_error);
    assert_eq!(report.final_endpoints.len(), 5);
    assert_eq!(want.len(), 2, "two services with instances: {want:?}");
    for (i, view) in report.final_endpoints.iter().enumerate() {
        let have: BTreeMap<String, BTreeSet<SocketAddr>> =
            view.iter().filter(|(_, a)| !a.is_empty()).map(|(c, a)| (c.clone(), a.iter().copied().collect())).collect();
        assert_eq!(&have, want, "proxy bench-{i} ends with the store's instances");
    }
    assert_eq!(report.mismatched_proxies, 0, "{:?}", report.first_mismatch);
    let (eds, _) = report.received.of(lodestar::xds::resources::ResourceType::Endpoint);
    assert!(eds >= 5, "the proxies received EDS during the churn");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_bench_converges_and_proxies_match_the_store() {
    let cluster = common::Cluster::start(1, "").await;
    let r = cluster.replica(1);
    let (api, xds) = (r.api(), r.xds_addr());
    let pid = r.child.as_ref().unwrap().id().to_string();
    let tiny = ["--proxies", "5", "--services", "2", "--instances", "2", "--rate", "50", "--duration", "2", "--concurrency", "4", "--pid", &pid];

    let mut delta: Vec<&str> = tiny.to_vec();
    delta.extend(["--protocol", "delta", "--xds", &xds]);
    let report = run(&delta, &api).await;
    check(&report, &store(&cluster, &api).await);
    let cpu = &report.cpu[0];
    assert!(cpu.pid.is_some() && cpu.error.is_none() && cpu.churn_pct.is_some(), "{cpu:?}");

    // Again, state of the world, xDS addresses from the cluster: the first
    // run's instances are replaced.
    let mut sotw: Vec<&str> = tiny.to_vec();
    sotw.extend(["--protocol", "sotw"]);
    let report = run(&sotw, &api).await;
    check(&report, &store(&cluster, &api).await);
    let names: BTreeSet<String> = common::get_json(&cluster.http, &format!("{api}/v1/resources/instances?namespace=default")).await.1["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i: &Value| i["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert!(names.iter().all(|n| n.starts_with("churn-")), "{names:?}");
}
