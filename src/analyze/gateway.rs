//! Gateway analyzers (Istio's `gateway.*`):
//! - IST0145 (`ConflictingGatewayAnalyzer`): two Gateways for the same
//!   workloads serve one host on one port (the same `bind`);
//! - IST0138 (`CertificateAnalyzer`): two Gateways for the same workloads
//!   use one certificate (HTTP/2 connection reuse then reaches the wrong
//!   server);
//! - IST0101 `credentialName` and IST0161 (`SecretAnalyzer`): the Secret a
//!   server names exists where the gateway proxy is served secrets from
//!   (its workload's namespace: Lodestar's SDS serves a gateway its own
//!   namespace's), holds a certificate and a key, and the certificate is
//!   within its validity period (`Options::now`).
//!
//! Lodestar serves a Gateway with an empty selector to no proxy, so such a
//! Gateway takes part in none of these (Istio's selects every pod). Istio's
//! IST0101 `selector` for Gateways is not reported: Lodestar's gateway
//! proxies connect with their labels and are seldom registered, so a
//! Gateway no registered workload matches stands for its own proxy (as
//! `istioctl analyze --use-kube=false` assumes an ingress gateway pod).

use super::{quote, selector_text, selects, slice, Ctx, Item, Message, IST0101, IST0138, IST0145, IST0161};
use crate::model::istio::gateway::Server;
use crate::model::istio::Gateway;
use crate::model::secret::{Stored, KEY_KEYS, SEALED_FIELD};
use crate::model::{Kind, ResourceKey, StoredObject};
use std::collections::{BTreeMap, BTreeSet};

pub(super) fn run(ctx: &Ctx, out: &mut Vec<Message>) {
    let gateways: Vec<&Item<Gateway>> = ctx.gw.iter().filter(|g| !g.spec.selector.is_empty()).collect();
    conflicts(ctx, &gateways, out);
    duplicate_certificates(&gateways, out);
    for gw in &gateways {
        credentials(ctx, gw, out);
    }
}

fn bind(s: &Server) -> &str {
    s.bind.as_deref().unwrap_or("")
}

/// A gateway's hosts on one port, each with its bind.
type HostBinds<'a> = BTreeMap<&'a str, &'a str>;

/// IST0145.
fn conflicts(ctx: &Ctx, gateways: &[&Item<Gateway>], out: &mut Vec<Message>) {
    // (selector text, port) → gateway → host → bind; a later server on a
    // port replaces an earlier one's hosts (as Istio's index does).
    let mut index: BTreeMap<(String, u32), BTreeMap<String, HostBinds>> = BTreeMap::new();
    for gw in gateways {
        let sel = selector_text(&gw.spec.selector);
        for s in &gw.spec.servers {
            let hosts = s.hosts.iter().map(|h| (h.as_str(), bind(s))).collect();
            index.entry((sel.clone(), s.port.number())).or_default().insert(gw.full_name(), hosts);
        }
    }
    for gw in gateways {
        let sel = selector_text(&gw.spec.selector);
        let candidates: Vec<&&Item<Gateway>> = gateways
            .iter()
            .filter(|other| other.key() != gw.key())
            .filter(|other| {
                let other_sel = selector_text(&other.spec.selector);
                other_sel == sel
                    || ((other_sel.contains(&sel) || sel.contains(&other_sel))
                        && ctx.selected(&gw.spec.selector).any(|w| selects(&other.spec.selector, &w.labels)))
            })
            .collect();
        for (i, s) in gw.spec.servers.iter().enumerate() {
            let mut with: BTreeSet<String> = BTreeSet::new();
            for other in &candidates {
                let key = (selector_text(&other.spec.selector), s.port.number());
                let Some(hosts) = index.get(&key).and_then(|g| g.get(&other.full_name())) else { continue };
                if s.hosts.iter().any(|h| hosts.get(h.as_str()) == Some(&bind(s))) {
                    with.insert(other.full_name());
                }
            }
            if !with.is_empty() {
                let names = with.into_iter().collect::<Vec<_>>().join(",");
                let text = format!("Conflict with gateways {names} (workload selector {sel}, port {}, hosts {}).", s.port.number(), s.hosts.join(","));
                let related: Vec<&ResourceKey> = candidates.iter().filter(|o| names.split(',').any(|n| n == o.full_name())).map(|o| o.key()).collect();
                out.push(Message::new(IST0145, gw.key(), Some(format!("spec.servers[{i}]")), text).naming(related));
            }
        }
    }
}

/// IST0138.
fn duplicate_certificates(gateways: &[&Item<Gateway>], out: &mut Vec<Message>) {
    let same_cert = |a: &Server, b: &Server| -> bool {
        let (Some(x), Some(y)) = (&a.tls, &b.tls) else { return false };
        fn set(v: &Option<String>) -> Option<&str> {
            v.as_deref().filter(|s| !s.is_empty())
        }
        match (set(&x.credential_name), set(&y.credential_name)) {
            (Some(c), Some(d)) => c == d,
            (None, None) => {
                set(&x.server_certificate).is_some()
                    && set(&x.private_key).is_some()
                    && set(&x.server_certificate) == set(&y.server_certificate)
                    && set(&x.private_key) == set(&y.private_key)
            }
            _ => false,
        }
    };
    for gw in gateways {
        for other in gateways.iter().filter(|o| o.key() != gw.key() && selects(&gw.spec.selector, &o.spec.selector)) {
            for (i, a) in gw.spec.servers.iter().enumerate() {
                for b in &other.spec.servers {
                    if same_cert(a, b) {
                        let text = format!(
                            "Duplicate certificate in multiple gateways {} may cause 404s if clients re-use HTTP2 connections.",
                            slice([gw.full_name(), other.full_name()])
                        );
                        out.push(Message::new(IST0138, gw.key(), Some(format!("spec.servers[{i}].tls")), text).naming([other.key()]));
                    }
                }
            }
        }
    }
}

/// IST0101 `credentialName` and IST0161.
fn credentials(ctx: &Ctx, gw: &Item<Gateway>, out: &mut Vec<Message>) {
    let Some(workload) = ctx.gateway_workloads(gw.spec).into_iter().next() else { return };
    for (i, s) in gw.spec.servers.iter().enumerate() {
        let Some(tls) = &s.tls else { continue };
        let names = tls.credential_name.iter().map(|c| (c, "credentialName".to_string()));
        let names = names.chain(tls.credential_names.iter().enumerate().map(|(j, c)| (c, format!("credentialNames[{j}]"))));
        for (credential, field) in names.filter(|(c, _)| !c.is_empty()) {
            let (ns, name) = credential.split_once('/').unwrap_or((workload.namespace.as_str(), credential.as_str()));
            let field = Some(format!("spec.servers[{i}].tls.{field}"));
            let key = ResourceKey::new(Kind::Secret, ns, name);
            match ctx.state.get(&key) {
                None => out.push(Message::new(IST0101, gw.key(), field, format!("Referenced credentialName not found: {}", quote(credential))).naming([&key])),
                Some(secret) if !usable(secret, ctx.opts.now) => {
                    let text = format!(
                        "The credential referenced by the Gateway {} in namespace {ns} is invalid, which can cause the traffic not to work as expected.",
                        gw.name()
                    );
                    out.push(Message::new(IST0161, gw.key(), field, text).naming([&key]));
                }
                Some(_) => {}
            }
        }
    }
}

/// A Secret with a certificate chain and a key (sealed, as the store keeps
/// it, or in `data`, as a file has it), whose certificates all parse and
/// (given `now`) are within their validity period.
fn usable(secret: &StoredObject, now: Option<i64>) -> bool {
    let body = secret.body();
    let stored = Stored::from_body(body);
    let key_in_data = KEY_KEYS.iter().any(|k| body.get("data").and_then(|d| d.get(*k)).and_then(|v| v.as_str()).is_some_and(|v| !v.is_empty()));
    let key_sealed = stored.sealed_key.is_some() || body.get(SEALED_FIELD).is_some();
    let Some(chain) = stored.cert_chain else { return false };
    if !(key_in_data || key_sealed) {
        return false;
    }
    let Ok(blocks) = pem::parse_many(chain.as_bytes()) else { return false };
    let certs: Vec<&pem::Pem> = blocks.iter().filter(|b| b.tag() == "CERTIFICATE").collect();
    !certs.is_empty()
        && certs.iter().all(|b| match x509_parser::parse_x509_certificate(b.contents()) {
            Ok((_, cert)) => now.is_none_or(|t| cert.validity().not_before.timestamp() <= t && t <= cert.validity().not_after.timestamp()),
            Err(_) => false,
        })
}
