// useTask in a real react-dom root, on happy-dom, against a real runner.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { Window } from "happy-dom";
import { StrictMode, createElement, useEffect } from "react";
import type { Root } from "react-dom/client";
import { createClient } from "../src/index.js";
import type { SubmitResponse, TaskleaseClient } from "../src/index.js";
import { TaskleaseProvider, useTask } from "../src/react.js";
import type { UseTaskResult } from "../src/react.js";
import { baseUrl, mint, needsRunner, recordingFetch, subject, waitFor } from "./helpers.js";

let window: Window;
let createRoot: (typeof import("react-dom/client"))["createRoot"];

before(async () => {
  // react-dom reads window and document from the global scope. Node's own
  // fetch stays in place: happy-dom's is not installed.
  window = new Window();
  Object.assign(globalThis, { window, document: window.document, navigator: window.navigator });
  ({ createRoot } = await import("react-dom/client"));
});
after(async () => {
  await window.happyDOM.close();
});

/** Renders useTask for each [subject, scope] under one provider; results[i] is the latest of hook i. */
function mount(client: TaskleaseClient, tasks: [string, string][], strict = false) {
  const results: UseTaskResult[][] = tasks.map(() => []);
  function Probe({ i, s, sc }: { i: number; s: string; sc: string }) {
    const r = useTask(s, sc);
    useEffect(() => void results[i]!.push(r));
    return createElement("p", null, `${sc}: ${r.status} ${r.view?.status ?? "-"}`);
  }
  const container = window.document.createElement("div");
  window.document.body.appendChild(container);
  const root: Root = createRoot(container as unknown as Element);
  const tree = createElement(TaskleaseProvider, { client }, ...tasks.map(([s, sc], i) => createElement(Probe, { key: i, i, s, sc })));
  root.render(strict ? createElement(StrictMode, null, tree) : tree);
  return {
    latest: (i = 0) => results[i]!.at(-1),
    history: (i = 0) => results[i]!,
    text: () => container.textContent,
    unmount: () => {
      root.unmount();
      container.remove();
    },
  };
}

test("useTask: idle, then syncNow runs it live through the stages to done", needsRunner, async () => {
  const s = subject();
  const c = createClient({ baseUrl, token: () => mint({ sub: s }) });
  const m = mount(c, [[s, "course_sync"]]);
  try {
    const first = await waitFor("idle and live", () => m.latest()?.status === "live" && m.latest());
    assert.equal(first.view?.status, "idle");
    assert.equal(first.lastSubmit, null);
    assert.equal(m.history()[0]!.status, "loading");

    const r: SubmitResponse = await first.syncNow();
    assert.equal(r.outcome, "started");
    await waitFor("lastSubmit", () => m.latest()?.lastSubmit?.outcome === "started");
    const again = await m.latest()!.syncNow();
    assert.equal(again.outcome, "joined", "a second tap joins");
    await waitFor("done", () => m.latest()?.view?.status === "done");
    const statuses = m.history().map((x) => x.view?.status);
    assert.ok(statuses.includes("running"), statuses.join(","));
    assert.match(m.text() ?? "", /course_sync: live done/);
  } finally {
    m.unmount();
  }
});

test("useTask: cancel() turns a running task cancelled", needsRunner, async () => {
  const s = subject("slow");
  const c = createClient({ baseUrl, token: mint({ sub: s }) });
  const m = mount(c, [[s, "course_sync"]]);
  try {
    await waitFor("live", () => m.latest()?.status === "live");
    await m.latest()!.syncNow();
    await waitFor("running", () => m.latest()?.view?.status === "running");
    assert.equal((await m.latest()!.cancel()).outcome, "cancelling");
    await waitFor("cancelled", () => m.latest()?.view?.status === "cancelled");
  } finally {
    m.unmount();
  }
});

test("useTask: hooks of one subject share one stream, and it closes with the last", needsRunner, async () => {
  const s = subject();
  const rec = recordingFetch();
  const c = createClient({ baseUrl, token: mint({ sub: s }), fetch: rec.fetch });
  const pre = await c.submit(s, "message_sync");
  await waitFor("message_sync done", async () => (await c.get(s, "message_sync")).status === "done");
  // StrictMode mounts, unmounts and mounts again: still one stream open.
  const m = mount(c, [[s, "course_sync"], [s, "course_sync"], [s, "message_sync"]], true);
  // Streams still open: each watch connect passes its signal, aborted on close.
  const open = () => rec.calls.filter((x) => x.url.endsWith(`/v1/subjects/${s}/events`) && !x.signal?.aborted).length;
  try {
    await waitFor("all live", () => [0, 1, 2].every((i) => m.latest(i)?.status === "live"));
    assert.equal(m.latest(2)!.view?.runId, pre.task.runId, "replayed from the stream");
    assert.equal(m.latest(0)!.view?.status, "idle");
    await m.latest(0)!.syncNow();
    await waitFor("both hooks done", () => [0, 1].every((i) => m.latest(i)?.view?.status === "done"));
    assert.equal(m.latest(1)!.lastSubmit, null, "lastSubmit is per hook");
    assert.equal(open(), 1, "one stream for three hooks");
  } finally {
    m.unmount();
  }
  await waitFor("stream closed with the last hook", () => open() === 0);
  // Without StrictMode's double mount: exactly one stream for three hooks.
  const rec2 = recordingFetch();
  const c2 = createClient({ baseUrl, token: mint({ sub: s }), fetch: rec2.fetch });
  const m2 = mount(c2, [[s, "course_sync"], [s, "course_sync"], [s, "message_sync"]]);
  try {
    await waitFor("all live", () => [0, 1, 2].every((i) => m2.latest(i)?.status === "live"));
    assert.equal(rec2.calls.filter((x) => x.url.endsWith("/events")).length, 1);
  } finally {
    m2.unmount();
  }
  assert.ok(rec2.calls.filter((x) => x.url.endsWith("/events")).every((x) => x.signal?.aborted), "closed on unmount");
});

test("useTask: a token for another subject is status error", needsRunner, async () => {
  const c = createClient({ baseUrl, token: mint({ sub: "u42r" }) });
  const m = mount(c, [["u4r", "course_sync"]]);
  try {
    const r = await waitFor("error", () => m.latest()?.status === "error" && m.latest());
    assert.equal((r.error as { status: number }).status, 403);
  } finally {
    m.unmount();
  }
});
