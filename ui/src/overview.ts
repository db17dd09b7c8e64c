// Overview: members, leader, revision, each replica's health and proxies,
// this replica's proxies, analyze findings by severity. Proxies: the
// proxies connected to this replica with their ACK/NACK state per type.

import { api, ApiError, apiAt, learnMembers, origin } from "./api";
import { alert, h, link, route, segment, table } from "./dom";
import { Ctx, explain, objectHref, refLink, since } from "./common";
import { topologyGraph } from "./graph";
import type { Analysis, ClusterStatus, ConfigDump, Member, NackEvent, ProxyStatus, RecentNacks, ServiceView, Syncz, Topology, TopologyEdge, Via } from "./types";

function settled<T>(r: PromiseSettledResult<T>): T | HTMLElement {
  return r.status === "fulfilled" ? r.value : alert(explain(r.reason));
}

const noClusterRead = (what: string) =>
  Promise.reject(new ApiError(403, `this token may not read the cluster (${what} needs read on the cluster); the Config view shows what it may read`));

function serving(m: Member): boolean {
  return m.info.api_addr === new URL(origin()).host;
}

function health(m: Member): string {
  if (!m.status) return `Unreachable: ${m.error ?? "no answer"}`;
  return m.status.ready ? "Ready" : "Not ready";
}

function card(label: string, value: string | number, cls = ""): HTMLElement {
  return h("div", { class: `card stat ${cls}` }, h("span", { class: "label" }, label), h("span", { class: "value" }, String(value)));
}

/** In sync, pending, or the NACK with its error: per type. */
export function proxyState(p: ProxyStatus): string {
  if (p.generate_error) return `Generation failed: ${p.generate_error}`;
  const nacks = Object.entries(p.types).filter(([, t]) => t.last_nack && t.sent_version === t.last_nack.rejected_version);
  if (nacks.length) return nacks.map(([k, t]) => `NACK ${k} v${t.last_nack?.rejected_version}: ${t.last_nack?.error}`).join("; ");
  return Object.values(p.types).every((t) => t.in_sync) ? "In sync (ACKed)" : "Pending";
}

/** A NACK with the replica whose proxy sent it. */
type ReplicaNack = NackEvent & { replica: number };

/**
 * The NACKs of the last hour on every member that answers (each keeps
 * its own proxies'), newest first, and the members that did not answer.
 */
async function clusterNacks(c: ClusterStatus): Promise<{ nacks: ReplicaNack[]; missing: string[] }> {
  const asked = await Promise.all(
    c.members.map(async (m) => {
      if (!m.status) return { missing: `replica ${m.id}: ${m.error ?? "unreachable"}` };
      try {
        const r = serving(m) ? await api<RecentNacks>("/v1/nacks/recent") : await apiAt<RecentNacks>(`${location.protocol}//${m.info.api_addr}`, "/v1/nacks/recent");
        return { nacks: r.nacks.map((n) => ({ ...n, replica: r.replica })) };
      } catch (e) {
        return { missing: `replica ${m.id}: ${explain(e)}` };
      }
    }),
  );
  const nacks = asked.flatMap((a) => a.nacks ?? []).sort((x, y) => y.atUnixMs - x.atUnixMs);
  return { nacks, missing: asked.flatMap((a) => (a.missing ? [a.missing] : [])) };
}

function nacksView(n: { nacks: ReplicaNack[]; missing: string[] }): HTMLElement {
  return h(
    "div",
    {},
    n.missing.map((m) => alert(`NACKs not known: ${m}`)),
    n.nacks.length === 0
      ? h("p", { class: "muted" }, "No proxy rejected a config in the last hour.")
      : table(
          `${n.nacks.length} NACK${n.nacks.length === 1 ? "" : "s"} in the last hour, every replica`,
          ["When", "Replica", "Proxy", "Type", "Rejected version", "Error"],
          n.nacks.map((x) => [since(x.atUnixMs), `replica ${x.replica}`, h("code", {}, x.proxy), x.type, x.rejectedVersion, h("span", { class: "bad" }, x.error)]),
        ),
  );
}

export async function overview(ctx: Ctx): Promise<Node> {
  const read = ctx.who.clusterRead;
  const [cluster, sync, analysis] = await Promise.allSettled([
    read ? api<ClusterStatus>("/v1/cluster") : noClusterRead("the member list"),
    read ? api<Syncz>("/debug/syncz") : noClusterRead("the proxy list"),
    api<Analysis>("/v1/analyze"),
  ]);
  const c = settled(cluster);
  const s = settled(sync);
  const a = settled(analysis);
  const n = c instanceof HTMLElement ? (c.cloneNode(true) as HTMLElement) : await clusterNacks(c);
  const cards: HTMLElement[] = [];
  if (!(c instanceof HTMLElement)) {
    learnMembers([...c.members].sort((x, y) => x.id - y.id).map((m) => m.info.api_addr));
    const leader = c.members.find((m) => m.id === c.leader);
    const ready = c.members.filter((m) => m.status?.ready).length;
    cards.push(
      card("Leader", c.leader === null ? "none" : `replica ${c.leader}`, c.leader === null ? "bad" : ""),
      card("Revision", leader?.status?.revision ?? Math.max(0, ...c.members.map((m) => m.status?.revision ?? 0))),
      card("Members ready", `${ready} of ${c.members.length}`, ready === c.members.length ? "" : "bad"),
      card("Connected proxies", c.members.reduce((n, m) => n + (m.status?.xds_streams ?? 0), 0)),
    );
  }
  if (!(n instanceof HTMLElement)) {
    cards.push(card("NACKs, last hour (all replicas)", n.missing.length ? `${n.nacks.length}+` : n.nacks.length, n.nacks.length || n.missing.length ? "bad" : ""));
  }
  if (!(a instanceof HTMLElement)) {
    const count = (l: string) => a.messages.filter((m) => m.level === l).length;
    cards.push(card("Errors", count("Error"), count("Error") ? "bad" : ""), card("Warnings", count("Warning"), count("Warning") ? "warn" : ""), card("Info", count("Info")));
  }
  return h(
    "div",
    {},
    h("h1", {}, "Overview"),
    h("div", { class: "cards" }, cards),
    h("h2", {}, "Members"),
    c instanceof HTMLElement
      ? c
      : table(
          `${c.members.length} members, term ${c.term}`,
          ["Replica", "API address", "Role", "State", "Revision", "Applied index", "Proxies", "Health"],
          c.members.map((m) => [
            h("span", {}, `replica ${m.id}`, m.id === c.leader ? h("span", { class: "badge" }, "leader") : null, serving(m) ? h("span", { class: "badge" }, "answering this console") : null),
            m.info.api_addr,
            m.role,
            m.status?.state ?? "—",
            m.status?.revision ?? "—",
            m.status?.applied_index ?? "—",
            m.status?.xds_streams ?? "—",
            h("span", { class: m.status?.ready ? "ok" : "bad" }, health(m)),
          ]),
        ),
    h("h2", {}, "NACKs in the last hour"),
    n instanceof HTMLElement ? n : nacksView(n),
    h("h2", {}, "Proxies on this replica"),
    s instanceof HTMLElement
      ? s
      : s.proxies.length === 0
        ? h("p", { class: "muted" }, "No proxy is connected to this replica.")
        : table(
            `${s.proxies.length} connected`,
            ["Proxy", "Revision", "State"],
            s.proxies.map((p) => [link(`#/proxies/${segment(p.id)}`, p.id), p.revision ?? "—", proxyState(p)]),
          ),
    h("h2", {}, "Analyze findings"),
    a instanceof HTMLElement
      ? a
      : a.messages.length === 0
        ? h("p", { class: "muted" }, `No findings at revision ${a.revision}.`)
        : table(
            `${a.messages.length} findings at revision ${a.revision}`,
            ["Severity", "Code", "Resource", "Message"],
            a.messages.map((m) => [h("span", { class: `level ${m.level}` }, m.level), m.code, m.resource ? refLink(m.resource) : "—", m.message]),
          ),
  );
}

export async function proxies(ctx: Ctx): Promise<Node> {
  if (!ctx.who.clusterRead) {
    return h("div", {}, h("h1", {}, "Proxies"), alert(explain(new ApiError(403, "this token may not read the cluster: the proxy list needs read on the cluster"))));
  }
  const s = await api<Syncz>("/debug/syncz");
  const types = ["CDS", "EDS", "LDS", "RDS"];
  const typeCell = (p: ProxyStatus, t: string) => {
    const ts = p.types[t];
    if (!ts) return "—";
    if (ts.last_nack && ts.sent_version === ts.last_nack.rejected_version) return h("span", { class: "bad" }, `NACK v${ts.last_nack.rejected_version}: ${ts.last_nack.error}`);
    if (ts.in_sync) return h("span", { class: "ok" }, `ACK v${ts.acked_version}`);
    return h("span", { class: "warn" }, `sent v${ts.sent_version ?? "—"}, waiting`);
  };
  return h(
    "div",
    {},
    h("h1", {}, "Proxies"),
    h("p", { class: "muted" }, "The proxies connected to the replica this console is using (the Overview counts every replica's)."),
    s.proxies.length === 0
      ? h("p", { class: "muted" }, "No proxy is connected to this replica.")
      : table(
          `${s.proxies.length} connected proxies`,
          ["Proxy", "Workload", "Address", "Protocol", "Connected", "Revision", ...types, "State"],
          s.proxies.map((p) => [
            link(`#/proxies/${segment(p.id)}`, h("code", {}, p.id)),
            `${p.namespace}/${p.name}`,
            p.ip,
            String(p.protocol),
            since(p.connected_at_unix_ms),
            p.revision ?? "—",
            ...types.map((t) => typeCell(p, t)),
            proxyState(p),
          ]),
        ),
  );
}

/** One proxy's config as this replica serves it (`/debug/config_dump`). */
export async function proxyConfig(ctx: Ctx): Promise<Node> {
  const id = decodeURIComponent(ctx.parts[1]);
  const dump = await api<ConfigDump>(`/debug/config_dump?proxyID=${segment(id)}`);
  const sections = ["clusters", "listeners", "routes", "endpoints"].map((t) => {
    const items = (dump[t] as { name: string; version: string; resource: unknown }[] | undefined) ?? [];
    return h(
      "section",
      {},
      h("h2", {}, `${t[0].toUpperCase()}${t.slice(1)} (${items.length})`),
      items.map((r) => h("details", {}, h("summary", {}, h("code", {}, r.name), ` version ${r.version}`), h("pre", { class: "doc" }, JSON.stringify(r.resource, null, 2)))),
    );
  });
  return h("div", {}, h("h1", {}, `Proxy ${id}`), h("p", {}, link("#/proxies", "All proxies"), ` · the config this replica serves it, at revision ${dump.revision}`), sections);
}

function viaLink(v: Via): HTMLElement {
  return h("span", { class: `via ${v.role}` }, `${v.role} `, link(objectHref({ kind: v.kind, namespace: v.namespace, name: v.name }), `${v.kind} ${v.namespace}/${v.name}`));
}

const VERDICT: Record<TopologyEdge["verdict"], [string, string]> = {
  allowed: ["ok", "allowed"],
  denied: ["bad", "denied"],
  conditional: ["warn", "some requests"],
};

/** The edges, caller → callee, as a table (one row per edge). */
function topologyView(t: Topology): HTMLElement {
  return h(
    "section",
    { class: "topology" },
    t.truncated ? alert(`Only the first ${t.edges.length} edges are shown: filter by namespace.`) : null,
    topologyGraph(t),
    t.edges.length === 0
      ? h("p", { class: "muted" }, "No workload calls another (or none this token may read).")
      : table(
          `${t.edges.length} edges between ${t.services.length} services at revision ${t.revision}`,
          ["Caller", "Callee", "Verdict", "Via", "Why"],
          t.edges.map((e) => [
            h("code", {}, e.from),
            h("span", {}, h("code", {}, e.to), e.host ? h("span", { class: "muted" }, ` (called as ${e.host})`) : null),
            h("span", { class: `verdict ${VERDICT[e.verdict][0]}` }, VERDICT[e.verdict][1]),
            e.via.length ? h("ul", { class: "via" }, e.via.map((v) => h("li", {}, viaLink(v)))) : "—",
            e.reason,
          ]),
        ),
    t.services.some((n) => n.sidecar)
      ? h(
          "p",
          { class: "muted" },
          "Calls scoped by a Sidecar: ",
          t.services.filter((n) => n.sidecar).map((n, i) => [i ? "; " : "", h("code", {}, n.hostname), " by ", viaLink(n.sidecar as Via)]),
        )
      : null,
  );
}

/** The registry: every service with its instances' health, and who may call whom. */
export async function services(ctx: Ctx): Promise<Node> {
  const ns = ctx.params.get("namespace") ?? "";
  const q = ns ? `?namespace=${segment(ns)}` : "";
  const [registry, topo] = await Promise.allSettled([api<{ revision: number; services: ServiceView[] }>(`/v1/registry/services${q}`), api<Topology>(`/v1/topology${q}`)]);
  const answer = settled(registry);
  const t = settled(topo);
  // The config that applies to each service (the topology's nodes).
  const applying = new Map(t instanceof HTMLElement ? [] : t.services.map((n) => [`${n.hostname} ${n.namespace}`, [...(n.sidecar ? [n.sidecar] : []), ...n.applies]]));
  const applies = (hostname: string, namespace: string) => {
    const vias = applying.get(`${hostname} ${namespace}`) ?? [];
    return vias.length ? h("ul", { class: "via" }, vias.map((v) => h("li", {}, viaLink(v)))) : "—";
  };
  const nsInput = h("input", { id: "services-ns", name: "namespace", value: ns, placeholder: "every namespace", autocomplete: "off" }) as HTMLInputElement;
  return h(
    "div",
    {},
    h("h1", {}, "Services"),
    h(
      "form",
      {
        class: "filters",
        role: "search",
        onsubmit: (ev: Event) => {
          ev.preventDefault();
          location.hash = route("/services", { namespace: nsInput.value.trim() });
        },
      },
      h("div", { class: "field" }, h("label", { for: "services-ns" }, "Namespace"), nsInput),
      h("button", { type: "submit" }, "Filter"),
    ),
    answer instanceof HTMLElement
      ? answer
      : answer.services.length === 0
        ? h("p", { class: "muted" }, "No registry service.")
        : table(
            `${answer.services.length} services at revision ${answer.revision}`,
            ["Service", "Namespace", "Ports", "Instances", "Healthy", "Unhealthy", "Unknown", "Config that applies"],
            answer.services.map((s) => [
              h("code", {}, s.hostname),
              s.namespace,
              s.ports.join(", "),
              link(route("/config", { kind: "Instance", namespace: s.namespace }), String(s.instances)),
              h("span", { class: "ok" }, String(s.healthy)),
              h("span", { class: s.unhealthy ? "bad" : "" }, String(s.unhealthy)),
              String(s.unknown),
              applies(s.hostname, s.namespace),
            ]),
          ),
    h("h2", {}, "Topology: who may call whom"),
    h("p", { class: "muted" }, "From config and registry: the routes of VirtualServices, the egress of Sidecars, and AuthorizationPolicies (DENY, then ALLOW), for each workload's identity."),
    t instanceof HTMLElement ? t : topologyView(t),
  );
}
