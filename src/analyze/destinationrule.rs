//! DestinationRule analyzers (Istio's `destinationrule.*`):
//! - IST0128 / IST0129 (`CaCertificateAnalyzer`): TLS origination (SIMPLE
//!   or MUTUAL) without `caCertificates`, at the rule's level and at each
//!   port's, exempt only when `credentialName` and a `workloadSelector`
//!   are both set (Istio's scope: subsets' policies are not looked at);
//! - IST0174 and IST0173 (`SubsetSelectPodAnalyzer`): the host is a
//!   service of the mesh (looked up as IST0101 does), and each subset's
//!   labels (with a ServiceEntry's `workloadSelector`) select some
//!   workload, in any namespace (Istio's "any pod");
//! - LST0004: a subset that selects workloads, none of which is an
//!   instance of its host (Kiali's check; stricter than IST0173);
//! - LST0001 / LST0002: several DestinationRules of one namespace for one
//!   host (Lodestar, as Pilot before merging, uses one per host and proxy):
//!   the same subset defined twice, or rules that shadow each other.

use super::{quote, selects, slice, Ctx, Item, Message, IST0128, IST0129, IST0173, IST0174, LST0001, LST0002, LST0004};
use crate::model::istio::destination_rule::{ClientTlsMode, ClientTlsSettings};
use crate::model::istio::{resolve_short_name, DestinationRule};
use crate::model::Kind;
use std::collections::BTreeMap;

pub(super) fn run(ctx: &Ctx, out: &mut Vec<Message>) {
    for dr in &ctx.dr {
        ca_certificates(dr, out);
        hosts_and_subsets(ctx, dr, out);
    }
    shadowed(ctx, out);
}

fn ca_certificates(dr: &Item<DestinationRule>, out: &mut Vec<Message>) {
    let Some(policy) = &dr.spec.traffic_policy else { return };
    let exempt = |tls: &ClientTlsSettings| tls.credential_name.as_deref().is_some_and(|c| !c.is_empty()) && dr.spec.workload_selector.is_some();
    let unverified = |tls: &ClientTlsSettings| -> Option<&'static str> {
        let mode = match tls.mode {
            Some(ClientTlsMode::Simple) => "SIMPLE",
            Some(ClientTlsMode::Mutual) => "MUTUAL",
            _ => return None,
        };
        (tls.ca_certificates.as_deref().is_none_or(str::is_empty) && !exempt(tls)).then_some(mode)
    };
    let (name, ns, host) = (dr.full_name(), dr.ns(), &dr.spec.host);
    if let Some(mode) = policy.tls.as_ref().and_then(unverified) {
        let text = format!(
            "DestinationRule {name} in namespace {ns} has TLS mode set to {mode} but no caCertificates are set to validate server identity for host: {host}"
        );
        out.push(Message::new(IST0128, dr.key(), Some("spec.trafficPolicy.tls".into()), text));
    }
    for (i, p) in policy.port_level_settings.iter().enumerate() {
        if let Some(mode) = p.tls.as_ref().and_then(unverified) {
            // The PortSelector in protobuf text form, as Istio prints it.
            let port = format!("number:{}", p.port.as_ref().map_or(0, |p| p.number));
            let text = format!(
                "DestinationRule {name} in namespace {ns} has TLS mode set to {mode} but no caCertificates are set to validate server identity for host: {host} at port {port}"
            );
            out.push(Message::new(IST0129, dr.key(), Some(format!("spec.trafficPolicy.portLevelSettings[{i}].tls")), text));
        }
    }
}

fn hosts_and_subsets(ctx: &Ctx, dr: &Item<DestinationRule>, out: &mut Vec<Message>) {
    let host = &dr.spec.host;
    let Some(svc) = ctx.find_host(dr.ns(), &dr.spec.export_to, host) else {
        let text = format!("The host {host} defined in the DestinationRule does not match any services in the mesh.");
        out.push(Message::new(IST0174, dr.key(), Some("spec.host".into()), text));
        return;
    };
    // A ServiceEntry's workloadSelector narrows every subset.
    let entry_selector: BTreeMap<String, String> = svc
        .sources
        .iter()
        .filter(|(k, _)| k.kind == Kind::ServiceEntry)
        .find_map(|(k, _)| ctx.se.iter().find(|se| se.key() == k)?.spec.workload_selector.as_ref().map(|s| s.labels.clone()))
        .unwrap_or_default();
    for (i, subset) in dr.spec.subsets.iter().enumerate() {
        let mut selector = entry_selector.clone();
        selector.extend(subset.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        let field = Some(format!("spec.subsets[{i}]"));
        let own = svc.instances.iter().any(|inst| selects(&subset.labels, &inst.labels));
        if !own && !ctx.any_workload(&selector, true) {
            let text =
                format!("The Subset {} defined in the DestinationRule does not select any pods. Which may lead to 503 UH (NoHealthyUpstream).", subset.name);
            out.push(Message::new(IST0173, dr.key(), field, text));
        } else if !subset.labels.is_empty() && !own {
            let text = format!(
                "The Subset {} defined in the DestinationRule selects no instance of host {} (it has {}); traffic to the subset gets 503 UH (NoHealthyUpstream).",
                subset.name,
                svc.hostname,
                svc.instances.len()
            );
            out.push(Message::new(LST0004, dr.key(), field, text));
        }
    }
}

/// LST0001 and LST0002, by namespace and host (short names resolved).
fn shadowed(ctx: &Ctx, out: &mut Vec<Message>) {
    let mut groups: BTreeMap<(&str, String), Vec<&Item<DestinationRule>>> = BTreeMap::new();
    for dr in &ctx.dr {
        groups.entry((dr.ns(), resolve_short_name(&dr.spec.host, dr.ns(), ctx.suffix()))).or_default().push(dr);
    }
    for ((ns, host), mut rules) in groups {
        if rules.len() < 2 {
            continue;
        }
        rules.sort_by(|a, b| (a.obj.create_revision, a.key()).cmp(&(b.obj.create_revision, b.key())));
        let mut names: Vec<&str> = rules.iter().map(|r| r.name()).collect();
        names.sort();
        let oldest = rules[0].name();
        for dr in &rules {
            let text = format!(
                "The DestinationRules {} in namespace {} apply to the same host {host}; a proxy that sees several of them uses the oldest ({oldest}) and ignores the others.",
                slice(&names),
                quote(ns)
            );
            out.push(Message::new(LST0002, dr.key(), Some("spec.host".into()), text));
        }
        let mut subsets: BTreeMap<&str, Vec<(&Item<DestinationRule>, usize)>> = BTreeMap::new();
        for dr in &rules {
            for (i, s) in dr.spec.subsets.iter().enumerate() {
                subsets.entry(s.name.as_str()).or_default().push((dr, i));
            }
        }
        for (subset, defs) in subsets.into_iter().filter(|(_, d)| d.len() > 1) {
            let mut names: Vec<&str> = defs.iter().map(|(d, _)| d.name()).collect();
            names.sort();
            names.dedup();
            if names.len() < 2 {
                continue;
            }
            for (dr, i) in &defs {
                let text = format!(
                    "The DestinationRules {} in namespace {} define subset {} for the same host {host}; a proxy uses one DestinationRule per host, so only one of these definitions applies.",
                    slice(&names),
                    quote(ns),
                    quote(subset)
                );
                out.push(Message::new(LST0001, dr.key(), Some(format!("spec.subsets[{i}]")), text));
            }
        }
    }
}
