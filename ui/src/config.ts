// Config: every kind listed and filtered (kind, namespace, labels, text),
// one object as YAML or JSON, and the editor: Preview runs the dry-run and
// shows what would change; Confirm applies exactly that, guarded by the
// revision the preview was computed at (409 if anything changed since).

import { api, apiEverywhere, ApiError, apiStream } from "./api";
import { alert, fill, h, link, route, segment, table } from "./dom";
import { Ctx, explain, mergeProxies, objectHref, previewView } from "./common";
import { toYaml } from "./yaml";
import { highlighted, yamlEditor } from "./highlight";
import { checkAsTyped } from "./check";
import type { Analysis, Preview, Resource, WaitReport, WriteResult } from "./types";

export const KINDS = [
  "VirtualService",
  "DestinationRule",
  "ServiceEntry",
  "Gateway",
  "Sidecar",
  "WorkloadEntry",
  "WorkloadGroup",
  "AuthorizationPolicy",
  "RequestAuthentication",
  "PeerAuthentication",
  "Service",
  "Instance",
  "Lease",
  "Secret",
  "Policy",
  "Role",
  "Token",
];

/** The fields the server sets: left out of what the editor sends back. */
const SERVER_OWNED = ["resourceVersion", "creationRevision", "modRevision", "generation"];

function labelsText(l?: Record<string, string>): string {
  return Object.entries(l ?? {})
    .map(([k, v]) => `${k}=${v}`)
    .join(", ");
}

function field(id: string, label: string, input: HTMLElement): HTMLElement {
  input.id = id;
  return h("div", { class: "field" }, h("label", { for: id }, label), input);
}

export async function configList(ctx: Ctx): Promise<Node> {
  const kind = ctx.params.get("kind") || "VirtualService";
  const ns = ctx.params.get("namespace") ?? "";
  const labels = ctx.params.get("labels") ?? "";
  const q = ctx.params.get("q") ?? "";
  const kindSelect = h("select", { name: "kind" }, KINDS.map((k) => h("option", { value: k, selected: k === kind }, k))) as HTMLSelectElement;
  const nsInput = h("input", { name: "namespace", value: ns, placeholder: "every namespace", autocomplete: "off" }) as HTMLInputElement;
  const labelInput = h("input", { name: "labels", value: labels, placeholder: "app=reviews,version!=v1", autocomplete: "off" }) as HTMLInputElement;
  const textInput = h("input", { name: "q", type: "search", value: q, placeholder: "name or label", autocomplete: "off" }) as HTMLInputElement;
  const results = h("div", { "aria-live": "polite" });
  const form = h(
    "form",
    {
      class: "filters",
      role: "search",
      onsubmit: (ev: Event) => {
        ev.preventDefault();
        location.hash = route("/config", { kind: kindSelect.value, namespace: nsInput.value.trim(), labels: labelInput.value.trim(), q: textInput.value.trim() });
      },
    },
    field("kind", "Kind", kindSelect),
    field("namespace", "Namespace", nsInput),
    field("labels", "Labels", labelInput),
    field("q", "Text", textInput),
    h("button", { type: "submit" }, "Filter"),
  );
  const page = h("div", {}, h("h1", {}, "Config"), form, h("p", {}, link(route("/config/new", { kind, namespace: ns }), `New ${kind}…`)), results);
  let items: Resource[];
  let revision: number;
  try {
    const query = new URLSearchParams();
    if (ns) query.set("namespace", ns);
    if (labels) query.set("labelSelector", labels);
    ({ items, revision } = await api<{ items: Resource[]; revision: number }>(`/v1/resources/${segment(kind)}?${query}`));
  } catch (e) {
    results.append(alert(explain(e)));
    return page;
  }
  const show = () => {
    const needle = textInput.value.trim().toLowerCase();
    const shown = items.filter((o) => !needle || `${o.metadata.namespace}/${o.metadata.name} ${labelsText(o.metadata.labels)}`.toLowerCase().includes(needle));
    results.replaceChildren(
      shown.length === 0
        ? h("p", { class: "muted" }, `No ${kind} ${ns ? `in namespace ${ns} ` : ""}matches (revision ${revision}).`)
        : table(
            `${shown.length} of ${items.length} ${kind} at revision ${revision}`,
            ["Name", "Namespace", "Labels", "Modified at"],
            shown.map((o) => {
              const r = { kind, namespace: o.metadata.namespace ?? "", name: o.metadata.name };
              return [link(objectHref(r), o.metadata.name), r.namespace, labelsText(o.metadata.labels), o.metadata.modRevision ?? "—"];
            }),
          ),
    );
  };
  textInput.addEventListener("input", show);
  show();
  return page;
}

export async function configObject(ctx: Ctx): Promise<Node> {
  const [kind, ns, name] = ctx.parts.slice(1, 4).map(decodeURIComponent);
  const format = ctx.params.get("format") === "json" ? "json" : "yaml";
  const path = `/v1/resources/${segment(kind)}/${segment(ns)}/${segment(name)}`;
  const [obj, analysis] = await Promise.all([api<Resource>(path), api<Analysis>(`/v1/analyze?namespace=${segment(ns)}`).catch(() => null)]);
  const self = objectHref({ kind, namespace: ns, name });
  const findings = (analysis?.messages ?? []).filter((m) => m.resource?.kind === kind && m.resource.name === name && m.resource.namespace === ns);
  const m = obj.metadata;
  return h(
    "div",
    {},
    h("h1", {}, `${kind} ${ns}/${name}`),
    h("p", { class: "muted" }, `Created at revision ${m.creationRevision ?? "—"}, modified at revision ${m.modRevision ?? "—"} (generation ${m.generation ?? "—"}).`),
    h(
      "p",
      { class: "actions" },
      link(`${self}/edit`, "Edit", { class: "button" }),
      link(route("/history", { kind, namespace: ns, name }), "History", { class: "button" }),
      " Format: ",
      link(`${self}?format=yaml`, "YAML", { "aria-current": format === "yaml" ? "true" : undefined }),
      " ",
      link(`${self}?format=json`, "JSON", { "aria-current": format === "json" ? "true" : undefined }),
    ),
    findings.length
      ? h("ul", { class: "findings" }, findings.map((f) => h("li", { class: `level ${f.level}` }, `${f.level} ${f.code}: ${f.message}${f.field ? ` (${f.field})` : ""}`)))
      : null,
    h("pre", { class: "doc", tabindex: "0", "aria-label": `${kind} ${ns}/${name} as ${format.toUpperCase()}` }, format === "json" ? JSON.stringify(obj, null, 2) : highlighted(toYaml(obj))),
  );
}

/** An object as the editor shows it: without the fields the server sets. */
async function fetchEditable(path: string): Promise<Resource> {
  const doc = await api<Resource>(path);
  for (const k of SERVER_OWNED) delete doc.metadata[k];
  return doc;
}

function template(kind: string, ns: string): Resource {
  return { apiVersion: "networking.istio.io/v1", kind, metadata: { name: "", namespace: ns || "default" }, spec: {} };
}

/** `#/config/KIND/NS/NAME/edit`, or `#/config/new?kind=&namespace=`. */
export async function configEdit(ctx: Ctx): Promise<Node> {
  let title: string;
  let doc: Resource;
  let source: string | null = null;
  if (ctx.parts[1] === "new") {
    const kind = ctx.params.get("kind") || "VirtualService";
    doc = template(kind, ctx.params.get("namespace") ?? "");
    title = `New ${kind}`;
  } else {
    const [kind, ns, name] = ctx.parts.slice(1, 4).map(decodeURIComponent);
    source = `/v1/resources/${segment(kind)}/${segment(ns)}/${segment(name)}`;
    doc = await fetchEditable(source);
    title = `Edit ${kind} ${ns}/${name}`;
  }
  const yaml = toYaml(doc);
  const text = h("textarea", { id: "doc", rows: Math.min(30, Math.max(14, yaml.split("\n").length + 2)), spellcheck: "false", autocomplete: "off", "aria-describedby": "doc-help" }, yaml) as HTMLTextAreaElement;
  const out = h("div", { class: "outcome", "aria-live": "polite" });
  // The change message History shows (sent as X-Lodestar-Message, which
  // takes printable ASCII).
  const message = h("input", { id: "change-message", maxlength: 500, pattern: "[ -~]*", autocomplete: "off", placeholder: "why (optional)", title: "printable ASCII" }) as HTMLInputElement;
  // What was previewed: Confirm applies exactly this text.
  let previewed: { body: string; base: number } | null = null;
  text.addEventListener("input", () => {
    if (previewed) {
      previewed = null;
      out.replaceChildren(h("p", { class: "muted" }, "Edited since the preview: preview again."));
    }
  });
  const confirm = async (btn: HTMLButtonElement) => {
    if (!previewed) return;
    // (a header value: a browser refuses to send anything else)
    if (!/^[ -~]*$/.test(message.value)) {
      out.append(alert("The change message takes printable ASCII only (no accents, no line breaks)."));
      message.focus();
      return;
    }
    btn.disabled = true;
    try {
      const r = await api<WriteResult>(`/v1/apply?expectedRevision=${previewed.base}`, { body: previewed.body, yaml: true, message: message.value.trim() || undefined });
      previewed = null;
      fill(
        out,
        h("p", { class: "ok", role: "status" }, `Applied: revision ${r.revision}.`),
        h("ul", {}, r.items.map((i) => h("li", {}, `${i.action} `, link(objectHref(i), `${i.kind} ${i.namespace}/${i.name}`)))),
        r.warnings?.length ? h("ul", { class: "warnings" }, r.warnings.map((w) => h("li", {}, w))) : null,
        h("p", {}, link(route("/history"), "See it in History")),
      );
      if (ctx.who.clusterRead) await waitForProxies(r.revision, out);
    } catch (e) {
      btn.disabled = false;
      out.append(alert(explain(e)));
      const again = reloadButton();
      if (e instanceof ApiError && e.status === 409 && again) out.append(h("p", {}, "It changed since the preview: reload it, redo the edit, and preview again. ", again));
    }
  };
  // Start over from the object as stored now (after a conflict, say).
  const reloadButton = (): HTMLElement | null => {
    if (!source) return null;
    const from = source;
    const b = h("button", { type: "button" }, "Reload from the server");
    b.addEventListener("click", async () => {
      try {
        text.value = toYaml(await fetchEditable(from));
        text.dispatchEvent(new Event("input"));
        previewed = null;
        fill(out, h("p", { class: "muted", role: "status" }, "Reloaded."));
        text.focus();
      } catch (e) {
        fill(out, alert(explain(e)));
      }
    });
    return b;
  };
  const preview = async (ev: Event) => {
    ev.preventDefault();
    const body = text.value;
    out.replaceChildren(h("p", { class: "muted" }, "Previewing…"));
    try {
      const p = await api<Preview>("/v1/apply?dryRun=true", { body, yaml: true, readOnly: true });
      // Every replica previews the proxies connected to it.
      if (p.proxies && !p.proxies.hidden) {
        const notes = mergeProxies(p, await apiEverywhere<Preview>("/v1/apply?dryRun=true", { body, yaml: true }));
        if (notes.length) p.warnings = [...(p.warnings ?? []), ...notes];
      }
      previewed = p.changes.length ? { body, base: p.baseRevision } : null;
      const btn = h("button", { type: "button", class: "primary" }, `Confirm: apply at revision ${p.baseRevision}`) as HTMLButtonElement;
      btn.addEventListener("click", () => void confirm(btn));
      fill(out, h("h2", {}, "Dry run"), previewView(p), previewed ? btn : null);
      if (previewed) btn.focus();
    } catch (e) {
      out.replaceChildren(alert(explain(e)));
    }
  };
  // Checked as typed: errors by line, before any preview.
  const editor = yamlEditor(text);
  const problems = checkAsTyped(text, editor);
  return h(
    "div",
    {},
    h("h1", {}, title),
    h(
      "form",
      { class: "editor", onsubmit: preview },
      h("label", { for: "doc" }, "Resource (YAML or JSON)"),
      h("p", { id: "doc-help", class: "muted" }, "Checked as you type (errors are listed under the editor, by line). Save previews the change with a dry run; nothing is written until you confirm it."),
      editor.element,
      problems,
      h("div", { class: "field" }, h("label", { for: "change-message" }, "Change message"), message),
      h("p", { class: "actions" }, h("button", { type: "submit" }, "Save (preview changes)"), reloadButton()),
    ),
    out,
  );
}


/**
 * After a write: the proxies' ACKs of `revision` as they come, across
 * every replica (`/v1/wait?progress=true`, the data `lodestar wait`
 * uses), until every connected proxy has ACKed it, or one rejected it,
 * or 30 s passed.
 */
async function waitForProxies(revision: number, out: HTMLElement): Promise<void> {
  const bar = h("progress", { max: 1, value: 0, "aria-labelledby": "ack-progress" }) as HTMLProgressElement;
  const status = h("p", { id: "ack-progress", class: "muted", role: "status" }, `Waiting for the proxies to ACK revision ${revision}…`);
  const details = h("div");
  const box = h("div", { class: "wait" }, status, bar, details);
  out.append(box);
  let last: WaitReport | null = null;
  try {
    await apiStream<WaitReport>(`/v1/wait?revision=${revision}&timeout=30s&progress=true`, (w) => {
      last = w;
      bar.max = Math.max(1, w.proxies);
      bar.value = w.proxies ? w.synced : 1;
      const pct = w.proxies ? Math.round((100 * w.synced) / w.proxies) : 100;
      status.textContent = `${w.synced} of ${w.proxies} proxies ACKed revision ${w.revision} (${pct}%)${w.converged ? "." : "…"}`;
      status.className = w.converged ? "ok" : w.nacked.length ? "bad" : "muted";
      const lists: [string, string[]][] = [
        ["Rejected (NACK)", w.nacked],
        ["Not yet", w.pending],
        ["Replicas that did not answer", w.unreachable],
      ];
      fill(details, lists.filter(([, l]) => l.length).map(([what, l]) => h("div", {}, h("h3", {}, what), h("ul", {}, l.map((p) => h("li", {}, p))))));
    });
    const w = last as WaitReport | null;
    if (w && !w.converged && !w.nacked.length) status.textContent += " Not every proxy ACKed it within 30 s.";
  } catch (e) {
    box.append(alert(explain(e)));
  }
}
