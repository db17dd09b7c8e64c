//! Prometheus metrics (`GET /metrics`). Names follow Istio's where the
//! meaning matches, so pilot dashboards carry over: `pilot_xds`,
//! `pilot_xds_pushes`, `pilot_total_xds_rejects`, `pilot_debounce_time`,
//! `pilot_xds_push_time`, `pilot_proxy_convergence_time`.
//! Raft, write and API metrics are `lodestar_*`.
//!
//! One process-wide set ([`metrics`]) whose members are registered in a
//! `prometheus-client` [`Registry`]; that crate writes the exposition (HELP
//! and TYPE lines, label escaping, histogram buckets). We serve it as the
//! Prometheus text format 0.0.4 ([`CONTENT_TYPE`]), not OpenMetrics:
//! OpenMetrics names a counter's samples `<name>_total`, and Istio's counters
//! (`pilot_xds_pushes`, `pilot_total_xds_rejects`, `pilot_push_triggers`)
//! have no such suffix. So our [`Counter`] is encoded under the name it is
//! registered with, which is the name of its samples, as in 0.0.4; the rest
//! of what prometheus-client writes is valid 0.0.4 as it is.
//!
//! Lock-free on the hot paths: counters and gauges are atomics, and
//! [`Histogram`] is ours, an atomic per bucket (prometheus-client's takes a
//! mutex per observation). A labelled [`Family`] takes a read lock to find
//! its series (a write lock the first time a series is seen).

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{family, MetricType, TypedMetric};
use prometheus_client::registry::{Metric, Registry};

pub use prometheus_client::metrics::gauge::Gauge;

/// What `/metrics` is served as: the format [`Metrics::render`] writes.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// A counter whose samples carry the name it is registered under
/// (prometheus-client's own would append `_total`; see the module doc).
#[derive(Clone, Debug, Default)]
pub struct Counter(prometheus_client::metrics::counter::Counter);

impl Counter {
    pub fn inc(&self) {
        self.0.inc();
    }
    pub fn inc_by(&self, n: u64) {
        self.0.inc_by(n);
    }
    pub fn get(&self) -> u64 {
        self.0.get()
    }
}

impl TypedMetric for Counter {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for Counter {
    fn encode(&self, mut encoder: MetricEncoder) -> fmt::Result {
        // A gauge's sample is the bare name: what 0.0.4 has for a counter.
        encoder.encode_gauge(&self.get())
    }
    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// Seconds, with fixed buckets.
#[derive(Clone, Debug)]
pub struct Histogram(Arc<Buckets>);

#[derive(Debug)]
struct Buckets {
    bounds: &'static [f64],
    /// Observations per bucket, not cumulative: one per bound, then the
    /// overflow (`+Inf`) bucket. Their total is the count, so `_count` and
    /// `le="+Inf"` agree even when a scrape races an observation.
    counts: Box<[AtomicU64]>,
    sum_micros: AtomicU64,
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
        let counts = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        Histogram(Arc::new(Buckets { bounds, counts, sum_micros: AtomicU64::new(0) }))
    }

    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let h = &self.0;
        let i = h.bounds.iter().position(|b| secs <= *b).unwrap_or(h.bounds.len());
        h.counts[i].fetch_add(1, Ordering::Relaxed);
        h.sum_micros.fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }
}

impl TypedMetric for Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> fmt::Result {
        let h = &self.0;
        let buckets: Vec<(f64, u64)> = h.bounds.iter().copied().chain([f64::INFINITY]).zip(h.counts.iter().map(|c| c.load(Ordering::Relaxed))).collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        encoder.encode_histogram::<NoLabelSet>(h.sum_micros.load(Ordering::Relaxed) as f64 / 1e6, count, &buckets, None)
    }
    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// The most series one [`Family`] holds (see [`Family::with`]).
pub const MAX_SERIES: usize = 1000;
/// The label value of a family's series past [`MAX_SERIES`].
pub const OVERFLOW: &str = "overflow";

/// A metric with one series per set of label values.
#[derive(Debug)]
pub struct Family<M> {
    label_names: &'static [&'static str],
    series: family::Family<Vec<(&'static str, String)>, M>,
    /// Series created (about: two threads creating the same one at once
    /// both count it, so the bound errs low).
    created: Arc<AtomicUsize>,
}

impl<M> Clone for Family<M> {
    fn clone(&self) -> Self {
        Family { label_names: self.label_names, series: self.series.clone(), created: self.created.clone() }
    }
}

impl<M: Default + Clone> Family<M> {
    fn new(label_names: &'static [&'static str]) -> Self {
        Family { label_names, series: family::Family::default(), created: Arc::default() }
    }

    /// The series for `values`, given in the order of the label names: a
    /// handle on it, not the family's lock guard, which would deadlock a
    /// caller that holds one while it asks for a series not seen yet.
    ///
    /// Label values must come from bounded sets (callers map client input
    /// to a fixed vocabulary). As a backstop, a family holds at most
    /// [`MAX_SERIES`]; a new set of values past that is counted in one
    /// series whose every label is [`OVERFLOW`].
    pub fn with(&self, values: &[&str]) -> M {
        let labels: Vec<(&'static str, String)> = self.label_names.iter().zip(values).map(|(n, v)| (*n, v.to_string())).collect();
        if let Some(m) = self.series.get(&labels) {
            return m.clone();
        }
        if self.created.fetch_add(1, Ordering::Relaxed) >= MAX_SERIES {
            self.created.fetch_sub(1, Ordering::Relaxed);
            let overflow = self.label_names.iter().map(|n| (*n, OVERFLOW.to_string())).collect();
            return self.series.get_or_create(&overflow).clone();
        }
        self.series.get_or_create(&labels).clone()
    }
}

impl<M: EncodeMetric + TypedMetric> EncodeMetric for Family<M> {
    fn encode(&self, encoder: MetricEncoder) -> fmt::Result {
        self.series.encode(encoder)
    }
    fn metric_type(&self) -> MetricType {
        M::TYPE
    }
    // `is_empty` stays the default (false): prometheus-client's family
    // leaves out the HELP and TYPE of a family with no series yet; ours keeps
    // them, so `/metrics` names every metric from the start (dashboards are
    // checked against it).
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
    pub xds_request_buffer: Gauge,
    // Raft and the write path.
    pub raft_term: Gauge,
    pub raft_last_log_index: Gauge,
    pub raft_commit_index: Gauge,
    pub raft_applied_index: Gauge,
    pub raft_apply_duration: Histogram,
    pub raft_is_leader: Gauge,
    pub raft_leader_changes: Counter,
    pub store_revision: Gauge,
    pub history_oldest_revision: Gauge,
    pub history_compacted: Counter,
    pub nack_reverts: Family<Counter>,
    pub write_duration: Histogram,
    pub writes: Family<Counter>,
    // The API.
    pub api_requests: Family<Counter>,
    pub api_duration: Family<Histogram>,
    // ACLs.
    pub acl_refusals: Family<Counter>,
    pub audit_dropped: Counter,
    // Connections on the API, xDS and raft ports (`tls::conn`).
    pub connections: Family<Gauge>,
    pub connections_refused: Family<Counter>,
    pub connections_closed: Family<Counter>,
    // The mesh CA (Istio's citadel_server_* names where they match).
    pub ca_csr: Counter,
    pub ca_issued: Counter,
    pub ca_auth_failures: Counter,
    pub ca_errors: Family<Counter>,
    pub ca_sign_duration: Histogram,
    pub ca_root_expiry: Gauge,
    pub ca_cert_chain_expiry: Gauge,
    // RequestAuthentication key sets fetched from jwksUri (Istio's names).
    pub jwks_fetch_success: Counter,
    pub jwks_fetch_fail: Counter,
    pub jwks_uris: Gauge,
    registry: Registry,
}

/// Registers `metric` as `name` (its samples' name; a histogram's, before
/// `_bucket`, `_sum`, `_count`) and gives it back. prometheus-client ends
/// `help` with a period.
fn register<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

pub fn metrics() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(|| {
        let r = &mut Registry::default();
        Metrics {
            xds_connected: register(r, "pilot_xds", "Connected xDS streams on this replica", Gauge::default()),
            xds_pushes: register(r, "pilot_xds_pushes", "xDS responses sent, by type (cds, eds, lds, rds)", Family::new(&["type"])),
            xds_rejects: register(r, "pilot_total_xds_rejects", "xDS responses the proxies rejected (NACKs), by type", Family::new(&["type"])),
            debounce_time: register(r, "pilot_debounce_time", "Seconds from the first change held by the debouncer to its push", Histogram::default()),
            push_time: register(r, "pilot_xds_push_time", "Seconds to generate and queue one proxy's push, by type", Family::new(&["type"])),
            convergence_time: register(r, "pilot_proxy_convergence_time", "Seconds from a revision's push to a proxy ACKing it", Histogram::default()),
            push_triggers: register(r, "pilot_push_triggers", "Revisions pushed to the proxies (after debouncing)", Counter::default()),
            streams_shed: register(r, "lodestar_xds_streams_shed_total", "Streams closed to rebalance or at their maximum age", Counter::default()),
            streams_refused: register(r, "lodestar_xds_streams_refused_total", "Streams refused or ended by the server: not_ready, behind, unauthenticated, permission_denied, stream_limit (xds_max_streams), request_buffer_full (xds_max_buffered_request_bytes), credential_quota (xds_max_streams_per_credential), source_quota (xds_max_streams_per_source), subscription_limit (xds_max_subscription_bytes)", Family::new(&["reason"])),
            xds_request_buffer: register(
                r,
                "lodestar_xds_request_buffer_bytes",
                "Bytes of incomplete xDS requests held across streams (limit: xds_max_buffered_request_bytes)",
                Gauge::default(),
            ),
            raft_term: register(r, "lodestar_raft_term", "Current raft term", Gauge::default()),
            raft_last_log_index: register(r, "lodestar_raft_last_log_index", "Index of the last raft log entry here", Gauge::default()),
            raft_commit_index: register(
                r,
                "lodestar_raft_commit_index",
                "Highest raft log index known committed here (the leader's quorum match; a follower's applied index)",
                Gauge::default(),
            ),
            raft_applied_index: register(r, "lodestar_raft_applied_index", "Index of the last raft log entry applied here", Gauge::default()),
            raft_apply_duration: register(
                r,
                "lodestar_raft_apply_duration_seconds",
                "Seconds the state machine took to apply one group of committed entries",
                Histogram::new(APPLY_BUCKETS),
            ),
            raft_is_leader: register(r, "lodestar_raft_is_leader", "1 on the leader", Gauge::default()),
            raft_leader_changes: register(r, "lodestar_raft_leader_changes_total", "Leader changes seen by this replica", Counter::default()),
            store_revision: register(r, "lodestar_store_revision", "The store revision applied here", Gauge::default()),
            history_oldest_revision: register(
                r,
                "lodestar_history_oldest_revision",
                "The oldest revision the history keeps here (history_revisions, history_max_age_s)",
                Gauge::default(),
            ),
            history_compacted: register(r, "lodestar_history_compacted_revisions_total", "Revisions dropped from the history by retention", Counter::default()),
            nack_reverts: register(
                r,
                "lodestar_nack_reverts_total",
                "NACKed revisions the cluster-wide revert (revert_on_nack) handled, by result: reverted, not_reverted (changed since, or outside the window), failed",
                Family::new(&["result"]),
            ),
            write_duration: register(r, "lodestar_write_duration_seconds", "Seconds from a write's arrival to its commit and apply", Histogram::default()),
            writes: register(r, "lodestar_writes_total", "Write transactions, by result (ok, or the error code)", Family::new(&["result"])),
            api_requests: register(r, "lodestar_api_requests_total", "API requests, by method, route and status", Family::new(&["method", "route", "code"])),
            api_duration: register(r, "lodestar_api_request_duration_seconds", "API request latency", Family::new(&["method", "route"])),
            acl_refusals: register(
                r,
                "lodestar_acl_refusals_total",
                "API requests refused by ACLs, by reason (unauthenticated, denied)",
                Family::new(&["reason"]),
            ),
            audit_dropped: register(r, "lodestar_audit_dropped_total", "Audit log lines dropped because the writer fell behind", Counter::default()),
            connections: register(r, "lodestar_connections", "Connections open, by port (api, xds, raft), TLS handshakes included", Family::new(&["port"])),
            connections_refused: register(
                r,
                "lodestar_connections_refused_total",
                "Connections closed as they were accepted, by port and reason: port_limit (<port>_max_connections), source_limit (<port>_max_connections_per_source)",
                Family::new(&["port", "reason"]),
            ),
            connections_closed: register(
                r,
                "lodestar_connections_closed_total",
                "Connections the server closed, by port and reason: handshake_timeout (tls_handshake_timeout_ms), header_timeout (http_header_read_timeout_ms), idle (conn_idle_timeout_ms)",
                Family::new(&["port", "reason"]),
            ),
            ca_csr: register(r, "citadel_server_csr_count", "Certificate signing requests received by the mesh CA", Counter::default()),
            ca_issued: register(r, "citadel_server_success_cert_issuance_count", "Workload certificates issued", Counter::default()),
            ca_auth_failures: register(
                r,
                "citadel_server_authentication_failure_count",
                "Certificate requests whose caller was not authenticated",
                Counter::default(),
            ),
            ca_errors: register(
                r,
                "lodestar_ca_errors_total",
                "Certificate requests refused or failed, by reason (unauthenticated, denied, invalid, unavailable, exhausted: turned away over ca_max_in_flight, internal)",
                Family::new(&["reason"]),
            ),
            ca_sign_duration: register(
                r,
                "lodestar_ca_sign_duration_seconds",
                "Seconds to handle one certificate request: authentication (a join token's use is a replicated write) and signing",
                Histogram::default(),
            ),
            ca_root_expiry: register(r, "citadel_server_root_cert_expiry_timestamp", "Unix time the mesh CA's root expires", Gauge::default()),
            ca_cert_chain_expiry: register(
                r,
                "citadel_server_cert_chain_expiry_timestamp",
                "Unix time the mesh CA's signing certificate expires",
                Gauge::default(),
            ),
            jwks_fetch_success: register(
                r,
                "pilot_jwks_resolver_network_fetch_success_total",
                "jwksUri key sets fetched and accepted by this replica",
                Counter::default(),
            ),
            jwks_fetch_fail: register(
                r,
                "pilot_jwks_resolver_network_fetch_fail_total",
                "jwksUri fetches that failed (network, status, or a key set that does not parse); the last good set is kept",
                Counter::default(),
            ),
            jwks_uris: register(r, "lodestar_jwks_uris", "jwksUris this replica fetches (named by RequestAuthentications)", Gauge::default()),
            registry: std::mem::take(r),
        }
    })
}

impl Metrics {
    /// The exposition, in the format of [`CONTENT_TYPE`].
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8 * 1024);
        // encode_registry, not encode: OpenMetrics' `# EOF` is no part of 0.0.4.
        prometheus_client::encoding::text::encode_registry(&mut out, &self.registry).expect("our metrics encode into a String without error");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_encode_cumulative_buckets_sum_and_count() {
        let mut r = Registry::default();
        let h = register(&mut r, "x", "A histogram", Histogram::new(&[0.01, 0.1]));
        h.observe(Duration::from_millis(5));
        h.observe(Duration::from_millis(50));
        h.observe(Duration::from_millis(500));
        let mut out = String::new();
        prometheus_client::encoding::text::encode_registry(&mut out, &r).unwrap();
        assert_eq!(
            out,
            "# HELP x A histogram.\n# TYPE x histogram\nx_sum 0.555\nx_count 3\nx_bucket{le=\"0.01\"} 1\nx_bucket{le=\"0.1\"} 2\nx_bucket{le=\"+Inf\"} 3\n"
        );
    }

    /// Every series keeps the name it had when this module wrote the text
    /// itself: counters with or without `_total` alike, and a family with
    /// no series yet still has its HELP and TYPE.
    #[test]
    fn exports_every_metric_under_its_name_and_type() {
        let m = metrics();
        m.xds_pushes.with(&["eds"]).inc();
        m.writes.with(&["ok"]).inc();
        m.raft_leader_changes.inc();
        m.debounce_time.observe(Duration::from_millis(3));
        let text = m.render();
        let types: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).collect();
        assert_eq!(
            types,
            [
                "pilot_xds gauge",
                "pilot_xds_pushes counter",
                "pilot_total_xds_rejects counter",
                "pilot_debounce_time histogram",
                "pilot_xds_push_time histogram",
                "pilot_proxy_convergence_time histogram",
                "pilot_push_triggers counter",
                "lodestar_xds_streams_shed_total counter",
                "lodestar_xds_streams_refused_total counter",
                "lodestar_xds_request_buffer_bytes gauge",
                "lodestar_raft_term gauge",
                "lodestar_raft_last_log_index gauge",
                "lodestar_raft_commit_index gauge",
                "lodestar_raft_applied_index gauge",
                "lodestar_raft_apply_duration_seconds histogram",
                "lodestar_raft_is_leader gauge",
                "lodestar_raft_leader_changes_total counter",
                "lodestar_store_revision gauge",
                "lodestar_history_oldest_revision gauge",
                "lodestar_history_compacted_revisions_total counter",
                "lodestar_nack_reverts_total counter",
                "lodestar_write_duration_seconds histogram",
                "lodestar_writes_total counter",
                "lodestar_api_requests_total counter",
                "lodestar_api_request_duration_seconds histogram",
                "lodestar_acl_refusals_total counter",
                "lodestar_audit_dropped_total counter",
                "lodestar_connections gauge",
                "lodestar_connections_refused_total counter",
                "lodestar_connections_closed_total counter",
                "citadel_server_csr_count counter",
                "citadel_server_success_cert_issuance_count counter",
                "citadel_server_authentication_failure_count counter",
                "lodestar_ca_errors_total counter",
                "lodestar_ca_sign_duration_seconds histogram",
                "citadel_server_root_cert_expiry_timestamp gauge",
                "citadel_server_cert_chain_expiry_timestamp gauge",
                "pilot_jwks_resolver_network_fetch_success_total counter",
                "pilot_jwks_resolver_network_fetch_fail_total counter",
                "lodestar_jwks_uris gauge",
            ]
        );
        for sample in
            ["pilot_xds_pushes{type=\"eds\"} ", "lodestar_writes_total{result=\"ok\"} ", "lodestar_raft_leader_changes_total ", "pilot_debounce_time_count "]
        {
            assert!(text.contains(sample), "no {sample:?} in\n{text}");
        }
        assert!(!text.contains("# EOF"), "{text}");
    }

    /// A family takes at most MAX_SERIES sets of label values; more are
    /// counted together under `overflow`.
    #[test]
    fn a_family_holds_a_bounded_number_of_series() {
        let mut r = Registry::default();
        let f: Family<Counter> = register(&mut r, "x", "A family", Family::new(&["a", "b"]));
        for i in 0..MAX_SERIES + 500 {
            f.with(&[&i.to_string(), "y"]).inc();
        }
        f.with(&["0", "y"]).inc();
        let mut out = String::new();
        prometheus_client::encoding::text::encode_registry(&mut out, &r).unwrap();
        assert_eq!(out.lines().filter(|l| l.starts_with("x{")).count(), MAX_SERIES + 1);
        assert!(out.contains("x{a=\"overflow\",b=\"overflow\"} 500\n"), "{out}");
        assert!(out.contains("x{a=\"0\",b=\"y\"} 2\n"), "{out}");
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
