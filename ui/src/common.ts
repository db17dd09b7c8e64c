// What several views share: the view context, error text, change lists.

import { ApiError } from "./api";
import { alert, Child, h, link, segment, table } from "./dom";
import type { Change, FieldChange, Preview, ProxiesPreview, Ref, Who } from "./types";

export interface Ctx {
  who: Who;
  parts: string[];
  params: URLSearchParams;
}

export function explain(e: unknown): string {
  return e instanceof ApiError ? e.explain() : String(e);
}

export function objectHref(r: Ref): string {
  return `#/config/${segment(r.kind)}/${segment(r.namespace)}/${segment(r.name)}`;
}

export function refLink(r: Ref): HTMLElement {
  return link(objectHref(r), `${r.kind} ${r.namespace}/${r.name}`);
}

function value(v: unknown): string {
  return v === undefined ? "—" : JSON.stringify(v);
}

/** Resource-level changes with their field diffs (dry-runs, diffs, rollbacks). */
export function changesView(changes: Change[]): HTMLElement {
  if (changes.length === 0) return h("p", { class: "muted" }, "No resource changes.");
  return h(
    "div",
    { class: "changes" },
    changes.map((c) =>
      h(
        "section",
        { class: `change ${c.action}` },
        h("h3", {}, h("span", { class: "badge" }, c.action), " ", c.action === "deleted" ? `${c.kind} ${c.namespace}/${c.name}` : refLink(c)),
        c.diff.length === 0
          ? null
          : table(
              `${c.diff.length} field${c.diff.length === 1 ? "" : "s"}`,
              ["Field", "Before", "After"],
              c.diff.map((f) => [
                h("code", {}, f.path),
                f.redacted ? "(redacted)" : h("code", { class: "before" }, value(f.before)),
                f.redacted ? "(redacted)" : h("code", { class: "after" }, value(f.after)),
              ]),
            ),
      ),
    ),
  );
}

const KNOWN = new Set(["dryRun", "baseRevision", "revision", "items", "changes", "warnings", "proxies"]);

function fieldTable(diff: FieldChange[]): HTMLElement {
  return table(
    `${diff.length} field${diff.length === 1 ? "" : "s"}`,
    ["Field", "Before", "After"],
    diff.map((f) => [h("code", {}, f.path), h("code", { class: "before" }, value(f.before)), h("code", { class: "after" }, value(f.after))]),
  );
}

/**
 * Fold other members' previews into `into` (the proxies connected to
 * them); an answer at another base revision is not merged, and said so.
 */
export function mergeProxies(into: Preview, others: { from: string; answer?: Preview; error?: string }[]): string[] {
  const notes: string[] = [];
  const p = into.proxies;
  if (!p || p.hidden) return notes;
  for (const o of others) {
    const q = o.answer?.proxies;
    if (!o.answer || !q) notes.push(`${o.from}: proxies not previewed (${o.error ?? "no answer"})`);
    else if (o.answer.baseRevision !== into.baseRevision) notes.push(`${o.from}: previewed at revision ${o.answer.baseRevision}, not ${into.baseRevision}; preview again`);
    else {
      p.replicas.push(...q.replicas);
      p.unchanged += q.unchanged;
      p.changed.push(...q.changed);
      if (q.failed?.length) p.failed = [...(p.failed ?? []), ...q.failed];
    }
  }
  p.changed.sort((a, b) => Number(!a.lostClusters?.length) - Number(!b.lostClusters?.length) || a.proxy.localeCompare(b.proxy));
  return notes;
}

/** The proxies whose Envoy config a change would alter, each with its xDS resources. */
export function proxiesPreview(p: ProxiesPreview): HTMLElement {
  if (p.hidden) return h("p", { class: "muted" }, `Proxies not shown: ${p.hidden}.`);
  const n = p.changed.length;
  return h(
    "section",
    { class: "proxies" },
    h("h3", {}, `${n} connected ${n === 1 ? "proxy" : "proxies"} would change (${p.unchanged} unchanged; replicas ${p.replicas.join(", ")})`),
    (p.failed ?? []).map((f) => alert(`${f.proxy} (replica ${f.replica}) cannot be translated: ${f.error}`)),
    p.changed.map((c) =>
      h(
        "details",
        { class: "proxy" },
        h("summary", {}, h("code", {}, c.proxy), ` (replica ${c.replica}): ${c.changes.length} resource${c.changes.length === 1 ? "" : "s"}`),
        c.lostClusters?.length ? alert(`would lose cluster${c.lostClusters.length === 1 ? "" : "s"} its routes still use: ${c.lostClusters.join(", ")}`) : null,
        c.changes.map((r) => h("div", {}, h("p", {}, h("span", { class: "badge" }, r.action), ` ${r.type} `, h("code", {}, r.name)), r.diff?.length ? fieldTable(r.diff) : null)),
      ),
    ),
  );
}

/**
 * A dry-run's answer: what would change and, for any further field the
 * answer carries (the per-proxy effect, say), that field as it is.
 */
export function previewView(p: Preview): HTMLElement {
  const extra = Object.entries(p).filter(([k]) => !KNOWN.has(k));
  return h(
    "div",
    { class: "preview" },
    h(
      "p",
      {},
      p.changes.length === 0
        ? `Nothing would change (at revision ${p.baseRevision}).`
        : `Computed at revision ${p.baseRevision}: ${p.changes.length} resource${p.changes.length === 1 ? "" : "s"} would change, committing revision ${p.revision}.`,
    ),
    p.warnings?.length ? h("ul", { class: "warnings" }, p.warnings.map((w) => h("li", {}, w))) : null,
    changesView(p.changes),
    p.proxies ? proxiesPreview(p.proxies) : null,
    extra.map(([k, v]) => h("section", { class: "extra" }, h("h3", {}, k), proxiesView(v))),
  );
}

/** A list of affected proxies if it looks like one, else the JSON. */
function proxiesView(v: unknown): Child {
  if (Array.isArray(v) && v.every((x) => typeof x === "object" && x !== null)) {
    const rows = v as Record<string, unknown>[];
    const cols = [...new Set(rows.flatMap((r) => Object.keys(r)))];
    return table(`${rows.length} entries`, cols, rows.map((r) => cols.map((c) => (typeof r[c] === "string" ? (r[c] as string) : h("code", {}, JSON.stringify(r[c]))))));
  }
  return h("pre", {}, JSON.stringify(v, null, 2));
}

export function since(ms: number): string {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 90) return `${s} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  return `${Math.round(s / 3600)} h ago`;
}
