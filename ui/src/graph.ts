// The topology drawn: services on a circle, grouped by namespace, an
// arrow per caller → callee edge coloured by its verdict. A picture of the
// table below it (which screen readers use: the drawing is one labelled
// image); a mesh too large to read as a picture is not drawn.

import { h } from "./dom";
import type { Topology } from "./types";

const NS = "http://www.w3.org/2000/svg";
const MAX_NODES = 60;
const MAX_EDGES = 600;

function svg(tag: string, attrs: Record<string, string | number>, ...children: (Node | string)[]): SVGElement {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  el.append(...children);
  return el;
}

/** `reviews.shop` for `reviews.shop.svc.cluster.local`. */
function short(host: string): string {
  const parts = host.split(".");
  return parts.length > 2 && parts[2] === "svc" ? `${parts[0]}.${parts[1]}` : host;
}

export function topologyGraph(t: Topology): HTMLElement | null {
  if (t.edges.length === 0) return null;
  if (t.services.length > MAX_NODES || t.edges.length > MAX_EDGES) {
    return h("p", { class: "muted" }, `${t.services.length} services and ${t.edges.length} edges are too many to draw: the table lists them (filter by namespace to draw one).`);
  }
  const nodes = [...t.services].sort((a, b) => a.namespace.localeCompare(b.namespace) || a.hostname.localeCompare(b.hostname));
  const size = 560;
  const c = size / 2;
  const r = c - 110;
  const at = new Map<string, [number, number]>();
  nodes.forEach((n, i) => {
    const a = (2 * Math.PI * i) / nodes.length - Math.PI / 2;
    at.set(n.hostname, [c + r * Math.cos(a), c + r * Math.sin(a)]);
  });
  const marker = (v: string) =>
    svg("marker", { id: `arrow-${v}`, viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" }, svg("path", { d: "M0,0 L10,5 L0,10 z", class: `edge-${v}` }));
  const edges = t.edges.flatMap((e) => {
    const [a, b] = [at.get(e.from), at.get(e.to)];
    if (!a || !b) return [];
    // A slight curve to the right of its direction (so that A → B and
    // B → A do not overlap), stopping short of the node for the arrow.
    const [dx, dy] = [b[0] - a[0], b[1] - a[1]];
    const len = Math.hypot(dx, dy) || 1;
    const ctrl = [(a[0] + b[0]) / 2 - (dy / len) * 22, (a[1] + b[1]) / 2 + (dx / len) * 22];
    const [ex, ey] = [b[0] - ctrl[0], b[1] - ctrl[1]];
    const elen = Math.hypot(ex, ey) || 1;
    const end = [b[0] - (ex / elen) * 9, b[1] - (ey / elen) * 9];
    return [
      svg(
        "path",
        { d: `M${a[0]},${a[1]} Q${ctrl[0]},${ctrl[1]} ${end[0]},${end[1]}`, class: `edge edge-${e.verdict}`, "marker-end": `url(#arrow-${e.verdict})` },
        svg("title", {}, `${short(e.from)} → ${short(e.to)}: ${e.verdict}`),
      ),
    ];
  });
  const labels = nodes.map((n) => {
    const [x, y] = at.get(n.hostname) as [number, number];
    const right = x >= c;
    return svg(
      "g",
      { class: "node" },
      svg("circle", { cx: x, cy: y, r: 6 }),
      svg("text", { x: x + (right ? 10 : -10), y: y + 4, "text-anchor": right ? "start" : "end" }, short(n.hostname)),
      svg("title", {}, n.hostname),
    );
  });
  const picture = svg(
    "svg",
    { viewBox: `0 0 ${size} ${size}`, width: size, height: size, role: "img", "aria-label": `Topology: ${nodes.length} services, ${t.edges.length} edges (listed in the table below)` },
    svg("defs", {}, marker("allowed"), marker("denied"), marker("conditional")),
    ...edges,
    ...labels,
  );
  const key = h("p", { class: "legend" }, h("span", { class: "ok" }, "— allowed"), " ", h("span", { class: "warn" }, "— some requests"), " ", h("span", { class: "bad" }, "— denied"));
  return h("figure", { class: "graph" }, picture, h("figcaption", {}, key));
}
