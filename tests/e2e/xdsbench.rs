//! `lodestar-bench xds` end to end, with tiny numbers, against a replica
//! process: the convergence and idle scenarios succeed and print their
//! figures (the `result:` lines parse). No timing checks.

use crate::kit;

use kit::{number, results};

async fn bench(api: &str, args: &[&str]) -> String {
    let mut all = vec!["xds"];
    all.extend(args);
    kit::bench(api, &all).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_bench_convergence_and_idle_succeed_and_print_figures() {
    let cluster = kit::Cluster::start(1, "").await;
    let r = cluster.replica(1);
    let (api, xds) = (r.api(), r.xds_addr());
    let pid = r.child.as_ref().unwrap().id().to_string();

    // xDS addresses asked from the cluster.
    let out = bench(&api, &["--scenario", "convergence", "--proxies", "10", "--services", "20", "--repeat", "2", "--pid", &pid]).await;
    let res = results(&out);
    assert_eq!(res.len(), 1, "{out}");
    let c = &res[0];
    assert_eq!(c["scenario"], "convergence");
    assert_eq!((number(c, "proxies"), number(c, "affected"), number(c, "writes")), (10.0, 10.0, 2.0));
    assert_eq!((number(c, "pairs"), number(c, "converged")), (20.0, 20.0), "every (write, proxy) pair converged");
    for k in ["p50_ms", "p99_ms", "max_ms", "start_p99_ms", "ack_p50_ms", "target_p99_ms"] {
        assert!(number(c, k) >= 0.0, "{k}");
    }
    assert!(number(c, "p50_ms") <= number(c, "p99_ms") && number(c, "p99_ms") <= number(c, "max_ms"));
    assert_eq!((number(c, "pushed_min"), number(c, "pushed_max"), number(c, "unaffected_pushed")), (10.0, 10.0, 0.0), "every proxy sees web");
    assert!(["yes", "no"].contains(&c["target_met"].as_str()));

    let out = bench(
        &api,
        &["--scenario", "idle", "--proxies", "50", "--services", "20", "--xds", &xds, "--pid", &pid, "--hold", "0", "--streams-per-connection", "10"],
    )
    .await;
    let res = results(&out);
    assert_eq!(res.len(), 1, "{out}");
    let i = &res[0];
    assert_eq!((i["scenario"].as_str(), number(i, "proxies"), number(i, "streams_per_connection")), ("idle", 50.0, 10.0));
    assert!(number(i, "rss_before_kib") > 0.0 && number(i, "rss_after_kib") > 0.0);
    for k in ["per_stream_kib", "client_per_proxy_kib", "target_kib"] {
        number(i, k);
    }
    assert!(["yes", "no"].contains(&i["target_met"].as_str()));
}
