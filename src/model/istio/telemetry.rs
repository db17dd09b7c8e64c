//! `Telemetry` (telemetry.istio.io v1alpha1 and v1): access logging and
//! tracing per mesh (root namespace), namespace or workload
//! (`translate::telemetry`).
//!
//! Providers are named here and declared in the `MeshConfig`
//! (`extensionProviders`, plus Istio's built-in `envoy` file logger); a
//! name no mesh config declares is reported at translation (the entry is
//! left out, as istiod does) and by `lodestar analyze`. Refused by name:
//! `metrics` (Istio's standard metrics, `istio_requests_total` and kin,
//! come from Istio's own `istio.stats` filter, which upstream Envoy, what
//! Lodestar's proxies run, does not have: there is nothing to override) and
//! `targetRef(s)` (Kubernetes Gateway API references).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::common::MatchLabelsSelector;
use super::validate::{check_policy_target, Path, Report};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Telemetry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<MatchLabelsSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target_refs: Vec<Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tracing: Vec<Tracing>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub access_logging: Vec<AccessLogging>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProviderRef {
    #[serde(default)]
    pub name: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum WorkloadMode {
    #[default]
    ClientAndServer,
    Client,
    Server,
}

impl WorkloadMode {
    /// Whether this mode covers the inbound (server) or outbound side.
    pub fn covers(self, server: bool) -> bool {
        match self {
            WorkloadMode::ClientAndServer => true,
            WorkloadMode::Client => !server,
            WorkloadMode::Server => server,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ModeMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<WorkloadMode>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Filter {
    #[serde(default)]
    pub expression: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AccessLogging {
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub r#match: Option<ModeMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub providers: Vec<ProviderRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<Filter>,
}

impl AccessLogging {
    pub fn mode(&self) -> WorkloadMode {
        self.r#match.as_ref().and_then(|m| m.mode).unwrap_or_default()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Tracing {
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub r#match: Option<ModeMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub providers: Vec<ProviderRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub random_sampling_percentage: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_span_reporting: Option<bool>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub custom_tags: BTreeMap<String, CustomTag>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_request_id_for_trace_sampling: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_istio_tags: Option<bool>,
}

impl Tracing {
    pub fn mode(&self) -> WorkloadMode {
        self.r#match.as_ref().and_then(|m| m.mode).unwrap_or_default()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CustomTag {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub literal: Option<Literal>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<FromSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<FromSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub formatter: Option<Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Literal {
    #[serde(default)]
    pub value: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FromSource {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_value: Option<String>,
}

/// Bound on a CEL filter expression (Envoy parses it on every config load).
const MAX_EXPRESSION: usize = 4096;

impl Telemetry {
    pub(super) fn check(&self, at: &Path, r: &mut Report) {
        check_policy_target(r, at, self.selector.as_ref(), self.target_ref.is_some(), !self.target_refs.is_empty());
        if !self.metrics.is_empty() {
            r.error(
                &at.field("metrics"),
                "metrics overrides are not supported: Istio's standard metrics (istio_requests_total, ...) come from Istio's istio.stats filter, which the upstream Envoy Lodestar's proxies run does not have, so there is nothing to disable or retag; Envoy's own statistics are on each proxy's admin /stats",
            );
        }
        for (i, l) in self.access_logging.iter().enumerate() {
            let at = at.field("accessLogging").index(i);
            check_providers(r, &at, &l.providers);
            if let Some(f) = &l.filter {
                let at = at.field("filter").field("expression");
                if f.expression.trim().is_empty() {
                    r.error(&at, "empty expression");
                } else if f.expression.len() > MAX_EXPRESSION {
                    r.error(&at, format!("longer than {MAX_EXPRESSION} bytes"));
                } else {
                    r.check(&at, check_delimiters(&f.expression));
                }
            }
        }
        if self.tracing.len() > 1 {
            // Istio: "only one tracing config is supported".
            r.error(&at.field("tracing"), "only one tracing entry is supported");
        }
        for (i, t) in self.tracing.iter().enumerate() {
            let at = at.field("tracing").index(i);
            check_providers(r, &at, &t.providers);
            if t.providers.len() > 1 {
                r.error(&at.field("providers"), "only one tracing provider per entry is supported");
            }
            if t.use_request_id_for_trace_sampling == Some(false) {
                r.unsupported_one(
                    &at.field("useRequestIdForTraceSampling"),
                    "useRequestIdForTraceSampling: false",
                    "leave it out (Envoy samples by request id)",
                );
            }
            if t.enable_istio_tags == Some(true) {
                r.unsupported_one(
                    &at.field("enableIstioTags"),
                    "Istio's own span tags",
                    "they come from Istio's node metadata; leave the field out (Lodestar adds none)",
                );
            }
            if let Some(p) = t.random_sampling_percentage.filter(|p| !(0.0..=100.0).contains(p)) {
                r.error(&at.field("randomSamplingPercentage"), format!("{p} must be in the range 0..=100"));
            }
            for (name, tag) in &t.custom_tags {
                let at = at.field("customTags").key(name);
                let set = [tag.literal.is_some(), tag.environment.is_some(), tag.header.is_some(), tag.formatter.is_some()].iter().filter(|b| **b).count();
                if set != 1 {
                    r.error(&at, "exactly one of literal, environment, header, formatter");
                }
                if tag.formatter.is_some() {
                    r.unsupported_one(&at.field("formatter"), "a formatter tag", "use literal, environment or header");
                }
                for (field, src) in [("environment", &tag.environment), ("header", &tag.header)] {
                    if src.as_ref().is_some_and(|s| s.name.is_empty()) {
                        r.error(&at.field(field).field("name"), "required");
                    }
                }
            }
        }
    }
}

/// What Lodestar can check of a CEL expression without a CEL parser:
/// balanced brackets and closed string literals (Envoy parses the rest when
/// the listener loads, and NACKs a syntax error).
fn check_delimiters(expr: &str) -> Result<(), String> {
    let mut stack = Vec::new();
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in expr.char_indices() {
        if let Some(q) = quote {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                _ if c == q => quote = None,
                _ => {}
            }
            continue;
        }
        match c {
            '"' | '\'' => quote = Some(c),
            '(' | '[' | '{' => stack.push(c),
            ')' | ']' | '}' => {
                let open = match c {
                    ')' => '(',
                    ']' => '[',
                    _ => '{',
                };
                if stack.pop() != Some(open) {
                    return Err(format!("CEL syntax: unbalanced {c:?} at offset {i}"));
                }
            }
            _ => {}
        }
    }
    match (quote, stack.last()) {
        (Some(q), _) => Err(format!("CEL syntax: unterminated string ({q})")),
        (None, Some(open)) => Err(format!("CEL syntax: unclosed {open:?}")),
        (None, None) => Ok(()),
    }
}

fn check_providers(r: &mut Report, at: &Path, providers: &[ProviderRef]) {
    for (i, p) in providers.iter().enumerate() {
        if p.name.is_empty() {
            r.error(&at.field("providers").index(i).field("name"), "required");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::validate::validate;

    fn errors(yaml: &str) -> Vec<String> {
        let docs: Vec<serde_json::Value> = yaml_serde::Deserializer::from_str(yaml).map(|d| serde::Deserialize::deserialize(d).unwrap()).collect();
        let mut out = Vec::new();
        for d in docs {
            if let Err(e) = validate("Telemetry", &d["spec"]) {
                out.extend(e.iter().map(|e| e.to_string()));
            }
        }
        out
    }

    #[test]
    fn cel_delimiters() {
        let bad = |e: &str| errors(&format!("spec: {{accessLogging: [{{providers: [{{name: envoy}}], filter: {{expression: {e:?}}}}}]}}\n")).join(" ");
        assert!(bad("response.code >= (500").contains("spec.accessLogging[0].filter.expression: CEL syntax: unclosed '('"), "{}", bad("response.code >= (500"));
        assert!(bad("request.useragent.startsWith('x)").contains("unterminated string"));
        assert_eq!(bad("!has(request.useragent) || !(request.useragent.startsWith(\"A(\"))"), "");
    }

    #[test]
    fn corpus() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/istio/corpus-38/");
        for f in [
            "telemetry-access-logging.yaml",
            "telemetry-access-logging-filter.yaml",
            "telemetry-access-logging-filter-5xx.yaml",
            "telemetry-access-logging-filter-envoy.yaml",
        ] {
            assert_eq!(errors(&std::fs::read_to_string(format!("{dir}{f}")).unwrap()), Vec::<String>::new(), "{f}");
        }
        for f in ["telemetry-metrics-disable.yaml", "telemetry-metrics-remove-tag.yaml"] {
            let e = errors(&std::fs::read_to_string(format!("{dir}{f}")).unwrap());
            assert!(!e.is_empty() && e.iter().all(|e| e.starts_with("spec.metrics: metrics overrides are not supported")), "{f}: {e:?}");
        }
    }
}
