// The web console in a real browser: playwright-core drives Debian's
// headless Chromium through the scenarios below, each in a fresh browser
// context (its own sessionStorage), against a running cluster that
// tests/e2e/console.rs starts. Every scenario fails on any console error,
// page error, failed request or HTTP error response except those it
// provokes (listed with it). Prints one JSON line per scenario with what
// the Rust side checks through the REST API; exits non-zero on the first
// failure, with a screenshot of the page as it was.
//
// Environment: CONSOLE_URL (https://.../ui/), CONSOLE_TOKEN (management),
// CONSOLE_SCOPED_TOKEN (reads namespace CONSOLE_NS_A only) and its
// CONSOLE_SCOPED_ACCESSOR, CONSOLE_NS_A,
// CONSOLE_NS_B, CONSOLE_PROXY (a connected proxy's node id),
// CONSOLE_PROXIES (how many are connected, on every replica),
// CONSOLE_NACKER (a proxy that NACKed on a replica other than the first),
// CONSOLE_MEMBERS (how many replicas), CONSOLE_SHOTS (screenshot dir),
// CONSOLE_SCENARIOS (`main`, or `failover` with CONSOLE_KILL_PID and
// CONSOLE_OTHER_API),
// CHROMIUM (the browser), NODE_EXTRA_CA_CERTS (the cluster CA, for the
// script's own REST calls).

"use strict";
const { chromium } = require("playwright-core");
const fs = require("fs");
const path = require("path");

function env(k) {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
}
const URL = env("CONSOLE_URL");
const API = new globalThis.URL(URL).origin;
const TOKEN = env("CONSOLE_TOKEN");
const SCOPED = env("CONSOLE_SCOPED_TOKEN");
const NS_A = env("CONSOLE_NS_A");
const NS_B = env("CONSOLE_NS_B");
const PROXY = env("CONSOLE_PROXY");
const MEMBERS = Number(env("CONSOLE_MEMBERS"));
const PROXIES = Number(env("CONSOLE_PROXIES"));
const NACKER = env("CONSOLE_NACKER");
const SHOTS = env("CONSOLE_SHOTS");
const WAIT = 15000;

function check(cond, what) {
  if (!cond) throw new Error(what);
}

async function rest(method, p, body, api = API) {
  const r = await fetch(`${api}${p}`, {
    method,
    headers: { Authorization: `Bearer ${TOKEN}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const json = await r.json();
  check(r.ok, `${method} ${p}: ${r.status} ${JSON.stringify(json)}`);
  return json;
}

/**
 * Run `body(page)` in a fresh context. `allowed`: regexes over
 * "STATUS URL" of the error responses (and their console lines) this
 * scenario provokes ("failed URL" for a request that got no response).
 */
async function scenario(browser, name, allowed, body, options = {}) {
  const context = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1180, height: 760 }, colorScheme: "light", ...options });
  const page = await context.newPage();
  const problems = [];
  let closing = false;
  const ok = (status, url) => allowed.some((re) => re.test(`${status} ${url}`));
  page.on("console", (m) => {
    if (closing || m.type() !== "error") return;
    // Chromium logs each error response as a console error: allowed when
    // the response is.
    if (m.text().includes("net::ERR_NETWORK_CHANGED")) return; // as below
    const status = /status of (\d+)/.exec(m.text())?.[1] ?? (m.text().includes("net::ERR_") ? "failed" : undefined);
    if (status && ok(status, m.location().url)) return;
    problems.push(`console error: ${m.text()} (${m.location().url})`);
  });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("requestfailed", (r) => {
    // Chromium ends requests in flight when the host's interfaces change
    // (other tests on the machine create network namespaces and veth
    // pairs): not the console's doing; the scenario's checks still have
    // to pass, so the console has to recover from it.
    if (r.failure()?.errorText === "net::ERR_NETWORK_CHANGED") {
      process.stderr.write(`note: ${r.method()} ${r.url()} ended by a network change on the host\n`);
      return;
    }
    if (!closing && !ok("failed", r.url())) problems.push(`request failed: ${r.method()} ${r.url()}: ${r.failure()?.errorText}`);
  });
  page.on("response", (r) => {
    if (!closing && r.status() >= 400 && !ok(r.status(), r.url())) problems.push(`HTTP ${r.status()}: ${r.request().method()} ${r.url()}`);
  });
  const started = Date.now();
  try {
    const out = (await body(page)) ?? {};
    check(problems.length === 0, `unexpected errors:\n  ${problems.join("\n  ")}`);
    console.log(JSON.stringify({ scenario: name, ok: true, ms: Date.now() - started, ...out }));
  } catch (e) {
    await page.screenshot({ path: path.join(SHOTS, `failed-${name}.png`) }).catch(() => {});
    const more = problems.length ? `\nother errors on the page:\n  ${problems.join("\n  ")}` : "";
    throw new Error(`scenario ${name}: ${e.message}${more}\npage: ${page.url()}`);
  } finally {
    closing = true;
    await context.close();
  }
}

/** A VirtualService `name` in namespace A. */
function route(name) {
  return {
    apiVersion: "networking.istio.io/v1",
    kind: "VirtualService",
    metadata: { name, namespace: NS_A },
    spec: { hosts: [name], http: [{ route: [{ destination: { host: name } }] }] },
  };
}

async function shot(page, name) {
  await page.screenshot({ path: path.join(SHOTS, `${name}.png`), fullPage: true });
}

/** Sign in with `token` through the form, keyboard only. */
async function signIn(page, token) {
  await page.goto(URL);
  await page.locator("#token").waitFor({ timeout: WAIT });
  check(await page.evaluate(() => document.activeElement?.id === "token"), "the token field has the focus");
  await page.keyboard.type(token);
  await page.keyboard.press("Enter");
  await page.locator("h1", { hasText: "Overview" }).waitFor({ timeout: WAIT });
}

async function main() {
  fs.mkdirSync(SHOTS, { recursive: true });
  const which = process.env.CONSOLE_SCENARIOS || "main";
  for (const f of fs.readdirSync(SHOTS)) if (f.startsWith("failed-")) fs.rmSync(path.join(SHOTS, f));
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium", args: ["--no-sandbox"] });
  try {
    if (which === "failover") await failover(browser);
    else await scenarios(browser);
  } finally {
    await browser.close();
  }
}

/**
 * The replica serving the page dies (CONSOLE_KILL_PID): the open page
 * carries on with another member (CONSOLE_OTHER_API), without a reload,
 * live updates included.
 */
async function failover(browser) {
  const pid = Number(env("CONSOLE_KILL_PID"));
  const other = env("CONSOLE_OTHER_API");
  const dead = new globalThis.URL(URL).origin.replace(/[.]/g, "\\.");
  // Provoked: what was in flight to the killed replica fails, and members
  // still electing a leader answer /readyz with 503.
  await scenario(browser, "failover", [new RegExp(`^failed ${dead}/`), /^503 .*\/readyz$/], async (page) => {
    await signIn(page, TOKEN);
    await page.locator("caption", { hasText: `${MEMBERS} members` }).waitFor({ timeout: WAIT });
    await page.locator("#live", { hasText: "live" }).waitFor({ timeout: WAIT });
    await page.evaluate(() => (window.marker = 1));
    process.kill(pid, "SIGKILL");
    await page.evaluate((ns) => (location.hash = `#/config?kind=VirtualService&namespace=${ns}`), NS_A);
    await page.locator("tr", { hasText: "reviews" }).waitFor({ timeout: 2 * WAIT });
    await page.locator("#notice", { hasText: `now using ${other}` }).waitFor({ timeout: WAIT });
    await page.locator("#live", { hasText: "● live" }).waitFor({ timeout: 2 * WAIT });
    // Live again, from the member now in use.
    await rest("POST", "/v1/apply", { resources: [route("details")] }, other);
    await page.locator("tr", { hasText: "details" }).waitFor({ timeout: WAIT });
    check((await page.evaluate(() => window.marker)) === 1, "the page did not reload");
    await shot(page, "failover");
    await page.evaluate(() => (location.hash = "#/overview"));
    const answering = page.locator("tr", { has: page.locator(".badge", { hasText: "answering this console" }) });
    await answering.waitFor({ timeout: WAIT });
    check((await answering.innerText()).includes(new globalThis.URL(other).host), `the Overview marks ${other}: ${await answering.innerText()}`);
  });
  console.log(JSON.stringify({ scenario: "all", ok: true }));
}

async function scenarios(browser) {
  {
    // Provoked: signing out ends the watch.
    await scenario(browser, "sign-in", [/^failed .*\/v1\/watch$/], async (page) => {
      await page.goto(URL);
      await page.locator("#token").waitFor({ timeout: WAIT });
      check(page.url().includes("#/signin"), `not sent to sign in: ${page.url()}`);
      await shot(page, "sign-in");
      await signIn(page, TOKEN);
      const stored = await page.evaluate(() => ({ session: sessionStorage.getItem("lodestar.token"), local: JSON.stringify(localStorage) }));
      check(stored.session === TOKEN, "the token is in sessionStorage");
      check(!stored.local.includes(TOKEN), "the token is not in localStorage");
      check(!page.url().includes(TOKEN), "the token is not in the URL");
      // Keyboard: a view takes the focus when it opens; the header's
      // controls are before it (Sign out the last), and work by keyboard.
      check(await page.evaluate(() => document.activeElement?.id === "main"), "the view has the focus");
      await page.keyboard.press("Shift+Tab");
      check(await page.evaluate(() => document.activeElement?.textContent === "Sign out"), "Shift+Tab reaches Sign out");
      await page.keyboard.press("Enter");
      await page.locator("#token").waitFor({ timeout: WAIT });
      check((await page.evaluate(() => sessionStorage.getItem("lodestar.token"))) === null, "signing out removes the token");
    });

    await scenario(browser, "overview", [], async (page) => {
      await signIn(page, TOKEN);
      const members = page.locator("table", { has: page.locator("caption", { hasText: "members" }) }).locator("tbody tr");
      await page.waitForFunction((n) => [...document.querySelectorAll("caption")].some((c) => c.textContent.startsWith(`${n} members`)), MEMBERS, { timeout: WAIT });
      check((await members.count()) === MEMBERS, `${MEMBERS} member rows`);
      await page.waitForFunction((n) => document.querySelectorAll("td .ok").length >= n, MEMBERS, { timeout: WAIT });
      const text = await page.locator("main").innerText();
      check(text.includes("leader"), "the leader is marked");
      check(text.includes("answering this console"), "the replica in use is marked");
      // Every replica's NACKs: the one of a proxy on another replica, gone since.
      check(/NACKs, last hour \(all replicas\)\s*1\b/.test(text), `one NACK: ${text}`);
      const nack = await page.locator("tr", { hasText: NACKER }).innerText();
      check(nack.includes("console: rejected on purpose") && nack.includes("CDS") && !nack.includes("replica 1"), `the NACK's row: ${nack}`);
      const proxyRow = page.locator("tr", { hasText: PROXY });
      await proxyRow.waitFor({ timeout: WAIT });
      check((await proxyRow.innerText()).includes("In sync"), `the proxy is in sync: ${await proxyRow.innerText()}`);
      await page.locator("#live", { hasText: "live" }).waitFor({ timeout: WAIT });
      await shot(page, "overview");
      await page.emulateMedia({ colorScheme: "dark" });
      await shot(page, "overview-dark");
    });

    await scenario(browser, "live-config-list", [], async (page) => {
      await signIn(page, TOKEN);
      await page.goto(`${URL}#/config?kind=VirtualService&namespace=${NS_A}`);
      await page.locator("tr", { hasText: "reviews" }).waitFor({ timeout: WAIT });
      await page.locator("#live", { hasText: "live" }).waitFor({ timeout: WAIT });
      // Nothing is polled: an idle list makes no request.
      let reads = 0;
      page.on("request", (r) => {
        if (!r.url().includes("/v1/watch")) reads++;
      });
      await page.waitForTimeout(1500);
      check(reads === 0, `an idle list made ${reads} requests`);
      await page.evaluate(() => ((window).marker = 1));
      // A change made elsewhere shows up by itself (the watch), with no reload.
      await rest("POST", "/v1/apply", { resources: [route("ratings")] });
      await page.locator("tr", { hasText: "ratings" }).waitFor({ timeout: WAIT });
      check((await page.evaluate(() => (window).marker)) === 1, "the page did not reload");
      await shot(page, "config");
    });

    await scenario(browser, "check-as-typed", [], async (page) => {
      await signIn(page, TOKEN);
      await page.goto(`${URL}#/config/new?kind=VirtualService&namespace=${NS_A}`);
      const doc = page.getByLabel("Resource (YAML or JSON)");
      await doc.waitFor({ timeout: WAIT });
      // Typed key by key (a textarea does not indent by itself): the
      // check waits for a pause, so typing makes a few requests, not one
      // per key.
      let checks = 0;
      page.on("request", (r) => {
        if (r.url().endsWith("/v1/validate")) checks++;
      });
      const lines = [
        "apiVersion: networking.istio.io/v1",
        "kind: VirtualService",
        "metadata:",
        "  name: typed",
        `  namespace: ${NS_A}`,
        "spec:",
        `  hosts: [reviews.${NS_A}.svc.cluster.local]`,
        "  http:",
        "  - route:",
        "    - destination:",
        `        host: reviews.${NS_A}.svc.cluster.local`,
        "      weight: 150",
      ];
      await doc.click();
      await page.keyboard.press("Control+A");
      await page.keyboard.press("Delete");
      await page.keyboard.type(lines.join("\n"), { delay: 5 });
      const keys = lines.join("\n").length;
      // Within a few seconds: the error, naming the field, at its line
      // (12), in the list under the editor and in the gutter.
      const error = page.locator("ul.problems button.error", { hasText: "spec.http[0].route[0].weight" });
      await error.waitFor({ timeout: 5000 });
      const said = await error.innerText();
      check(said.startsWith("Error: Line 12: resources[0].spec.http[0].route[0].weight:") && said.includes("0..=100"), `the error names the field and its line: ${said}`);
      check((await page.locator(".code-editor pre.gutter .g-error").allTextContents()).includes("12"), "the gutter marks line 12");
      check((await page.locator(".code-editor pre.highlight .y-mark-error").first().textContent()).includes("weight: 150"), "the line is marked under the text");
      check((await doc.getAttribute("aria-invalid")) === "true", "the editor is marked invalid");
      check((await page.locator("#doc-problems[aria-live=polite]").innerText()).includes("spec.http[0].route[0].weight"), "the errors are in a live region");
      check(checks >= 1 && checks <= 5, `${checks} checks for ${keys} keys typed`);
      // The highlighted copy still is the text, marks and all.
      check((await page.locator(".code-editor pre.highlight").textContent()) === `${await doc.inputValue()}`, "the highlighted copy is the editor's text");
      await shot(page, "edit-errors");
      // By keyboard: Tab from the editor reaches the error; Enter puts
      // the caret on its line.
      await doc.focus();
      await page.keyboard.press("Tab");
      check(await page.evaluate(() => document.activeElement?.classList.contains("problem")), "Tab from the editor reaches the first problem");
      await page.keyboard.press("Enter");
      const caret = () => page.evaluate(() => {
        const t = document.activeElement;
        return t instanceof HTMLTextAreaElement ? t.value.slice(0, t.selectionStart).split("\n").length : -1;
      });
      check((await caret()) === 12, `the caret is on line 12: ${await caret()}`);
      // Fixed where the caret is: the error goes.
      await page.keyboard.press("End");
      for (let i = 0; i < 3; i++) await page.keyboard.press("Backspace");
      await page.keyboard.type("100");
      const valid = page.locator("#doc-status", { hasText: "Valid at revision" });
      await valid.waitFor({ timeout: 5000 });
      check((await page.locator("ul.problems button.error").count()) === 0, "no error left");
      check((await page.locator(".code-editor pre.gutter .g-error").count()) === 0, "no line marked");
      check((await doc.getAttribute("aria-invalid")) === "false", "the editor is valid");
      // The analyzers' findings (another VirtualService has this host):
      // warnings, at the document they name.
      const finding = page.locator("ul.problems button.warning", { hasText: `[IST0109] (VirtualService ${NS_A}/typed)` });
      await finding.waitFor({ timeout: 5000 });
      check((await finding.innerText()).startsWith("Warning: Line 1: "), `the finding's line: ${await finding.innerText()}`);
      // A field the kind does not have: dropped with a warning (as apply
      // does by default), at its line, not an error.
      await page.keyboard.press("Enter");
      await page.keyboard.type("    retriez: 3");
      const warning = page.locator("ul.problems button.warning", { hasText: "unknown field" });
      await warning.waitFor({ timeout: 5000 });
      check((await warning.innerText()).startsWith("Warning: Line 13: "), `the warning's line: ${await warning.innerText()}`);
      check((await page.locator("ul.problems button.error").count()) === 0, "a warning is not an error");
      check((await page.locator(".code-editor pre.gutter .g-warning").allTextContents()).includes("13"), "the gutter marks line 13 as a warning");
      // A YAML syntax error: the parser's line (a tab indents line 5).
      const text = await doc.inputValue();
      await doc.fill(text.replace(`  namespace: ${NS_A}`, `\tnamespace: ${NS_A}`));
      const syntax = page.locator("ul.problems button.error", { hasText: "malformed YAML" });
      await syntax.waitFor({ timeout: 5000 });
      const bad = await syntax.innerText();
      check(/^Error: Line 5: /.test(bad), `the syntax error's line: ${bad}`);
      check((await page.locator(".code-editor pre.gutter .g-error").allTextContents()).includes("5"), "the gutter marks line 5");
      await doc.fill(text);
      await page.locator("ul.problems button.warning", { hasText: "unknown field" }).waitFor({ timeout: 5000 });
      check((await page.locator("ul.problems button.error").count()) === 0, "the syntax error is gone");
      // One check at a time, and the answer for text changed since is
      // dropped: the next check's request is held back 1.5 s, and the
      // invalid text it carries is fixed meanwhile.
      let [held, inFlight, most, answered] = [true, 0, 0, 0];
      let bothAnswered;
      const both = new Promise((res) => (bothAnswered = res));
      await page.route("**/v1/validate", async (route) => {
        most = Math.max(most, ++inFlight);
        if (held) {
          held = false;
          await new Promise((res) => setTimeout(res, 1500));
        }
        await route.fulfill({ response: await route.fetch() });
        inFlight--;
        if (++answered === 2) bothAnswered();
      });
      await page.evaluate(() => {
        window.sawError = false;
        new MutationObserver(() => (window.sawError ||= !!document.querySelector("ul.problems button.error"))).observe(document.body, { subtree: true, childList: true });
      });
      await doc.fill(text.replace("weight: 100", "weight: 150"));
      await page.waitForTimeout(700);
      await doc.fill(text);
      await both;
      await page.waitForFunction(() => !document.querySelector("#doc-problems[aria-busy]"), null, { timeout: WAIT });
      await page.waitForTimeout(200);
      check(most === 1, `${most} checks in flight at once`);
      check(answered === 2, `${answered} checks for two edits`);
      check(!(await page.evaluate(() => window.sawError)), "the answer for the replaced text was shown");
      check((await page.locator("#doc-status").innerText()).startsWith("Valid at revision"), "the last text's answer is shown");
      await page.unroute("**/v1/validate");
    });

    const edit = await (async () => {
      let out;
      // Provoked: a Confirm after another change to the object.
      await scenario(browser, "edit", [/^409 .*\/v1\/apply\?expectedRevision=\d+$/], async (page) => {
        await signIn(page, TOKEN);
        await page.goto(`${URL}#/config/VirtualService/${NS_A}/reviews`);
        await page.locator("pre.doc").waitFor({ timeout: WAIT });
        check((await page.locator("pre.doc").innerText()).includes('timeout: "2s"'), "the YAML view shows the spec");
        await shot(page, "object");
        await page.getByRole("link", { name: "Edit" }).click();
        const doc = page.getByLabel("Resource (YAML or JSON)");
        await doc.waitFor({ timeout: WAIT });
        const yaml = await doc.inputValue();
        check(yaml.includes('timeout: "2s"'), `the editor holds the object: ${yaml}`);
        // The YAML the console prints reads back as the same object
        // (strings that look like booleans, numbers, comments...).
        await page.getByRole("button", { name: "Save (preview changes)" }).click();
        await page.locator(".preview", { hasText: "Nothing would change" }).waitFor({ timeout: WAIT });
        await doc.fill(yaml.replace('timeout: "2s"', 'timeout: "5s"'));
        // The highlighted copy under the editor follows what was typed.
        const copy = page.locator(".code-editor pre.highlight");
        check((await copy.textContent()) === `${await doc.inputValue()} `, "the highlighted copy is the editor's text");
        const key = await copy.locator(".y-key", { hasText: "timeout:" }).count();
        const value = await copy.locator(".y-string", { hasText: '"5s"' }).count();
        check(key === 1 && value === 1, `the key and the string are highlighted (${key}, ${value})`);
        await page.getByRole("button", { name: "Save (preview changes)" }).click();
        const preview = page.locator(".preview");
        await preview.waitFor({ timeout: WAIT });
        const text = await preview.innerText();
        check(text.includes(`VirtualService ${NS_A}/reviews`) && text.includes("spec.http[0].timeout"), `the preview names the change: ${text}`);
        check(text.includes('"2s"') && text.includes('"5s"'), `the preview shows before and after: ${text}`);
        // Every replica's proxies: the connected Envoy's routes would change.
        check(text.includes(`${PROXIES} connected proxies would change (0 unchanged; replicas`) && text.includes(PROXY), `the preview names the proxies: ${text}`);
        const base = Number(/Computed at revision (\d+)/.exec(text)?.[1]);
        check(base > 0, `the preview's base revision: ${text}`);
        await shot(page, "edit-preview");
        // Someone else changes the object meanwhile: Confirm is refused
        // (the preview no longer says what would happen), with the reason.
        const theirs = await rest("GET", `/v1/resources/VirtualService/${NS_A}/reviews`);
        theirs.metadata.labels = { ...(theirs.metadata.labels ?? {}), changed: "meanwhile" };
        for (const k of ["resourceVersion", "creationRevision", "modRevision", "generation"]) delete theirs.metadata[k];
        await rest("POST", "/v1/apply", { resources: [theirs] });
        await page.getByRole("button", { name: /^Confirm: apply at revision/ }).click();
        const conflict = page.locator(".outcome p.error[role=alert]");
        await conflict.waitFor({ timeout: WAIT });
        check((await conflict.innerText()).startsWith("Conflict (409)"), `a stale preview is refused: ${await conflict.innerText()}`);
        // Reloaded, redone and previewed again, at the new revision: only
        // the edit changes (the other change stays).
        await page.locator(".outcome").getByRole("button", { name: "Reload from the server" }).click();
        await page.locator(".outcome", { hasText: "Reloaded." }).waitFor({ timeout: WAIT });
        const fresh = await doc.inputValue();
        check(fresh.includes("changed: meanwhile") && fresh.includes('timeout: "2s"'), `reloaded: ${fresh}`);
        await doc.fill(fresh.replace('timeout: "2s"', 'timeout: "5s"'));
        await page.getByLabel("Change message").fill("console: timeout 5s");
        await page.getByRole("button", { name: "Save (preview changes)" }).click();
        const again = page.locator(".preview", { hasText: `Computed at revision ${base + 1}` });
        await again.waitFor({ timeout: WAIT });
        check(!(await again.innerText()).includes("metadata.labels"), `only the edit: ${await again.innerText()}`);
        // A change message a header cannot carry is refused before sending.
        await page.getByLabel("Change message").fill("café");
        await page.getByRole("button", { name: /^Confirm: apply at revision/ }).click();
        await page.locator(".outcome p.error", { hasText: "printable ASCII only" }).waitFor({ timeout: WAIT });
        await page.getByLabel("Change message").fill("console: timeout 5s");
        await page.getByRole("button", { name: /^Confirm: apply at revision/ }).click();
        const done = page.locator("p.ok", { hasText: "Applied: revision" });
        await done.waitFor({ timeout: WAIT });
        const revision = Number(/revision (\d+)/.exec(await done.innerText())?.[1]);
        check(revision === base + 2, `the new revision ${revision} follows the other change, at ${base + 1}`);
        // Then the proxies' ACKs of it as they come, across the replicas,
        // up to every proxy.
        const seen = [];
        const progress = page.locator("#ack-progress");
        await progress.waitFor({ timeout: WAIT });
        for (let t = Date.now(); Date.now() - t < 2 * WAIT; ) {
          const now = await progress.innerText();
          if (seen[seen.length - 1] !== now) seen.push(now);
          if (now.startsWith(`${PROXIES} of`)) break;
          await page.waitForTimeout(20);
        }
        await page.locator("p.ok#ack-progress", { hasText: `${PROXIES} of ${PROXIES} proxies ACKed revision ${revision} (100%).` }).waitFor({ timeout: WAIT });
        const bar = await page.locator(".wait progress").evaluate((b) => [b.value, b.max]);
        check(bar[0] === PROXIES && bar[1] === PROXIES, `the progress bar is full: ${bar}`);
        await shot(page, "edit-applied");
        out = { base: base + 1, revision, progress: seen };
        return out;
      });
      return out;
    })();

    const rollback = await (async () => {
      let out;
      await scenario(browser, "history-rollback", [], async (page) => {
        await signIn(page, TOKEN);
        await page.goto(`${URL}#/history`);
        const entry = page.locator("li.revision", { has: page.locator("h2", { hasText: `Revision ${edit.revision}` }) });
        await entry.waitFor({ timeout: WAIT });
        const said = await entry.innerText();
        check(said.includes(`VirtualService ${NS_A}/reviews`), "the edit is in the history");
        // Who made it, and why (the editor's change message).
        check(/By \S/.test(said) && said.includes("console: timeout 5s"), `the author and message: ${said}`);
        await shot(page, "history");
        await entry.getByRole("link", { name: "Diff with the revision before" }).click();
        await page.locator("h1", { hasText: `Diff: revision ${edit.revision - 1}` }).waitFor({ timeout: WAIT });
        check((await page.locator("main").innerText()).includes("spec.http[0].timeout"), "the diff shows the field");
        await shot(page, "diff");
        await page.goBack();
        await entry.waitFor({ timeout: WAIT });
        await entry.getByRole("button", { name: `Roll back revision ${edit.revision}…` }).click();
        const preview = entry.locator(".preview");
        await preview.waitFor({ timeout: WAIT });
        const text = await preview.innerText();
        check(text.includes("spec.http[0].timeout") && text.includes('"5s"') && text.includes('"2s"'), `the rollback preview: ${text}`);
        await shot(page, "rollback-preview");
        await entry.getByRole("button", { name: /^Confirm rollback/ }).click();
        const done = entry.locator("p.ok", { hasText: "Rolled back" });
        await done.waitFor({ timeout: WAIT });
        out = { revision: Number(/revision (\d+) restores/.exec(await done.innerText())?.[1]) };
        return out;
      });
      return out;
    })();

    await scenario(
      browser,
      "scoped-token",
      // Provoked: another namespace's list, the watch of every namespace
      // (this token may watch none), and the registry of every namespace.
      [new RegExp(`^403 .*/v1/resources/VirtualService\\?namespace=${NS_B}$`), /^403 .*\/v1\/watch$/, /^403 .*\/v1\/registry\/services$/],
      async (page) => {
        await signIn(page, SCOPED);
        const main = page.locator("main");
        await page.locator("p.error", { hasText: "may not read the cluster" }).first().waitFor({ timeout: WAIT });
        // Live updates are off, and the header says why.
        const live = page.locator("#live span", { hasText: "not live: permission denied" });
        await live.waitFor({ timeout: WAIT });
        check((await live.getAttribute("title")).includes("lacks watch"), "the reason is the API's");
        await page.goto(`${URL}#/config?kind=VirtualService&namespace=${NS_A}`);
        await page.locator("tr", { hasText: "reviews" }).waitFor({ timeout: WAIT });
        await page.goto(`${URL}#/config?kind=VirtualService&namespace=${NS_B}`);
        const refusal = page.locator("p.error[role=alert]");
        await refusal.waitFor({ timeout: WAIT });
        const text = await refusal.innerText();
        check(text.startsWith("Permission denied (403)") && text.includes(NS_B), `the refusal says why: ${text}`);
        check((await main.locator("tbody tr").count()) === 0, "no list is shown");
        await shot(page, "scoped-denied");
        // The topology: its namespace's services only, nothing of another.
        await page.goto(`${URL}#/services`);
        const topo = page.locator("section.topology");
        await topo.locator("tbody tr").first().waitFor({ timeout: WAIT });
        const edges = await topo.innerText();
        check(edges.includes(`ratings.${NS_A}.svc.cluster.local`) && !edges.includes(NS_B), `only ${NS_A}: ${edges}`);
        check(!(await main.innerText()).includes(`.${NS_B}.`), "no other namespace's service on the page");
      },
    );

    await scenario(browser, "proxies-security", [], async (page) => {
      await signIn(page, TOKEN);
      await page.goto(`${URL}#/proxies`);
      const row = page.locator("tr", { hasText: PROXY });
      await row.waitFor({ timeout: WAIT });
      const text = await row.innerText();
      for (const t of ["ACK v", "In sync"]) check(text.includes(t), `the proxy row shows ${t}: ${text}`);
      check(!text.includes("NACK"), `no NACK: ${text}`);
      await shot(page, "proxies");
      // A proxy's translated config, as this replica serves it.
      await row.getByRole("link").first().click();
      await page.locator("h1", { hasText: `Proxy ${PROXY}` }).waitFor({ timeout: WAIT });
      const clusters = page.locator("section", { has: page.locator("h2", { hasText: "Clusters" }) });
      check((await clusters.innerText()).includes("reviews.shop.svc.cluster.local"), `the proxy's clusters: ${await clusters.innerText()}`);
      await clusters.locator("summary").first().click();
      await shot(page, "proxy-config");
      // The registry's services with their instances' health.
      await page.goto(`${URL}#/services`);
      // (the registry's table comes first; the topology's rows name it too)
      const svc = page.locator("tr", { hasText: "reviews.shop.svc.cluster.local" }).first();
      await svc.waitFor({ timeout: WAIT });
      check(/9080/.test(await svc.innerText()), `the service row: ${await svc.innerText()}`);
      // With the config that applies to each service.
      check((await svc.innerText()).includes(`route VirtualService ${NS_A}/reviews`), `what applies to reviews: ${await svc.innerText()}`);
      const pay = await page.locator("tr", { hasText: `payments.${NS_B}.svc.cluster.local` }).first().innerText();
      check(pay.includes(`route VirtualService ${NS_B}/payments`) && pay.includes(`allow AuthorizationPolicy ${NS_B}/payments-from-ratings`), `what applies to payments: ${pay}`);
      // Who may call whom: routes, policies, verdicts.
      const edge = (from, to) => page.locator("section.topology tr", { has: page.locator("td:first-child", { hasText: from }) }).filter({ has: page.locator("td:nth-child(2)", { hasText: to }) });
      const permitted = await edge(`ratings.${NS_A}`, `payments.${NS_B}`).innerText();
      check(permitted.includes("allowed") && permitted.includes(`AuthorizationPolicy ${NS_B}/payments-from-ratings`), `ratings -> payments: ${permitted}`);
      const refused = await edge(`reviews.${NS_A}`, `payments.${NS_B}`).innerText();
      check(refused.includes("denied") && refused.includes("no rule of"), `reviews -> payments: ${refused}`);
      const routed = await edge(`ratings.${NS_A}`, `reviews.${NS_A}`).innerText();
      check(routed.includes(`route VirtualService ${NS_A}/reviews`), `ratings -> reviews: ${routed}`);
      // And drawn: an arrow per edge, between labelled services.
      const rows = await page.locator("section.topology tbody tr").count();
      const arrows = await page.locator("figure.graph svg path.edge.edge-denied").count();
      check((await page.locator("figure.graph svg path.edge").count()) === rows && arrows === 1, `the graph draws the ${rows} edges (${arrows} denied)`);
      check((await page.locator("figure.graph svg text").allTextContents()).includes(`payments.${NS_B}`), "the graph names the services");
      await shot(page, "services");
      await page.goto(`${URL}#/security`);
      await page.locator("caption", { hasText: "tokens" }).waitFor({ timeout: WAIT });
      const all = await page.content();
      check(!all.includes(SCOPED) && !all.includes(TOKEN), "no secret on the page");
      check(!all.includes("sha256:"), "no secret hash on the page");
      const token = page.locator("tr", { hasText: env("CONSOLE_SCOPED_ACCESSOR") });
      const t = await token.innerText();
      check(t.includes("console reader") && t.includes("shop-reader") && /\d{4}-\d\d-\d\dT/.test(t) && !t.includes("never"), `the token's row: ${t}`);
      // The authorization check, against the proxy's own config.
      await page.getByLabel("Port").fill("8000");
      const verdict = async (method, p) => {
        await page.getByLabel("Method").fill(method);
        await page.getByLabel("Path").fill(p);
        const before = await page.locator("#authz-result").textContent();
        await page.getByRole("button", { name: "Check" }).click();
        await page.waitForFunction(
          (b) => {
            const t = document.querySelector("#authz-result").textContent;
            return t !== b && /^(Allowed|Denied)/.test(t);
          },
          before,
          { timeout: WAIT },
        );
        return page.locator("#authz-result p").first().innerText();
      };
      const denied = await verdict("POST", "/admin");
      check(denied.startsWith("Denied"), `POST /admin: ${denied}`);
      const allowed = await verdict("GET", "/public/a");
      check(allowed.startsWith("Allowed"), `GET /public/a: ${allowed}`);
      await shot(page, "security");
    });
    console.log(JSON.stringify({ scenario: "all", ok: true, edit, rollback }));
  }
}

main().catch((e) => {
  console.error(e.stack || String(e));
  process.exit(1);
});
