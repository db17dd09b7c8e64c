//! AuthorizationPolicy analyzers (Istio's `auth.AuthorizationPoliciesAnalyzer`):
//! - IST0127: a policy that selects no workload: with a selector, none of
//!   its namespace's (in the root namespace: of any namespace); without
//!   one, outside the root namespace, when its namespace has no workload at
//!   all. A `targetRef` policy counts as one without a selector (Istio
//!   reads only `selector`).
//! - IST0101 `namespace`: a `source.namespaces` / `notNamespaces` value
//!   that matches no namespace (`*`, `*suffix`, `prefix*`, or a name, any
//!   case). Lodestar has no Namespace objects: a namespace exists when it
//!   holds an object.
//! - LST0005: a workload no policy applies to while ALLOW policies select
//!   other workloads of its namespace: the namespace looks locked down,
//!   but every request to this one is allowed (Kiali's check).
//!
//! - LST0006: a CUSTOM policy whose ext_authz provider is not in the
//!   MeshConfig, is of another kind, or names no service of the mesh: its
//!   matched requests are denied (fail closed, as istiod).
//!
//! Workloads are the registry's Instances, the WorkloadEntries, and the
//! gateway proxies Gateways imply (policies on an ingress gateway select
//! those); LST0005 reports only the registered ones.

use super::{quote, selector_text, slice, Ctx, Item, Message, IST0101, IST0127, LST0005, LST0006};
use crate::model::istio::authorization_policy::{Action, DRY_RUN_ANNOTATION};
use crate::model::istio::AuthorizationPolicy;
use std::collections::BTreeMap;

pub(super) fn run(ctx: &Ctx, out: &mut Vec<Message>) {
    let root = ctx.root_ns();
    let workloads: Vec<_> = ctx.workloads.iter().filter(|w| w.key.is_some() || w.gateway).collect();
    for ap in &ctx.ap {
        let selector = ap.spec.selector.as_ref().map(|s| &s.match_labels).filter(|l| !l.is_empty());
        let selects_none = match selector {
            Some(labels) if ap.ns() == root => !ctx.any_workload(labels, false),
            Some(labels) => !ctx.selected(labels).any(|w| (w.key.is_some() || w.gateway) && w.namespace == ap.ns()),
            None if ap.ns() == root => false,
            None => !workloads.iter().any(|w| w.namespace == ap.ns()),
        };
        if selects_none {
            let labels = selector.map(selector_text).unwrap_or_default();
            let field = Some(if selector.is_some() { "spec.selector" } else { "metadata.namespace" }.to_string());
            out.push(Message::new(IST0127, ap.key(), field, format!("No matching workloads for this resource with the following labels: {labels}")));
        }
        source_namespaces(ctx, ap, out);
        if ap.spec.action() == Action::Custom {
            let name = ap.spec.provider.as_ref().map(|p| p.name.as_str()).unwrap_or_default();
            if let Err(why) = crate::translate::extauthz::resolve(&ctx.mesh, name) {
                out.push(Message::new(
                    LST0006,
                    ap.key(),
                    Some("spec.provider.name".into()),
                    format!(
                        "The CUSTOM policy names ext_authz provider {}, which cannot be used ({why}): the requests its rules match are denied.",
                        quote(name)
                    ),
                ));
            }
        }
    }
    uncovered_workloads(ctx, out);
}

fn source_namespaces(ctx: &Ctx, ap: &Item<AuthorizationPolicy>, out: &mut Vec<Message>) {
    for (i, rule) in ap.spec.rules.iter().flatten().enumerate() {
        for (j, from) in rule.from.iter().flatten().enumerate() {
            let Some(source) = &from.source else { continue };
            for (field, values) in [("namespaces", &source.namespaces), ("notNamespaces", &source.not_namespaces)] {
                for (k, v) in values.iter().enumerate().filter(|(_, v)| !ctx.namespace_exists(v)) {
                    let at = Some(format!("spec.rules[{i}].from[{j}].source.{field}[{k}]"));
                    out.push(Message::new(IST0101, ap.key(), at, format!("Referenced namespace not found: {}", quote(v))));
                }
            }
        }
    }
}

/// Whether a policy is enforced (not an `istio.io/dry-run` one).
fn enforced(ap: &Item<AuthorizationPolicy>) -> bool {
    !ap.obj.annotation(DRY_RUN_ANNOTATION).is_some_and(|v| matches!(v, "1" | "t" | "T" | "TRUE" | "true" | "True"))
}

/// LST0005.
fn uncovered_workloads(ctx: &Ctx, out: &mut Vec<Message>) {
    let root = ctx.root_ns();
    let mut allow: BTreeMap<&str, Vec<&Item<AuthorizationPolicy>>> = BTreeMap::new();
    for ap in ctx.ap.iter().filter(|ap| ap.spec.action() == Action::Allow && enforced(ap)) {
        allow.entry(ap.ns()).or_default().push(ap);
    }
    for w in ctx.workloads.iter().filter(|w| w.key.is_some()) {
        let Some(policies) = allow.get(w.namespace.as_str()) else { continue };
        let covered = ctx.ap.iter().filter(|ap| enforced(ap)).any(|ap| {
            let labels = ap.spec.selector.as_ref().map(|s| &s.match_labels);
            crate::model::istio::common::policy_applies(ap.ns(), labels, root, &w.namespace, &w.labels)
        });
        if !covered {
            let Some(key) = w.key else { continue };
            let text = format!(
                "No AuthorizationPolicy applies to this workload although ALLOW policies {} in namespace {} select other workloads: every request to it is allowed.",
                slice(policies.iter().map(|p| p.name())),
                quote(&w.namespace)
            );
            out.push(Message::new(LST0005, key, Some("metadata.labels".into()), text).naming(policies.iter().map(|p| p.key())));
        }
    }
}
