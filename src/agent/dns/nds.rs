//! The DNS proxy's name table, watched over xDS as Istio's agent does
//! (NDS: `istio.networking.nds.v1.NameTable`): an ADS stream of its own to
//! a replica, over mutual TLS with the workload certificate, that
//! subscribes to that one type. Its node is the proxy's, with the name
//! `NAME.dns` (so `/debug/syncz` and `config_dump` keep Envoy's stream
//! apart) and `LODESTAR_NAME_TABLE_ONLY` (the replica translates the table
//! only, of what the proxy's Sidecar lets it reach). The replicas are tried
//! in turn; a broken stream is dialled again after a backoff.

use super::{stopped, Names};
use crate::{CaClient, Identity};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value as PbValue};
use lodestar_model::dns::NameTable;
use prost::Message;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// JSON (a bootstrap's node metadata) as a protobuf `Struct` value.
fn to_pb(v: &Value) -> PbValue {
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(a) => Kind::ListValue(ListValue { values: a.iter().map(to_pb).collect() }),
        Value::Object(o) => Kind::StructValue(Struct { fields: o.iter().map(|(k, v)| (k.clone(), to_pb(v))).collect() }),
    };
    PbValue { kind: Some(kind) }
}

/// The DNS stream's node, from the proxy's (a bootstrap's `node`): the
/// same namespace, address, labels and capture; the name `NAME.dns`.
pub fn dns_node(envoy_node: &Value) -> anyhow::Result<Node> {
    let id = envoy_node["id"].as_str().ok_or_else(|| anyhow::anyhow!("the bootstrap's node has no id"))?;
    let parts: Vec<&str> = id.split('~').collect();
    let [kind, ip, name_ns, domain] = parts.as_slice() else { anyhow::bail!("node id {id:?} is not TYPE~IP~NAME.NAMESPACE~DOMAIN") };
    let (name, ns) = name_ns.rsplit_once('.').ok_or_else(|| anyhow::anyhow!("node id {id:?}: no namespace"))?;
    let mut meta = envoy_node["metadata"].as_object().cloned().unwrap_or_default();
    meta.insert("NAME".into(), Value::String(format!("{name}.dns")));
    meta.insert(lodestar_model::proxy::NAME_TABLE_ONLY_METADATA.into(), Value::String("true".into()));
    let metadata = Struct { fields: meta.iter().map(|(k, v)| (k.clone(), to_pb(v))).collect() };
    Ok(Node { id: format!("{kind}~{ip}~{name}.dns.{ns}~{domain}"), metadata: Some(metadata), cluster: format!("{name}.{ns}"), ..Default::default() })
}

/// Keep `tx` current with the proxy's name table until `shutdown`.
pub async fn watch_names(
    ca: CaClient,
    identity: watch::Receiver<Option<Arc<Identity>>>,
    node: Node,
    domain: String,
    tx: watch::Sender<Arc<Names>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = BACKOFF_MIN;
    let mut i = 0usize;
    loop {
        let server = ca.servers.get(i % ca.servers.len().max(1)).cloned().unwrap_or_default();
        i += 1;
        let current = identity.borrow().clone();
        let run = async {
            let Some(current) = current else { return Err("no certificate yet".to_string()) };
            stream(&ca, &server, &current, &node, &domain, &tx, &mut backoff).await
        };
        tokio::select! {
            _ = stopped(&mut shutdown) => return,
            r = run => {
                if let Err(e) = r {
                    tracing::warn!(%server, error = %e, "DNS proxy: the name table stream ended; dialling again in {backoff:?}");
                }
            }
        }
        tokio::select! {
            _ = stopped(&mut shutdown) => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// One stream: subscribe, then take each table and ACK it.
async fn stream(
    ca: &CaClient,
    server: &str,
    current: &Identity,
    node: &Node,
    domain: &str,
    tx: &watch::Sender<Arc<Names>>,
    backoff: &mut Duration,
) -> Result<(), String> {
    let channel = ca.channel(server, Some(current), None).await.map_err(|s| s.message().to_string())?;
    let (req_tx, req_rx) = tokio::sync::mpsc::channel(4);
    let type_url = <NameTable as prost::Name>::type_url();
    let first = DiscoveryRequest { node: Some(node.clone()), type_url: type_url.clone(), ..Default::default() };
    req_tx.send(first).await.map_err(|e| e.to_string())?;
    let mut responses = AggregatedDiscoveryServiceClient::new(channel)
        .stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(req_rx))
        .await
        .map_err(|s| format!("{}: {}", s.code(), s.message()))?
        .into_inner();
    while let Some(r) = responses.message().await.map_err(|s| format!("{}: {}", s.code(), s.message()))? {
        let table = match r.resources.first() {
            None => NameTable::default(),
            Some(any) => NameTable::decode(any.value.as_slice()).map_err(|e| format!("the name table does not decode: {e}"))?,
        };
        let names = Names::from_table(&table, domain);
        tracing::info!(names = names.len(), version = %r.version_info, "DNS proxy: name table");
        tx.send_replace(Arc::new(names));
        *backoff = BACKOFF_MIN;
        let ack = DiscoveryRequest { type_url: type_url.clone(), version_info: r.version_info.clone(), response_nonce: r.nonce.clone(), ..Default::default() };
        req_tx.send(ack).await.map_err(|e| e.to_string())?;
    }
    Err("the replica closed the stream".into())
}
