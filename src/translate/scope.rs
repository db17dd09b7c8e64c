//! What a proxy can see and which listeners it gets, on bare metal.
//!
//! The Sidecar that applies to a proxy is, as in Istio: one in the proxy's
//! namespace whose `workloadSelector` matches its labels (oldest first), else
//! the selector-less one in its namespace, else the selector-less one in the
//! root namespace, else none.
//!
//! Without capture every listener binds a real address (a captured
//! proxy's are made virtual in `capture`). Egress listeners
//! bind `bind:port` (default: the proxy's own IP) and route by Host header to
//! every visible service on that port. A proxy with no Sidecar, and an egress
//! entry with no port, get one such listener per port of the services they
//! can see (hosts `*/*` by default). This is the documented default: a
//! workload calls `http://reviews:9080` through `PROXY_IP:9080`.

use crate::mesh::{resolve, Config, Mesh, Service};
use crate::model::istio::sidecar::CaptureMode;
use crate::model::istio::{host_matches, Sidecar};
use crate::model::proxy::{ProxyIdentity, ProxyKind};
use std::collections::BTreeMap;
use std::sync::Arc;

pub fn sidecar_for<'a>(mesh: &'a Mesh, proxy: &'a ProxyIdentity) -> Option<&'a Arc<Config<Sidecar>>> {
    fn in_ns<'m>(mesh: &'m Mesh, ns: &'m str) -> impl Iterator<Item = &'m Arc<Config<Sidecar>>> + 'm {
        mesh.sidecars.iter().filter(move |s| s.key.namespace == ns)
    }
    let no_selector = |s: &&Arc<Config<Sidecar>>| s.spec.workload_selector.as_ref().is_none_or(|sel| sel.labels.is_empty());
    in_ns(mesh, &proxy.namespace)
        .find(|s| s.spec.workload_selector.as_ref().is_some_and(|sel| !sel.labels.is_empty() && sel.labels.iter().all(|(k, v)| proxy.labels.get(k) == Some(v))))
        .or_else(|| in_ns(mesh, &proxy.namespace).find(no_selector))
        .or_else(|| in_ns(mesh, &mesh.config.root_namespace).find(no_selector))
}

/// Does an egress `hosts` entry (`ns/dnsName`, `./x`, `*/x`, `~/x`) admit
/// this service for a proxy in `proxy_ns`?
pub fn egress_host_admits(entry: &str, service: &Service, proxy_ns: &str) -> bool {
    let (ns, host) = entry.split_once('/').unwrap_or(("*", entry));
    let ns_ok = match ns {
        "*" => true,
        "~" => false,
        "." => service.namespace == proxy_ns,
        other => service.namespace == other,
    };
    ns_ok && host_matches(host, &service.hostname)
}

/// One egress listener to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressPlan {
    pub bind: String,
    pub port: u32,
    /// Services reachable through it, by hostname.
    pub services: BTreeMap<String, Arc<Service>>,
}

impl EgressPlan {
    pub fn listener_name(&self) -> String {
        format!("{}_{}", self.bind, self.port)
    }

    /// The RDS name: the port (Istio's outbound convention), qualified by
    /// the bind address when it is not the proxy's own.
    pub fn route_name(&self, proxy_ip: &str) -> String {
        if self.bind == proxy_ip {
            self.port.to_string()
        } else {
            format!("{}:{}", self.bind, self.port)
        }
    }
}

/// How one proxy sees the services: for each hostname, the one
/// [`crate::mesh::resolve`] picks among those exported to its namespace,
/// preferring those its Sidecar's egress `hosts` admit (so that its
/// listeners, clusters and routes agree on one service per hostname; a
/// name no egress entry admits is still resolved, for a route's port).
pub struct ProxyScope<'a> {
    pub mesh: &'a Mesh,
    namespace: &'a str,
    /// The `hosts` of the egress entries its listeners are built from;
    /// `None`: every service (no Sidecar, a gateway).
    egress: Option<Vec<&'a str>>,
}

impl<'a> ProxyScope<'a> {
    pub fn new(mesh: &'a Mesh, proxy: &'a ProxyIdentity, sidecar: Option<&'a Config<Sidecar>>) -> ProxyScope<'a> {
        let egress = sidecar
            .map(|s| &s.spec.egress)
            .filter(|e| !e.is_empty())
            .map(|egress| egress.iter().filter(|e| served(e, proxy)).flat_map(|e| e.hosts.iter().map(String::as_str)).collect());
        ProxyScope { mesh, namespace: &proxy.namespace, egress }
    }

    /// A proxy's scope: a sidecar's (or proxyless client's) Sidecar
    /// applies; a gateway sees every service exported to it.
    pub fn of(mesh: &'a Mesh, proxy: &'a ProxyIdentity) -> ProxyScope<'a> {
        let sidecar = if proxy.kind == ProxyKind::Router { None } else { sidecar_for(mesh, proxy) };
        ProxyScope::new(mesh, proxy, sidecar.map(|s| s.as_ref()))
    }

    /// Whether its egress entries admit `svc` (any of them).
    fn admits(&self, svc: &Service) -> bool {
        self.egress.as_ref().is_none_or(|hosts| hosts.iter().any(|h| egress_host_admits(h, svc, self.namespace)))
    }

    /// The service this proxy uses for `hostname`.
    pub fn service(&self, hostname: &str) -> Option<&'a Arc<Service>> {
        self.pick(self.mesh.claims(hostname))
    }

    /// Every hostname it can see, resolved.
    pub fn services(&self) -> impl Iterator<Item = &'a Arc<Service>> + '_ {
        self.mesh.services.values().filter_map(|claims| self.pick(claims))
    }

    fn pick(&self, claims: &'a [Arc<Service>]) -> Option<&'a Arc<Service>> {
        match claims {
            // Most hostnames have one claim: nothing to choose.
            [one] => one.visible_to(self.namespace).then_some(one),
            _ => resolve(claims, self.namespace, |s| self.admits(s)).or_else(|| resolve(claims, self.namespace, |_| true)),
        }
    }
}

/// Whether an egress entry is served to `proxy`: one that relies on
/// iptables (`captureMode: IPTABLES`) only to a proxy whose traffic is
/// captured.
fn served(e: &crate::model::istio::sidecar::EgressListener, proxy: &ProxyIdentity) -> bool {
    proxy.capture || e.capture_mode != Some(CaptureMode::Iptables)
}

/// The egress listeners of a sidecar proxy.
pub fn egress_plans(scope: &ProxyScope, proxy: &ProxyIdentity, sidecar: Option<&Config<Sidecar>>) -> Vec<EgressPlan> {
    let default_hosts = vec!["*/*".to_string()];
    let entries: Vec<(Option<u32>, Option<String>, &Vec<String>)> = match sidecar.map(|s| &s.spec.egress) {
        Some(egress) if !egress.is_empty() => {
            egress.iter().filter(|e| served(e, proxy)).map(|e| (e.port.as_ref().map(|p| p.number()), e.bind.clone(), &e.hosts)).collect()
        }
        _ => vec![(None, None, &default_hosts)],
    };
    let services: Vec<&Arc<Service>> = scope.services().collect();
    let mut plans: BTreeMap<(String, u32), EgressPlan> = BTreeMap::new();
    for (port, bind, hosts) in entries {
        let bind = bind.filter(|b| !b.is_empty() && b != "0.0.0.0").unwrap_or_else(|| proxy.ip.clone());
        for svc in &services {
            if !hosts.iter().any(|h| egress_host_admits(h, svc, &proxy.namespace)) {
                continue;
            }
            for p in &svc.ports {
                if port.is_some_and(|want| want != p.number) {
                    continue;
                }
                let plan =
                    plans.entry((bind.clone(), p.number)).or_insert_with(|| EgressPlan { bind: bind.clone(), port: p.number, services: BTreeMap::new() });
                plan.services.entry(svc.hostname.clone()).or_insert_with(|| (*svc).clone());
            }
        }
    }
    plans.into_values().collect()
}

/// Whether a security policy in `policy_ns` with workload selector
/// `match_labels` applies to `proxy` (`common::policy_applies`).
pub fn policy_selects(policy_ns: &str, match_labels: Option<&BTreeMap<String, String>>, root_ns: &str, proxy: &ProxyIdentity) -> bool {
    crate::model::istio::common::policy_applies(policy_ns, match_labels, root_ns, &proxy.namespace, &proxy.labels)
}
