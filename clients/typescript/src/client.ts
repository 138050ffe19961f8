import { TaskleaseError, errorFromResponse } from "./errors.js";
import { createSSEParser } from "./sse.js";
import type {
  CancelResponse,
  ForegroundRequest,
  ForegroundResponse,
  ForegroundResult,
  HistoryEvent,
  HistoryResponse,
  Policy,
  Source,
  SubmitRequest,
  SubmitResponse,
  TaskView,
} from "./types.js";

/**
 * A bearer token, or a function that returns a fresh one. A function is
 * called when the client first needs a token, and again only when the
 * runner refused the one it has (401) or a watch stream ended (a subject
 * token's stream ends when the token expires): it should mint or fetch a new
 * token each time it is called.
 */
export type TokenSource = string | (() => string | Promise<string>);

export interface ClientOptions {
  /** The runner's base URL, e.g. `https://tasks.example.com` (no `/v1`). */
  baseUrl: string;
  /** Sent as `Authorization: Bearer …`, never in a URL. */
  token?: TokenSource;
  /** A fetch implementation; default the global `fetch`. */
  fetch?: typeof fetch;
}

export interface SubmitOptions {
  /** Why the run is requested; default `manual`. */
  source?: Source;
  /** What to do when a run is active; default the job's policy. */
  policy?: Policy;
  /** A Go duration such as `90s` or `5m`: the run waits that long. */
  delay?: string;
  /** Not started before this time. */
  notBefore?: Date | string;
  /** The fair-share group of the run this request starts. */
  group?: string;
  signal?: AbortSignal;
}

export interface CallOptions {
  signal?: AbortSignal;
}

export interface HistoryOptions extends CallOptions {
  /** At most this many events (the runner's default is 50). */
  limit?: number;
}

export type WatchStatus = "connecting" | "open" | "reconnecting" | "closed";

export interface WatchOptions {
  /** Aborting it closes the watch, like `close()`. */
  signal?: AbortSignal;
  /** Deliver only this scope's views (the stream itself is per subject). */
  scope?: string;
  onStatus?: (status: WatchStatus) => void;
  /**
   * Every error of the stream. `willRetry` false means the watch has ended
   * (403, 400, 404, or 401 even with a fresh token) and status is `closed`.
   */
  onError?: (error: unknown, willRetry: boolean) => void;
  /** Reconnect delay before the runner says (`retry:`); default 1000 ms. */
  initialDelayMs?: number;
  /** The longest reconnect delay; default 30 000 ms. */
  maxDelayMs?: number;
}

/** A running watch; `close()` stops it for good (idempotent). */
export interface Watch {
  close(): void;
}

export interface TaskleaseClient {
  readonly baseUrl: string;
  /** POST /v1/tasks/{subject}/{scope}/runs: `{outcome, task}`. */
  submit(subject: string, scope: string, opts?: SubmitOptions): Promise<SubmitResponse>;
  /** GET /v1/tasks/{subject}/{scope}; 404 `not_found` when it never ran. */
  get(subject: string, scope: string, opts?: CallOptions): Promise<TaskView>;
  /** POST /v1/tasks/{subject}/{scope}/cancel: `{outcome}`. */
  cancel(subject: string, scope: string, opts?: CallOptions): Promise<CancelResponse>;
  /** GET /v1/tasks/{subject}/{scope}/history: the events, newest first. */
  history(subject: string, scope: string, opts?: HistoryOptions): Promise<HistoryEvent[]>;
  /** POST /v1/hooks/foreground: one result per scope. */
  foreground(subject: string, scopes?: string[], opts?: CallOptions): Promise<ForegroundResult[]>;
  /**
   * GET /v1/subjects/{subject}/events, kept open: `onView` gets the
   * subject's current state on every (re)connect, then every change.
   */
  watch(subject: string, onView: (view: TaskView) => void, opts?: WatchOptions): Watch;
}

const seg = encodeURIComponent;

/** Creates a client; it holds no connection until a call or a watch. */
export function createClient(options: ClientOptions): TaskleaseClient {
  const baseUrl = options.baseUrl.replace(/\/+$/, "");
  const doFetch: typeof fetch = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
  const tokens = tokenCache(options.token);

  // request sends one request; on a 401 with a token function it gets a
  // fresh token and tries once more.
  async function request(method: string, path: string, body: unknown, signal?: AbortSignal): Promise<Response> {
    const send = async (token: string | undefined): Promise<Response> => {
      const headers: Record<string, string> = { Accept: "application/json" };
      if (token) headers.Authorization = `Bearer ${token}`;
      const init: RequestInit = { method, headers };
      if (body !== undefined) {
        headers["Content-Type"] = "application/json";
        init.body = JSON.stringify(body);
      }
      if (signal) init.signal = signal;
      return doFetch(baseUrl + path, init);
    };
    const token = await tokens.current();
    let res = await send(token);
    if (res.status === 401 && tokens.refreshable) {
      await res.body?.cancel();
      res = await send(await tokens.refresh(token));
    }
    return res;
  }

  async function json<T>(method: string, path: string, body?: unknown, signal?: AbortSignal): Promise<T> {
    const res = await request(method, path, body, signal);
    if (!res.ok) throw await errorFromResponse(res);
    return (await res.json()) as T;
  }

  const taskPath = (subject: string, scope: string) => `/v1/tasks/${seg(subject)}/${seg(scope)}`;

  return {
    baseUrl,
    submit(subject, scope, opts = {}) {
      const body: SubmitRequest = { source: opts.source ?? "manual" };
      if (opts.policy) body.policy = opts.policy;
      if (opts.delay) body.delay = opts.delay;
      if (opts.notBefore) {
        body.notBefore = opts.notBefore instanceof Date ? opts.notBefore.toISOString() : opts.notBefore;
      }
      if (opts.group) body.group = opts.group;
      return json<SubmitResponse>("POST", taskPath(subject, scope) + "/runs", body, opts.signal);
    },
    get(subject, scope, opts = {}) {
      return json<TaskView>("GET", taskPath(subject, scope), undefined, opts.signal);
    },
    cancel(subject, scope, opts = {}) {
      return json<CancelResponse>("POST", taskPath(subject, scope) + "/cancel", undefined, opts.signal);
    },
    async history(subject, scope, opts = {}) {
      const q = opts.limit !== undefined ? `?limit=${seg(String(opts.limit))}` : "";
      const r = await json<HistoryResponse>("GET", taskPath(subject, scope) + "/history" + q, undefined, opts.signal);
      return r.events;
    },
    async foreground(subject, scopes, opts = {}) {
      const body: ForegroundRequest = { subject };
      if (scopes) body.scopes = scopes;
      const r = await json<ForegroundResponse>("POST", "/v1/hooks/foreground", body, opts.signal);
      return r.results;
    },
    watch(subject, onView, opts = {}) {
      return startWatch({ baseUrl, doFetch, tokens }, subject, onView, opts);
    },
  };
}

interface TokenCache {
  readonly refreshable: boolean;
  current(): Promise<string | undefined>;
  /** A token other than `stale`: fetched once however many callers ask. */
  refresh(stale: string | undefined): Promise<string | undefined>;
}

function tokenCache(source: TokenSource | undefined): TokenCache {
  if (typeof source !== "function") {
    return { refreshable: false, current: async () => source, refresh: async () => source };
  }
  let cached: Promise<string> | undefined;
  let cachedValue: string | undefined;
  const fetchNew = (): Promise<string> => {
    const p = Promise.resolve().then(source);
    cached = p;
    p.then(
      (v) => {
        if (cached === p) cachedValue = v;
      },
      () => {
        // A failed fetch is not kept: the next caller tries again.
        if (cached === p) cached = undefined;
      },
    );
    return p;
  };
  return {
    refreshable: true,
    current: () => cached ?? fetchNew(),
    refresh(stale) {
      // Calls that failed with the same token share one refresh; one that
      // failed with an older token gets the newer one already fetched.
      if (cached && cachedValue !== stale) return cached;
      if (cached && cachedValue === undefined) return cached;
      return fetchNew();
    },
  };
}

interface WatchDeps {
  baseUrl: string;
  doFetch: typeof fetch;
  tokens: TokenCache;
}

/** The reconnect delay's base before the runner sends `retry:`. */
const defaultInitialDelayMs = 1000;
const defaultMaxDelayMs = 30_000;

function startWatch(deps: WatchDeps, subject: string, onView: (v: TaskView) => void, opts: WatchOptions): Watch {
  const ctrl = new AbortController();
  const { signal } = ctrl;
  const onAbort = () => ctrl.abort();
  if (opts.signal) {
    if (opts.signal.aborted) ctrl.abort();
    else opts.signal.addEventListener("abort", onAbort, { once: true });
  }
  const maxDelay = opts.maxDelayMs ?? defaultMaxDelayMs;
  let baseDelay = opts.initialDelayMs ?? defaultInitialDelayMs;
  let status: WatchStatus | undefined;
  const setStatus = (s: WatchStatus) => {
    if (s === status) return;
    status = s;
    opts.onStatus?.(s);
  };
  const url = `${deps.baseUrl}/v1/subjects/${seg(subject)}/events`;

  // Waits ms, or less if the watch is closed meanwhile.
  const pause = (ms: number) =>
    new Promise<void>((resolve) => {
      if (signal.aborted) return resolve();
      const t = setTimeout(done, ms);
      function done() {
        clearTimeout(t);
        signal.removeEventListener("abort", done);
        resolve();
      }
      signal.addEventListener("abort", done, { once: true });
    });

  async function loop(): Promise<void> {
    let failures = 0; // consecutive attempts that ended in an error
    let refreshNext = false; // get a new token before the next connect
    setStatus("connecting");
    while (!signal.aborted) {
      let waitAtLeast = 0;
      let tokenExpired = false;
      try {
        let token = await (refreshNext ? deps.tokens.refresh(await deps.tokens.current()) : deps.tokens.current());
        refreshNext = false;
        const connect = (t: string | undefined) =>
          deps.doFetch(url, {
            headers: t ? { Accept: "text/event-stream", Authorization: `Bearer ${t}` } : { Accept: "text/event-stream" },
            signal,
          });
        let res = await connect(token);
        if (res.status === 401 && deps.tokens.refreshable) {
          await res.body?.cancel();
          token = await deps.tokens.refresh(token);
          res = await connect(token);
        }
        if (!res.ok || !res.body) {
          const err = res.ok ? new TaskleaseError(res.status, `http_${res.status}`, "no response body") : await errorFromResponse(res);
          // 5xx (503 too_many_clients and unavailable among them) is the
          // runner's trouble and passes; any 4xx is ours and will not.
          if (err.status < 500 && res.ok === false) {
            opts.onError?.(err, false);
            break;
          }
          opts.onError?.(err, true);
          failures++;
          if (err.retryAfter !== undefined) waitAtLeast = err.retryAfter * 1000;
        } else {
          setStatus("open");
          failures = 0;
          const parser = createSSEParser({
            onMessage(m) {
              if (m.event !== "task") return;
              let view: TaskView;
              try {
                view = JSON.parse(m.data) as TaskView;
              } catch (e) {
                opts.onError?.(e, true);
                return;
              }
              if (opts.scope !== undefined && view.scope !== opts.scope) return;
              onView(view);
            },
            onComment(text) {
              if (text === "token expired") tokenExpired = true;
            },
            onRetry(ms) {
              baseDelay = ms;
            },
          });
          // TextDecoder with stream: a UTF-8 sequence split across chunks
          // is held back until it is whole (and a BOM is dropped).
          const decoder = new TextDecoder();
          const reader = res.body.getReader();
          for (;;) {
            const { done, value } = await reader.read();
            if (done) break;
            parser.feed(decoder.decode(value, { stream: true }));
          }
          // The runner ended the stream: the token expired, or the runner
          // is shutting down. Either way a fresh token does no harm.
          refreshNext = deps.tokens.refreshable;
        }
      } catch (err) {
        if (signal.aborted) break;
        opts.onError?.(err, true);
        failures++;
      }
      if (signal.aborted) break;
      setStatus("reconnecting");
      // After a token's expiry the state is replayed on connect: reconnect
      // at once. Otherwise the runner's retry, doubled per failure, jittered.
      if (!tokenExpired || failures > 0) {
        await pause(Math.max(waitAtLeast, backoff(baseDelay, failures, maxDelay)));
      }
    }
    opts.signal?.removeEventListener("abort", onAbort);
    setStatus("closed");
  }

  void loop();
  return {
    close() {
      ctrl.abort();
    },
  };
}

/**
 * "Equal jitter": half the exponential delay fixed, half random, so a fleet
 * of clients cut off together does not come back together.
 */
export function backoff(baseMs: number, failures: number, maxMs: number, random = Math.random): number {
  const d = Math.min(maxMs, baseMs * 2 ** Math.min(failures, 20));
  return d / 2 + random() * (d / 2);
}
