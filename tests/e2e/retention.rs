//! History retention (issue 35): at least `history_revisions` revisions
//! or every revision younger than `history_max_age_s`, whichever keeps
//! more, decided from the leader's time in the log; compaction is logged
//! and counted; `history`, `diff` and `rollback` to a compacted revision
//! name the oldest kept; the marks of when revisions were made survive a
//! restart. Real replica process; the age is 4 seconds here, so the test
//! waits that long once (the thing under test is the passing of time).

use crate::kit;
use kit::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const AGE_S: u64 = 4;

async fn history(c: &Cluster) -> Value {
    let (status, h) = get_json(&c.http, &format!("{}/v1/history?limit=1", c.replica(1).api())).await;
    assert_eq!(status, 200, "{h}");
    h
}

fn oldest(h: &Value) -> u64 {
    h["oldest"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_keeps_what_the_setting_says_and_names_the_oldest_kept() {
    let mut c = Cluster::start(1, &format!("history_revisions = 5\nhistory_max_age_s = {AGE_S}\n")).await;
    let api = c.replica(1).api();
    // Ten revisions at once: the count alone would keep 5; the age keeps
    // them all.
    let started = Instant::now();
    let mut revisions = Vec::new();
    for i in 0..10 {
        revisions.push(applied(&c.http, &api, vec![vs("reviews", "default", &format!("v{i}"))]).await);
    }
    assert!(started.elapsed() < Duration::from_secs(AGE_S), "the writes took {:?}: too slow for this test's age", started.elapsed());
    let written = Instant::now();
    let h = history(&c).await;
    assert!(oldest(&h) <= revisions[0], "every revision younger than {AGE_S}s is kept: {h}");

    // The marks of when revisions were made are the store's: a restart
    // keeps them (without them the next write could drop nothing by age).
    c.stop(1);
    c.restart(1);
    c.wait_for_leader(Duration::from_secs(15)).await;
    assert_eq!(oldest(&history(&c).await), oldest(&h), "the same history after a restart");
    // Once they are older than the age, the count decides: the last 5.
    // (A revision is dated by the last write of its minute: the last of
    // the ten dates them all.)
    tokio::time::sleep(Duration::from_secs(AGE_S).saturating_sub(written.elapsed()) + Duration::from_millis(300)).await;
    let last = applied(&c.http, &api, vec![vs("reviews", "default", "later")]).await;
    let h = history(&c).await;
    assert_eq!(oldest(&h), last - 4, "the last 5 revisions: {h}");
    let compacted = last - 5;

    // A diff or rollback to a revision before that names the oldest kept;
    // the oldest kept still answers.
    let (status, body) = get_json(&c.http, &format!("{api}/v1/diff?from={}", compacted - 1)).await;
    assert_eq!(status, 410, "{body}");
    let want = format!("revision {} has been compacted; the oldest available is {compacted}", compacted - 1);
    assert!(body.to_string().contains(&want), "{body}");
    let (status, body) = get_json(&c.http, &format!("{api}/v1/diff?from={}", compacted + 1)).await;
    assert_eq!((status, body["changes"].as_array().map(Vec::len)), (200, Some(1)), "{body}");
    let (status, body) = kit::call(c.http.post(format!("{api}/v1/rollback")).json(&json!({"revision": revisions[0]}))).await;
    assert_eq!(status, 410, "{body}");
    assert!(body.to_string().contains(&format!("the oldest available is {compacted}")), "{body}");
    let (ok, _, err) = cli(&api, &["diff", &revisions[0].to_string()]);
    assert!(!ok && err.contains(&format!("the oldest available is {compacted}")), "{err}");
    let (ok, _, err) = cli(&api, &["history"]);
    assert!(ok && err.contains(&format!("history kept from revision {}", compacted + 1)), "{err}");

    // Reported: a log line and the metrics.
    until("the compaction log line", Duration::from_secs(5), || async {
        c.replica(1).log().lines().any(|l| l.contains("history compacted") && l.contains(&format!("the oldest kept is {}", compacted + 1)))
    })
    .await;
    let metrics = c.http.get(format!("{api}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains(&format!("lodestar_history_oldest_revision {}", compacted + 1)), "{metrics}");
    assert!(metrics.lines().any(|l| l.starts_with("lodestar_history_compacted_revisions_total ") && !l.ends_with(" 0")), "{metrics}");
}
