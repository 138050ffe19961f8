// Shared by the tests: the runner under test, HS256 tokens, polling.
import { createHmac, randomBytes } from "node:crypto";

/** The runner `cmd/runner/typescript_client_test.go` started, if any. */
export const baseUrl = process.env.TASKLEASE_URL ?? "";
const secret = process.env.TASKLEASE_APP_SECRET ?? "";

/** Set on the tests that need a runner: they skip without one. */
export const needsRunner = baseUrl && secret ? {} : { skip: "TASKLEASE_URL and TASKLEASE_APP_SECRET unset (go test ./cmd/runner -run TestTypeScriptClient sets them)" };

const b64url = (b: Buffer | string) => Buffer.from(b).toString("base64url");

export interface Claims {
  sub: string;
  /** Seconds from now; default 300. Negative: already expired. */
  ttl?: number;
  tasklease_scopes?: string[];
  tasklease_actions?: string[];
}

/** Mints a subject token as docs/app-access.md describes (HS256 JWT). */
export function mint({ sub, ttl = 300, ...rest }: Claims, key = secret): string {
  const now = Math.floor(Date.now() / 1000);
  const h = b64url(JSON.stringify({ alg: "HS256", typ: "JWT" }));
  const c = b64url(JSON.stringify({ sub, iat: now, exp: now + ttl, ...rest }));
  const s = createHmac("sha256", key).update(`${h}.${c}`).digest("base64url");
  return `${h}.${c}.${s}`;
}

/** A subject no other test uses, e.g. `u-3f9a1c`; `prefix` picks the job's behaviour. */
export function subject(prefix = "u"): string {
  return `${prefix}-${randomBytes(4).toString("hex")}`;
}

/** Polls cond until it returns a truthy value, or fails after ms. */
export async function waitFor<T>(what: string, cond: () => T | Promise<T>, ms = 10_000): Promise<Exclude<T, false | null | undefined | "" | 0>> {
  const deadline = Date.now() + ms;
  let last: unknown;
  for (;;) {
    try {
      const v = await cond();
      if (v) return v as Exclude<T, false | null | undefined | "" | 0>;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms${last ? `: ${String(last)}` : ""}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** A fetch that records every URL, Authorization header and AbortSignal it sends. */
export function recordingFetch() {
  const calls: { url: string; auth: string | null; signal: AbortSignal | undefined }[] = [];
  const f: typeof fetch = (input, init) => {
    const url = typeof input === "string" ? input : input instanceof URL ? input.href : input.url;
    calls.push({ url, auth: new Headers(init?.headers).get("Authorization"), signal: init?.signal ?? undefined });
    return fetch(input, init);
  };
  return { fetch: f, calls };
}
