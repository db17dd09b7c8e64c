// A few lines of DOM building instead of a framework: text always goes in
// as text (never as HTML), so nothing the API returns can inject markup.

export type Child = Node | string | number | null | undefined | false | Child[];
type Attrs = Record<string, string | number | boolean | EventListener | undefined>;

export function h(tag: string, attrs: Attrs = {}, ...children: Child[]): HTMLElement {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "value" && "value" in el) (el as HTMLInputElement).value = String(v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

function append(el: HTMLElement, children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : String(c));
  }
}

/** A table: a caption, column heads, rows of cells. */
export function table(caption: string, heads: string[], rows: Child[][]): HTMLElement {
  const row = (r: Child[]) => h("tr", {}, r.map((c) => h("td", {}, c)));
  const body = h("tbody", {}, rows.slice(0, ROWS_SHOWN).map(row));
  const t = h("table", {}, h("caption", {}, caption), h("thead", {}, h("tr", {}, heads.map((t) => h("th", { scope: "col" }, t)))), body);
  if (rows.length <= ROWS_SHOWN) return t;
  // A long list draws its first rows now (a view stays quick with
  // thousands of objects), the rest on demand.
  const more = h("button", { type: "button" }, `Show all ${rows.length} rows (${rows.length - ROWS_SHOWN} more)`) as HTMLButtonElement;
  more.addEventListener("click", () => {
    body.append(...rows.slice(ROWS_SHOWN).map(row));
    more.remove();
  });
  return h("div", {}, t, more);
}

/** Rows drawn at first by [`table`]; a button draws the rest. */
export const ROWS_SHOWN = 500;

/** An error box that screen readers announce. */
export function alert(text: string): HTMLElement {
  return h("p", { class: "error", role: "alert" }, text);
}

export function link(href: string, text: Child, attrs: Attrs = {}): HTMLElement {
  return h("a", { href, ...attrs }, text);
}

/** A hash route with a query (`#/config?kind=...`). */
export function route(path: string, query: Record<string, string | number | undefined> = {}): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== "") q.set(k, String(v));
  const s = q.toString();
  return `#${path}${s ? `?${s}` : ""}`;
}

export function segment(s: string): string {
  return encodeURIComponent(s);
}

/** Replace `el`'s children (nulls skipped). */
export function fill(el: HTMLElement, ...children: Child[]): void {
  el.replaceChildren();
  append(el, children);
}
