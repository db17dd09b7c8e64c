// YAML syntax highlighting without a dependency: a line tokenizer (keys,
// strings, numbers, booleans and null, comments, list dashes, document
// markers) into spans of text (never HTML), and the editor: a textarea
// over a highlighted copy of its text, kept in step as the user types.

import { h } from "./dom";

const SCALAR = /^(?:true|false|null|~|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)$/;

/** One line's tokens: [class, text] ("" is plain). */
export function tokens(line: string): [string, string][] {
  const out: [string, string][] = [];
  if (/^(---|\.\.\.)\s*$/.test(line)) return [["doc", line]];
  let rest = line;
  const take = (cls: string, n: number) => {
    out.push([cls, rest.slice(0, n)]);
    rest = rest.slice(n);
  };
  const lead = /^\s*(?:-\s+)*/.exec(rest)?.[0] ?? "";
  if (lead) take(lead.includes("-") ? "dash" : "", lead.length);
  const key = /^(?:"(?:[^"\\]|\\.)*"|'[^']*'|[^\s#'"{[][^:#]*?)\s*:(?=\s|$)/.exec(rest);
  if (key) take("key", key[0].length);
  while (rest) {
    const space = /^\s+/.exec(rest);
    if (space) {
      take("", space[0].length);
      continue;
    }
    if (rest.startsWith("#")) {
      take("comment", rest.length);
      break;
    }
    const str = /^(?:"(?:[^"\\]|\\.)*"?|'(?:[^']|'')*'?)/.exec(rest);
    if (str) {
      take("string", str[0].length);
      continue;
    }
    const punct = /^[[\]{},]/.exec(rest);
    if (punct) {
      take("punct", 1);
      continue;
    }
    // A plain scalar runs to a flow character, or a comment after a space.
    const end = rest.search(/\s+#|[[\]{},]/);
    const word = rest.slice(0, end < 0 ? rest.length : Math.max(end, 1));
    take(SCALAR.test(word.trim()) ? "scalar" : "text", word.length);
  }
  return out;
}

/** A line's mark: an error or a warning there. */
export type Mark = "error" | "warning";

/**
 * YAML text as highlighted nodes (one span per token, newlines kept);
 * the tokens of each line in `marks` (1-based) inside a span that marks
 * it. The text is the same either way.
 */
export function highlighted(text: string, marks: Map<number, Mark> = new Map()): Node[] {
  const nodes: Node[] = [];
  text.split("\n").forEach((line, i) => {
    if (i) nodes.push(document.createTextNode("\n"));
    const spans = tokens(line).map(([cls, t]) => (cls ? h("span", { class: `y-${cls}` }, t) : document.createTextNode(t)));
    const mark = marks.get(i + 1);
    if (mark) nodes.push(h("span", { class: `y-mark y-mark-${mark}` }, spans));
    else nodes.push(...spans);
  });
  return nodes;
}

/** The editor: its element, and how to mark lines in it. */
export interface Editor {
  element: HTMLElement;
  /** Mark these lines (1-based), in the gutter and under the text. */
  mark(marks: Map<number, Mark>): void;
}

/**
 * A textarea (kept as it is: its value, label and events) shown over a
 * highlighted copy of its text, with a gutter of line numbers beside it:
 * both are redrawn on each input and scrolled with it. Marked lines
 * (errors, warnings) show in both.
 */
export function yamlEditor(text: HTMLTextAreaElement): Editor {
  const copy = h("pre", { class: "highlight", "aria-hidden": "true" });
  const gutter = h("pre", { class: "gutter", "aria-hidden": "true" });
  let marks = new Map<number, Mark>();
  const scroll = () => {
    copy.scrollTop = text.scrollTop;
    copy.scrollLeft = text.scrollLeft;
    gutter.scrollTop = text.scrollTop;
  };
  const draw = () => {
    // A trailing newline needs a line under it to keep the heights equal.
    copy.replaceChildren(...highlighted(text.value + (text.value.endsWith("\n") ? " " : ""), marks));
    const count = text.value.split("\n").length;
    const numbers: Node[] = [];
    for (let n = 1; n <= count; n++) {
      const mark = marks.get(n);
      numbers.push(mark ? h("span", { class: `g-mark g-${mark}` }, String(n)) : document.createTextNode(String(n)), document.createTextNode("\n"));
    }
    gutter.replaceChildren(...numbers);
    scroll();
  };
  text.classList.add("highlighted");
  // Lines do not wrap, in either, so that they stay one over the other.
  text.setAttribute("wrap", "off");
  text.addEventListener("input", draw);
  text.addEventListener("scroll", scroll);
  draw();
  return {
    element: h("div", { class: "code-editor" }, gutter, h("div", { class: "code-area" }, copy, text)),
    mark(m: Map<number, Mark>) {
      marks = m;
      draw();
    },
  };
}
