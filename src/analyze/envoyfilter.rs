//! EnvoyFilter analyzers (Istio's `envoyfilter.EnvoyPatchAnalyzer`), per
//! patch, in `configPatches` order, located at the patch's value:
//! - IST0153 / IST0154: ADD or REMOVE with `applyTo` ROUTE_CONFIGURATION
//!   or HTTP_ROUTE (Istio's message says they are ignored; istiod does
//!   apply both on HTTP_ROUTE, the message is given anyway, as Istio's);
//! - IST0152: REPLACE with an `applyTo` other than HTTP_FILTER,
//!   NETWORK_FILTER and VIRTUAL_HOST;
//! - IST0151: a relative operation (REMOVE, REPLACE where valid,
//!   INSERT_BEFORE, INSERT_AFTER; not MERGE) in a filter without
//!   `priority`; IST0155 instead when a patch analysed earlier (this
//!   filter's or one before it, in store order) has `match.proxy.
//!   proxyVersion` and the same instance name.
//!
//! A patch's instance name, as Istio's: its value's top-level `name`, else
//! (a value without one) the listener match's filter name, else nothing.
//! The analysis of a filter stops at its first patch without `patch`
//! (validation refuses those, so only files can hold one).

use super::{Ctx, Message, IST0151, IST0152, IST0153, IST0154, IST0155};
use crate::model::istio::envoy_filter::{ApplyTo, ConfigPatch, Operation};
use serde_json::Value;

pub(super) fn run(ctx: &Ctx, out: &mut Vec<Message>) {
    // The instance names of the patches seen so far that set a proxy version.
    let mut pinned: Vec<String> = Vec::new();
    for ef in &ctx.envoy_filters {
        for (i, p) in ef.spec.config_patches.iter().enumerate() {
            let Some(patch) = &p.patch else { break };
            let name = instance_name(p);
            let field = Some(format!("spec.configPatches[{i}].patch.value"));
            let report = |code| Message::new(code, ef.key(), field.clone(), code.template.to_string());
            let route = matches!(p.apply_to, Some(ApplyTo::RouteConfiguration | ApplyTo::HttpRoute));
            let relative = match patch.operation {
                Some(Operation::Add) if route => {
                    out.push(report(IST0153));
                    false
                }
                Some(Operation::Remove) if route => {
                    out.push(report(IST0154));
                    false
                }
                Some(Operation::Replace) if !matches!(p.apply_to, Some(ApplyTo::NetworkFilter | ApplyTo::HttpFilter | ApplyTo::VirtualHost)) => {
                    out.push(report(IST0152));
                    false
                }
                Some(Operation::Remove | Operation::Replace | Operation::InsertBefore | Operation::InsertAfter) => true,
                _ => false,
            };
            if relative && ef.spec.priority == 0 {
                out.push(report(if pinned.contains(&name) { IST0155 } else { IST0151 }));
            }
            if p.match_.as_ref().and_then(|m| m.proxy.as_ref()).is_some_and(|px| !px.proxy_version.is_empty()) {
                pinned.push(name);
            }
        }
    }
}

/// Istio's instance name of a patch (see the module doc). A value's name
/// and a filter's never compare equal (Istio compares the protobuf text of
/// the value's name, `string_value:"…"`, with the bare filter name).
fn instance_name(p: &ConfigPatch) -> String {
    let Some(Value::Object(value)) = p.patch.as_ref().and_then(|p| p.value.as_ref()) else { return String::new() };
    if value.is_empty() {
        return String::new();
    }
    if let Some(name) = value.get("name") {
        return format!("value:{name}");
    }
    let filter = p.match_.as_ref().and_then(|m| m.listener.as_ref()).and_then(|l| l.filter_chain.as_ref()).and_then(|c| c.filter.as_ref());
    filter.map(|f| f.name.clone()).unwrap_or_default()
}
