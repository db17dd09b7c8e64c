//! Prometheus metrics (`GET /metrics`, text format 0.0.4). Names follow
//! Istio's where the meaning matches, so pilot dashboards carry over:
//! `pilot_xds`, `pilot_xds_pushes`, `pilot_total_xds_rejects`,
//! `pilot_debounce_time`, `pilot_xds_push_time`, `pilot_proxy_convergence_time`.
//! Raft, write and API metrics are `lodestar_*`.
//!
//! One process-wide registry ([`metrics`]), lock-free on the hot paths
//! (atomics; labelled families take a lock only to find their series).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[derive(Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    pub fn set(&self, v: i64) {
        self.0.store(v, Ordering::Relaxed);
    }
    pub fn add(&self, v: i64) {
        self.0.fetch_add(v, Ordering::Relaxed);
    }
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Seconds, with fixed buckets.
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
    count: AtomicU64,
}

/// 10 µs … 1 s: one state machine apply call.
pub const APPLY_BUCKETS: &[f64] = &[0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0];

/// 1 ms … 30 s: from an idle push to a slow convergence.
pub const LATENCY_BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new(LATENCY_BUCKETS)
    }
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram { bounds, counts: (0..bounds.len()).map(|_| AtomicU64::new(0)).collect(), sum_micros: AtomicU64::new(0), count: AtomicU64::new(0) }
    }

    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|b| secs <= *b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.sum_micros.fetch_add(d.as_micros() as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        let sep = if labels.is_empty() { "" } else { "," };
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cumulative += c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {cumulative}");
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let braces = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
        let _ = writeln!(out, "{name}_sum{braces} {}", self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count{braces} {count}");
    }
}

/// A metric with one set of label values per series.
pub struct Family<M> {
    label_names: &'static [&'static str],
    series: Mutex<BTreeMap<Vec<String>, Arc<M>>>,
}

impl<M: Default> Family<M> {
    fn new(label_names: &'static [&'static str]) -> Self {
        Family { label_names, series: Mutex::new(BTreeMap::new()) }
    }

    pub fn with(&self, values: &[&str]) -> Arc<M> {
        let key: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        self.series.lock().unwrap_or_else(|e| e.into_inner()).entry(key).or_default().clone()
    }

    fn each(&self, mut f: impl FnMut(String, &M)) {
        let series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        for (values, m) in series.iter() {
            let labels = self.label_names.iter().zip(values).map(|(n, v)| format!("{n}=\"{}\"", escape(v))).collect::<Vec<_>>().join(",");
            f(labels, m);
        }
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

pub struct Metrics {
    // xDS (Istio's names).
    pub xds_connected: Gauge,
    pub xds_pushes: Family<Counter>,
    pub xds_rejects: Family<Counter>,
    pub debounce_time: Histogram,
    pub push_time: Family<Histogram>,
    pub convergence_time: Histogram,
    pub push_triggers: Counter,
    pub streams_shed: Counter,
    pub streams_refused: Family<Counter>,
    // Raft and the write path.
    pub raft_term: Gauge,
    pub raft_last_log_index: Gauge,
    pub raft_commit_index: Gauge,
    pub raft_applied_index: Gauge,
    pub raft_apply_duration: Histogram,
    pub raft_is_leader: Gauge,
    pub raft_leader_changes: Counter,
    pub store_revision: Gauge,
    pub write_duration: Histogram,
    pub writes: Family<Counter>,
    // The API.
    pub api_requests: Family<Counter>,
    pub api_duration: Family<Histogram>,
    // ACLs.
    pub acl_refusals: Family<Counter>,
    pub audit_dropped: Counter,
}

pub fn metrics() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(|| Metrics {
        xds_connected: Gauge::default(),
        xds_pushes: Family::new(&["type"]),
        xds_rejects: Family::new(&["type"]),
        debounce_time: Histogram::default(),
        push_time: Family::new(&["type"]),
        convergence_time: Histogram::default(),
        push_triggers: Counter::default(),
        streams_shed: Counter::default(),
        streams_refused: Family::new(&["reason"]),
        raft_term: Gauge::default(),
        raft_last_log_index: Gauge::default(),
        raft_commit_index: Gauge::default(),
        raft_applied_index: Gauge::default(),
        raft_apply_duration: Histogram::new(APPLY_BUCKETS),
        raft_is_leader: Gauge::default(),
        raft_leader_changes: Counter::default(),
        store_revision: Gauge::default(),
        write_duration: Histogram::default(),
        writes: Family::new(&["result"]),
        api_requests: Family::new(&["method", "route", "code"]),
        api_duration: Family::new(&["method", "route"]),
        acl_refusals: Family::new(&["reason"]),
        audit_dropped: Counter::default(),
    })
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn counter_family(out: &mut String, name: &str, help: &str, f: &Family<Counter>) {
    header(out, name, "counter", help);
    f.each(|labels, c| {
        let _ = writeln!(out, "{name}{{{labels}}} {}", c.get());
    });
}

fn histogram_family(out: &mut String, name: &str, help: &str, f: &Family<Histogram>) {
    header(out, name, "histogram", help);
    f.each(|labels, h| h.render(out, name, &labels));
}

fn single(out: &mut String, name: &str, kind: &str, help: &str, v: impl std::fmt::Display) {
    header(out, name, kind, help);
    let _ = writeln!(out, "{name} {v}");
}

impl Metrics {
    /// The text exposition.
    pub fn render(&self) -> String {
        let mut o = String::with_capacity(8 * 1024);
        single(&mut o, "pilot_xds", "gauge", "Connected xDS streams on this replica.", self.xds_connected.get());
        counter_family(&mut o, "pilot_xds_pushes", "xDS responses sent, by type (cds, eds, lds, rds).", &self.xds_pushes);
        counter_family(&mut o, "pilot_total_xds_rejects", "xDS responses the proxies rejected (NACKs), by type.", &self.xds_rejects);
        header(&mut o, "pilot_debounce_time", "histogram", "Seconds from the first change held by the debouncer to its push.");
        self.debounce_time.render(&mut o, "pilot_debounce_time", "");
        histogram_family(&mut o, "pilot_xds_push_time", "Seconds to generate and queue one proxy's push, by type.", &self.push_time);
        header(&mut o, "pilot_proxy_convergence_time", "histogram", "Seconds from a revision's push to a proxy ACKing it.");
        self.convergence_time.render(&mut o, "pilot_proxy_convergence_time", "");
        single(&mut o, "pilot_push_triggers", "counter", "Revisions pushed to the proxies (after debouncing).", self.push_triggers.get());
        single(&mut o, "lodestar_xds_streams_shed_total", "counter", "Streams closed to rebalance or at their maximum age.", self.streams_shed.get());
        counter_family(&mut o, "lodestar_xds_streams_refused_total", "Streams refused: not ready, or behind the proxy.", &self.streams_refused);
        single(&mut o, "lodestar_raft_term", "gauge", "Current raft term.", self.raft_term.get());
        single(&mut o, "lodestar_raft_last_log_index", "gauge", "Index of the last raft log entry here.", self.raft_last_log_index.get());
        single(
            &mut o,
            "lodestar_raft_commit_index",
            "gauge",
            "Highest raft log index known committed here (the leader's quorum match; a follower's applied index).",
            self.raft_commit_index.get(),
        );
        single(&mut o, "lodestar_raft_applied_index", "gauge", "Index of the last raft log entry applied here.", self.raft_applied_index.get());
        header(&mut o, "lodestar_raft_apply_duration_seconds", "histogram", "Seconds the state machine took to apply one group of committed entries.");
        self.raft_apply_duration.render(&mut o, "lodestar_raft_apply_duration_seconds", "");
        single(&mut o, "lodestar_raft_is_leader", "gauge", "1 on the leader.", self.raft_is_leader.get());
        single(&mut o, "lodestar_raft_leader_changes_total", "counter", "Leader changes seen by this replica.", self.raft_leader_changes.get());
        single(&mut o, "lodestar_store_revision", "gauge", "The store revision applied here.", self.store_revision.get());
        header(&mut o, "lodestar_write_duration_seconds", "histogram", "Seconds from a write's arrival to its commit and apply.");
        self.write_duration.render(&mut o, "lodestar_write_duration_seconds", "");
        counter_family(&mut o, "lodestar_writes_total", "Write transactions, by result (ok, or the error code).", &self.writes);
        counter_family(&mut o, "lodestar_api_requests_total", "API requests, by method, route and status.", &self.api_requests);
        histogram_family(&mut o, "lodestar_api_request_duration_seconds", "API request latency.", &self.api_duration);
        counter_family(&mut o, "lodestar_acl_refusals_total", "API requests refused by ACLs, by reason (unauthenticated, denied).", &self.acl_refusals);
        single(&mut o, "lodestar_audit_dropped_total", "counter", "Audit log lines dropped because the writer fell behind.", self.audit_dropped.get());
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_exposition_format() {
        let m = metrics();
        m.xds_pushes.with(&["eds"]).inc();
        m.debounce_time.observe(Duration::from_millis(3));
        let h = Histogram::new(&[0.01, 0.1]);
        h.observe(Duration::from_millis(5));
        h.observe(Duration::from_millis(50));
        let mut out = String::new();
        h.render(&mut out, "x", "");
        assert!(out.contains("x_bucket{le=\"0.01\"} 1\nx_bucket{le=\"0.1\"} 2\nx_bucket{le=\"+Inf\"} 2\nx_sum 0.055\nx_count 2\n"), "{out}");
        let text = m.render();
        assert!(text.contains("# TYPE pilot_xds_pushes counter\n"), "{text}");
        assert!(text.contains("pilot_xds_pushes{type=\"eds\"} "), "{text}");
    }

    /// Every metric the Grafana dashboard in ops/ queries is one we export.
    #[test]
    fn the_dashboard_queries_only_exported_metrics() {
        let dash: serde_json::Value = serde_json::from_str(include_str!("../ops/grafana/lodestar.json")).unwrap();
        let exported = metrics().render();
        let names = regex::Regex::new(r"\b((?:pilot|lodestar)_[a-z_]+)").unwrap();
        let mut checked = 0;
        for panel in dash["panels"].as_array().unwrap() {
            for t in panel["targets"].as_array().unwrap() {
                for m in names.captures_iter(t["expr"].as_str().unwrap()) {
                    let name = &m[1];
                    assert!(
                        exported.contains(&format!("# TYPE {} ", name.trim_end_matches("_bucket"))),
                        "the dashboard queries {name}, which /metrics does not export"
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 10);
    }
}
