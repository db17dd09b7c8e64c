//! Telemetry API access logging → Envoy access logs, with Istio's
//! precedence and merging (pilot/pkg/model/telemetry.go,
//! pilot/pkg/networking/core/accesslog.go).
//!
//! - The Telemetries that apply to a proxy, in order: the root namespace's
//!   selector-less one (the oldest if several), its own namespace's
//!   selector-less one (oldest), then those of its namespace whose
//!   `selector.matchLabels` its labels contain (oldest first). Later levels
//!   override earlier ones per provider (`disabled`, `filter`), starting
//!   from the MeshConfig's `defaultProviders.accessLogging`; with no
//!   Telemetry logging at all and no default provider, the MeshConfig's
//!   legacy `accessLogFile` applies.
//! - Direction: `match.mode` SERVER is a sidecar's inbound (filter chains
//!   ending in `inbound|PORT||`, or `virtualInbound`), CLIENT its outbound
//!   and every gateway listener.
//! - Each logging provider (an `envoyFileAccessLog`, or Istio's built-in
//!   `envoy`: /dev/stdout) is one `access_log` entry, sorted by provider
//!   name, on every HTTP connection manager and TCP proxy of that
//!   direction: path, Istio's default text format (or the provider's
//!   `logFormat`, or the MeshConfig's `accessLogFormat` / `accessLogEncoding`
//!   for `envoy`), `filter.expression` as Envoy's CEL filter. Providers of
//!   other kinds named in `accessLogging` are left out, as istiod does.
//!   Istio's listener-level entries (no filter chain matched) are not
//!   generated.
//!
//! Applied last, to the listeners translation produced ([`apply`]): a
//! no-op for a proxy no logging applies to.

use super::resources::{ProxyConfig, ResourceType, XdsResource};
use super::util::any;
use crate::mesh::{Config, Mesh, Service};
use crate::model::istio::mesh_config::{AccessLogEncoding, FileAccessLog, MeshConfig, OpenTelemetry, ProviderKind, BUILTIN_ENVOY, OTLP_HTTP_PATH};
use crate::model::istio::telemetry::{Filter as LogFilter, Telemetry};
use crate::model::proxy::{ProxyIdentity, ProxyKind};
use envoy_types::pb::envoy::config::accesslog::v3::{access_log, access_log_filter, extension_filter, AccessLog, AccessLogFilter, ExtensionFilter};
use envoy_types::pb::envoy::config::core::v3::TrafficDirection;
use envoy_types::pb::envoy::config::core::v3::{data_source, substitution_format_string, DataSource, SubstitutionFormatString};
use envoy_types::pb::envoy::config::core::v3::{
    grpc_service, http_uri, GrpcService, HeaderValue, HeaderValueOption, HttpService, HttpUri, TypedExtensionConfig,
};
use envoy_types::pb::envoy::config::listener::v3::{filter, Filter, Listener};
use envoy_types::pb::envoy::config::trace::v3::{
    tracing::http as tracing_http, tracing::Http as TracingHttp, zipkin_config::CollectorEndpointVersion, OpenTelemetryConfig, ZipkinConfig,
};
use envoy_types::pb::envoy::extensions::access_loggers::file::v3::{file_access_log, FileAccessLog as EnvoyFileAccessLog};
use envoy_types::pb::envoy::extensions::access_loggers::filters::cel::v3::ExpressionFilter;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::Tracing as HcmTracing;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{http_connection_manager::RouteSpecifier, HttpConnectionManager};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{tcp_proxy::ClusterSpecifier, TcpProxy};
use envoy_types::pb::envoy::extensions::tracers::opentelemetry::resource_detectors::v3::EnvironmentResourceDetectorConfig;
use envoy_types::pb::envoy::r#type::tracing::v3::{custom_tag, CustomTag as EnvoyCustomTag};
use envoy_types::pb::envoy::r#type::v3::Percent;
use envoy_types::pb::google::protobuf::{value::Kind as PbKind, Struct, Value as PbValue};
use envoy_types::pb::google::protobuf::{BoolValue, UInt32Value};
use prost::Message;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Istio's `EnvoyTextLogFormat` (pilot/pkg/model/telemetry_logging.go),
/// byte for byte.
pub const ISTIO_TEXT_FORMAT: &str = "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%\" %RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% \"%UPSTREAM_TRANSPORT_FAILURE_REASON%\" %BYTES_RECEIVED% %BYTES_SENT% %DURATION% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" \"%REQ(USER-AGENT)%\" \"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\" %UPSTREAM_CLUSTER_RAW% %UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% %REQUESTED_SERVER_NAME% %ROUTE_NAME%\n";

/// Istio's JSON default (`accessLogEncoding: JSON`): key → operator.
const ISTIO_JSON_FORMAT: &[(&str, &str)] = &[
    ("authority", "%REQ(:AUTHORITY)%"),
    ("bytes_received", "%BYTES_RECEIVED%"),
    ("bytes_sent", "%BYTES_SENT%"),
    ("connection_termination_details", "%CONNECTION_TERMINATION_DETAILS%"),
    ("downstream_local_address", "%DOWNSTREAM_LOCAL_ADDRESS%"),
    ("downstream_remote_address", "%DOWNSTREAM_REMOTE_ADDRESS%"),
    ("duration", "%DURATION%"),
    ("method", "%REQ(:METHOD)%"),
    ("path", "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%"),
    ("protocol", "%PROTOCOL%"),
    ("request_id", "%REQ(X-REQUEST-ID)%"),
    ("requested_server_name", "%REQUESTED_SERVER_NAME%"),
    ("response_code", "%RESPONSE_CODE%"),
    ("response_code_details", "%RESPONSE_CODE_DETAILS%"),
    ("response_flags", "%RESPONSE_FLAGS%"),
    ("route_name", "%ROUTE_NAME%"),
    ("start_time", "%START_TIME%"),
    ("upstream_cluster", "%UPSTREAM_CLUSTER_RAW%"),
    ("upstream_host", "%UPSTREAM_HOST%"),
    ("upstream_local_address", "%UPSTREAM_LOCAL_ADDRESS%"),
    ("upstream_service_time", "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%"),
    ("upstream_transport_failure_reason", "%UPSTREAM_TRANSPORT_FAILURE_REASON%"),
    ("user_agent", "%REQ(USER-AGENT)%"),
    ("x_forwarded_for", "%REQ(X-FORWARDED-FOR)%"),
];

const FILE_LOGGER: &str = "envoy.access_loggers.file";
const CEL_FILTER: &str = "envoy.access_loggers.extension_filters.cel";

/// The Telemetries that apply to `proxy`, in precedence order (later wins).
pub fn applicable<'m>(mesh: &'m Mesh, proxy: &ProxyIdentity) -> Vec<&'m Arc<Config<Telemetry>>> {
    let root = mesh.config.root_namespace.as_str();
    let oldest_in = |ns: &str| mesh.telemetries.iter().find(|t| t.key.namespace == ns && t.spec.selector.is_none());
    let mut out = Vec::new();
    out.extend(oldest_in(root));
    if proxy.namespace != root {
        out.extend(oldest_in(&proxy.namespace));
    }
    out.extend(mesh.telemetries.iter().filter(|t| {
        t.key.namespace == proxy.namespace && t.spec.selector.as_ref().is_some_and(|s| s.match_labels.iter().all(|(k, v)| proxy.labels.get(k) == Some(v)))
    }));
    out
}

/// Istio's `mergeLogs`: the logging providers of one direction, each with
/// the filter of the last entry that named it.
pub fn logging_providers(mesh: &Mesh, telemetries: &[&Arc<Config<Telemetry>>], server: bool) -> BTreeMap<String, Option<LogFilter>> {
    let defaults: Vec<String> = mesh.mesh_config.default_providers.as_ref().map(|d| d.access_logging.clone()).unwrap_or_default();
    let logs: Vec<&Telemetry> = telemetries.iter().map(|t| &t.spec).filter(|t| !t.access_logging.is_empty()).collect();
    let mut providers: BTreeMap<String, Option<LogFilter>> = BTreeMap::new();
    if logs.is_empty() {
        providers.extend(defaults.into_iter().map(|d| (d, None)));
        return providers;
    }
    let mut in_scope: std::collections::BTreeSet<String> = defaults.iter().cloned().collect();
    let mut filters: BTreeMap<String, Option<LogFilter>> = BTreeMap::new();
    for t in &logs {
        for l in t.access_logging.iter().filter(|l| l.mode().covers(server)) {
            for p in &l.providers {
                in_scope.insert(p.name.clone());
                filters.insert(p.name.clone(), l.filter.clone());
            }
        }
    }
    let mut parent = defaults;
    for t in &logs {
        for l in &t.access_logging {
            let mut names: Vec<String> = l.providers.iter().map(|p| p.name.clone()).collect();
            if names.is_empty() {
                names = parent.clone();
            }
            parent = names.clone();
            if !l.mode().covers(server) {
                continue;
            }
            for p in names.iter().filter(|p| in_scope.contains(*p)) {
                if l.disabled == Some(true) {
                    providers.remove(p);
                } else {
                    providers.insert(p.clone(), filters.get(p).cloned().flatten());
                }
            }
        }
    }
    providers
}

/// The `access_log` entries of one direction of `proxy`.
pub fn access_logs(mesh: &Mesh, proxy: &ProxyIdentity, server: bool) -> Vec<AccessLog> {
    let telemetries = applicable(mesh, proxy);
    let mc = &mesh.mesh_config;
    let providers = logging_providers(mesh, &telemetries, server);
    let logging_configured =
        mc.default_providers.as_ref().is_some_and(|d| !d.access_logging.is_empty()) || telemetries.iter().any(|t| !t.spec.access_logging.is_empty());
    if !logging_configured {
        // Istio's legacy mesh settings.
        return match mc.access_log_file.as_deref().filter(|f| !f.is_empty()) {
            Some(path) => vec![file_log(path, legacy_format(mc), None)],
            None => Vec::new(),
        };
    }
    providers
        .into_iter()
        .filter_map(|(name, filter)| match mc.provider(&name)? {
            ProviderKind::FileAccessLog(f) => Some(file_log(f.path.as_deref().unwrap_or("/dev/stdout"), format_of(mc, &name, f), filter.as_ref())),
            _ => None,
        })
        .collect()
}

/// The MeshConfig's own format: `accessLogFormat` (a newline appended when
/// missing) or Istio's default, in `accessLogEncoding`.
fn legacy_format(mc: &MeshConfig) -> SubstitutionFormatString {
    let custom = mc.access_log_format.as_deref().filter(|f| !f.is_empty());
    match mc.access_log_encoding {
        Some(AccessLogEncoding::Json) => {
            json_format(custom.map_or_else(default_json, |f| serde_json::from_str::<BTreeMap<String, String>>(f).unwrap_or_else(|_| default_json())))
        }
        _ => text_format(custom.unwrap_or(ISTIO_TEXT_FORMAT)),
    }
}

fn default_json() -> BTreeMap<String, String> {
    ISTIO_JSON_FORMAT.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn format_of(mc: &MeshConfig, name: &str, f: &FileAccessLog) -> SubstitutionFormatString {
    match f.log_format.as_ref() {
        Some(lf) => match (&lf.text, &lf.labels) {
            (Some(text), _) => text_format(text),
            (None, Some(labels)) if !labels.is_empty() => {
                let mut s = json_format(labels.clone());
                s.omit_empty_values = lf.omit_empty_values;
                s
            }
            _ => json_format(default_json()),
        },
        None if name == BUILTIN_ENVOY && mc.extension_providers.iter().all(|p| p.name != BUILTIN_ENVOY) => legacy_format(mc),
        None => text_format(ISTIO_TEXT_FORMAT),
    }
}

fn text_format(text: &str) -> SubstitutionFormatString {
    let text = if text.ends_with('\n') { text.to_string() } else { format!("{text}\n") };
    SubstitutionFormatString {
        format: Some(substitution_format_string::Format::TextFormatSource(DataSource {
            specifier: Some(data_source::Specifier::InlineString(text)),
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn json_format(labels: BTreeMap<String, String>) -> SubstitutionFormatString {
    let fields = labels.into_iter().map(|(k, v)| (k, PbValue { kind: Some(PbKind::StringValue(v)) })).collect();
    SubstitutionFormatString { format: Some(substitution_format_string::Format::JsonFormat(Struct { fields })), ..Default::default() }
}

fn file_log(path: &str, format: SubstitutionFormatString, filter: Option<&LogFilter>) -> AccessLog {
    let cfg = EnvoyFileAccessLog { path: path.into(), access_log_format: Some(file_access_log::AccessLogFormat::LogFormat(format)) };
    let filter = filter.map(|f| AccessLogFilter {
        filter_specifier: Some(access_log_filter::FilterSpecifier::ExtensionFilter(ExtensionFilter {
            name: CEL_FILTER.into(),
            config_type: Some(extension_filter::ConfigType::TypedConfig(any(&ExpressionFilter { expression: f.expression.clone(), ..Default::default() }))),
        })),
    });
    AccessLog { name: FILE_LOGGER.into(), filter, config_type: Some(access_log::ConfigType::TypedConfig(any(&cfg))) }
}

/// Istio's tracing merge for one direction: the provider (the first
/// named by the last level that names one, else
/// `defaultProviders.tracing[0]`), then field by field the later levels'
/// sampling, custom tags (as a whole) and span reporting.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TracingSpec {
    pub provider: Option<String>,
    pub sampling: Option<f64>,
    pub tags: BTreeMap<String, crate::model::istio::telemetry::CustomTag>,
    pub disabled: bool,
}

pub fn tracing_spec(mesh: &Mesh, telemetries: &[&Arc<Config<Telemetry>>], server: bool) -> TracingSpec {
    let mut spec = TracingSpec { provider: mesh.mesh_config.default_providers.as_ref().and_then(|d| d.tracing.first().cloned()), ..Default::default() };
    for t in telemetries {
        for tr in t.spec.tracing.iter().filter(|tr| tr.mode().covers(server)) {
            if let Some(p) = tr.providers.first() {
                spec.provider = Some(p.name.clone());
            }
            if let Some(p) = tr.random_sampling_percentage {
                spec.sampling = Some(p);
            }
            if !tr.custom_tags.is_empty() {
                spec.tags = tr.custom_tags.clone();
            }
            if let Some(d) = tr.disable_span_reporting {
                spec.disabled = d;
            }
        }
    }
    spec
}

/// Istio's default sampling when neither a Telemetry nor the MeshConfig's
/// `defaultConfig.tracing.sampling` says (`PILOT_TRACE_SAMPLING`).
const DEFAULT_SAMPLING: f64 = 1.0;
const ZIPKIN_TRACER: &str = "envoy.tracers.zipkin";
const OTEL_TRACER: &str = "envoy.tracers.opentelemetry";
const OTEL_ENV_DETECTOR: &str = "envoy.tracers.opentelemetry.resource_detectors.environment";
/// Envoy requires a timeout on an `HttpUri`; Istio leaves it to the user.
const OTLP_HTTP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The HCM `tracing` of one direction; `None` when tracing is off (no
/// provider, span reporting disabled, or a provider that is not a Zipkin
/// tracer of the mesh).
pub fn hcm_tracing(mesh: &Mesh, proxy: &ProxyIdentity, server: bool) -> Option<HcmTracing> {
    let spec = tracing_spec(mesh, &applicable(mesh, proxy), server);
    let name = spec.provider.as_deref().filter(|_| !spec.disabled)?;
    let (provider, max_tag_length) = tracer(mesh, proxy, name)?;
    let default_sampling = mesh.mesh_config.default_config.as_ref().and_then(|d| d.tracing.as_ref()).and_then(|t| t.sampling).filter(|s| *s > 0.0);
    let sampling = spec.sampling.or(default_sampling).unwrap_or(DEFAULT_SAMPLING);
    let percent = |v: f64| Some(Percent { value: v });
    let custom_tags = spec
        .tags
        .iter()
        .filter_map(|(tag, t)| {
            let r#type = if let Some(l) = &t.literal {
                custom_tag::Type::Literal(custom_tag::Literal { value: l.value.clone() })
            } else if let Some(e) = &t.environment {
                custom_tag::Type::Environment(custom_tag::Environment { name: e.name.clone(), default_value: e.default_value.clone().unwrap_or_default() })
            } else {
                let h = t.header.as_ref()?;
                custom_tag::Type::RequestHeader(custom_tag::Header { name: h.name.clone(), default_value: h.default_value.clone().unwrap_or_default() })
            };
            Some(EnvoyCustomTag { tag: tag.clone(), r#type: Some(r#type) })
        })
        .collect();
    Some(HcmTracing {
        client_sampling: percent(100.0),
        random_sampling: percent(sampling),
        overall_sampling: percent(100.0),
        max_path_tag_length: max_tag_length.map(|v| UInt32Value { value: v }),
        custom_tags,
        provider: Some(provider),
        // Istio: gateways start an upstream span of their own.
        spawn_upstream_span: (proxy.kind == ProxyKind::Router).then_some(BoolValue { value: true }),
        ..Default::default()
    })
}

/// The tracer of provider `name` and its `maxTagLength`; `None` when it is
/// not a tracer or its collector is not a service of the mesh (istiod
/// leaves tracing out alike).
fn tracer(mesh: &Mesh, proxy: &ProxyIdentity, name: &str) -> Option<(TracingHttp, Option<u32>)> {
    let typed = |name: &str, cfg: envoy_types::pb::google::protobuf::Any| TracingHttp {
        name: name.into(),
        config_type: Some(tracing_http::ConfigType::TypedConfig(cfg)),
    };
    match mesh.mesh_config.provider(name)? {
        ProviderKind::Zipkin(z) => {
            let svc = super::extauthz::provider_service(mesh, name, &z.service, z.port.0).ok()?;
            let zipkin = ZipkinConfig {
                collector_cluster: super::outbound_cluster_name(z.port.0, "", &svc.hostname),
                collector_endpoint: z.path.clone().unwrap_or_else(|| "/api/v2/spans".into()),
                collector_hostname: svc.hostname.clone(),
                trace_id_128bit: !z.enable64bit_trace_id.unwrap_or(false),
                shared_span_context: Some(BoolValue { value: false }),
                collector_endpoint_version: CollectorEndpointVersion::HttpJson as i32,
                ..Default::default()
            };
            Some((typed(ZIPKIN_TRACER, any(&zipkin)), z.max_tag_length))
        }
        ProviderKind::OpenTelemetry(o) => {
            let svc = super::extauthz::provider_service(mesh, name, &o.service, o.port.0).ok()?;
            Some((typed(OTEL_TRACER, any(&otel_config(o, &svc.hostname, proxy))), o.max_tag_length))
        }
        _ => None,
    }
}

/// Istio's `otelConfig` (pilot/pkg/networking/core/tracing.go): OTLP over
/// gRPC through the collector's outbound cluster (authority: its host
/// name), or over HTTP to `HOST/path` through it; the resource detectors
/// asked for; the service name is the proxy's service cluster.
fn otel_config(o: &OpenTelemetry, hostname: &str, proxy: &ProxyIdentity) -> OpenTelemetryConfig {
    let cluster = super::outbound_cluster_name(o.port.0, "", hostname);
    let (grpc_service, http_service) = match &o.http {
        None => {
            let target =
                grpc_service::TargetSpecifier::EnvoyGrpc(grpc_service::EnvoyGrpc { cluster_name: cluster, authority: hostname.into(), ..Default::default() });
            (Some(GrpcService { target_specifier: Some(target), ..Default::default() }), None)
        }
        Some(h) => {
            let path = h.path.as_deref().unwrap_or(OTLP_HTTP_PATH);
            let uri = HttpUri {
                uri: format!("{hostname}{path}"),
                http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster(cluster)),
                timeout: Some(h.timeout.as_ref().map(super::util::istio_duration).unwrap_or(super::util::duration(OTLP_HTTP_TIMEOUT))),
            };
            let headers = h
                .headers
                .iter()
                .map(|hd| HeaderValueOption {
                    header: Some(HeaderValue { key: hd.name.clone(), value: hd.value.clone().unwrap_or_default(), ..Default::default() }),
                    ..Default::default()
                })
                .collect();
            (None, Some(HttpService { http_uri: Some(uri), request_headers_to_add: headers, ..Default::default() }))
        }
    };
    let resource_detectors = o
        .resource_detectors
        .as_ref()
        .filter(|d| d.environment.is_some())
        .map(|_| TypedExtensionConfig { name: OTEL_ENV_DETECTOR.into(), typed_config: Some(any(&EnvironmentResourceDetectorConfig::default())) })
        .into_iter()
        .collect();
    OpenTelemetryConfig { grpc_service, http_service, service_name: service_cluster(proxy), resource_detectors, ..Default::default() }
}

/// Istio's service cluster of a proxy (istio-agent's default
/// `--serviceCluster`): its canonical service name, else its `app` label,
/// else its workload name, then `.NAMESPACE`.
pub fn service_cluster(proxy: &ProxyIdentity) -> String {
    let name = ["service.istio.io/canonical-name", "app.kubernetes.io/name", "app"].iter().find_map(|k| proxy.labels.get(*k)).unwrap_or(&proxy.name);
    format!("{name}.{}", proxy.namespace)
}

/// The collectors' services of the tracers `proxy` uses: their clusters
/// must be in its config even outside its outbound scope.
pub fn tracer_services(mesh: &Mesh, proxy: &ProxyIdentity) -> BTreeMap<String, Arc<Service>> {
    if proxy.kind == ProxyKind::Grpc || mesh.telemetries.is_empty() && mesh.mesh_config.default_providers.is_none() {
        return BTreeMap::new();
    }
    let telemetries = applicable(mesh, proxy);
    [false, true]
        .iter()
        .filter_map(|server| {
            let spec = tracing_spec(mesh, &telemetries, *server);
            let name = spec.provider?;
            let (service, port) = match mesh.mesh_config.provider(&name)? {
                ProviderKind::Zipkin(z) => (&z.service, z.port.0),
                ProviderKind::OpenTelemetry(o) => (&o.service, o.port.0),
                _ => return None,
            };
            super::extauthz::provider_service(mesh, &name, service, port).ok()
        })
        .map(|s| (s.hostname.clone(), s))
        .collect()
}

/// Put the access logs and tracing into every listener of `cfg` (gRPC
/// proxies have none).
pub fn apply(cfg: &mut ProxyConfig, mesh: &Mesh, proxy: &ProxyIdentity) {
    if proxy.kind == ProxyKind::Grpc || (mesh.telemetries.is_empty() && *mesh.mesh_config == MeshConfig::default()) {
        return;
    }
    let gateway = proxy.kind == ProxyKind::Router;
    let client = Side { logs: access_logs(mesh, proxy, false), tracing: hcm_tracing(mesh, proxy, false) };
    let server = if gateway { Side::default() } else { Side { logs: access_logs(mesh, proxy, true), tracing: hcm_tracing(mesh, proxy, true) } };
    if client.is_empty() && server.is_empty() {
        return;
    }
    let listeners: Vec<(String, Arc<XdsResource>)> = cfg.of(ResourceType::Listener).into_iter().flatten().map(|(n, r)| (n.clone(), r.clone())).collect();
    for (name, res) in listeners {
        let Ok(mut l) = Listener::decode(res.any.value.as_slice()) else { continue };
        let inbound_listener = l.name == super::capture::VIRTUAL_INBOUND;
        let (mut changed, mut server_side) = (false, inbound_listener);
        for chain in &mut l.filter_chains {
            for f in &mut chain.filters {
                changed |= with_logs(f, |inbound| {
                    let is_server = !gateway && (inbound || inbound_listener);
                    server_side |= is_server;
                    if is_server {
                        &server
                    } else {
                        &client
                    }
                });
            }
        }
        if changed {
            // As Istio's listeners: spans are SERVER on the inbound side,
            // CLIENT on the outbound side and at gateways.
            if l.traffic_direction == 0 {
                l.traffic_direction = if server_side { TrafficDirection::Inbound } else { TrafficDirection::Outbound } as i32;
            }
            cfg.insert(ResourceType::Listener, XdsResource::new(name, &l));
        }
    }
}

/// What one direction gets.
#[derive(Default)]
struct Side {
    logs: Vec<AccessLog>,
    tracing: Option<HcmTracing>,
}

impl Side {
    fn is_empty(&self) -> bool {
        self.logs.is_empty() && self.tracing.is_none()
    }
}

/// Set the access logs (and, on an HCM, the tracing) of one HCM or TCP
/// proxy filter; whether it was one.
fn with_logs<'a>(f: &mut Filter, mut side: impl FnMut(bool) -> &'a Side) -> bool {
    let Some(filter::ConfigType::TypedConfig(a)) = &mut f.config_type else { return false };
    if f.name == super::listener::HCM {
        let Ok(mut hcm) = HttpConnectionManager::decode(a.value.as_slice()) else { return false };
        let inbound = matches!(&hcm.route_specifier, Some(RouteSpecifier::RouteConfig(rc)) if rc.name.starts_with("inbound|"));
        let side = side(inbound);
        hcm.access_log = side.logs.clone();
        hcm.tracing = side.tracing.clone();
        *a = any(&hcm);
        true
    } else if f.name == super::listener::TCP_PROXY {
        let Ok(mut tcp) = TcpProxy::decode(a.value.as_slice()) else { return false };
        let inbound = matches!(&tcp.cluster_specifier, Some(ClusterSpecifier::Cluster(c)) if c.starts_with("inbound|"));
        tcp.access_log = side(inbound).logs.clone();
        *a = any(&tcp);
        true
    } else {
        false
    }
}
