//! Envoy resources as proto-JSON (the form Envoy's own config_dump uses),
//! through a descriptor set of the Envoy API compiled by build.rs. Used by
//! golden tests and debug endpoints; never on the push path.

use envoy_types::pb::google::protobuf::Any;
use prost_reflect::{DynamicMessage, SerializeOptions};
use serde_json::Value;

/// Render a packed resource as proto-JSON, nested `Any`s included.
pub fn any_to_json(any: &Any) -> Result<Value, String> {
    if any.type_url == <super::dns::NameTable as prost::Name>::type_url() {
        return super::dns::table_json(any);
    }
    let pool = crate::model::envoy_api::pool()?;
    let name = any.type_url.rsplit('/').next().unwrap_or_default();
    let desc = pool.get_message_by_name(name).ok_or_else(|| format!("no descriptor for {name}"))?;
    let msg = DynamicMessage::decode(desc, any.value.as_slice()).map_err(|e| format!("decoding {name}: {e}"))?;
    let opts = SerializeOptions::new().stringify_64_bit_integers(false);
    msg.serialize_with_options(serde_json::value::Serializer, &opts).map_err(|e| format!("rendering {name}: {e}"))
}
