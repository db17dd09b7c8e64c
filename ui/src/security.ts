// Security: tokens (accessor, description, policies, expiry; the API never
// returns a secret or its hash), policies, and an authorization check
// against a connected proxy's config (`/debug/authz`).

import { api } from "./api";
import { alert, h, table } from "./dom";
import { Ctx, explain } from "./common";
import type { Resource, Syncz } from "./types";

interface Explanation {
  allowed: boolean;
  summary: string;
  decided_by: string | null;
  filters: { action: string; policies: { name: string; matched: boolean; why: string }[] }[];
}

const list = (kind: string) => api<{ items: Resource[] }>(`/v1/resources/${kind}`).then((r) => r.items);
const strings = (v: unknown) => (Array.isArray(v) ? v.join(", ") : "—");

export async function security(_ctx: Ctx): Promise<Node> {
  const [tokens, policies, sync] = await Promise.allSettled([list("Token"), list("Policy"), api<Syncz>("/debug/syncz")]);
  const tokenView =
    tokens.status === "rejected"
      ? alert(explain(tokens.reason))
      : table(
          `${tokens.value.length} tokens`,
          ["Accessor", "Description", "Type", "Policies", "Roles", "Created", "Expires"],
          tokens.value.map((t) => {
            const s = t.spec ?? {};
            return [h("code", {}, t.metadata.name), String(s.description ?? ""), String(s.type ?? "client"), strings(s.policies), strings(s.roles), String(s.createdAt ?? "—"), String(s.expiresAt ?? "never")];
          }),
        );
  const policyView =
    policies.status === "rejected"
      ? alert(explain(policies.reason))
      : table(
          `${policies.value.length} policies`,
          ["Policy", "Rules"],
          policies.value.map((p) => [p.metadata.name, h("code", {}, JSON.stringify((p.spec ?? {}).rules ?? []))]),
        );
  return h("div", {}, h("h1", {}, "Security"), h("h2", {}, "Tokens"), tokenView, h("h2", {}, "Policies"), policyView, h("h2", {}, "Authorization check"), authzForm(sync));
}

function authzForm(sync: PromiseSettledResult<Syncz>): HTMLElement {
  if (sync.status === "rejected") return alert(explain(sync.reason));
  if (sync.value.proxies.length === 0) return h("p", { class: "muted" }, "No proxy is connected to this replica: the check replays a connected proxy's config.");
  const input = (id: string, label: string, attrs: Record<string, string> = {}) => {
    const el = h("input", { id, autocomplete: "off", ...attrs }) as HTMLInputElement;
    return { el, field: h("div", { class: "field" }, h("label", { for: id }, label), el) };
  };
  const proxy = h("select", { id: "authz-proxy" }, sync.value.proxies.map((p) => h("option", { value: p.id }, `${p.namespace}/${p.name}`))) as HTMLSelectElement;
  const principal = input("authz-principal", "Caller (SPIFFE id)", { placeholder: "spiffe://cluster.local/ns/shop/sa/web" });
  const port = input("authz-port", "Port", { type: "number", min: "1", max: "65535", placeholder: "the only one with policies" });
  const method = input("authz-method", "Method", { value: "GET" });
  const path = input("authz-path", "Path", { value: "/" });
  const out = h("div", { id: "authz-result", "aria-live": "polite" });
  const check = async (ev: Event) => {
    ev.preventDefault();
    const body = JSON.stringify({
      port: port.el.value ? Number(port.el.value) : undefined,
      principal: principal.el.value.trim() || undefined,
      method: method.el.value.trim(),
      path: path.el.value.trim(),
    });
    try {
      const e = await api<Explanation>(`/debug/authz?proxyID=${encodeURIComponent(proxy.value)}`, { body });
      out.replaceChildren(
        h("p", { class: e.allowed ? "ok" : "bad", role: "status" }, `${e.allowed ? "Allowed" : "Denied"}: ${e.summary}`),
        ...e.filters.map((f) => table(`${f.action} policies`, ["Policy", "Matched", "Why not"], f.policies.map((p) => [p.name, p.matched ? "yes" : "no", p.why]))),
      );
    } catch (err) {
      out.replaceChildren(alert(explain(err)));
    }
  };
  return h(
    "div",
    {},
    h(
      "form",
      { class: "filters", onsubmit: check },
      h("div", { class: "field" }, h("label", { for: "authz-proxy" }, "At proxy"), proxy),
      port.field,
      principal.field,
      method.field,
      path.field,
      h("button", { type: "submit" }, "Check"),
    ),
    out,
  );
}
