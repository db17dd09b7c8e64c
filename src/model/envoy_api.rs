//! Envoy's API as data: a descriptor pool of every Envoy config and
//! extension message (compiled by build.rs from the `.proto` files the
//! envoy-types crate ships), proto-JSON → protobuf with field paths in
//! errors, and protobuf MERGE as Istio does it (`pkg/proto/merge`).
//!
//! EnvoyFilter patch values (`model::istio::envoy_filter`) are checked and
//! built here, so any Envoy extension a user names by `@type` works
//! without Lodestar knowing it. Pure: no IO.

use prost::Message as _;
use prost_reflect::{DescriptorPool, DynamicMessage, Kind as FieldKind, MessageDescriptor, ReflectMessage, Value as PValue};
use serde_json::{Map, Value};
use std::sync::LazyLock;

static POOL: LazyLock<Result<DescriptorPool, String>> =
    LazyLock::new(|| DescriptorPool::decode(include_bytes!(concat!(env!("OUT_DIR"), "/envoy_descriptors.bin")).as_ref()).map_err(|e| e.to_string()));

/// The descriptor pool of Envoy's API.
pub fn pool() -> Result<&'static DescriptorPool, String> {
    POOL.as_ref().map_err(|e| format!("envoy descriptors: {e}"))
}

/// `udpa.type.v1.TypedStruct` and `xds.type.v3.TypedStruct`: an `Any`
/// whose content is a JSON struct of type `type_url`. Envoy expands it into
/// that type; so does [`message_from_json`] (checking its fields too).
pub const TYPED_STRUCTS: [&str; 2] = ["udpa.type.v1.TypedStruct", "xds.type.v3.TypedStruct"];

/// Well-known types with a JSON form of their own (not an object of fields).
fn special_json(desc: &MessageDescriptor) -> bool {
    desc.full_name().starts_with("google.protobuf.") && desc.full_name() != "google.protobuf.Any"
}

/// The message name of a type URL (`type.googleapis.com/NAME`).
pub fn type_name(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or(url)
}

/// A problem at a path below the value (`typed_config.@type`), and why.
pub type JsonError = (String, String);

/// Proto-JSON `value` as a message of type `full_name`: field names in
/// snake_case or lowerCamelCase, `Any` by `@type` from the pool (TypedStruct
/// expanded into its type), unknown fields and types refused. Errors name
/// the path below `value` (empty for the value itself).
pub fn message_from_json(full_name: &str, value: &Value) -> Result<DynamicMessage, JsonError> {
    let pool = pool().map_err(|e| (String::new(), e))?;
    let desc = pool.get_message_by_name(full_name).ok_or_else(|| (String::new(), format!("no descriptor for {full_name}")))?;
    let normalized = normalize(pool, &desc, value, "")?;
    DynamicMessage::deserialize(desc, normalized).map_err(|e| (String::new(), e.to_string()))
}

fn join(at: &str, field: &str) -> String {
    if at.is_empty() {
        field.to_string()
    } else {
        format!("{at}.{field}")
    }
}

/// Checks every field name and `@type` of `value` against `desc`, and
/// expands TypedStructs, so that the deserializer (which names no path)
/// only sees input whose structure is right.
fn normalize(pool: &DescriptorPool, desc: &MessageDescriptor, value: &Value, at: &str) -> Result<Value, JsonError> {
    if special_json(desc) || value.is_null() {
        return Ok(value.clone());
    }
    let Some(obj) = value.as_object() else {
        return Err((at.to_string(), format!("expected an object ({})", desc.full_name())));
    };
    if desc.full_name() == "google.protobuf.Any" {
        return normalize_any(pool, obj, at);
    }
    let mut out = Map::new();
    for (k, v) in obj {
        let here = join(at, k);
        let field = desc
            .get_field_by_name(k)
            .or_else(|| desc.get_field_by_json_name(k))
            .ok_or_else(|| (here.clone(), format!("unknown field {k:?} of {}", desc.full_name())))?;
        let v = match field.kind() {
            FieldKind::Message(inner) if field.is_map() => {
                let value_kind = inner.map_entry_value_field().kind();
                match (value_kind, v.as_object()) {
                    (FieldKind::Message(m), Some(entries)) => {
                        let mut map = Map::new();
                        for (mk, mv) in entries {
                            map.insert(mk.clone(), normalize(pool, &m, mv, &join(&here, mk))?);
                        }
                        Value::Object(map)
                    }
                    _ => v.clone(),
                }
            }
            FieldKind::Message(inner) if field.is_list() => match v.as_array() {
                Some(items) => {
                    Value::Array(items.iter().enumerate().map(|(i, item)| normalize(pool, &inner, item, &format!("{here}[{i}]"))).collect::<Result<_, _>>()?)
                }
                None => v.clone(),
            },
            FieldKind::Message(inner) => normalize(pool, &inner, v, &here)?,
            _ => v.clone(),
        };
        out.insert(k.clone(), v);
    }
    Ok(Value::Object(out))
}

fn normalize_any(pool: &DescriptorPool, obj: &Map<String, Value>, at: &str) -> Result<Value, JsonError> {
    let type_at = join(at, "@type");
    let url = obj.get("@type").and_then(Value::as_str).ok_or_else(|| (type_at.clone(), "an Any needs a \"@type\" (a type URL)".to_string()))?;
    let lookup = |url: &str, at: &str| {
        let name = type_name(url);
        let hint = if name.contains(".v2.") { " (Envoy's v2 API is gone: use the v3 type)" } else { "" };
        pool.get_message_by_name(name).ok_or_else(|| (at.to_string(), format!("unknown type URL {url:?}: no Envoy message {name}{hint}")))
    };
    if TYPED_STRUCTS.contains(&type_name(url)) {
        if let Some(k) = obj.keys().find(|k| !matches!(k.as_str(), "@type" | "type_url" | "typeUrl" | "value")) {
            return Err((join(at, k), format!("unknown field {k:?} of {}", type_name(url))));
        }
        let inner_at = join(at, "type_url");
        let inner_url = obj
            .get("type_url")
            .or_else(|| obj.get("typeUrl"))
            .and_then(Value::as_str)
            .ok_or_else(|| (inner_at.clone(), "a TypedStruct needs a type_url".to_string()))?;
        let desc = lookup(inner_url, &inner_at)?;
        let content = obj.get("value").cloned().unwrap_or_else(|| Value::Object(Map::new()));
        let mut expanded = normalize(pool, &desc, &content, &join(at, "value"))?;
        return Ok(with_type(&mut expanded, inner_url, &desc));
    }
    let desc = lookup(url, &type_at)?;
    let mut rest = Value::Object(obj.iter().filter(|(k, _)| k.as_str() != "@type").map(|(k, v)| (k.clone(), v.clone())).collect());
    if special_json(&desc) {
        return Ok(Value::Object(obj.clone()));
    }
    let mut expanded = normalize(pool, &desc, &rest, at)?;
    rest = with_type(&mut expanded, url, &desc);
    Ok(rest)
}

fn with_type(expanded: &mut Value, url: &str, desc: &MessageDescriptor) -> Value {
    let mut out = Map::new();
    let url = if url.contains('/') { url.to_string() } else { format!("type.googleapis.com/{}", desc.full_name()) };
    out.insert("@type".into(), Value::String(url));
    if let Some(o) = expanded.as_object_mut() {
        out.extend(std::mem::take(o));
    }
    Value::Object(out)
}

/// `message` (a generated Envoy type) as a dynamic message of the pool.
pub fn to_dynamic<M: prost::Message + prost::Name>(message: &M) -> Result<DynamicMessage, String> {
    let desc = pool()?.get_message_by_name(&M::full_name()).ok_or_else(|| format!("no descriptor for {}", M::full_name()))?;
    DynamicMessage::decode(desc, message.encode_to_vec().as_slice()).map_err(|e| e.to_string())
}

/// A dynamic message as the generated type `M`.
pub fn from_dynamic<M: prost::Message + Default>(message: &DynamicMessage) -> Result<M, String> {
    M::decode(message.encode_to_vec().as_slice()).map_err(|e| e.to_string())
}

/// Istio's MERGE (`pkg/proto/merge`): over the fields set in `patch`,
/// scalars overwrite (proto3 fields without presence at their zero value
/// count as not set), messages merge recursively, `google.protobuf.Duration`
/// is replaced whole, repeated fields append, map entries replace the
/// entry with the same key; `Any` merges as a message (type and bytes
/// overwritten). Both must be of the same type.
pub fn merge(base: &mut DynamicMessage, patch: &DynamicMessage) {
    for (field, value) in patch.fields() {
        if !field.supports_presence() && value.is_default(&field.kind()) {
            continue;
        }
        match value {
            PValue::List(items) => {
                if let Some(list) = base.get_field_mut(&field).as_list_mut() {
                    list.extend(items.iter().cloned());
                }
            }
            PValue::Map(entries) => {
                if let Some(map) = base.get_field_mut(&field).as_map_mut() {
                    map.extend(entries.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
            }
            PValue::Message(m) if m.descriptor().full_name() != "google.protobuf.Duration" && base.has_field(&field) => {
                if let Some(existing) = base.get_field_mut(&field).as_message_mut() {
                    merge(existing, m);
                }
            }
            other => base.set_field(&field, other.clone()),
        }
    }
}

/// The message packed in an `Any` (`type_url` and `value`), decoded.
pub fn unpack(type_url: &str, bytes: &[u8]) -> Result<DynamicMessage, String> {
    let name = type_name(type_url);
    let desc = pool()?.get_message_by_name(name).ok_or_else(|| format!("no descriptor for {name}"))?;
    DynamicMessage::decode(desc, bytes).map_err(|e| format!("decoding {name}: {e}"))
}

/// The full name of a dynamic message's type.
pub fn full_name(m: &DynamicMessage) -> String {
    m.descriptor().full_name().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn typed_config_checks_types_and_fields_with_paths() {
        let ok = json!({"name": "envoy.lua", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua", "inlineCode": "x"}});
        let m = message_from_json("envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter", &ok).unwrap();
        assert!(m.has_field_by_name("typed_config"));
        let bad_type = json!({"name": "x", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.nope.v3.Nope"}});
        let e = message_from_json("envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter", &bad_type).unwrap_err();
        assert_eq!(e.0, "typed_config.@type");
        let bad_field = json!({"name": "x", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua", "inline_cod": "x"}});
        let e = message_from_json("envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter", &bad_field).unwrap_err();
        assert_eq!(e.0, "typed_config.inline_cod");
        let typed_struct = json!({"name": "x", "typed_config": {"@type": "type.googleapis.com/udpa.type.v1.TypedStruct",
            "type_url": "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit", "value": {"stat_prefix": "p", "bogus": 1}}});
        let e = message_from_json("envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter", &typed_struct).unwrap_err();
        assert_eq!(e.0, "typed_config.value.bogus");
    }

    #[test]
    fn merge_appends_lists_replaces_durations_and_map_entries() {
        let base = message_from_json(
            "envoy.config.cluster.v3.Cluster",
            &json!({"name": "a", "connect_timeout": "1.5s", "metadata": {"filter_metadata": {"k": {"a": 1}}}, "health_checks": [{"timeout": "1s"}]}),
        )
        .unwrap();
        let patch = message_from_json(
            "envoy.config.cluster.v3.Cluster",
            &json!({"connect_timeout": "2s", "metadata": {"filter_metadata": {"k": {"b": 2}}}, "health_checks": [{"timeout": "2s"}]}),
        )
        .unwrap();
        let mut merged = base.clone();
        merge(&mut merged, &patch);
        let c: envoy_types::pb::envoy::config::cluster::v3::Cluster = from_dynamic(&merged).unwrap();
        assert_eq!(c.name, "a");
        assert_eq!(c.connect_timeout.map(|d| (d.seconds, d.nanos)), Some((2, 0)));
        assert_eq!(c.health_checks.len(), 2);
        let fm = &c.metadata.unwrap().filter_metadata["k"];
        assert!(fm.fields.contains_key("b") && !fm.fields.contains_key("a"));
    }
}
