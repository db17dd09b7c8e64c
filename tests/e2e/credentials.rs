//! Gateway `credentialName`: Kubernetes TLS Secrets applied to a replica,
//! their keys sealed at rest, served over SDS on a real gateway Envoy's
//! ADS stream, with real TLS handshakes through it.
//!
//! What is checked: the gateway serves the Secret's certificate (SIMPLE);
//! replacing the Secret changes the served certificate while the listener
//! keeps its LDS version; MUTUAL with the CA in `<name>-cacert` requires a
//! client certificate; no read path, no sled file, no backup and no replica
//! log holds the private key; a sidecar, or a gateway of another
//! namespace, asking for the secret gets nothing; bad Secrets are refused
//! with 400 naming the field. `credentialNames`: an RSA and an ECDSA
//! certificate on one server, each presented to the clients that can
//! verify only its kind; `caCertCredentialName`: the client CA from its own
//! Secret, winning over the credential's.

use crate::kit;

use base64::Engine;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use kit::mesh::*;
use kit::tls::{Ca, Leaf, Offer, TlsClient};
use prost::{Message, Name};
use serde_json::Value;
use std::net::SocketAddr;
use std::time::Duration;

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A `kubernetes.io/tls` Secret in `namespace`, as kubectl writes one.
fn tls_secret(name: &str, namespace: &str, leaf: &Leaf) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: {namespace}}}\ntype: kubernetes.io/tls\ndata:\n  tls.crt: {}\n  tls.key: {}\n",
        b64(leaf.cert_pem.as_bytes()),
        b64(leaf.key_pem.as_bytes())
    )
}

/// `shop-gateway`: shop.example.test on 8443 and 9443, with these `tls`
/// settings (flow maps).
fn shop_gateway(tls_8443: &str, tls_9443: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: shop-gateway, namespace: default}}\nspec:\n  \
         selector: {{istio: ingressgateway}}\n  servers:\n  \
         - port: {{number: 8443, name: https, protocol: HTTPS}}\n    hosts: [shop.example.test]\n    tls: {tls_8443}\n  \
         - port: {{number: 9443, name: https-partners, protocol: HTTPS}}\n    hosts: [shop.example.test]\n    tls: {tls_9443}\n"
    )
}

/// Routes shop.example.test on `shop-gateway` to the shop service.
const SHOP_ROUTE: &str = r#"
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: shop, namespace: default}
spec:
  hosts: [shop.example.test]
  gateways: [shop-gateway]
  http:
  - route: [{destination: {host: shop, port: {number: 9080}}}]
"#;

/// A gateway proxy (node type router, `istio: ingressgateway`) of
/// istio-system, where its Secrets are, at `127.A.B.n`.
fn gateway_options(fx: &Fixture, name: &str, n: u8) -> kit::envoy::EnvoyOptions {
    let mut o = kit::envoy::EnvoyOptions::new(name, &fx.ip(n));
    o.namespace = "istio-system".into();
    o.node_type = "router".into();
    o.labels = vec![("istio".into(), "ingressgateway".into())];
    o
}

/// `attempt` until it succeeds (a listener may still be warming), within
/// `BOUND`; a failure then panics, saying `what`.
async fn until_ok<T, F: std::future::Future<Output = Result<T, String>>>(what: &str, attempt: impl FnMut() -> F) -> T {
    kit::eventually_or(what, BOUND, attempt).await
}

fn shop_service(u: &kit::envoy::Upstream) -> String {
    format!(
        "apiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {{name: shop, namespace: default}}\nspec:\n  ports: [{{name: http, number: 9080}}]\n---\n\
         apiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {{name: shop-1, namespace: default}}\nspec: {{service: shop, address: {}, port: {}}}\n",
        u.addr.ip(),
        u.addr.port()
    )
}

/// The version_info of the proxy's dynamic listener on `port`.
async fn listener_version(p: &Proxy, port: u16) -> String {
    let dump = p.envoy.config_dump().await;
    let configs = dump["configs"].as_array().cloned().unwrap_or_default();
    let listeners = configs.iter().find(|c| c["@type"].as_str().is_some_and(|t| t.ends_with("ListenersConfigDump"))).expect("listeners in config_dump");
    let l = listeners["dynamic_listeners"]
        .as_array()
        .and_then(|ls| ls.iter().find(|l| l["name"].as_str().is_some_and(|n| n.ends_with(&format!("_{port}")))))
        .unwrap_or_else(|| panic!("no listener on {port}: {listeners:#}"));
    l["active_state"]["version_info"].as_str().unwrap_or_default().to_string()
}

/// Poll until the server on `addr` presents `want` (DER).
async fn wait_for_leaf(client: &TlsClient<'_>, addr: SocketAddr, want: &[u8], what: &str) {
    let what = format!("{what}: the gateway presents the expected certificate");
    kit::eventually_or(&what, BOUND, || async {
        match client.peer_leaf(addr).await {
            Ok(der) if der == want => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

/// Every file under `dir`, read.
fn files(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let path = e.path();
        if path.is_dir() {
            out.extend(files(&path));
        } else if let Ok(bytes) = std::fs::read(&path) {
            out.push((path, bytes));
        }
    }
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// The forms a key could be found in: its DER, its PEM body's lines, the
/// base64 of its PEM (as `data` carries it).
fn key_forms(leaf: &Leaf) -> Vec<Vec<u8>> {
    let mut forms = vec![leaf.key_der().to_vec(), b64(leaf.key_pem.as_bytes()).into_bytes()];
    forms.extend(leaf.key_pem.lines().filter(|l| !l.starts_with("-----") && l.len() > 20).map(|l| l.as_bytes().to_vec()));
    forms
}

/// One SotW request for `names` of the Secret type as `node_id`: the
/// resources of the first response (none, if none comes within a second:
/// an unknown or refused secret is not answered with content).
async fn ask_for_secret(addr: &str, node_id: &str, names: &[&str]) -> Vec<Secret> {
    ask_member_for_secret(1, addr, node_id, names).await
}

/// As `ask_for_secret`, of member `id` (its certificate's name).
async fn ask_member_for_secret(id: u64, addr: &str, node_id: &str, names: &[&str]) -> Vec<Secret> {
    use envoy_types::pb::envoy::config::core::v3::Node;
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
    let mut client = kit::ads_client(id, addr);
    let req = DiscoveryRequest {
        node: Some(Node { id: node_id.into(), cluster: "test".into(), ..Default::default() }),
        type_url: Secret::type_url(),
        resource_names: names.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(req).await.unwrap();
    let mut stream = client.stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx)).await.expect("ADS stream").into_inner();
    let first = tokio::time::timeout(Duration::from_secs(2), stream.message()).await;
    drop(tx);
    match first {
        Ok(Ok(Some(resp))) => resp.resources.iter().map(|a| Secret::decode(a.value.as_slice()).expect("a Secret")).collect(),
        _ => Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_serves_secrets_over_sds() {
    let fx = Fixture::start(1).await;
    let shop = fx.upstream(11, "shop").await;
    let ca = Ca::new("lodestar test CA");
    let first = ca.server(&["shop.example.test"]);
    let second = ca.server(&["shop.example.test"]);
    let partners = ca.server(&["shop.example.test"]);
    let client_ca = Ca::new("partners client CA");
    let partner = client_ca.client("spiffe://partners.example.test/client");
    let stranger = Ca::new("another CA").client("spiffe://partners.example.test/client");

    // The gateway proxy lives in istio-system: its Secrets are there.
    let ca_secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: partners-credential-cacert, namespace: istio-system}}\nstringData:\n  ca.crt: |\n{}",
        client_ca.pem.lines().map(|l| format!("    {l}\n")).collect::<String>()
    );
    let yaml = format!(
        "{}---\n{}---\n{}---\n{ca_secret}---\n{}---\n{SHOP_ROUTE}",
        shop_service(&shop),
        tls_secret("shop-credential", "istio-system", &first),
        tls_secret("partners-credential", "istio-system", &partners),
        // SIMPLE with `shop-credential`; MUTUAL with `partners-credential`,
        // its client CA in `partners-credential-cacert`.
        shop_gateway("{mode: SIMPLE, credentialName: shop-credential}", "{mode: MUTUAL, credentialName: partners-credential}"),
    );
    let rev = fx.apply(&yaml).await;
    let gateway = |n: u8, delta: bool| {
        let mut o = gateway_options(&fx, if delta { "ingressgateway-delta" } else { "ingressgateway" }, n);
        o.delta = delta;
        o
    };
    let p = fx.proxy(gateway(2, false), 1, rev).await;
    // A second gateway on delta xDS, for the same secret.
    let pd = fx.proxy(gateway(3, true), 1, rev).await;

    // SIMPLE: a request through the gateway, and the certificate served
    // is the Secret's.
    let simple: SocketAddr = format!("{}:8443", p.ip).parse().unwrap();
    let client = TlsClient { ca: &ca, server_name: "shop.example.test", certificate: None, alpn: &["http/1.1"] };
    wait_for_leaf(&client, simple, first.der(), "first certificate").await;
    let reply = client.get(simple, "shop.example.test", "/products").await.expect("shop over TLS");
    assert_eq!((reply.status, reply.body.as_str()), (200, "shop"));
    let simple_delta: SocketAddr = format!("{}:8443", pd.ip).parse().unwrap();
    wait_for_leaf(&client, simple_delta, first.der(), "first certificate, delta").await;

    // Rotation: the Secret replaced, the new certificate served, the
    // listener untouched (same LDS version).
    let lds_before = listener_version(&p, 8443).await;
    let rev2 = fx.apply(&tls_secret("shop-credential", "istio-system", &second)).await;
    assert!(rev2 > rev);
    wait_for_leaf(&client, simple, second.der(), "rotated certificate").await;
    wait_for_leaf(&client, simple_delta, second.der(), "rotated certificate, delta").await;
    assert_eq!(listener_version(&p, 8443).await, lds_before, "a Secret change must not change the listener");
    // Applying the same Secret again changes nothing (its sealed key is kept).
    let (status, body) = kit::apply(&fx.client, &fx.api(1), vec![serde_yaml_value(&tls_secret("shop-credential", "istio-system", &second))]).await;
    assert_eq!(status, 200, "{body:#}");
    assert_eq!(body["items"][0]["action"], "unchanged", "{body:#}");

    // MUTUAL: the client CA from `partners-credential-cacert`.
    let mutual: SocketAddr = format!("{}:9443", p.ip).parse().unwrap();
    let as_partner = |certificate| TlsClient { ca: &ca, server_name: "shop.example.test", certificate, alpn: &["http/1.1"] };
    let partner_client = as_partner(Some(&partner));
    let reply = until_ok("partner over mutual TLS", || partner_client.get(mutual, "shop.example.test", "/orders")).await;
    assert_eq!((reply.status, reply.body.as_str()), (200, "shop"));
    for (who, cert) in [("no certificate", None), ("a certificate of another CA", Some(&stranger))] {
        let r = as_partner(cert).get(mutual, "shop.example.test", "/orders").await;
        assert!(r.is_err(), "a client with {who} was let in: {r:?}");
    }
    p.envoy.assert_no_rejections().await;
    pd.envoy.assert_no_rejections().await;

    // No read path shows the key: get, list, the gateway's config dump.
    let api = fx.api(1);
    let mut shown = String::new();
    for url in [
        format!("{api}/v1/resources/secrets/istio-system/shop-credential"),
        format!("{api}/v1/resources/secrets"),
        format!("{api}/debug/config_dump?proxyID={}", p.id),
    ] {
        let r = fx.client.get(&url).send().await.unwrap();
        assert_eq!(r.status(), 200, "{url}");
        shown.push_str(&r.text().await.unwrap());
    }
    let got: Value = fx.client.get(format!("{api}/v1/resources/secrets/istio-system/shop-credential")).send().await.unwrap().json().await.unwrap();
    assert_eq!(got["data"]["tls.crt"], b64(second.cert_pem.as_bytes()), "{got:#}");
    assert!(got["data"].get("tls.key").is_none() && got.get("sealed").is_none(), "{got:#}");
    for leaf in [&first, &second, &partners] {
        for form in key_forms(leaf) {
            assert!(!contains(shown.as_bytes(), &form), "a read path shows a private key");
        }
    }

    // Nor does any store file, a backup, or the replica's log.
    let backup = fx.tmp.path().join("backup.snap");
    let (ok, _, err) = kit::cli(&api, &["snapshot", "save", backup.to_str().unwrap()]);
    assert!(ok, "snapshot save: {err}");
    let mut stored = files(&fx.cluster.replica(1).data_dir());
    stored.push((backup.clone(), std::fs::read(&backup).unwrap()));
    stored.push(("replica log".into(), fx.cluster.replica(1).log().into_bytes()));
    for (path, bytes) in &stored {
        for leaf in [&first, &second, &partners] {
            for form in key_forms(leaf) {
                assert!(!contains(bytes, &form), "{} holds a private key in the clear", path.display());
            }
        }
    }
    // The certificate is there (the scan reads what it should).
    assert!(stored.iter().any(|(_, b)| contains(b, b64(second.cert_pem.as_bytes()).as_bytes())), "the store holds no certificate: the scan is blind");

    // Who may fetch: a gateway of the Secret's namespace gets it (over
    // this TLS connection); a sidecar there, or a gateway elsewhere, not.
    let xds = fx.cluster.replica(1).xds_addr();
    let gw = |ns: &str| format!("router~{}~probe.{ns}~{ns}.svc.cluster.local", fx.ip(20));
    let served = ask_for_secret(&xds, &gw("istio-system"), &["shop-credential"]).await;
    assert_eq!(served.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["shop-credential"]);
    let sidecar = format!("sidecar~{}~probe.istio-system~istio-system.svc.cluster.local", fx.ip(21));
    assert!(ask_for_secret(&xds, &sidecar, &["shop-credential"]).await.is_empty(), "a sidecar was served a gateway secret");
    assert!(ask_for_secret(&xds, &gw("default"), &["shop-credential"]).await.is_empty(), "a gateway of another namespace was served the secret");
    assert!(ask_for_secret(&xds, &gw("istio-system"), &["no-such-secret"]).await.is_empty(), "an unknown secret was served");
}

/// The key algorithm of a certificate (DER): `RSA` or `EC`.
fn key_type(der: &[u8]) -> &'static str {
    let (_, cert) = x509_parser::parse_x509_certificate(der).expect("a certificate");
    let oid = &cert.public_key().algorithm.algorithm;
    if *oid == x509_parser::oid_registry::OID_PKCS1_RSAENCRYPTION {
        "RSA"
    } else if *oid == x509_parser::oid_registry::OID_KEY_TYPE_EC_PUBLIC_KEY {
        "EC"
    } else {
        panic!("unexpected key algorithm {oid}")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_serves_credential_names_and_ca_cert_credential_name() {
    use rustls::SignatureScheme as S;
    let fx = Fixture::start(1).await;
    let shop = fx.upstream(11, "shop").await;
    let ca = Ca::new("lodestar test CA");
    let rsa = ca.server_rsa(&["shop.example.test"]);
    let ecdsa = ca.server(&["shop.example.test"]);
    assert_eq!((key_type(rsa.der()), key_type(ecdsa.der())), ("RSA", "EC"));
    let mtls = ca.server(&["shop.example.test"]);
    let client_ca = Ca::new("partners client CA");
    let partner = client_ca.client("spiffe://partners.example.test/client");
    // The server credential carries a CA of its own (ca.crt): the
    // caCertCredentialName must win over it, so its clients are refused.
    let credential_ca = Ca::new("the credential's own CA");
    let stranger = credential_ca.client("spiffe://partners.example.test/client");

    let mtls_secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: mtls-cred, namespace: istio-system}}\ntype: kubernetes.io/tls\ndata:\n  tls.crt: {}\n  tls.key: {}\n  ca.crt: {}\n",
        b64(mtls.cert_pem.as_bytes()),
        b64(mtls.key_pem.as_bytes()),
        b64(credential_ca.pem.as_bytes())
    );
    let client_ca_secret =
        format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: client-ca, namespace: istio-system}}\ndata:\n  ca.crt: {}\n", b64(client_ca.pem.as_bytes()));
    let yaml = format!(
        "{}---\n{}---\n{}---\n{mtls_secret}---\n{client_ca_secret}---\n{}---\n{SHOP_ROUTE}",
        shop_service(&shop),
        tls_secret("rsa-cred", "istio-system", &rsa),
        tls_secret("ecdsa-cred", "istio-system", &ecdsa),
        // 8443: an RSA and an ECDSA certificate; 9443: the client CA from
        // its own Secret.
        shop_gateway("{mode: SIMPLE, credentialNames: [rsa-cred, ecdsa-cred]}", "{mode: MUTUAL, credentialName: mtls-cred, caCertCredentialName: client-ca}"),
    );
    let rev = fx.apply(&yaml).await;
    let p = fx.proxy(gateway_options(&fx, "ingressgateway", 2), 1, rev).await;

    // credentialNames: a client that verifies only ECDSA signatures gets the
    // ECDSA certificate, one that verifies only RSA the RSA one.
    let simple: SocketAddr = format!("{}:8443", p.ip).parse().unwrap();
    let client = TlsClient { ca: &ca, server_name: "shop.example.test", certificate: None, alpn: &["http/1.1"] };
    let only_ecdsa = [S::ECDSA_NISTP256_SHA256, S::ECDSA_NISTP384_SHA384];
    let only_rsa = [S::RSA_PSS_SHA256, S::RSA_PSS_SHA384, S::RSA_PSS_SHA512, S::RSA_PKCS1_SHA256, S::RSA_PKCS1_SHA384, S::RSA_PKCS1_SHA512];
    let tls13 = Offer { schemes: &only_ecdsa, version: &rustls::version::TLS13 };
    until_ok("ECDSA-only client", || client.peer_leaf_offering(simple, Some(tls13))).await;
    for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
        for (schemes, want, leaf) in [(&only_ecdsa[..], "EC", &ecdsa), (&only_rsa[..], "RSA", &rsa)] {
            let what = format!("{version:?}, offering only {want} signatures");
            let served = client.peer_leaf_offering(simple, Some(Offer { schemes, version })).await.unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(key_type(&served), want, "{what}");
            assert!(served == leaf.der(), "{what}: not the certificate of its credential");
        }
    }
    let reply = client.get(simple, "shop.example.test", "/products").await.expect("shop over TLS");
    assert_eq!((reply.status, reply.body.as_str()), (200, "shop"));

    // caCertCredentialName: clients of client-ca get in; none, or one of
    // the credential's own CA, are refused at the handshake.
    let mutual: SocketAddr = format!("{}:9443", p.ip).parse().unwrap();
    let as_client = |certificate| TlsClient { ca: &ca, server_name: "shop.example.test", certificate, alpn: &["http/1.1"] };
    let partner_client = as_client(Some(&partner));
    let reply = until_ok("partner over mutual TLS", || partner_client.get(mutual, "shop.example.test", "/orders")).await;
    assert_eq!((reply.status, reply.body.as_str()), (200, "shop"));
    for (who, cert) in [("no certificate", None), ("a certificate of the credential's own CA", Some(&stranger))] {
        let r = as_client(cert).get(mutual, "shop.example.test", "/orders").await;
        let e = r.expect_err(&format!("a client with {who} was let in"));
        assert!(e.contains("TLS handshake") || e.contains("read from"), "{who}: not refused by TLS: {e}");
    }
    p.envoy.assert_no_rejections().await;

    // No read path shows a key of the new credentials either.
    let shown = fx.client.get(format!("{}/debug/config_dump?proxyID={}", fx.api(1), p.id)).send().await.unwrap().text().await.unwrap();
    for leaf in [&rsa, &ecdsa, &mtls] {
        for form in key_forms(leaf) {
            assert!(!contains(shown.as_bytes(), &form), "the config dump shows a private key");
        }
    }
}

fn serde_yaml_value(yaml: &str) -> Value {
    yaml_serde::from_str(yaml).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_secrets_are_refused_naming_the_field() {
    let c = kit::Cluster::start(1, "").await;
    let api = c.replica(1).api();
    let ca = Ca::new("lodestar test CA");
    let leaf = ca.server(&["a.example.test"]);
    let other = ca.server(&["a.example.test"]);
    let secret = |crt: &str, key: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bad", "namespace": "default"},
            "type": "kubernetes.io/tls", "data": {"tls.crt": b64(crt.as_bytes()), "tls.key": b64(key.as_bytes())}})
    };
    for (what, body, field, reason) in [
        ("a certificate that is not PEM", secret("not a certificate", &leaf.key_pem), "resources[0].data[tls.crt]", "no PEM certificate"),
        ("a key of another certificate", secret(&leaf.cert_pem, &other.key_pem), "resources[0].data[tls.key]", "does not match the certificate"),
        ("a key that is not PEM", secret(&leaf.cert_pem, "garbage"), "resources[0].data[tls.key]", "no PEM private key"),
    ] {
        let (status, out) = kit::apply(&c.http, &api, vec![body]).await;
        assert_eq!(status, 400, "{what}: {out:#}");
        let fields = out["error"]["fields"].as_array().cloned().unwrap_or_default();
        assert!(fields.iter().any(|f| f["field"] == field && f["reason"].as_str().is_some_and(|r| r.contains(reason))), "{what}: {out:#}");
        for form in key_forms(&leaf).into_iter().chain(key_forms(&other)) {
            assert!(!contains(out.to_string().as_bytes(), &form), "{what}: the error echoes a key");
        }
    }
    // Over gRPC: the same checks (INVALID_ARGUMENT naming the field), and a
    // good Secret is stored with its key sealed, read back without it.
    use lodestar::proto::api::{ApplyItem, ApplyRequest, GetRequest};
    let mut grpc = kit::grpc_api(&api);
    let bad = secret(&leaf.cert_pem, &other.key_pem).to_string();
    let err = grpc.apply(ApplyRequest { items: vec![ApplyItem { resource_json: bad, expected_revision: None }], ..Default::default() }).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("data[tls.key]"), "{}", err.message());
    let good = secret(&leaf.cert_pem, &leaf.key_pem).to_string();
    grpc.apply(ApplyRequest { items: vec![ApplyItem { resource_json: good, expected_revision: None }], ..Default::default() })
        .await
        .expect("a good Secret over gRPC");
    let got = grpc
        .get(GetRequest { kind: "secret".into(), namespace: "default".into(), name: "bad".into(), consistency: 0 })
        .await
        .expect("get over gRPC")
        .into_inner()
        .resource_json;
    assert!(got.contains(&b64(leaf.cert_pem.as_bytes())), "{got}");
    for form in key_forms(&leaf) {
        assert!(!contains(got.as_bytes(), &form), "gRPC get shows the key");
    }
    assert!(!got.contains("sealed") && !got.contains("tls.key"), "{got}");

    // A Gateway naming a credential it cannot use is refused too.
    let (status, out) = kit::apply(
        &c.http,
        &api,
        vec![serde_json::json!({"apiVersion": "networking.istio.io/v1", "kind": "Gateway", "metadata": {"name": "g", "namespace": "default"},
            "spec": {"selector": {"istio": "ingressgateway"}, "servers": [{"port": {"number": 443, "name": "https", "protocol": "HTTPS"}, "hosts": ["a.example.test"],
            "tls": {"mode": "MUTUAL", "credentialName": "a", "caCertificates": "/ca.pem"}}]}})],
    )
    .await;
    assert_eq!(status, 400, "{out:#}");
    assert!(out.to_string().contains("spec.servers[0].tls.caCertificates"), "{out:#}");
    // credentialNames and caCertCredentialName: each bad one named by path.
    let (status, out) = kit::apply(
        &c.http,
        &api,
        vec![serde_json::json!({"apiVersion": "networking.istio.io/v1", "kind": "Gateway", "metadata": {"name": "g", "namespace": "default"},
            "spec": {"selector": {"istio": "ingressgateway"}, "servers": [
                {"port": {"number": 443, "name": "https", "protocol": "HTTPS"}, "hosts": ["a.example.test"],
                 "tls": {"mode": "SIMPLE", "credentialNames": ["rsa-cred", "Not_A_Name"]}},
                {"port": {"number": 444, "name": "https-2", "protocol": "HTTPS"}, "hosts": ["a.example.test"],
                 "tls": {"mode": "SIMPLE", "credentialNames": ["a", "b", "c"]}},
                {"port": {"number": 445, "name": "https-3", "protocol": "HTTPS"}, "hosts": ["a.example.test"],
                 "tls": {"mode": "MUTUAL", "credentialName": "a", "caCertCredentialName": "configmap://istio-system/ca"}}]}})],
    )
    .await;
    assert_eq!(status, 400, "{out:#}");
    let fields: Vec<String> =
        out["error"]["fields"].as_array().cloned().unwrap_or_default().iter().map(|f| f["field"].as_str().unwrap_or_default().to_string()).collect();
    for want in [
        "resources[0].spec.servers[0].tls.credentialNames[1]",
        "resources[0].spec.servers[1].tls.credentialNames",
        "resources[0].spec.servers[2].tls.caCertCredentialName",
    ] {
        assert!(fields.iter().any(|f| f == want), "{want} not named: {out:#}");
    }
}

/// Three members sharing one mesh CA directory (`lodestar tls ca create
/// --mesh` makes `secrets.key` with it): a Secret applied through one
/// member is served, key opened, by another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_share_the_secrets_key() {
    let ca_dir = tempfile::tempdir().unwrap();
    let out = kit::cli_command().args(["tls", "ca", "create", "--mesh", "--dir"]).arg(ca_dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(ca_dir.path().join("secrets.key").exists(), "the mesh CA comes with the cluster secrets key");
    let c = kit::Cluster::start(3, &format!("mesh_ca_dir = {:?}\n", ca_dir.path())).await;
    let leaf = Ca::new("lodestar test CA").server(&["shop.example.test"]);
    let yaml = tls_secret("shop-credential", "istio-system", &leaf);
    let rev = kit::applied(&c.http, &c.replica(2).api(), &yaml).await;
    c.wait_for_revision(rev, BOUND).await;
    let node = "router~127.0.0.1~probe.istio-system~istio-system.svc.cluster.local";
    let served = ask_member_for_secret(3, &c.replica(3).xds_addr(), node, &["shop-credential"]).await;
    let [secret] = served.as_slice() else { panic!("member 3 served {served:?}") };
    use envoy_types::pb::envoy::config::core::v3::data_source::Specifier;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::secret::Type;
    let Some(Type::TlsCertificate(cert)) = &secret.r#type else { panic!("not a TLS certificate") };
    let bytes = |d: &Option<envoy_types::pb::envoy::config::core::v3::DataSource>| match d.as_ref().and_then(|d| d.specifier.as_ref()) {
        Some(Specifier::InlineBytes(b)) => b.clone(),
        other => panic!("not inline bytes: {other:?}"),
    };
    assert_eq!(bytes(&cert.certificate_chain), leaf.cert_pem.as_bytes());
    assert!(bytes(&cert.private_key) == leaf.key_pem.as_bytes(), "member 3 opened a different key");
}

/// A Gateway API listener's certificate in another namespace: without a
/// ReferenceGrant there the listener is RefNotPermitted, not served, and
/// no proxy is served the Secret; with one (from Gateways of the gateway's
/// namespace) the gateway proxy is served it over SDS as `NS/NAME` and
/// terminates TLS with it, while a gateway of a third namespace still gets
/// nothing; the grant deleted, the Secret and the listener go away again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_api_certificate_in_another_namespace_needs_a_reference_grant() {
    use lodestar::translate::gateway_api::CLASS_LABEL;
    let fx = Fixture::start(1).await;
    let shop = fx.upstream(11, "shop").await;
    let ca = Ca::new("lodestar test CA");
    let leaf = ca.server(&["shop.example.test"]);
    let ip = fx.ip(2);
    let yaml = format!(
        "{}---\n{}---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: edge}}\nspec: {{controllerName: lodestar.dev/gateway-controller}}\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: web, namespace: default}}\nspec:\n  gatewayClassName: edge\n  \
         addresses: [{{type: IPAddress, value: \"{ip}\"}}]\n  listeners:\n  - name: https\n    port: 8443\n    protocol: HTTPS\n    hostname: shop.example.test\n    \
         tls: {{certificateRefs: [{{name: shop-cert, namespace: certs}}]}}\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: shop, namespace: default}}\nspec:\n  parentRefs: [{{name: web}}]\n  \
         rules: [{{backendRefs: [{{name: shop, port: 9080}}]}}]\n",
        shop_service(&shop),
        tls_secret("shop-cert", "certs", &leaf),
    );
    let rev = fx.apply(&yaml).await;
    let mut o = kit::envoy::EnvoyOptions::new("edge", &ip);
    o.node_type = "router".into();
    o.labels = vec![(CLASS_LABEL.into(), "edge".into())];
    // No listener yet (its certificate is not permitted): no RDS either.
    let p = fx.proxy_of_types(o, 1, rev, &["CDS", "EDS", "LDS"]).await;
    let api = fx.api(1);
    let listener_refs = |want: &'static str| {
        let url = format!("{api}/v1/resources/gateways.gateway.networking.k8s.io/default/web");
        let client = fx.client.clone();
        async move {
            kit::eventually_or(&format!("listener ResolvedRefs {want}"), BOUND, || async {
                let (_, g) = kit::get_json(&client, &url).await;
                let c = g["status"]["listeners"][0]["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == "ResolvedRefs").cloned());
                match c {
                    Some(c) if c["reason"] == want => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            })
            .await
        }
    };
    let xds = fx.cluster.replica(1).xds_addr();
    let gw = |ns: &str| format!("router~{}~probe.{ns}~{ns}.svc.cluster.local", fx.ip(20));
    let name = "certs/shop-cert";

    // No grant: not permitted, not served to anyone.
    listener_refs("RefNotPermitted").await;
    assert!(ask_for_secret(&xds, &gw("default"), &[name]).await.is_empty(), "a Secret of another namespace was served without a grant");

    // A grant from Gateways of `default`: served, and TLS terminates with it.
    let grant = "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: default-gateways, namespace: certs}\n\
                 spec:\n  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: default}]\n  to: [{group: \"\", kind: Secret, name: shop-cert}]\n";
    fx.apply(grant).await;
    listener_refs("ResolvedRefs").await;
    let addr: SocketAddr = format!("{ip}:8443").parse().unwrap();
    let client = TlsClient { ca: &ca, server_name: "shop.example.test", certificate: None, alpn: &["http/1.1"] };
    wait_for_leaf(&client, addr, leaf.der(), "the certificate from namespace certs").await;
    let reply = until_ok("shop over TLS", || client.get(addr, "shop.example.test", "/")).await;
    assert_eq!((reply.status, reply.body.as_str()), (200, "shop"));
    let served = ask_for_secret(&xds, &gw("default"), &[name]).await;
    assert_eq!(served.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), [name]);
    assert!(ask_for_secret(&xds, &gw("other"), &[name]).await.is_empty(), "a gateway of a namespace the grant does not name was served the Secret");
    p.envoy.assert_no_rejections().await;

    // The grant deleted: not permitted again, the Secret no longer served,
    // and the listener gone.
    let (ok, _, err) = kit::cli(&api, &["delete", "referencegrant", "default-gateways", "-n", "certs"]);
    assert!(ok, "{err}");
    listener_refs("RefNotPermitted").await;
    assert!(ask_for_secret(&xds, &gw("default"), &[name]).await.is_empty(), "the Secret is still served after its grant was deleted");
    kit::eventually_or("the listener removed", BOUND, || async {
        match client.peer_leaf(addr).await {
            Err(_) => Ok(()),
            Ok(_) => Err("still presents the certificate".to_string()),
        }
    })
    .await;
}
