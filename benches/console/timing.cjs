// Times the console's views in headless Chromium (benches/console.sh runs
// it against a replica holding many resources): prints one `result:` line
// per figure, the median and the max of CONSOLE_ROUNDS rounds, in ms; with
// CONSOLE_PID (the replica's), its CPU while 10 consoles sit open.
"use strict";
const { chromium } = require("playwright-core");
const fs = require("fs");

const URL = process.env.CONSOLE_URL;
const TOKEN = process.env.CONSOLE_TOKEN;
const ROUNDS = Number(process.env.CONSOLE_ROUNDS || 5);
const VS = Number(process.env.CONSOLE_VS);
const PROXIES = Number(process.env.CONSOLE_PROXIES || 0);
const WAIT = 60000;
const CONSOLES = 10;
const IDLE_S = 10;

async function round(browser) {
  const context = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1180, height: 760 } });
  const page = await context.newPage();
  const out = {};
  await page.goto(URL);
  await page.locator("#token").waitFor({ timeout: WAIT });
  out["first-paint"] = await page.evaluate(() => performance.getEntriesByName("first-contentful-paint")[0]?.startTime ?? NaN);
  await page.locator("#token").fill(TOKEN);
  let t = Date.now();
  await page.keyboard.press("Enter");
  await page.locator("caption", { hasText: "members" }).waitFor({ timeout: WAIT });
  out.overview = Date.now() - t;
  t = Date.now();
  await page.evaluate(() => (location.hash = "#/config?kind=VirtualService"));
  // Every one listed: "N of N", N at least VS (the simulated proxies'
  // mesh adds its own).
  await page.locator("caption", { hasText: /^(\d+) of \1 VirtualService/ }).filter({ hasText: new RegExp(`^\\d{${String(VS).length},} of`) }).waitFor({ timeout: WAIT });
  out["config-list"] = Date.now() - t;
  t = Date.now();
  await page.evaluate(() => (location.hash = "#/services"));
  await page.locator("section.topology").waitFor({ timeout: WAIT });
  out.services = Date.now() - t;
  if (PROXIES > 0) {
    t = Date.now();
    await page.evaluate(() => (location.hash = "#/proxies"));
    await page.locator("caption", { hasText: `${PROXIES} connected proxies` }).waitFor({ timeout: WAIT });
    out.proxies = Date.now() - t;
  }
  // The API calls behind the views, alone (the rest is the page's).
  for (const [k, p] of [["api-analyze", "/v1/analyze"], ["api-config-list", "/v1/resources/VirtualService"], ["api-topology", "/v1/topology"], ...(PROXIES > 0 ? [["api-proxies", "/debug/syncz"]] : [])]) {
    t = Date.now();
    await page.evaluate(async ([p, token]) => (await fetch(p, { headers: { Authorization: `Bearer ${token}` } })).text(), [p, TOKEN]);
    out[k] = Date.now() - t;
  }
  await context.close();
  return out;
}

/** The replica's CPU time so far (user + system), in clock ticks. */
function cpuTicks(pid) {
  const fields = fs.readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1].split(" ");
  return Number(fields[11]) + Number(fields[12]);
}

/**
 * CONSOLES pages open on the Overview, live (each follows the watch), and
 * idle: the replica's CPU over IDLE_S seconds, as a share of one core.
 */
/** The replica's CPU over IDLE_S seconds, percent of one core. */
async function cpuOver(pid) {
  const before = cpuTicks(pid);
  await new Promise((r) => setTimeout(r, IDLE_S * 1000));
  return (100 * (cpuTicks(pid) - before)) / 100 / IDLE_S; // USER_HZ is 100 on Linux
}

async function idleCpu(browser, pid) {
  const contexts = [];
  for (let i = 0; i < CONSOLES; i++) {
    const context = await browser.newContext({ ignoreHTTPSErrors: true });
    const page = await context.newPage();
    await page.goto(URL);
    await page.locator("#token").fill(TOKEN);
    await page.keyboard.press("Enter");
    await page.locator("#live", { hasText: "● live" }).waitFor({ timeout: WAIT });
    contexts.push(context);
  }
  await new Promise((r) => setTimeout(r, 2000));
  const pct = await cpuOver(pid);
  for (const c of contexts) await c.close();
  return pct;
}

async function main() {
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium", args: ["--no-sandbox"] });
  const all = [];
  try {
    for (let i = 0; i < ROUNDS; i++) all.push(await round(browser));
    if (process.env.CONSOLE_PID) {
      const pid = Number(process.env.CONSOLE_PID);
      const alone = await cpuOver(pid);
      const pct = await idleCpu(browser, pid);
      console.log(`result: view=idle consoles=${CONSOLES} seconds=${IDLE_S} replica_cpu_percent=${pct.toFixed(2)} without_consoles=${alone.toFixed(2)}`);
    }
  } finally {
    await browser.close();
  }
  for (const k of Object.keys(all[0])) {
    const v = all.map((r) => r[k]).sort((a, b) => a - b);
    console.log(`result: view=${k} median_ms=${Math.round(v[Math.floor(v.length / 2)])} max_ms=${Math.round(v[v.length - 1])} rounds=${v.length}`);
  }
}

main().catch((e) => {
  console.error(e.stack || String(e));
  process.exit(1);
});
