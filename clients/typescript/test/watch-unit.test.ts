// watch()'s reconnect rules, with a scripted fetch (no runner needed).
import { test } from "node:test";
import assert from "node:assert/strict";
import { backoff, createClient } from "../src/index.js";
import type { WatchStatus } from "../src/index.js";
import { waitFor } from "./helpers.js";

type Answer = () => Response | Promise<Response>;

/** A fetch that answers with answers[i] for the i-th call and records when each came. */
function scripted(answers: Answer[]) {
  const calls: { at: number; auth: string | null; url: string }[] = [];
  const f: typeof fetch = async (input, init) => {
    calls.push({ at: Date.now(), auth: new Headers(init?.headers).get("Authorization"), url: String(input) });
    const a = answers[calls.length - 1];
    if (!a) return new Promise<Response>((_, reject) => init?.signal?.addEventListener("abort", () => reject(new Error("aborted"))));
    return a();
  };
  return { fetch: f, calls };
}

const json = (status: number, code: string, headers: Record<string, string> = {}) => () =>
  new Response(JSON.stringify({ error: { code, message: code } }), { status, headers: { "Content-Type": "application/json", ...headers } });

const stream = (text: string) => () => new Response(text, { status: 200, headers: { "Content-Type": "text/event-stream" } });

const view = (status: string) => JSON.stringify({ key: "u1|course_sync", subject: "u1", scope: "course_sync", status });

test("503 too_many_clients: waits Retry-After before the next attempt", async () => {
  const f = scripted([json(503, "too_many_clients", { "Retry-After": "1" }), stream(`retry: 10\n\nevent: task\ndata: ${view("done")}\n\n`)]);
  const c = createClient({ baseUrl: "http://127.0.0.1:9", token: "t", fetch: f.fetch });
  const seen: string[] = [];
  const errors: [unknown, boolean][] = [];
  const w = c.watch("u1", (v) => seen.push(v.status), { initialDelayMs: 10, onError: (e, r) => errors.push([e, r]) });
  try {
    await waitFor("view after 503", () => seen.length === 1, 5000);
    assert.ok(f.calls[1]!.at - f.calls[0]!.at >= 990, `retried after ${f.calls[1]!.at - f.calls[0]!.at} ms`);
    assert.equal((errors[0]![0] as { code: string }).code, "too_many_clients");
    assert.equal(errors[0]![1], true);
  } finally {
    w.close();
  }
});

test("EOF and network errors reconnect with growing delays; only event: task is delivered", async () => {
  const f = scripted([
    stream(`retry: 50\n\nevent: other\ndata: {}\n\ndata: ${view("queued")}\n\nevent: task\ndata: ${view("running")}\n\n`),
    () => Promise.reject(new TypeError("fetch failed")),
    () => Promise.reject(new TypeError("fetch failed")),
    stream(`event: task\ndata: ${view("done")}\n\n`),
  ]);
  const c = createClient({ baseUrl: "http://127.0.0.1:9", token: "t", fetch: f.fetch });
  const seen: string[] = [];
  const statuses: WatchStatus[] = [];
  const w = c.watch("u1", (v) => seen.push(v.status), { onStatus: (s) => statuses.push(s), initialDelayMs: 5000 });
  try {
    await waitFor("second stream", () => seen.length === 2, 5000);
    assert.deepEqual(seen, ["running", "done"]);
    // (The last stream ends too, so "reconnecting" may follow.)
    assert.deepEqual(statuses.slice(0, 4), ["connecting", "open", "reconnecting", "open"]);
    // The runner's retry (50 ms) is the base, not initialDelayMs; a failed
    // connect doubles it: gaps of [25,50], [50,100], [100,200] ms.
    const gaps = f.calls.slice(1).map((c, i) => c.at - f.calls[i]!.at);
    assert.ok(gaps[0]! >= 20 && gaps[0]! < 1000, `gaps ${gaps}`);
    assert.ok(gaps[1]! >= 45, `gaps ${gaps}`);
    assert.ok(gaps[2]! >= 95, `gaps ${gaps}`);
  } finally {
    w.close();
  }
});

test("401 with a token function: one refresh, then 401 again ends the watch", async () => {
  const f = scripted([json(401, "unauthorized"), json(401, "unauthorized")]);
  let n = 0;
  const c = createClient({ baseUrl: "http://127.0.0.1:9", token: () => `t${++n}`, fetch: f.fetch });
  const errors: [unknown, boolean][] = [];
  const statuses: WatchStatus[] = [];
  c.watch("u1", () => {}, { onError: (e, r) => errors.push([e, r]), onStatus: (s) => statuses.push(s) });
  await waitFor("closed", () => statuses.at(-1) === "closed");
  assert.deepEqual(f.calls.map((x) => x.auth), ["Bearer t1", "Bearer t2"]);
  assert.equal(errors.length, 1);
  assert.equal(errors[0]![1], false);
  assert.equal((errors[0]![0] as { status: number }).status, 401);
  assert.ok(f.calls.every((x) => x.url === "http://127.0.0.1:9/v1/subjects/u1/events"), "token never in the URL");
});

test("a 5xx without Retry-After is retried; close() during the wait stops at once", async () => {
  const f = scripted([json(503, "unavailable")]);
  const c = createClient({ baseUrl: "http://127.0.0.1:9", token: "t", fetch: f.fetch });
  const statuses: WatchStatus[] = [];
  const w = c.watch("u1", () => {}, { onStatus: (s) => statuses.push(s), initialDelayMs: 60_000 });
  await waitFor("reconnecting", () => statuses.at(-1) === "reconnecting");
  const t0 = Date.now();
  w.close();
  await waitFor("closed", () => statuses.at(-1) === "closed");
  assert.ok(Date.now() - t0 < 1000);
  assert.equal(f.calls.length, 1);
});

test("backoff: exponential from the base, jittered in [d/2, d], capped", () => {
  assert.equal(backoff(2000, 0, 30_000, () => 0), 1000);
  assert.equal(backoff(2000, 0, 30_000, () => 1), 2000);
  assert.equal(backoff(2000, 3, 30_000, () => 1), 16_000);
  assert.equal(backoff(2000, 10, 30_000, () => 1), 30_000);
  assert.equal(backoff(2000, 10, 30_000, () => 0), 15_000);
});
