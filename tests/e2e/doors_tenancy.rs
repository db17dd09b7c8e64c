//! Multi-tenancy walls (issue 32, items 2 and 11), against real replica
//! processes with ACLs on, real Envoys and a hand-rolled ADS client:
//!
//! - a writer scoped to team-a cannot claim team-b's hostnames (a registry
//!   Service, an Instance joining by FQDN, a ServiceEntry, a wildcard over
//!   every namespace), nor, without a grant, a hostname outside its own;
//! - a hostname two namespaces may legally claim (a ServiceEntry for an
//!   external host) is resolved per proxy: team-b's Envoy reaches team-b's
//!   endpoints, a third namespace's the oldest, and `exportTo: ["."]`
//!   keeps team-a's to team-a;
//! - a proxy credential for team-a cannot open a stream under a node id
//!   that names team-b.

use crate::kit;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::google::protobuf::{value::Kind as PbKind, Struct, Value as PbValue};
use kit::envoy::EnvoyOptions;
use kit::mesh::{get, render, wait_for, Fixture};
use kit::Cluster;
use serde_json::{json, Value};
use std::time::Duration;

const BOUND: Duration = Duration::from_secs(20);

/// An HTTP client (trusting the test CA) that sends `secret`.
fn client_as(secret: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {secret}").parse().unwrap());
    kit::anonymous_http_builder().default_headers(headers).build().unwrap()
}

/// A policy through the CLI (as the management token).
fn policy(api: &str, name: &str, rules: &[&str]) {
    let mut args = vec!["policy", "create", name];
    for r in rules {
        args.extend(["--rule", r]);
    }
    let (ok, _, err) = kit::cli(api, &args);
    assert!(ok, "policy create {name}: {err}");
}

fn secret(created: &Value) -> String {
    created["secret"].as_str().expect("a secret").to_string()
}

fn service(ns: &str, name: &str, hostname: Option<&str>) -> Value {
    let mut spec = json!({"ports": [{"name": "http", "number": 9080}]});
    if let Some(h) = hostname {
        spec["hostname"] = json!(h);
    }
    json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Service", "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

fn instance(ns: &str, name: &str, service: &str, address: &str) -> Value {
    json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Instance", "metadata": {"name": name, "namespace": ns},
           "spec": {"service": service, "address": address, "port": 9080, "serviceAccount": "attacker"}})
}

fn service_entry(ns: &str, name: &str, hosts: &[&str]) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry", "metadata": {"name": name, "namespace": ns},
           "spec": {"hosts": hosts, "location": "MESH_INTERNAL", "resolution": "STATIC",
                    "ports": [{"number": 9080, "name": "http", "protocol": "HTTP"}], "endpoints": [{"address": "127.0.0.66"}]}})
}

/// A refused apply: the status, and the error's message and field paths.
async fn refused(http: &reqwest::Client, api: &str, doc: Value, status: u16) -> (String, Vec<String>) {
    let (got, body) = kit::apply(http, api, vec![doc.clone()]).await;
    assert_eq!(got, status, "{doc}\n{body:#}");
    let message = body["error"]["message"].as_str().unwrap_or_default().to_string();
    let fields = body["error"]["fields"].as_array().into_iter().flatten().filter_map(|f| f["field"].as_str().map(String::from)).collect();
    (message, fields)
}

/// A team-a writer tries each way into team-b's hostnames: refused before
/// anything is proposed, naming the field and the owner; so is everyone
/// (the management token too: another namespace's hostname never takes
/// effect). A hostname outside any namespace's own takes a policy grant on
/// a registry object, and none on a ServiceEntry. Nothing refused is
/// stored, and the mesh team-b's proxies see is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_writer_cannot_claim_another_namespaces_hostnames() {
    let c = Cluster::start(1, "").await;
    let api = c.replica(1).api();
    policy(&api, "team-a", &["read,watch,write,delete:*:team-a"]);
    let writer = client_as(&secret(&kit::token_create(&api, &["--policy", "team-a"])));

    // team-b's service, by the management token.
    let (status, body) = kit::apply(&c.http, &api, vec![service("team-b", "reviews", None), instance("team-b", "reviews-1", "reviews", "127.0.0.20")]).await;
    assert_eq!(status, 200, "{body:#}");
    let before: Value = kit::get_json(&c.http, &format!("{api}/debug/registryz")).await.1;

    let theirs = "reviews.team-b.svc.cluster.local";
    let hijacks = [
        (service("team-a", "reviews", Some(theirs)), "resources[0].spec.hostname"),
        (instance("team-a", "hijack", theirs, "127.0.0.66"), "resources[0].spec.service"),
        (service_entry("team-a", "hijack", &["api.example.com", theirs]), "resources[0].spec.hosts[1]"),
        // The short forms are team-b's names too.
        (service_entry("team-a", "short", &["reviews.team-b.svc"]), "resources[0].spec.hosts[0]"),
    ];
    for (doc, field) in &hijacks {
        for http in [&writer, &c.http] {
            let (message, fields) = refused(http, &api, doc.clone(), 400).await;
            assert_eq!(fields, [field.to_string()], "{message}");
            assert!(message.contains("belongs to namespace team-b"), "{message}");
        }
    }
    // A wildcard reaching into every namespace's names.
    let (message, fields) = refused(&writer, &api, service_entry("team-a", "all", &["*.svc.cluster.local"]), 400).await;
    assert_eq!(fields, ["resources[0].spec.hosts[0]"], "{message}");
    assert!(message.contains("every namespace"), "{message}");

    // A hostname no namespace owns: a registry Service needs the grant...
    let (message, _) = refused(&writer, &api, service("team-a", "pay", Some("api.payments.example.com")), 403).await;
    policy(&api, "team-a-payments", &["write:services:team-a:*.payments.example.com"]);
    let payer = client_as(&secret(&kit::token_create(&api, &["--policy", "team-a", "--policy", "team-a-payments"])));
    assert!(message.contains("may not claim the hostname api.payments.example.com (resources[0].spec.hostname)"), "{message}");
    assert!(message.contains("hostnames"), "{message}");
    // ...which covers Services (not Instances) in team-a, under *.payments.example.com.
    let (status, body) = kit::apply(&payer, &api, vec![service("team-a", "pay", Some("api.payments.example.com"))]).await;
    assert_eq!(status, 200, "{body:#}");
    refused(&payer, &api, service("team-a", "pay-2", Some("api.example.com")), 403).await;
    refused(&payer, &api, instance("team-a", "pay-1", "api.payments.example.com", "127.0.0.21"), 403).await;
    // Its own hostnames need nothing.
    let (status, body) = kit::apply(&writer, &api, vec![service("team-a", "web", None), instance("team-a", "web-1", "web", "127.0.0.22")]).await;
    assert_eq!(status, 200, "{body:#}");
    // ...and a ServiceEntry may name an external host team-b names too,
    // with a warning that says who wins.
    let (status, body) = kit::apply(&c.http, &api, vec![service_entry("team-b", "api", &["api.example.com"])]).await;
    assert_eq!(status, 200, "{body:#}");
    let (status, body) = kit::apply(&writer, &api, vec![service_entry("team-a", "api", &["api.example.com"])]).await;
    assert_eq!(status, 200, "{body:#}");
    let warnings = body["warnings"].to_string();
    assert!(warnings.contains("api.example.com is also claimed by serviceentries/team-b/api"), "{warnings}");
    assert!(warnings.contains("else the oldest (serviceentries/team-b/api)"), "{warnings}");
    // A ServiceEntry for the hostname of team-a's registry Service: in
    // team-b, resolved per proxy (team-b's proxies use team-b's entry), so
    // no warning that the registry's instances are served instead; in
    // team-a, they are (one service per hostname and namespace, the
    // registry's first), and both warnings say so.
    let (status, body) = kit::apply(&c.http, &api, vec![service_entry("team-b", "pay", &["api.payments.example.com"])]).await;
    assert_eq!(status, 200, "{body:#}");
    let warnings = body["warnings"].to_string();
    assert!(warnings.contains("api.payments.example.com is also claimed by services/team-a/pay"), "{warnings}");
    assert!(!warnings.contains("is also a registry service's"), "another namespace's registry Service does not win here: {warnings}");
    let (status, body) = kit::apply(&writer, &api, vec![service_entry("team-a", "pay-entry", &["api.payments.example.com"])]).await;
    assert_eq!(status, 200, "{body:#}");
    let warnings = body["warnings"].to_string();
    assert!(warnings.contains("api.payments.example.com is also claimed by services/team-a/pay"), "{warnings}");
    assert!(warnings.contains("is also a registry service's (Service team-a/pay)"), "{warnings}");
    assert!(!warnings.contains("Service team-b"), "{warnings}");

    // The gRPC API refuses the same way.
    let mut grpc = kit::grpc_api_as(&api, Some(&secret(&kit::token_create(&api, &["--policy", "team-a"]))));
    let item = |doc: &Value| lodestar::proto::api::ApplyItem { resource_json: doc.to_string(), expected_revision: None };
    let err = grpc.apply(lodestar::proto::api::ApplyRequest { items: vec![item(&hijacks[1].0)], ..Default::default() }).await.expect_err("a hijack over gRPC");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("spec.service"), "{err:?}");
    let err = grpc
        .apply(lodestar::proto::api::ApplyRequest { items: vec![item(&service("team-a", "pay", Some("x.payments.example.com")))], ..Default::default() })
        .await;
    assert_eq!(err.expect_err("an ungranted hostname over gRPC").code(), tonic::Code::PermissionDenied);

    // Nothing refused was stored; team-b's service is as it was.
    for (kind, name) in [("services", "reviews"), ("instances", "hijack"), ("serviceentries", "hijack"), ("serviceentries", "all")] {
        let (status, _) = kit::get_json(&c.http, &format!("{api}/v1/resources/{kind}/team-a/{name}")).await;
        assert_eq!(status, 404, "{kind}/team-a/{name} was stored");
    }
    let after: Value = kit::get_json(&c.http, &format!("{api}/debug/registryz")).await.1;
    let reviews = |v: &Value| v["services"].as_array().into_iter().flatten().filter(|s| s["hostname"] == theirs).cloned().collect::<Vec<_>>();
    assert_eq!(reviews(&before), reviews(&after));
    assert_eq!(reviews(&after).len(), 1, "{after:#}");
    // The refusal for want of a grant is audited.
    let deadline = std::time::Instant::now() + BOUND;
    while !c.replica(1).log().contains("may not claim the hostname api.payments.example.com") {
        assert!(std::time::Instant::now() < deadline, "no audit line for the refused claim");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Config for the resolution test: team-b's ServiceEntries (the older),
/// then team-a's for the same hosts, `ledger` private to team-a.
fn entry(ns: &str, host: &str, upstream: &str, export_to: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {}, namespace: {ns}}}\nspec:\n  hosts: [{host}]\n  exportTo: [{export_to}]\n  location: MESH_EXTERNAL\n  resolution: STATIC\n  ports: [{{number: 8080, name: http, protocol: HTTP}}]\n  endpoints: [{{address: ${{{upstream}.ip}}, ports: {{http: ${{{upstream}.port}}}}}}]\n---\n",
        host.split('.').next().unwrap()
    )
}

/// Two namespaces claim `payments.example.com` and `ledger.example.com`
/// (a legal write: external hosts), team-b first. Real Envoys: team-b's
/// sends its traffic to team-b's endpoints, though team-a's entry sorts
/// first; team-c's to the oldest (team-b's); team-a's private `ledger`
/// reaches no one outside team-a.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostname_claimed_twice_resolves_per_proxy_through_real_envoys() {
    let fx = Fixture::start(1).await;
    let api = fx.api(1);
    let (a, b) = (fx.upstream(11, "team-a").await, fx.upstream(12, "team-b").await);
    let ups = [("a", &a), ("b", &b)];
    fx.apply(&render(&(entry("team-b", "payments.example.com", "b", "\"*\"") + &entry("team-b", "ledger.example.com", "b", "\"*\"")), &ups)).await;
    // team-a's, by a writer scoped to team-a.
    policy(&api, "team-a", &["read,watch,write,delete:*:team-a"]);
    let writer = client_as(&secret(&kit::token_create(&api, &["--policy", "team-a"])));
    let yaml = render(&(entry("team-a", "payments.example.com", "a", "\"*\"") + &entry("team-a", "ledger.example.com", "a", "\".\"")), &ups);
    let rev = kit::applied(&writer, &api, &yaml).await;

    let mut ob = EnvoyOptions::new("client", &fx.ip(2));
    ob.namespace = "team-b".into();
    let pb = fx.proxy(ob, 1, rev).await;
    let mut oc = EnvoyOptions::new("client", &fx.ip(3));
    oc.namespace = "team-c".into();
    let pc = fx.proxy(oc, 1, rev).await;
    let mut oa = EnvoyOptions::new("client", &fx.ip(4));
    oa.namespace = "team-a".into();
    let pa = fx.proxy(oa, 1, rev).await;

    for (proxy, host, want) in [
        (&pb, "payments.example.com", "team-b"),
        (&pb, "ledger.example.com", "team-b"),
        (&pc, "payments.example.com", "team-b"),
        (&pc, "ledger.example.com", "team-b"),
        (&pa, "payments.example.com", "team-a"),
        (&pa, "ledger.example.com", "team-a"),
    ] {
        let url = proxy.url(8080, "/");
        wait_for(&fx.client, &url, host, &[], &format!("{} reaches {host}", proxy.id), |r| r.status == 200).await;
        for _ in 0..5 {
            let r = get(&fx.client, &url, host, &[]).await;
            assert_eq!((r.status, r.body.as_str()), (200, want), "{} calling {host}", proxy.id);
        }
    }
    for p in [&pa, &pb, &pc] {
        p.envoy.assert_no_rejections().await;
    }
}

fn node(id: &str, namespace: &str) -> Node {
    let ns = PbValue { kind: Some(PbKind::StringValue(namespace.into())) };
    Node { id: id.into(), metadata: Some(Struct { fields: [("NAMESPACE".to_string(), ns)].into() }), ..Default::default() }
}

/// Open a SotW stream as `id` (metadata NAMESPACE `namespace`) with
/// `token`: its first response, or the status it was refused with.
async fn open(xds: &str, token: &str, id: &str, namespace: &str) -> Result<String, tonic::Status> {
    let first =
        DiscoveryRequest { node: Some(node(id, namespace)), type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(), ..Default::default() };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(first).await.unwrap();
    let mut client = kit::ads_client_as(1, xds, Some(token));
    let mut stream = client.stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx)).await?.into_inner();
    let resp = tokio::time::timeout(BOUND, stream.message()).await.expect("an answer in time")?.expect("a response");
    drop(tx);
    Ok(resp.type_url)
}

/// Item 11: a proxy token for team-a may not send a node id that names
/// team-b (whatever its metadata says): such a stream would shadow
/// team-b's proxy of that id in `/debug/config_dump`, `proxy-config`,
/// `authz check` and `wait`. Refused INVALID_ARGUMENT naming both; team-a's
/// own id is served, team-b's id with team-b's metadata is refused as
/// before (PERMISSION_DENIED).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_credential_cannot_send_another_namespaces_node_id() {
    let c = Cluster::start(1, "").await;
    let (api, xds) = (c.replica(1).api(), c.replica(1).xds_addr());
    let token = secret(&kit::token_create(&api, &["--proxy", "team-a"]));
    let theirs = "sidecar~127.0.0.9~web.team-b~team-b.svc.cluster.local";

    let err = open(&xds, &token, theirs, "team-a").await.expect_err("team-b's node id under team-a's credential");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("namespace \"team-b\"") && err.message().contains("NAMESPACE says \"team-a\""), "{err:?}");
    let err = open(&xds, &token, theirs, "team-b").await.expect_err("team-b's node id and metadata");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    // No namespace in the id at all (metadata alone named it before).
    let err = open(&xds, &token, "sidecar~127.0.0.9~web~team-a.svc.cluster.local", "team-a").await.expect_err("an id without a namespace");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(open(&xds, &token, "sidecar~127.0.0.9~web.team-a~team-a.svc.cluster.local", "team-a").await.is_ok());
    // No stream of team-b's id was ever opened on the replica.
    let syncz = kit::mesh::syncz(&c.http, &api).await;
    assert!(!syncz["proxies"].to_string().contains("web.team-b"), "{syncz:#}");
}
