// The console's shell: sign-in state, hash routing (every view and object
// has a URL), the header, and live updates: one `/v1/watch` stream for
// the session, and the Overview and Config lists re-render on each change.

import { api, learnMembers, onFailover, onUnauthorized, setToken, token, watch } from "./api";
import { alert, h, link, route } from "./dom";
import { Ctx, explain } from "./common";
import { configEdit, configList, configObject } from "./config";
import { diff, history } from "./history";
import { overview, proxies, proxyConfig, services } from "./overview";
import { security } from "./security";
import type { ClusterStatus, Who } from "./types";

const WHO = "lodestar.who";
const main = document.getElementById("main") as HTMLElement;
const nav = document.getElementById("nav") as HTMLElement;
const session = document.getElementById("session") as HTMLElement;
const live = document.getElementById("live") as HTMLElement;
const notice = document.getElementById("notice") as HTMLElement;

function who(): Who | null {
  const s = sessionStorage.getItem(WHO);
  return s ? (JSON.parse(s) as Who) : null;
}

interface View {
  title: string;
  render: (ctx: Ctx) => Promise<Node>;
  /** Re-rendered when the store changes. */
  live?: boolean;
}

function view(parts: string[]): View {
  switch (parts[0]) {
    case "config":
      if (parts.length === 1) return { title: "Config", render: configList, live: true };
      if (parts[1] === "new" || parts[4] === "edit") return { title: "Edit", render: configEdit };
      return { title: decodeURIComponent(parts.slice(1, 4).join("/")), render: configObject };
    case "history":
      return parts[1] === "diff" ? { title: "Diff", render: diff } : { title: "History", render: history };
    case "proxies":
      return parts[1] ? { title: "Proxy", render: proxyConfig } : { title: "Proxies", render: proxies };
    case "services":
      return { title: "Services", render: services, live: true };
    case "security":
      return { title: "Security", render: security };
    default:
      return { title: "Overview", render: overview, live: true };
  }
}

const NAV: [string, string][] = [
  ["overview", "Overview"],
  ["services", "Services"],
  ["config", "Config"],
  ["history", "History"],
  ["proxies", "Proxies"],
  ["security", "Security"],
];

function parse(): { parts: string[]; params: URLSearchParams } {
  const hash = location.hash.replace(/^#\/?/, "");
  const [path, query] = hash.split("?", 2);
  return { parts: path.split("/").filter(Boolean), params: new URLSearchParams(query ?? "") };
}

let generation = 0;
let current: View | null = null;

async function render(navigated: boolean): Promise<void> {
  const { parts, params } = parse();
  const w = who();
  if (!token() || !w || parts[0] === "signin") {
    current = null;
    stopLive();
    if (parts[0] !== "signin") {
      // The view asked for comes back after signing in.
      location.replace(route("/signin", { next: parts.length ? location.hash : undefined }));
      return;
    }
    showSignin(params.get("why"));
    return;
  }
  startLive();
  const v = view(parts);
  current = v;
  header(w, parts[0] ?? "overview");
  const gen = ++generation;
  if (navigated) main.replaceChildren(h("p", { class: "muted" }, "Loading…"));
  let node: Node;
  try {
    node = await v.render({ who: w, parts, params });
  } catch (e) {
    node = h("div", {}, h("h1", {}, v.title), alert(explain(e)));
  }
  if (gen !== generation) return;
  main.replaceChildren(node);
  document.title = `${v.title} · Lodestar`;
  if (navigated) {
    window.scrollTo(0, 0);
    main.focus({ preventScroll: true });
  }
}

function header(w: Who, section: string): void {
  nav.replaceChildren(
    ...NAV.map(([path, label]) => link(`#/${path}`, label, { "aria-current": (section || "overview") === path ? "page" : undefined })),
  );
  const out = h("button", { type: "button", class: "link" }, "Sign out");
  out.addEventListener("click", () => signOut(null));
  session.replaceChildren(h("span", { class: "muted" }, `Signed in as ${w.who}`), " ", out);
}

function showSignin(why: string | null): void {
  nav.replaceChildren();
  session.replaceChildren();
  live.replaceChildren();
  const input = h("input", { id: "token", type: "password", autocomplete: "off", spellcheck: "false", required: true }) as HTMLInputElement;
  const msg = h("div", { "aria-live": "polite" }, why ? alert(why) : null);
  const form = h(
    "form",
    { class: "card signin" },
    h("h1", {}, "Sign in to Lodestar"),
    h("p", {}, "Paste a token: the management token, or a scoped one from `lodestar token create`. It stays in this tab's session storage and is sent only as a bearer header."),
    h("label", { for: "token" }, "Token"),
    input,
    h("p", {}, h("button", { type: "submit", class: "primary" }, "Sign in")),
    msg,
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    setToken(input.value.trim());
    try {
      const w = await api<Who>("/v1/acl/token/self");
      sessionStorage.setItem(WHO, JSON.stringify(w));
      // The members, to fail over to if this replica stops answering.
      if (w.clusterRead) learnMembers((await api<ClusterStatus>("/v1/cluster")).members.sort((a, b) => a.id - b.id).map((m) => m.info.api_addr));
      const next = parse().params.get("next");
      if (next?.startsWith("#/") && !next.startsWith("#/signin")) location.hash = next;
      else if (location.hash === "#/overview") void render(true);
      else location.hash = "#/overview";
    } catch (e) {
      setToken(null);
      msg.replaceChildren(alert(explain(e)));
    }
  });
  main.replaceChildren(form);
  document.title = "Sign in · Lodestar";
  input.focus();
}

function signOut(why: string | null): void {
  setToken(null);
  sessionStorage.removeItem(WHO);
  stopLive();
  location.hash = route("/signin", { why: why ?? undefined });
}

let stop: (() => void) | null = null;
let pending: number | null = null;

function startLive(): void {
  if (stop) return;
  stop = watch(
    () => {
      // A burst of changes is one refresh; a user typing in a form of
      // the view keeps it (the refresh would take their input away).
      if (pending !== null || !current?.live) return;
      pending = window.setTimeout(() => {
        pending = null;
        const typing = document.activeElement?.closest("form") && main.contains(document.activeElement);
        if (current?.live && !typing) void render(false);
      }, 300);
    },
    (up, why) => {
      // Short in the header; the whole reason in its title and for
      // screen readers.
      const text = up ? "● live" : `○ not live${why.startsWith("Permission denied") ? ": permission denied" : ""}`;
      live.replaceChildren(h("span", { class: up ? "ok" : "warn", title: why, "aria-label": up ? "live updates on" : `live updates off: ${why}` }, text));
    },
  );
}

function stopLive(): void {
  stop?.();
  stop = null;
}

onFailover((from, to) => {
  notice.replaceChildren(h("p", { class: "notice" }, `The replica at ${from} stopped answering: now using ${to}.`));
});
onUnauthorized((why) => {
  if (parse().parts[0] !== "signin") signOut(`Signed out: ${why}`);
});
window.addEventListener("hashchange", () => void render(true));
void render(true);
