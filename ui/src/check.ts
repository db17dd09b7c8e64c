// Schema-aware errors while typing: at each pause (400 ms) the editor's
// text goes to `POST /v1/validate`, which checks it as an apply would
// (parser, schema, authorization, the store's preconditions, the write's
// warnings) without translating any proxy. One request at a time; an
// answer for text that has changed since is dropped. Each error's field
// path (and a parser's "line L column C") is mapped to its line in the
// text (yamlpath.ts), marked in the editor, and listed under it as a
// button that puts the caret there; the list is a live region.
// `problemsOf` is pure: unit-tested by ui/test/check.test.ts.

import { api, ApiError } from "./api";
import { h } from "./dom";
import type { Editor, Mark } from "./highlight";
import { documentOf, locate, messagePlace, offsetOf, type Place } from "./yamlpath";

/** How long typing pauses before the text is checked. */
const PAUSE_MS = 400;

interface FieldError {
  field: string;
  reason: string;
}

/** `POST /v1/validate`'s answer. */
export interface Validation {
  valid: boolean;
  revision?: number;
  warnings?: string[];
  error?: { code: string; message: string; fields?: FieldError[] };
}

export interface Problem {
  level: Mark;
  message: string;
  at: Place | null;
}

/** Where a warning of the write is: by the document it names. */
function warningPlace(text: string, w: string): Place | null {
  // Of the request: "resources[i] (Kind ns/name): ..."
  const own = /^resources\[(\d+)\] \([^)]*\): (?:unknown field (\S+) dropped|([\w.[\]-]+): )?/.exec(w);
  if (own) {
    const [, i, unknown, field] = own;
    const path = unknown ? (unknown.startsWith("spec") ? unknown : `spec.${unknown}`) : field;
    return locate(text, `resources[${i}]${path ? `.${path}` : ""}`);
  }
  // The analyzers': "Warning [IST0101] (Kind ns/name) ..." or "(Kind name)".
  const finding = /^\w+ \[[A-Z]+\d+\] \((\w+) (?:[^/\s)]+\/)?([^\s)]+)/.exec(w);
  if (finding) {
    const doc = documentOf(text, finding[1], finding[2]);
    if (doc !== null) return locate(text, `resources[${doc}]`);
  }
  return null;
}

/** What an answer says about `text`: its errors, then its warnings. */
export function problemsOf(text: string, v: Validation): Problem[] {
  const out: Problem[] = [];
  if (!v.valid && v.error) {
    const fields = v.error.fields?.length ? v.error.fields : [{ field: "", reason: v.error.message }];
    for (const f of fields) {
      // A parser's error names its place; a schema's, its field.
      const at = messagePlace(f.reason) ?? (f.field ? locate(text, f.field) : null);
      out.push({ level: "error", message: f.field ? `${f.field}: ${f.reason}` : f.reason, at });
    }
  }
  for (const w of v.warnings ?? []) out.push({ level: "warning", message: w, at: warningPlace(text, w) });
  return out;
}

/** Put the caret at `at` in `text`, and its line in view. */
function moveTo(text: HTMLTextAreaElement, at: Place): void {
  text.focus();
  const off = offsetOf(text.value, at);
  text.setSelectionRange(off, off);
  const lineHeight = parseFloat(getComputedStyle(text).lineHeight) || 20;
  const y = (at.line - 1) * lineHeight;
  if (y < text.scrollTop || y > text.scrollTop + text.clientHeight - 2 * lineHeight) text.scrollTop = Math.max(0, y - text.clientHeight / 3);
}

/**
 * Check `text` as it is typed, marking `editor`'s lines: the element
 * that lists what the last check found (status and problems).
 */
export function checkAsTyped(text: HTMLTextAreaElement, editor: Editor): HTMLElement {
  const status = h("p", { id: "doc-status", class: "check-status muted" });
  const list = h("ul", { class: "problems", "aria-label": "Problems in the resource" });
  const box = h("div", { id: "doc-problems", "aria-live": "polite" }, status, list);
  let timer: number | undefined;
  let inFlight = false;
  let again = false;

  const show = (body: string, problems: Problem[], summary: string) => {
    const marks = new Map<number, Mark>();
    for (const p of problems) if (p.at && marks.get(p.at.line) !== "error") marks.set(p.at.line, p.level);
    editor.mark(marks);
    const errors = problems.filter((p) => p.level === "error").length;
    text.setAttribute("aria-invalid", errors ? "true" : "false");
    status.className = `check-status ${errors ? "bad" : problems.length ? "warn" : "ok"}`;
    status.textContent = summary;
    list.replaceChildren(
      ...problems.map((p) => {
        const where = p.at ? `Line ${p.at.line}: ` : "";
        const b = h("button", { type: "button", class: `problem ${p.level}`, "data-line": p.at?.line }, `${p.level === "error" ? "Error" : "Warning"}: ${where}${p.message}`);
        const at = p.at;
        if (at) b.addEventListener("click", () => text.value === body && moveTo(text, at));
        else b.setAttribute("disabled", "");
        return h("li", {}, b);
      }),
    );
  };

  const check = async () => {
    if (!text.isConnected) return;
    if (inFlight) {
      again = true;
      return;
    }
    inFlight = true;
    const body = text.value;
    // (a screen reader waits for the answer before reading the region)
    box.setAttribute("aria-busy", "true");
    try {
      const v = await api<Validation>("/v1/validate", { body, yaml: true, readOnly: true });
      // Typed on since: that text gets its own check.
      if (text.value === body) {
        const problems = problemsOf(body, v);
        const count = (level: Mark) => problems.filter((p) => p.level === level).length;
        const [e, w] = [count("error"), count("warning")];
        const summary = v.valid
          ? `Valid at revision ${v.revision}${w ? `, with ${w} warning${w > 1 ? "s" : ""}` : ""}.`
          : `${e} error${e > 1 ? "s" : ""}${w ? ` and ${w} warning${w > 1 ? "s" : ""}` : ""}: not valid as it is.`;
        show(body, problems, summary);
      }
    } catch (e) {
      // Refused (a token that may not write there, say): why, no line.
      if (text.value === body) show(body, [{ level: "error", message: e instanceof ApiError ? e.explain() : String(e), at: null }], "Could not check it.");
    } finally {
      box.removeAttribute("aria-busy");
      inFlight = false;
      if (again) {
        again = false;
        void check();
      }
    }
  };

  text.setAttribute("aria-describedby", `${text.getAttribute("aria-describedby") ?? ""} doc-problems`.trim());
  text.addEventListener("input", () => {
    clearTimeout(timer);
    timer = window.setTimeout(() => void check(), PAUSE_MS);
  });
  return box;
}
