//! Small conversions from the Istio model to Envoy protos.

use crate::model::istio::common::{MatchKind, Percent, StringMatch};
use crate::model::istio::Duration as IstioDuration;
use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::{
    config_source::ConfigSourceSpecifier, AggregatedConfigSource, ApiVersion, ConfigSource, HeaderValue, HeaderValueOption,
};
use envoy_types::pb::envoy::config::core::v3::{transport_socket, TransportSocket};
use envoy_types::pb::envoy::r#type::matcher::v3::{string_matcher::MatchPattern, RegexMatcher, StringMatcher};
use envoy_types::pb::envoy::r#type::v3::{fractional_percent::DenominatorType, FractionalPercent};
use envoy_types::pb::google::protobuf::{Any, Duration};
use prost::{Message, Name};
use std::collections::BTreeMap;

pub const TLS_TRANSPORT_SOCKET: &str = "envoy.transport_sockets.tls";

pub fn transport_socket<M: Message + Name>(context: &M) -> TransportSocket {
    TransportSocket { name: TLS_TRANSPORT_SOCKET.into(), config_type: Some(transport_socket::ConfigType::TypedConfig(any(context))) }
}

pub fn any<M: Message + Name>(m: &M) -> Any {
    Any { type_url: M::type_url(), value: m.encode_to_vec() }
}

pub fn duration(d: std::time::Duration) -> Duration {
    Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

/// Stored specs were validated, so a duration always parses; a zero
/// duration stands in if one somehow does not.
pub fn istio_duration(d: &IstioDuration) -> Duration {
    duration(d.to_std().unwrap_or_default())
}

pub fn millis(ms: u64) -> Duration {
    duration(std::time::Duration::from_millis(ms))
}

/// Istio percentages (0–100, fractional) as millionths, as Pilot does.
pub fn fraction(p: Option<&Percent>, default_percent: f64) -> FractionalPercent {
    let v = p.map_or(default_percent, |p| p.get());
    FractionalPercent { numerator: (v.clamp(0.0, 100.0) * 10_000.0).round() as u32, denominator: DenominatorType::Million as i32 }
}

pub fn string_matcher(m: &StringMatch, ignore_case: bool) -> Option<StringMatcher> {
    let pattern = match m.kind()? {
        MatchKind::Exact(s) => MatchPattern::Exact(s.to_string()),
        MatchKind::Prefix(s) => MatchPattern::Prefix(s.to_string()),
        MatchKind::Regex(s) => MatchPattern::SafeRegex(RegexMatcher { regex: s.to_string(), ..Default::default() }),
    };
    Some(StringMatcher { match_pattern: Some(pattern), ignore_case })
}

pub fn ads_config_source() -> ConfigSource {
    ConfigSource {
        config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource::default())),
        resource_api_version: ApiVersion::V3 as i32,
        ..Default::default()
    }
}

/// Istio `set` overwrites, `add` appends.
pub fn header_options(set: &BTreeMap<String, String>, add: &BTreeMap<String, String>) -> Vec<HeaderValueOption> {
    let opt = |k: &String, v: &String, action: HeaderAppendAction| HeaderValueOption {
        header: Some(HeaderValue { key: k.clone(), value: v.clone(), ..Default::default() }),
        append_action: action as i32,
        ..Default::default()
    };
    set.iter()
        .map(|(k, v)| opt(k, v, HeaderAppendAction::OverwriteIfExistsOrAdd))
        .chain(add.iter().map(|(k, v)| opt(k, v, HeaderAppendAction::AppendIfExistsOrAdd)))
        .collect()
}
