// watch() against a real runner.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createClient } from "../src/index.js";
import type { TaskView, WatchStatus } from "../src/index.js";
import { baseUrl, mint, needsRunner, recordingFetch, subject, waitFor } from "./helpers.js";

const scope = "course_sync";

/** Collects what a watch delivers. */
function collector() {
  const views: TaskView[] = [];
  const statuses: WatchStatus[] = [];
  const errors: [unknown, boolean][] = [];
  return {
    views,
    statuses,
    errors,
    onView: (v: TaskView) => void views.push(v),
    opts: { onStatus: (s: WatchStatus) => void statuses.push(s), onError: (e: unknown, retry: boolean) => void errors.push([e, retry]) },
    last: (sc = scope) => views.filter((v) => v.scope === sc).at(-1),
  };
}

test("watch: the current state on connect, then live changes through the stages to done", needsRunner, async () => {
  const s = subject();
  const c = createClient({ baseUrl, token: mint({ sub: s }) });
  // A finished message_sync run exists before the watch: it must be replayed.
  await c.submit(s, "message_sync");
  await waitFor("message_sync done", async () => (await c.get(s, "message_sync")).status === "done");

  const col = collector();
  const w = c.watch(s, col.onView, col.opts);
  try {
    await waitFor("replayed state", () => col.last("message_sync")?.status === "done");
    await waitFor("open", () => col.statuses.includes("open"));
    const r = await c.submit(s, scope);
    await waitFor("done view", () => col.last()?.status === "done" && col.last()?.runId === r.task.runId);
    const seen = col.views.filter((v) => v.scope === scope);
    assert.ok(seen.some((v) => v.status === "running" && v.stage === "pulling"), "saw pulling");
    assert.ok(seen.some((v) => v.status === "running" && v.stage === "pushing"), "saw pushing");
    assert.deepEqual(col.last()!.completedStages, ["pulling", "pushing"]);
    assert.ok(col.views.every((v) => v.subject === s));
    assert.deepEqual(col.errors, []);
  } finally {
    w.close();
  }
  await waitFor("closed", () => col.statuses.at(-1) === "closed");
  assert.deepEqual(col.statuses, ["connecting", "open", "closed"]);
});

test("watch: a failing subject ends failed", needsRunner, async () => {
  const s = subject("fail");
  const c = createClient({ baseUrl, token: mint({ sub: s }) });
  const col = collector();
  const w = c.watch(s, col.onView, { ...col.opts, scope });
  try {
    await waitFor("open", () => col.statuses.includes("open"));
    await c.submit(s, scope);
    const failed = await waitFor("failed view", () => col.last()?.status === "failed" && col.last());
    assert.match(failed.lastError, /exit/);
    assert.equal(failed.attempt, 1);
    assert.equal(failed.maxAttempts, 1);
  } finally {
    w.close();
  }
});

test("watch: the stream of u42 never delivers u4's views", needsRunner, async () => {
  const c42 = createClient({ baseUrl, token: mint({ sub: "u42" }) });
  const c4 = createClient({ baseUrl, token: mint({ sub: "u4" }) });
  const col = collector();
  const w = c42.watch("u42", col.onView, col.opts);
  try {
    await waitFor("open", () => col.statuses.includes("open"));
    // u4's run first, then u42's: once u42's run is done, u4's events
    // (published before it) would have arrived too.
    await c4.submit("u4", scope);
    await waitFor("u4 done", async () => (await c4.get("u4", scope)).status === "done");
    const r = await c42.submit("u42", scope, { policy: "queue" });
    await waitFor("u42 done", () => col.views.some((v) => v.runId === (r.runId ?? r.task.runId) && v.status === "done"));
    assert.ok(col.views.length > 0);
    assert.deepEqual(col.views.filter((v) => v.subject !== "u42"), []);
  } finally {
    w.close();
  }
});

test("watch: reconnects with a fresh token when the stream ends at expiry, and misses nothing", needsRunner, async () => {
  const s = subject();
  const operator = createClient({ baseUrl, token: mint({ sub: s }) });
  let asked = 0;
  let submitted: string | undefined;
  const token = async () => {
    asked++;
    if (asked === 2) {
      // The stream has ended. A whole run happens before the watcher has
      // a token again: only the state replayed on connect can show it.
      const r = await operator.submit(s, scope);
      submitted = r.task.runId;
      await waitFor("run done while disconnected", async () => (await operator.get(s, scope)).status === "done");
    }
    // The first token ends its stream in 1-2 s (exp is in whole seconds).
    return mint({ sub: s, ttl: asked === 1 ? 2 : 300 });
  };
  const rec = recordingFetch();
  const c = createClient({ baseUrl, token, fetch: rec.fetch });
  const col = collector();
  const w = c.watch(s, col.onView, col.opts);
  try {
    await waitFor("first open", () => col.statuses.includes("open"));
    assert.equal(col.views.length, 0, "nothing ran yet");
    const done = await waitFor("done view after reconnect", () => col.views.find((v) => v.status === "done"), 15_000);
    assert.equal(done.runId, submitted);
    assert.ok(!col.views.some((v) => v.status === "running"), "the run happened while disconnected");
    assert.deepEqual(col.statuses, ["connecting", "open", "reconnecting", "open"]);
    assert.equal(asked, 2);
    const streams = rec.calls.filter((x) => x.url.endsWith("/events"));
    assert.equal(streams.length, 2);
    assert.notEqual(streams[0]!.auth, streams[1]!.auth, "the second connect used the fresh token");
    assert.deepEqual(col.errors, []);
  } finally {
    w.close();
  }
});

test("watch: an AbortSignal stops it, and a closed watch delivers nothing more", needsRunner, async () => {
  const s = subject();
  const c = createClient({ baseUrl, token: mint({ sub: s }) });
  const ac = new AbortController();
  const col = collector();
  c.watch(s, col.onView, { ...col.opts, signal: ac.signal });
  await waitFor("open", () => col.statuses.includes("open"));
  ac.abort();
  await waitFor("closed", () => col.statuses.at(-1) === "closed");
  await c.submit(s, scope);
  await waitFor("done", async () => (await c.get(s, scope)).status === "done");
  assert.deepEqual(col.views, []);
  assert.deepEqual(col.errors, []);
});

test("watch: 403 for another subject ends the watch without reconnecting", needsRunner, async () => {
  const rec = recordingFetch();
  const c = createClient({ baseUrl, token: mint({ sub: "u42w" }), fetch: rec.fetch });
  const col = collector();
  c.watch("u4w", col.onView, col.opts);
  await waitFor("closed", () => col.statuses.at(-1) === "closed");
  assert.equal(col.errors.length, 1);
  const [err, willRetry] = col.errors[0]!;
  assert.equal(willRetry, false);
  assert.equal((err as { status: number }).status, 403);
  assert.equal(rec.calls.length, 1);
});
