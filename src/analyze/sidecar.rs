//! Sidecar analyzers (Istio's `sidecar.SelectorAnalyzer`):
//! - IST0111: several Sidecars of one namespace without a workload
//!   selector (which one applies is undefined);
//! - IST0110: several Sidecars whose selectors pick the same workload;
//! - IST0101 `selector`: a Sidecar's selector picks no workload of its
//!   namespace.
//!
//! Workloads are the registry's Instances and the WorkloadEntries (Istio's
//! pods); a workload's name is its object's.

use super::{quote, selector_text, selects, slice, Ctx, Item, Message, IST0101, IST0110, IST0111};
use crate::model::istio::Sidecar;
use std::collections::BTreeMap;

pub(super) fn run(ctx: &Ctx, out: &mut Vec<Message>) {
    let mut by_ns: BTreeMap<&str, Vec<&Item<Sidecar>>> = BTreeMap::new();
    for sc in &ctx.sidecars {
        by_ns.entry(sc.ns()).or_default().push(sc);
    }
    for (ns, sidecars) in by_ns {
        let selector = |sc: &Item<Sidecar>| sc.spec.workload_selector.as_ref().map(|s| &s.labels).filter(|l| !l.is_empty()).cloned();
        let (with, without): (Vec<&Item<Sidecar>>, Vec<&Item<Sidecar>>) = sidecars.iter().partition(|sc| selector(sc).is_some());
        if without.len() > 1 {
            let mut names: Vec<&str> = without.iter().map(|s| s.name()).collect();
            names.sort();
            for sc in &without {
                let text =
                    format!("The Sidecars {} in namespace {} have no workload selector, which can lead to undefined behavior.", slice(&names), quote(ns));
                out.push(Message::new(IST0111, sc.key(), Some("metadata.name".into()), text));
            }
        }
        let workloads: Vec<_> = ctx.workloads.iter().filter(|w| w.key.is_some() && w.namespace == ns).collect();
        for sc in &with {
            let labels = selector(sc).unwrap_or_default();
            if !workloads.iter().any(|w| selects(&labels, &w.labels)) {
                let text = format!("Referenced selector not found: {}", quote(&selector_text(&labels)));
                out.push(Message::new(IST0101, sc.key(), Some("spec.workloadSelector".into()), text));
            }
        }
        for w in &workloads {
            let picking: Vec<&&Item<Sidecar>> = with.iter().filter(|sc| selects(&selector(sc).unwrap_or_default(), &w.labels)).collect();
            if picking.len() < 2 {
                continue;
            }
            let mut names: Vec<&str> = picking.iter().map(|s| s.name()).collect();
            names.sort();
            for sc in &picking {
                let text = format!(
                    "The Sidecars {} in namespace {} select the same workload pod {}, which can lead to undefined behavior.",
                    slice(&names),
                    quote(ns),
                    quote(&w.name)
                );
                out.push(Message::new(IST0110, sc.key(), Some("spec.workloadSelector".into()), text).naming(w.key));
            }
        }
    }
}
