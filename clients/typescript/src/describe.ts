import type { SubmitResponse, TaskView } from "./types.js";

/** What a label is given: times already formatted as HH:mm. */
export interface LabelParams {
  view: TaskView;
  /** startedAt (running, joined), nextAttemptAt (retrying), finishedAt (done, failed, cancelled). */
  time: string;
  stage: string;
  /** Why a queued run is not starting; "" when none. */
  waiting: string;
}

/** One sentence per task status, and per submit outcome. */
export interface Labels {
  idle(p: LabelParams): string;
  queued(p: LabelParams): string;
  running(p: LabelParams): string;
  retrying(p: LabelParams): string;
  done(p: LabelParams): string;
  failed(p: LabelParams): string;
  cancelled(p: LabelParams): string;
  /** A second tap while a run is active (outcome `joined`). */
  joined(p: LabelParams): string;
  started(p: LabelParams): string;
  queuedFollowUp(p: LabelParams): string;
  skipped(p: LabelParams): string;
  replaced(p: LabelParams): string;
  throttled(p: LabelParams): string;
}

export interface DescribeOptions {
  /** An IANA time zone for the times; default the runtime's. */
  timeZone?: string;
  /** Overrides of the built-in sentences, e.g. for "backup" instead of "sync". */
  labels?: Partial<Labels>;
}

const en: Labels = {
  idle: () => "Never synced",
  queued: ({ waiting }) => (waiting ? `Waiting to start — ${waiting}` : "Waiting to start"),
  running: ({ time, stage }) => "Syncing" + joinParts(" — ", [time && `started ${time}`, stage && `stage ${stage}`], ", "),
  retrying: ({ time }) => (time ? `Sync failed, retrying at ${time}` : "Sync failed, retrying"),
  done: ({ time }) => (time ? `Last synced at ${time}` : "Last synced"),
  failed: ({ time }) => (time ? `Last sync failed at ${time} — retry` : "Last sync failed — retry"),
  cancelled: ({ time }) => (time ? `Sync cancelled at ${time}` : "Sync cancelled"),
  joined: ({ view, time, stage }) =>
    view.status === "running"
      ? "Already running" + joinParts(" ", [time && `since ${time}`], "") + (stage ? `, stage ${stage}` : "")
      : "Already waiting to start",
  started: () => "Sync started",
  queuedFollowUp: () => "Another sync will run after the current one",
  skipped: () => "A sync is already running",
  replaced: () => "Restarting the sync",
  throttled: () => "Synced a moment ago",
};

const zh: Labels = {
  idle: () => "尚未同步",
  queued: ({ waiting }) => (waiting ? `等待开始（${waiting}）` : "等待开始"),
  running: ({ time, stage }) => "正在同步" + joinParts("，", [time && `开始于 ${time}`, stage && `阶段 ${stage}`], "，"),
  retrying: ({ time }) => (time ? `同步失败，将于 ${time} 重试` : "同步失败，即将重试"),
  done: ({ time }) => (time ? `上次同步于 ${time}` : "上次同步成功"),
  failed: ({ time }) => (time ? `上次同步失败（${time}）— 重试` : "上次同步失败 — 重试"),
  cancelled: ({ time }) => (time ? `同步已取消（${time}）` : "同步已取消"),
  joined: ({ view, time, stage }) =>
    view.status === "running"
      ? "已在运行" + joinParts("，", [time && `开始于 ${time}`, stage && `阶段 ${stage}`], "，")
      : "已在等待开始",
  started: () => "已开始同步",
  queuedFollowUp: () => "当前同步结束后将再同步一次",
  skipped: () => "同步已在进行",
  replaced: () => "正在重新开始同步",
  throttled: () => "刚刚同步过",
};

function joinParts(lead: string, parts: (string | false | undefined)[], sep: string): string {
  const kept = parts.filter((p): p is string => !!p);
  return kept.length ? lead + kept.join(sep) : "";
}

function labelsFor(locale: string, opts: DescribeOptions): { labels: Labels; tag: string } {
  const zhLocale = /^zh\b/i.test(locale);
  return { labels: { ...(zhLocale ? zh : en), ...opts.labels }, tag: zhLocale ? locale : "en" };
}

function hhmm(iso: string | null | undefined, locale: string, timeZone: string | undefined): string {
  if (!iso) return "";
  const t = new Date(iso);
  if (Number.isNaN(t.getTime())) return "";
  // hourCycle h23: "14:03" in every locale, never "2:03 PM".
  const fmt = new Intl.DateTimeFormat(locale, { hour: "2-digit", minute: "2-digit", hourCycle: "h23", timeZone });
  return fmt.format(t);
}

function params(view: TaskView, time: string | null | undefined, tag: string, opts: DescribeOptions): LabelParams {
  return { view, time: hhmm(time, tag, opts.timeZone), stage: view.stage, waiting: view.waiting ?? "" };
}

/**
 * One line for a task's view, in `en` or `zh` (other locales: `en`):
 * "Syncing — started 14:03, stage pushing", "正在同步，开始于 14:03，阶段 pushing".
 * No view (not loaded yet, or never run) reads as idle.
 */
export function describeTask(view: TaskView | null | undefined, locale: string, opts: DescribeOptions = {}): string {
  const { labels, tag } = labelsFor(locale, opts);
  if (!view) return labels.idle({ view: idleView("", ""), time: "", stage: "", waiting: "" });
  switch (view.status) {
    case "running":
      return labels.running(params(view, view.startedAt, tag, opts));
    case "queued":
      return labels.queued(params(view, view.requestedAt, tag, opts));
    case "retrying":
      return labels.retrying(params(view, view.nextAttemptAt, tag, opts));
    case "done":
      return labels.done(params(view, view.finishedAt, tag, opts));
    case "failed":
      return labels.failed(params(view, view.finishedAt, tag, opts));
    case "cancelled":
      return labels.cancelled(params(view, view.finishedAt ?? view.updatedAt, tag, opts));
    default:
      return labels.idle(params(view, null, tag, opts));
  }
}

/**
 * One line for what a submit did: for `joined`, the answer to a second tap,
 * "Already running since 14:03, stage pushing" / "已在运行，开始于 14:03，阶段 pushing".
 */
export function describeSubmit(result: Pick<SubmitResponse, "outcome" | "task">, locale: string, opts: DescribeOptions = {}): string {
  const { labels, tag } = labelsFor(locale, opts);
  const p = params(result.task, result.task.startedAt, tag, opts);
  switch (result.outcome) {
    case "joined":
      return labels.joined(p);
    case "started":
      return labels.started(p);
    case "queued":
      return labels.queuedFollowUp(p);
    case "skipped":
      return labels.skipped(p);
    case "replaced":
      return labels.replaced(p);
    case "throttled":
      return labels.throttled(p);
  }
}

/** The view of a task that never ran (GET answers 404 for it). */
export function idleView(subject: string, scope: string): TaskView {
  return {
    key: `${subject}|${scope}`,
    subject,
    scope,
    runId: "",
    status: "idle",
    stage: "",
    stages: [],
    completedStages: [],
    attempt: 0,
    maxAttempts: 0,
    sources: [],
    owner: "",
    fencingToken: 0,
    requestedAt: null,
    startedAt: null,
    updatedAt: null,
    finishedAt: null,
    nextAttemptAt: null,
    lastError: "",
    canCancel: false,
    cancelRequested: false,
    followUpQueued: false,
  };
}
