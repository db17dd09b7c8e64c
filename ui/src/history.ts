// History: the revision timeline (of the mesh or one object), the diff
// between two revisions, and rollback: an entry's change is undone by
// restoring what it touched to the revision before it, previewed with a
// dry run first and applied on confirmation.

import { api } from "./api";
import { alert, h, link, route } from "./dom";
import { changesView, Ctx, explain, previewView, refLink } from "./common";
import type { HistoryAnswer, Preview, Ref, WriteResult } from "./types";

export async function history(ctx: Ctx): Promise<Node> {
  const kind = ctx.params.get("kind") ?? "";
  const ns = ctx.params.get("namespace") ?? "";
  const name = ctx.params.get("name") ?? "";
  const q = new URLSearchParams({ limit: "50" });
  if (kind) q.set("kind", kind);
  if (ns) q.set("namespace", ns);
  if (name) q.set("name", name);
  const hist = await api<HistoryAnswer>(`/v1/history?${q}`);
  const newest = hist.revisions[0]?.revision ?? hist.revision;
  const from = h("input", { type: "number", min: hist.oldest, max: hist.revision, value: Math.max(hist.oldest, newest - 1), required: true }) as HTMLInputElement;
  const to = h("input", { type: "number", min: hist.oldest, max: hist.revision, value: hist.revision, required: true }) as HTMLInputElement;
  from.id = "diff-from";
  to.id = "diff-to";
  const scope = kind ? `${kind}${ns ? ` ${ns}` : ""}${name ? `/${name}` : ""}` : "the mesh";
  return h(
    "div",
    {},
    h("h1", {}, `History of ${scope}`),
    kind ? h("p", {}, link(route("/history"), "Show every resource")) : null,
    h("p", { class: "muted" }, `At revision ${hist.revision}; the history goes back to revision ${hist.oldest}.`),
    h(
      "form",
      {
        class: "filters",
        onsubmit: (ev: Event) => {
          ev.preventDefault();
          location.hash = route("/history/diff", { from: from.value, to: to.value });
        },
      },
      h("div", { class: "field" }, h("label", { for: "diff-from" }, "From revision"), from),
      h("div", { class: "field" }, h("label", { for: "diff-to" }, "To revision"), to),
      h("button", { type: "submit" }, "Diff"),
    ),
    hist.revisions.length === 0
      ? h("p", { class: "muted" }, "No revision touched it.")
      : h(
          "ol",
          { class: "timeline", reversed: true },
          hist.revisions.map((r) => {
            const out = h("div", { class: "outcome", "aria-live": "polite" });
            const targets: Ref[] = r.changes.map((c) => ({ kind: c.kind, namespace: c.namespace, name: c.name }));
            const undo = h("button", { type: "button" }, `Roll back revision ${r.revision}…`) as HTMLButtonElement;
            undo.addEventListener("click", () => void rollback(r.revision - 1, targets, out));
            return h(
              "li",
              { class: "revision" },
              h("h2", {}, `Revision ${r.revision}`),
              h(
                "p",
                { class: "author" },
                r.author ? ["By ", h("strong", {}, r.author)] : h("span", { class: "muted" }, "Author not recorded"),
                r.message ? [": ", h("q", { class: "message" }, r.message)] : null,
              ),
              h("ul", {}, r.changes.map((c) => h("li", {}, h("span", { class: "badge" }, c.action), " ", c.action === "DELETE" ? `${c.kind} ${c.namespace}/${c.name}` : refLink(c), ` (version ${c.version})`))),
              h("p", { class: "actions" }, link(route("/history/diff", { from: r.revision - 1, to: r.revision }), "Diff with the revision before", { class: "button" }), " ", r.revision > hist.oldest ? undo : null),
              out,
            );
          }),
        ),
  );
}

/** Preview restoring `targets` to `revision`; a Confirm button applies it. */
async function rollback(revision: number, targets: Ref[], out: HTMLElement): Promise<void> {
  const body = JSON.stringify({ revision, resources: targets });
  out.replaceChildren(h("p", { class: "muted" }, "Previewing the rollback…"));
  try {
    const p = await api<Preview>("/v1/rollback?dryRun=true", { body, readOnly: true });
    if (p.changes.length === 0) {
      out.replaceChildren(previewView(p));
      return;
    }
    const btn = h("button", { type: "button", class: "primary" }, `Confirm rollback to revision ${revision}`) as HTMLButtonElement;
    btn.addEventListener("click", async () => {
      btn.disabled = true;
      try {
        // History then says what this revision was.
        const r = await api<WriteResult>("/v1/rollback", { body, message: `rollback to revision ${revision} (console)` });
        out.replaceChildren(h("p", { class: "ok", role: "status" }, `Rolled back: revision ${r.revision} restores revision ${revision}.`));
      } catch (e) {
        btn.disabled = false;
        out.append(alert(explain(e)));
      }
    });
    out.replaceChildren(h("h3", {}, `Rollback preview: restore revision ${revision}`), previewView(p), btn);
    btn.focus();
  } catch (e) {
    out.replaceChildren(alert(explain(e)));
  }
}

export async function diff(ctx: Ctx): Promise<Node> {
  const from = ctx.params.get("from") ?? "";
  const to = ctx.params.get("to") ?? "";
  const d = await api<{ from: number; to: number; changes: Preview["changes"] }>(`/v1/diff?${new URLSearchParams(to ? { from, to } : { from })}`);
  return h("div", {}, h("h1", {}, `Diff: revision ${d.from} → ${d.to}`), h("p", {}, link(route("/history"), "Back to History")), changesView(d.changes));
}
