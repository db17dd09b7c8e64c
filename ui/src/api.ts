// The REST API, as the console calls it: same origin, bearer token from
// sessionStorage (never a URL, never localStorage), errors as the API
// words them.

const TOKEN = "lodestar.token";
const MEMBERS = "lodestar.members";

// Where API calls go: "" is the replica that served the page; after a
// failover, another member's origin (the server's CSP and CORS allow the
// members' origins, and only those).
let base = "";

export function origin(): string {
  return base || location.origin;
}

/** The members' API origins, in order: where to fail over to. */
export function learnMembers(apiAddrs: string[]): void {
  sessionStorage.setItem(MEMBERS, JSON.stringify(apiAddrs.map((a) => `${location.protocol}//${a}`)));
}

function members(): string[] {
  return JSON.parse(sessionStorage.getItem(MEMBERS) ?? "[]") as string[];
}

let failedOver: (from: string, to: string) => void = () => {};
export function onFailover(f: (from: string, to: string) => void): void {
  failedOver = f;
}

let switching: Promise<boolean> | null = null;

/**
 * A request to the replica in use failed: keep it if it still answers (a
 * blip: a network change, a connection reset), else use the first other
 * member that is ready. Tries for up to 10 s (an election after losing
 * the leader takes a few seconds); false if none answers.
 */
function failover(): Promise<boolean> {
  switching ??= (async () => {
    const from = origin();
    for (let round = 0; round < 10; round++) {
      for (const m of [from, ...members().filter((m) => m !== from)]) {
        try {
          const r = await fetch(`${m}/readyz`, { cache: "no-store", signal: AbortSignal.timeout(2000) });
          if (r.ok) {
            if (m === from) return true;
            base = m === location.origin ? "" : m;
            failedOver(from, m);
            return true;
          }
        } catch {
          // Not this one.
        }
      }
      await new Promise((res) => setTimeout(res, 1000));
    }
    return false;
  })().finally(() => (switching = null));
  return switching;
}

export function token(): string | null {
  return sessionStorage.getItem(TOKEN);
}

export function setToken(t: string | null): void {
  if (t === null) sessionStorage.removeItem(TOKEN);
  else sessionStorage.setItem(TOKEN, t);
}

/** A refused or failed request: the HTTP status and the API's message. */
export class ApiError extends Error {
  constructor(public status: number, message: string) {
    super(message);
  }
  /** What the user reads: why, in the API's words, with the status. */
  explain(): string {
    const what: Record<number, string> = {
      400: "Invalid request",
      401: "Not signed in or the token is not valid",
      403: "Permission denied",
      404: "Not found",
      409: "Conflict",
      410: "Gone",
      503: "Unavailable",
    };
    return `${what[this.status] ?? "Error"} (${this.status}): ${this.message}`;
  }
}

interface ErrorBody {
  error?: { code?: string; message?: string; fields?: { field: string; reason: string }[] };
}

let unauthorized: (why: string) => void = () => {};
export function onUnauthorized(f: (why: string) => void): void {
  unauthorized = f;
}

function headers(body?: { yaml: boolean }, message?: string): Record<string, string> {
  const h: Record<string, string> = {};
  const t = token();
  if (t) h["Authorization"] = `Bearer ${t}`;
  if (body) h["Content-Type"] = body.yaml ? "application/yaml" : "application/json";
  if (message) h["X-Lodestar-Message"] = message;
  return h;
}

export interface CallOptions {
  method?: string;
  body?: string;
  yaml?: boolean;
  /** Error statuses whose body is the answer (`/v1/wait`'s 409 and 503). */
  accept?: number[];
  /** The change message of a write (History shows it). */
  message?: string;
  /** Writes nothing (a validate, a dry run): asked again of the next
   * member when the replica in use stops answering, as a GET is. */
  readOnly?: boolean;
}

export async function api<T>(path: string, o: CallOptions = {}): Promise<T> {
  const init: RequestInit = {
    method: o.method ?? (o.body === undefined ? "GET" : "POST"),
    headers: headers(o.body === undefined ? undefined : { yaml: o.yaml ?? false }, o.message),
    body: o.body,
    cache: "no-store",
  };
  let r: Response;
  try {
    r = await fetch(base + path, init);
  } catch (e) {
    const moved = await failover();
    // A read is asked again of the member now in use; a write is not
    // (it may have been applied: History says).
    if (!moved || !(o.readOnly ?? init.method === "GET")) {
      throw new ApiError(0, `${moved ? "the replica stopped answering during this write; see History for whether it was applied" : "no member of the cluster answers"} (${String(e)})`);
    }
    try {
      r = await fetch(base + path, init);
    } catch (e2) {
      throw new ApiError(0, `the replica did not answer (${String(e2)})`);
    }
  }
  const text = await r.text();
  let body: unknown = text;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    // Not JSON: keep the text.
  }
  if (!r.ok && !o.accept?.includes(r.status)) {
    const e = (body as ErrorBody | null)?.error;
    let message = e?.message ?? (typeof body === "string" && body ? body : r.statusText);
    if (e?.fields?.length && !e.fields.every((f) => message.includes(f.reason))) message += ` [${e.fields.map((f) => `${f.field}: ${f.reason}`).join("; ")}]`;
    if (r.status === 401) unauthorized(message);
    throw new ApiError(r.status, message);
  }
  return body as T;
}

/**
 * The same request to every other member (a dry run's proxies are those
 * connected to the replica asked): each member's answer, or why it gave
 * none. No failover: a member that does not answer is reported.
 */
export async function apiEverywhere<T>(path: string, o: CallOptions): Promise<{ from: string; answer?: T; error?: string }[]> {
  const others = members().filter((m) => m !== origin());
  return Promise.all(
    others.map(async (m) => {
      try {
        const r = await fetch(m + path, { method: "POST", headers: headers({ yaml: o.yaml ?? false }), body: o.body, cache: "no-store", signal: AbortSignal.timeout(10000) });
        if (!r.ok) return { from: m, error: `HTTP ${r.status}` };
        return { from: m, answer: (await r.json()) as T };
      } catch (e) {
        return { from: m, error: String(e) };
      }
    }),
  );
}

/** A refused request's error, in the API's words. */
async function refusal(r: Response): Promise<ApiError> {
  return new ApiError(r.status, ((await r.json().catch(() => null)) as ErrorBody | null)?.error?.message ?? r.statusText);
}

/**
 * A GET to one member's API (not failed over: a member that does not
 * answer is the answer).
 */
export async function apiAt<T>(member: string, path: string): Promise<T> {
  const r = await fetch(member + path, { headers: headers(), cache: "no-store", signal: AbortSignal.timeout(10000) });
  if (!r.ok) throw await refusal(r);
  return (await r.json()) as T;
}

/** Each line of an NDJSON body, parsed, until the body ends. */
async function lines<T>(body: ReadableStream<Uint8Array>, onLine: (v: T) => void): Promise<void> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true });
    let nl: number;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl).trim();
      buf = buf.slice(nl + 1);
      if (line) onLine(JSON.parse(line) as T);
    }
  }
}

/** A GET whose answer is NDJSON: `onLine` for each line, until it ends. */
export async function apiStream<T>(path: string, onLine: (v: T) => void): Promise<void> {
  const r = await fetch(base + path, { headers: headers(), cache: "no-store" });
  if (!r.ok || !r.body) throw await refusal(r);
  await lines(r.body, onLine);
}

export interface WatchEvent {
  revision?: number;
  type?: string;
  object?: { kind?: string; metadata?: { name?: string; namespace?: string } };
  error?: { code: string; message: string };
}

/**
 * Follow `/v1/watch` (NDJSON over one long response): `onEvent` for every
 * change from now on, `onState` when the stream opens or ends. Reconnects
 * (at most every 5 s) while signed in; the returned function stops it.
 */
export function watch(onEvent: (e: WatchEvent) => void, onState: (up: boolean, why: string) => void): () => void {
  let stopped = false;
  const ctl = new AbortController();
  const run = async (): Promise<void> => {
    while (!stopped && token()) {
      try {
        const r = await fetch(`${base}/v1/watch`, { headers: headers(), signal: ctl.signal, cache: "no-store" });
        if (!r.ok || !r.body) {
          const why = await refusal(r);
          onState(false, why.explain());
          return; // a refusal does not change by retrying
        }
        onState(true, "live");
        await lines(r.body, onEvent);
        onState(false, "the replica ended the watch; reconnecting");
      } catch (e) {
        if (stopped) return;
        onState(false, `watch interrupted (${String(e)}); reconnecting`);
        // The replica went away: follow the changes on another member.
        if (await failover()) continue;
      }
      await new Promise((res) => setTimeout(res, 5000));
    }
  };
  void run();
  return () => {
    stopped = true;
    ctl.abort();
  };
}
