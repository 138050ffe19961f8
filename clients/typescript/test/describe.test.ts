import { test } from "node:test";
import assert from "node:assert/strict";
import { describeSubmit, describeTask, idleView } from "../src/describe.js";
import type { TaskView } from "../src/types.js";

const utc = { timeZone: "UTC" };

function view(over: Partial<TaskView>): TaskView {
  return {
    ...idleView("u42", "course_sync"),
    runId: "r1",
    stages: ["pulling", "pushing"],
    requestedAt: "2026-05-01T14:02:58Z",
    startedAt: "2026-05-01T14:03:07.123Z",
    updatedAt: "2026-05-01T14:04:00Z",
    ...over,
  };
}

const running = view({ status: "running", stage: "pushing" });
const cases: [string, TaskView | null, string, string][] = [
  ["running", running, "Syncing — started 14:03, stage pushing", "正在同步，开始于 14:03，阶段 pushing"],
  ["queued", view({ status: "queued", startedAt: null }), "Waiting to start", "等待开始"],
  ["queued, paused", view({ status: "queued", startedAt: null, waiting: "scope course_sync is paused" }),
    "Waiting to start — scope course_sync is paused", "等待开始（scope course_sync is paused）"],
  ["retrying", view({ status: "retrying", nextAttemptAt: "2026-05-01T14:06:30Z" }), "Sync failed, retrying at 14:06", "同步失败，将于 14:06 重试"],
  ["failed", view({ status: "failed", finishedAt: "2026-05-01T14:05:00Z", lastError: "exit 1" }), "Last sync failed at 14:05 — retry", "上次同步失败（14:05）— 重试"],
  ["done", view({ status: "done", finishedAt: "2026-05-01T14:05:59Z" }), "Last synced at 14:05", "上次同步于 14:05"],
  ["cancelled", view({ status: "cancelled", finishedAt: "2026-05-01T14:05:00Z" }), "Sync cancelled at 14:05", "同步已取消（14:05）"],
  ["idle", idleView("u42", "course_sync"), "Never synced", "尚未同步"],
  ["no view yet", null, "Never synced", "尚未同步"],
];

for (const [name, v, en, zh] of cases) {
  test(`describeTask ${name}`, () => {
    assert.equal(describeTask(v, "en", utc), en);
    assert.equal(describeTask(v, "en-US", utc), en);
    assert.equal(describeTask(v, "zh", utc), zh);
    assert.equal(describeTask(v, "zh-CN", utc), zh);
    assert.equal(describeTask(v, "fr", utc), en, "unknown locales fall back to en");
  });
}

test("times are shown in the given time zone, 24-hour", () => {
  assert.equal(describeTask(running, "en", { timeZone: "Asia/Shanghai" }), "Syncing — started 22:03, stage pushing");
  assert.equal(describeTask(running, "en", { timeZone: "America/New_York" }), "Syncing — started 10:03, stage pushing");
});

test("labels override the wording", () => {
  const labels = { running: ({ time, stage }: { time: string; stage: string }) => `Backing up since ${time} (${stage})` };
  assert.equal(describeTask(running, "en", { ...utc, labels }), "Backing up since 14:03 (pushing)");
  assert.equal(describeTask(view({ status: "done", finishedAt: "2026-05-01T14:05:00Z" }), "en", { ...utc, labels }), "Last synced at 14:05");
});

test("describeSubmit: a second tap joins the running run", () => {
  assert.equal(describeSubmit({ outcome: "joined", task: running }, "en", utc), "Already running since 14:03, stage pushing");
  assert.equal(describeSubmit({ outcome: "joined", task: running }, "zh", utc), "已在运行，开始于 14:03，阶段 pushing");
  const queued = view({ status: "queued", startedAt: null });
  assert.equal(describeSubmit({ outcome: "joined", task: queued }, "en", utc), "Already waiting to start");
  assert.equal(describeSubmit({ outcome: "started", task: queued }, "en", utc), "Sync started");
  assert.equal(describeSubmit({ outcome: "started", task: queued }, "zh", utc), "已开始同步");
  assert.equal(describeSubmit({ outcome: "throttled", task: running }, "en", utc), "Synced a moment ago");
});
