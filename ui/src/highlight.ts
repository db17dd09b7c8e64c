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

/** YAML text as highlighted nodes (one span per token, newlines kept). */
export function highlighted(text: string): Node[] {
  const nodes: Node[] = [];
  text.split("\n").forEach((line, i) => {
    if (i) nodes.push(document.createTextNode("\n"));
    for (const [cls, t] of tokens(line)) nodes.push(cls ? h("span", { class: `y-${cls}` }, t) : document.createTextNode(t));
  });
  return nodes;
}

/**
 * A textarea (kept as it is: its value, label and events) shown over a
 * highlighted copy of its text: the copy is redrawn on each input and
 * scrolled with it.
 */
export function yamlEditor(text: HTMLTextAreaElement): HTMLElement {
  const copy = h("pre", { class: "highlight", "aria-hidden": "true" });
  const draw = () => {
    // A trailing newline needs a line under it to keep the heights equal.
    copy.replaceChildren(...highlighted(text.value + (text.value.endsWith("\n") ? " " : "")));
    copy.scrollTop = text.scrollTop;
    copy.scrollLeft = text.scrollLeft;
  };
  text.classList.add("highlighted");
  // Lines do not wrap, in either, so that they stay one over the other.
  text.setAttribute("wrap", "off");
  text.addEventListener("input", draw);
  text.addEventListener("scroll", () => {
    copy.scrollTop = text.scrollTop;
    copy.scrollLeft = text.scrollLeft;
  });
  draw();
  return h("div", { class: "code-editor" }, copy, text);
}
