// Where a field the server names (`resources[0].spec.http[0].route[0].weight`)
// is in the YAML the user typed: a walk over the text's block structure
// (documents, keys by indentation, list items by their dashes), with no
// YAML parser. Pure: unit-tested by ui/test/yamlpath.test.ts.
//
// What it does not follow (flow collections `{a: 1}`, a key the text
// lacks, JSON): the deepest enclosing field it found, so a message still
// points into the right object.

/** A place in the text: 1-based line and column. */
export interface Place {
  line: number;
  column: number;
}

/** A node of the text: it starts at `line`, `col` (0-based; a list item's
 * content starts after its dash) and runs to the line before `end`. */
interface Node {
  line: number;
  col: number;
  end: number;
}

/** A path's steps: keys and list indexes. `a.b[2]` is ["a", "b", 2]. */
export function steps(path: string): (string | number)[] {
  const out: (string | number)[] = [];
  for (const m of path.matchAll(/\[(\d+)\]|([^.[\]]+)/g)) out.push(m[1] !== undefined ? Number(m[1]) : m[2]);
  return out;
}

function blank(line: string): boolean {
  return /^\s*(#.*)?$/.test(line);
}

function indent(line: string): number {
  return /^ */.exec(line)![0].length;
}

const MARKER = /^(---|\.\.\.)(\s|$)/;
const DASH = /^-(\s|$)/;

/**
 * The documents of a YAML stream, as the server numbers them (`resources[i]`):
 * those with content, split at `---` lines; each as the lines it spans.
 */
export function documents(lines: string[]): Node[] {
  const docs: Node[] = [];
  // `onMarker`: the column of content on the `---` line itself, else -1.
  let start = 0;
  let onMarker = -1;
  const close = (end: number) => {
    if (onMarker >= 0) return void docs.push({ line: start, col: onMarker, end });
    let first = start;
    while (first < end && (blank(lines[first]) || lines[first].startsWith("%"))) first++;
    if (first < end) docs.push({ line: first, col: indent(lines[first]), end });
  };
  lines.forEach((l, i) => {
    if (!MARKER.test(l)) return;
    close(i);
    const rest = l.slice(3);
    [start, onMarker] = l.startsWith("---") && !blank(rest) ? [i, 3 + indent(rest)] : [i + 1, -1];
  });
  close(lines.length);
  return docs;
}

/** The lines of `n` that start an entry or item at its column. */
function* entries(lines: string[], n: Node): Generator<[number, string]> {
  for (let l = n.line; l < n.end; l++) {
    if (l === n.line || (!blank(lines[l]) && indent(lines[l]) === n.col)) yield [l, lines[l].slice(n.col)];
  }
}

/** The next line after `l` that starts an entry of `n` (`dash`: an item). */
function next(lines: string[], n: Node, l: number, dash: boolean): number {
  for (const [m, text] of entries(lines, n)) if (m > l && DASH.test(text) === dash) return m;
  return n.end;
}

/**
 * The value of an entry at `line` (a key, or a dash when `dash`, at
 * `col`) that has nothing after it on its line: the lines below, up to
 * `end`; a mapping's value may be a list at the key's own column.
 */
function below(lines: string[], line: number, col: number, end: number, dash: boolean): Node | null {
  let first = line + 1;
  while (first < end && blank(lines[first])) first++;
  if (first >= end) return null;
  const c = indent(lines[first]);
  if (c < col || (c === col && (dash || !DASH.test(lines[first].slice(c))))) return null;
  return { line: first, col: c, end };
}

function keyPattern(key: string): RegExp {
  const esc = key.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  return new RegExp(`^(?:${esc}|"${esc}"|'${esc}')\\s*:(?=\\s|$)`);
}

type Found = { at: Place; value: Node | null } | null;

/** The entry `key` of mapping `n`: where its key is, and its value. */
function entry(lines: string[], n: Node, key: string): Found {
  const re = keyPattern(key);
  for (const [l, text] of entries(lines, n)) {
    const m = re.exec(text);
    if (!m) continue;
    const at = { line: l + 1, column: n.col + 1 };
    const after = text.slice(m[0].length);
    const inline = after.replace(/\s+#.*$/, "").trim();
    const end = next(lines, n, l, false);
    // (`key: |` is a block scalar: nothing to walk into)
    if (inline) return { at, value: /^[|>]/.test(inline) ? null : { line: l, col: n.col + m[0].length + indent(after), end: l + 1 } };
    return { at, value: below(lines, l, n.col, end, false) };
  }
  return null;
}

/** The item `index` of list `n`: where its dash is, and its value. */
function item(lines: string[], n: Node, index: number): Found {
  let i = 0;
  for (const [l, text] of entries(lines, n)) {
    if (!DASH.test(text) || i++ < index) continue;
    const at = { line: l + 1, column: n.col + 1 };
    const after = text.slice(1);
    const end = next(lines, n, l, true);
    if (blank(after)) return { at, value: below(lines, l, n.col, end, true) };
    return { at, value: { line: l, col: n.col + 1 + indent(after), end } };
  }
  return null;
}

/** How far `path` goes in `lines`: its place, and the value's node if
 * every step was found. */
function walk(lines: string[], path: string): { at: Place; value: Node | null; whole: boolean } | null {
  const docs = documents(lines);
  const s = steps(path);
  let doc = 0;
  if (s[0] === "resources" || s[0] === "body") {
    if (typeof s[1] === "number") doc = s.splice(0, 2)[1] as number;
    else s.splice(0, 1);
  }
  if (doc >= docs.length) return null;
  let node: Node | null = docs[doc];
  let at: Place = { line: node.line + 1, column: node.col + 1 };
  for (const step of s) {
    const found: Found = node && (typeof step === "number" ? item(lines, node, step) : entry(lines, node, step));
    if (!found) return { at, value: null, whole: false };
    at = found.at;
    node = found.value;
  }
  return { at, value: node, whole: true };
}

/**
 * Where `path` (as the server names fields: `resources[i].` then the
 * field) is in `text`: the line and column of its key or list dash, or of
 * the deepest part of the path found; null when not even its document is.
 * A path without `resources[i]` (`body`, `metadata.name`) is looked up in
 * the first document.
 */
export function locate(text: string, path: string): Place | null {
  return walk(text.split("\n"), path)?.at ?? null;
}

/** The scalar written on the line of `path` (`resources[0].kind`), unquoted. */
export function scalarAt(text: string, path: string): string | null {
  const lines = text.split("\n");
  const w = walk(lines, path);
  if (!w?.whole || !w.value || w.value.end !== w.value.line + 1) return null;
  const v = lines[w.value.line].slice(w.value.col).replace(/\s+#.*$/, "").trim();
  return /^(["']).*\1$/.test(v) ? v.slice(1, -1) : v;
}

/** Which document of `text` (as `resources[i]` counts them) is `kind` `name`. */
export function documentOf(text: string, kind: string, name: string): number | null {
  const count = documents(text.split("\n")).length;
  for (let i = 0; i < count; i++) {
    if (scalarAt(text, `resources[${i}].kind`) === kind && scalarAt(text, `resources[${i}].metadata.name`) === name) return i;
  }
  return count === 1 ? 0 : null;
}

/** `at line L column C` in a parser's message (YAML's and JSON's). */
export function messagePlace(message: string): Place | null {
  const m = /\bline (\d+),? column (\d+)/.exec(message);
  return m ? { line: Number(m[1]), column: Number(m[2]) } : null;
}

/** The offset in `text` of a place (for the caret). */
export function offsetOf(text: string, p: Place): number {
  const lines = text.split("\n");
  let off = 0;
  for (let i = 0; i < Math.min(p.line - 1, lines.length); i++) off += lines[i].length + 1;
  const line = lines[p.line - 1] ?? "";
  return Math.min(text.length, off + Math.min(Math.max(p.column - 1, 0), line.length));
}
