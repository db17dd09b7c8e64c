//! ListenerSet (GEP-1713, issue 39): listeners a Gateway lets other
//! objects add (`spec.allowedListeners`), served by that Gateway's proxies.
//! One replica, one real gateway Envoy: a route attached through a
//! ListenerSet's listener, on a port the Gateway itself does not have,
//! answers; a ListenerSet whose Gateway admits none is refused and its
//! status says so; bad input is refused naming the field, over REST and
//! gRPC; the CLI knows the kind by its short name.

use crate::gateway_api::with_status;
use crate::kit;
use kit::envoy::EnvoyOptions;
use kit::mesh::*;
use serde_json::Value;

const SETUP: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: lodestar}
spec: {controllerName: lodestar.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: web, namespace: shop}
spec:
  gatewayClassName: lodestar
  allowedListeners: {namespaces: {from: Same}}
  listeners:
  - {name: http, port: 8080, protocol: HTTP}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: closed, namespace: shop}
spec:
  gatewayClassName: lodestar
  listeners:
  - {name: http, port: 8090, protocol: HTTP}
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: refused, namespace: shop}
spec:
  parentRef: {name: closed}
  listeners:
  - {name: extra, port: 8092, protocol: HTTP}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: store, namespace: shop}
spec:
  parentRefs: [{kind: ListenerSet, name: store, sectionName: extra}]
  hostnames: [store.example]
  rules:
  - backendRefs: [{name: store, port: 80}]
"#;

/// The ListenerSet added over gRPC.
const STORE_SET: &str = r#"{"apiVersion": "gateway.networking.k8s.io/v1", "kind": "ListenerSet",
  "metadata": {"name": "store", "namespace": "shop"},
  "spec": {"parentRef": {"name": "web"}, "listeners": [{"name": "extra", "port": 8081, "protocol": "HTTP"}]}}"#;

fn condition(obj: &Value, kind: &str) -> Value {
    obj["status"]["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == kind).cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_set_adds_a_port_to_its_gateway_and_a_closed_gateway_refuses_one() {
    use lodestar::proto::api::{ApplyItem, ApplyRequest, GetRequest};
    let fx = Fixture::start(1).await;
    let api = fx.api(1);
    let up = fx.upstream(10, "store-1").await;
    let instance = format!(
        "apiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {{name: store, namespace: shop}}\nspec: {{ports: [{{name: http, number: 80, protocol: HTTP}}]}}\n---\n\
         apiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {{name: store-1, namespace: shop}}\nspec: {{service: store, address: \"{}\", ports: {{http: {}}}}}\n",
        up.addr.ip(),
        up.addr.port()
    );
    let setup = fx.apply(&format!("{SETUP}---\n{instance}")).await;
    let mut watch = fx.client.get(format!("{api}/v1/watch?fromRevision={setup}&namespace=shop")).send().await.unwrap();
    assert_eq!(watch.status(), 200);

    // Bad input: refused, naming the field, over REST and gRPC.
    let bad = "apiVersion: gateway.networking.k8s.io/v1\nkind: ListenerSet\nmetadata: {name: bad, namespace: shop}\nspec:\n  parentRef: {name: web}\n  listeners:\n  - {name: a, port: 8083, protocol: HTTP}\n  - {name: a, port: 8084, protocol: HTTP}\n";
    let (code, body) = kit::apply(&fx.client, &api, bad).await;
    assert!(code == 400 && body.to_string().contains("spec.listeners[1].name"), "{code} {body}");
    let mut grpc = kit::grpc_api(&api);
    let item = |json: String| ApplyRequest { items: vec![ApplyItem { resource_json: json, expected_revision: None }], ..Default::default() };
    let err = grpc.apply(item(STORE_SET.replace("8081", "0"))).await.unwrap_err();
    assert!(err.code() == tonic::Code::InvalidArgument && err.message().contains("spec.listeners[0].port"), "{err:?}");
    let rev = grpc.apply(item(STORE_SET.to_string())).await.unwrap().into_inner().revision;
    let got = grpc.get(GetRequest { kind: "lset".into(), namespace: "shop".into(), name: "store".into(), consistency: 0 }).await.unwrap().into_inner();
    assert!(got.resource_json.contains("\"kind\":\"ListenerSet\""), "{}", got.resource_json);
    // Watched, as every kind.
    let mut buf = String::new();
    let event = loop {
        let found = buf
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|e| e["object"]["kind"] == "ListenerSet" && e["object"]["metadata"]["name"] == "store");
        if let Some(e) = found {
            break e;
        }
        let chunk = tokio::time::timeout(BOUND, watch.chunk()).await.expect("a watch event in time").unwrap().expect("the watch is open");
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
    };
    assert_eq!(event["object"]["metadata"]["modRevision"].as_u64(), Some(rev), "{event}");

    // The Gateway's proxy serves the set's port; the route answers there,
    // not on the Gateway's own listener.
    let mut o = EnvoyOptions::new("web", &fx.ip(2));
    o.node_type = "router".into();
    o.namespace = "shop".into();
    o.labels = vec![(lodestar::translate::gateway_api::NAME_LABEL.into(), "web".into())];
    let p = fx.proxy(o, 1, rev).await;
    let r = wait_for(&fx.client, &format!("http://{}:8081/", p.ip), "store.example", &[], "the ListenerSet's listener", |r| r.status == 200).await;
    assert_eq!(r.body.trim(), "store-1");
    let own = send(&fx.client, &format!("http://{}:8080/", p.ip), "store.example", &[]).await.unwrap();
    assert_eq!(own.status, 404, "a route of the set answered on the Gateway's own listener");
    let other = send(&fx.client, &format!("http://{}:8081/", p.ip), "other.example", &[]).await.unwrap();
    assert_eq!(other.status, 404, "a host the route does not name was routed");

    // Status: the set accepted with its listener's attached route; the
    // Gateway counts it; the refused set says why, and is not served.
    let set = with_status(&fx.client, &format!("{api}/v1/resources/lset/shop/store"), |s| s["status"]["listeners"][0]["attachedRoutes"] == 1).await;
    assert_eq!((condition(&set, "Accepted")["status"].as_str(), condition(&set, "Programmed")["status"].as_str()), (Some("True"), Some("True")), "{set}");
    let listener = &set["status"]["listeners"][0];
    assert_eq!(listener["supportedKinds"][0]["kind"], "HTTPRoute", "{set}");
    let gw = with_status(&fx.client, &format!("{api}/v1/resources/gtw/shop/web"), |g| g["status"]["attachedListenerSets"] == 1).await;
    assert_eq!(gw["status"]["listeners"][0]["attachedRoutes"], 0, "{gw}");
    let route = with_status(&fx.client, &format!("{api}/v1/resources/httproutes/shop/store"), |_| true).await;
    assert_eq!(route["status"]["parents"][0]["parentRef"]["kind"], "ListenerSet", "{route}");
    assert_eq!(route["status"]["parents"][0]["conditions"][0]["status"], "True", "{route}");
    let refused = with_status(&fx.client, &format!("{api}/v1/resources/listenersets/shop/refused"), |_| true).await;
    for kind in ["Accepted", "Programmed"] {
        let c = condition(&refused, kind);
        assert_eq!((c["status"].as_str(), c["reason"].as_str()), (Some("False"), Some("NotAllowed")), "{refused}");
    }
    let closed = with_status(&fx.client, &format!("{api}/v1/resources/gtw/shop/closed"), |_| true).await;
    assert_eq!(closed["status"]["attachedListenerSets"], 0, "{closed}");
    assert!(send(&fx.client, &format!("http://{}:8092/", p.ip), "store.example", &[]).await.is_err(), "a refused set's port is open");

    // The CLI: by short name, with status.
    let (ok, out, err) = kit::cli(&api, &["get", "lset", "refused", "-n", "shop", "-o", "yaml"]);
    assert!(ok && out.contains("reason: NotAllowed"), "{out}{err}");
    let (ok, out, err) = kit::cli(&api, &["get", "listenersets", "-n", "shop"]);
    assert!(ok && out.contains("extra(1)"), "{out}{err}");

    // Deleting the set closes its port and detaches the route.
    let (ok, out, err) = kit::cli(&api, &["delete", "lset", "store", "-n", "shop"]);
    assert!(ok, "{out}{err}");
    kit::eventually_or("the set's port closed", BOUND, || async {
        match send(&fx.client, &format!("http://{}:8081/", p.ip), "store.example", &[]).await {
            Err(_) => Ok(()),
            Ok(r) => Err(format!("{r:?}")),
        }
    })
    .await;
    let route =
        with_status(&fx.client, &format!("{api}/v1/resources/httproutes/shop/store"), |r| r["status"]["parents"].as_array().is_none_or(|p| p.is_empty())).await;
    assert!(route["status"]["parents"].as_array().is_none_or(|p| p.is_empty()), "{route}");
    p.envoy.assert_no_rejections().await;
}
