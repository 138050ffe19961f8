// The calls against a real runner (started by cmd/runner/typescript_client_test.go).
import { test } from "node:test";
import assert from "node:assert/strict";
import { TaskleaseError, createClient } from "../src/index.js";
import { baseUrl, mint, needsRunner, recordingFetch, subject, waitFor } from "./helpers.js";

const scope = "course_sync";

test("submit starts, a second submit joins, get, history", needsRunner, async () => {
  const s = subject();
  const c = createClient({ baseUrl, token: mint({ sub: s }) });
  const first = await c.submit(s, scope);
  assert.equal(first.outcome, "started");
  assert.equal(first.task.key, `${s}|${scope}`);
  assert.deepEqual(first.task.sources, ["manual"]);
  const second = await c.submit(s, scope, { source: "foreground" });
  assert.equal(second.outcome, "joined");
  assert.equal(second.task.runId, first.task.runId);

  const done = await waitFor("run done", async () => {
    const v = await c.get(s, scope);
    return v.status === "done" && v;
  });
  assert.deepEqual(done.completedStages, ["pulling", "pushing"]);
  assert.deepEqual([...done.sources].sort(), ["foreground", "manual"]);

  const events = await c.history(s, scope, { limit: 50 });
  const names = events.map((e) => e.event);
  assert.equal(names[0], "done", "newest first");
  assert.ok(names.includes("requested") && names.includes("joined"), names.join(","));
  assert.equal((await c.history(s, scope, { limit: 1 })).length, 1);
});

test("submit sends policy and delay; cancel a queued run", needsRunner, async () => {
  const s = subject();
  const c = createClient({ baseUrl, token: mint({ sub: s }) });
  const r = await c.submit(s, scope, { delay: "1h", policy: "join" });
  assert.equal(r.outcome, "started");
  assert.equal(r.task.status, "queued");
  assert.ok(r.task.notBefore, "delayed run has notBefore");
  assert.deepEqual(await c.cancel(s, scope), { outcome: "cancelled" });
  assert.equal((await c.get(s, scope)).status, "cancelled");
  assert.deepEqual(await c.cancel(s, scope), { outcome: "not_running" });
});

test("cancel a running run", needsRunner, async () => {
  const s = subject("slow");
  const c = createClient({ baseUrl, token: mint({ sub: s }) });
  await c.submit(s, scope);
  await waitFor("running", async () => (await c.get(s, scope)).status === "running");
  assert.deepEqual(await c.cancel(s, scope), { outcome: "cancelling" });
  await waitFor("cancelled", async () => (await c.get(s, scope)).status === "cancelled");
});

test("foreground submits the subject's foreground jobs", needsRunner, async () => {
  const s = subject();
  const c = createClient({ baseUrl, token: mint({ sub: s }) });
  const all = await c.foreground(s);
  assert.deepEqual(all.map((r) => [r.scope, r.outcome]), [["course_sync", "started"], ["message_sync", "started"]]);
  assert.ok(all.every((r) => r.task.sources.includes("foreground")));
  const one = await c.foreground(s, ["course_sync"]);
  assert.deepEqual(one.map((r) => [r.scope, r.outcome]), [["course_sync", "joined"]]);
});

test("subject and scope are URL-encoded", needsRunner, async () => {
  const s = "a@b.c:" + subject();
  const rec = recordingFetch();
  const c = createClient({ baseUrl, token: mint({ sub: s }), fetch: rec.fetch });
  assert.equal((await c.submit(s, scope)).task.subject, s);
  assert.ok(rec.calls[0]!.url.endsWith(`/v1/tasks/${encodeURIComponent(s)}/course_sync/runs`), rec.calls[0]!.url);
  // A subject with "/" must stay one path segment: the runner refuses it
  // as a subject (400), it is never read as another route.
  const err = await c.get("u42/x", scope).catch((e: unknown) => e);
  assert.ok(err instanceof TaskleaseError);
  assert.ok(err.status === 400 || err.status === 403, `${err.status} ${err.code}`);
});

test("typed errors: 403 for another subject, 401 for a bad token, 404 for an unknown scope", needsRunner, async () => {
  const c = createClient({ baseUrl, token: mint({ sub: "u42x" }) });
  const other = await c.get("u4x", scope).catch((e: unknown) => e);
  assert.ok(other instanceof TaskleaseError, String(other));
  assert.equal(other.status, 403);
  assert.equal(other.code, "forbidden");
  assert.ok(other.message.length > 0);

  const bad = createClient({ baseUrl, token: mint({ sub: "u42x" }, "not-the-secret-not-the-secret-xx") });
  const e401 = await bad.submit("u42x", scope).catch((e: unknown) => e);
  assert.ok(e401 instanceof TaskleaseError);
  assert.equal(e401.status, 401);
  assert.equal(e401.code, "unauthorized");

  const readOnly = createClient({ baseUrl, token: mint({ sub: "u42x", tasklease_actions: ["read"] }) });
  const e403 = await readOnly.submit("u42x", scope).catch((e: unknown) => e);
  assert.ok(e403 instanceof TaskleaseError && e403.status === 403 && e403.code === "forbidden");

  const e404 = await c.get("u42x", "no_such_job").catch((e: unknown) => e);
  assert.ok(e404 instanceof TaskleaseError && e404.status === 404 && e404.code === "not_found");
});

test("a token function: an expired token is refreshed once on 401, and the call retried once", needsRunner, async () => {
  const s = subject();
  const tokens = [mint({ sub: s, ttl: -120 }), mint({ sub: s })];
  let asked = 0;
  const rec = recordingFetch();
  const c = createClient({ baseUrl, fetch: rec.fetch, token: () => tokens[asked++]! });
  assert.equal((await c.submit(s, scope)).outcome, "started");
  assert.equal(asked, 2, "token function called twice: first token, then one refresh");
  assert.equal(rec.calls.length, 2, "one retry");
  assert.deepEqual(rec.calls.map((x) => x.auth), tokens.map((t) => `Bearer ${t}`));
  // The fresh token is kept: no more refreshes, one request per call.
  await c.get(s, scope);
  assert.equal(asked, 2);
  assert.equal(rec.calls.length, 3);
  for (const call of rec.calls) assert.ok(!call.url.includes(tokens[1]!) && !call.url.includes("access_token"), "token never in the URL");
});

test("a token function that keeps giving bad tokens: one retry, then the 401", needsRunner, async () => {
  let asked = 0;
  const rec = recordingFetch();
  const c = createClient({ baseUrl, fetch: rec.fetch, token: () => (asked++, mint({ sub: "u42y", ttl: -120 })) });
  const err = await c.get("u42y", scope).catch((e: unknown) => e);
  assert.ok(err instanceof TaskleaseError && err.status === 401);
  assert.equal(asked, 2);
  assert.equal(rec.calls.length, 2);
});

test("a static token is not retried on 401", needsRunner, async () => {
  const rec = recordingFetch();
  const c = createClient({ baseUrl, fetch: rec.fetch, token: mint({ sub: "u42z", ttl: -120 }) });
  await assert.rejects(c.get("u42z", scope), (e: unknown) => e instanceof TaskleaseError && e.status === 401);
  assert.equal(rec.calls.length, 1);
});
