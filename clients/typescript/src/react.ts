import { createContext, createElement, useCallback, useContext, useState, useSyncExternalStore } from "react";
import type { ReactNode } from "react";
import type { CancelResponse, SubmitResponse, TaskView } from "./types.js";
import type { TaskleaseClient, Watch, WatchStatus } from "./client.js";
import { TaskleaseError } from "./errors.js";
import { idleView } from "./describe.js";

const ClientContext = createContext<TaskleaseClient | null>(null);

export interface TaskleaseProviderProps {
  client: TaskleaseClient;
  children?: ReactNode;
}

/** Makes `client` the one `useTask` uses below it. */
export function TaskleaseProvider({ client, children }: TaskleaseProviderProps) {
  return createElement(ClientContext.Provider, { value: client }, children);
}

/** The client of the nearest TaskleaseProvider. */
export function useTaskleaseClient(): TaskleaseClient {
  const c = useContext(ClientContext);
  if (!c) throw new Error("useTask needs a <TaskleaseProvider client={…}> above it");
  return c;
}

/**
 * `loading`: no view yet; `live`: the view is kept current by the stream;
 * `reconnecting`: the stream is down for now, the view may be stale;
 * `error`: the stream gave up (403, or 401 even with a fresh token), or the
 * first read failed; see `error`.
 */
export type TaskHookStatus = "loading" | "live" | "reconnecting" | "error";

export interface UseTaskResult {
  /** The task's view; an idle view when it never ran; null while loading. */
  view: TaskView | null;
  status: TaskHookStatus;
  error: unknown;
  /** Submits with source `manual`; resolves to `{outcome, task}` (`joined` when a run was active). */
  syncNow(): Promise<SubmitResponse>;
  /** Cancels the active run; resolves to `{outcome}`. */
  cancel(): Promise<CancelResponse>;
  /** The result of this hook's last `syncNow`, null before one. */
  lastSubmit: SubmitResponse | null;
}

interface Snapshot {
  view: TaskView | null;
  status: TaskHookStatus;
  error: unknown;
}

const time = (v: TaskView) => (v.updatedAt ? Date.parse(v.updatedAt) : -Infinity);

/**
 * One subject's views for every hook of one client: one watch while any
 * hook of the subject is mounted, whatever their scopes.
 */
class SubjectStore {
  private readonly views = new Map<string, TaskView>();
  private readonly snapshots = new Map<string, Snapshot>();
  private readonly listeners = new Map<string, Set<() => void>>();
  private readonly scopeErrors = new Map<string, unknown>();
  private readonly loading = new Set<string>();
  private refs = 0;
  private watch: Watch | undefined;
  private stream: WatchStatus = "connecting";
  private fatal: unknown = null;
  /** Counts watches, so a late answer of a closed one changes nothing. */
  private gen = 0;

  constructor(
    private readonly client: TaskleaseClient,
    private readonly subject: string,
  ) {}

  subscribe(scope: string, listener: () => void): () => void {
    let set = this.listeners.get(scope);
    if (!set) this.listeners.set(scope, (set = new Set()));
    set.add(listener);
    if (this.refs++ === 0) this.open();
    else if (this.stream === "open" && !this.views.has(scope)) this.load(scope);
    return () => {
      set.delete(listener);
      if (set.size === 0) this.listeners.delete(scope);
      if (--this.refs === 0) this.shut();
    };
  }

  snapshot(scope: string): Snapshot {
    let s = this.snapshots.get(scope);
    if (!s) {
      s = this.compute(scope);
      this.snapshots.set(scope, s);
    }
    return s;
  }

  /** A view from a call's answer: kept unless the stream has a newer one. */
  offer(view: TaskView): void {
    const cur = this.views.get(view.scope);
    if (cur && time(cur) >= time(view)) return;
    this.views.set(view.scope, view);
    this.changed(view.scope);
  }

  private open(): void {
    const gen = ++this.gen;
    this.fatal = null;
    this.stream = "connecting";
    this.watch = this.client.watch(
      this.subject,
      (v) => {
        if (gen !== this.gen) return;
        this.views.set(v.scope, v);
        this.changed(v.scope);
      },
      {
        onStatus: (s) => {
          if (gen !== this.gen) return;
          this.stream = s;
          // The stream replays the tasks that exist; a scope without one
          // may never have run, which only GET can tell (404).
          if (s === "open") for (const scope of this.listeners.keys()) if (!this.views.has(scope)) this.load(scope);
          this.changed();
        },
        onError: (err, willRetry) => {
          if (gen !== this.gen || willRetry) return;
          this.fatal = err;
          this.changed();
        },
      },
    );
  }

  private shut(): void {
    this.gen++;
    this.watch?.close();
    this.watch = undefined;
    this.views.clear();
    this.scopeErrors.clear();
    this.loading.clear();
    this.stream = "connecting";
    this.changed();
  }

  private load(scope: string): void {
    if (this.loading.has(scope)) return;
    this.loading.add(scope);
    const gen = this.gen;
    this.client.get(this.subject, scope).then(
      (v) => {
        if (gen !== this.gen) return;
        if (!this.views.has(scope)) this.views.set(scope, v);
      },
      (err: unknown) => {
        if (gen !== this.gen) return;
        if (err instanceof TaskleaseError && err.status === 404) {
          if (!this.views.has(scope)) this.views.set(scope, idleView(this.subject, scope));
        } else {
          this.scopeErrors.set(scope, err);
        }
      },
    ).finally(() => {
      if (gen !== this.gen) return;
      this.loading.delete(scope);
      this.changed(scope);
    });
  }

  private compute(scope: string): Snapshot {
    const view = this.views.get(scope) ?? null;
    const error = this.fatal ?? this.scopeErrors.get(scope) ?? null;
    let status: TaskHookStatus;
    if (error) status = "error";
    else if (this.stream === "reconnecting") status = "reconnecting";
    else if (view && this.stream === "open") status = "live";
    else status = "loading";
    return { view, status, error };
  }

  /** Recomputes the snapshots of scope (or of all) and tells their hooks. */
  private changed(scope?: string): void {
    const scopes = scope === undefined ? [...new Set([...this.snapshots.keys(), ...this.listeners.keys()])] : [scope];
    for (const sc of scopes) {
      const prev = this.snapshots.get(sc);
      const next = this.compute(sc);
      if (prev && prev.view === next.view && prev.status === next.status && prev.error === next.error) continue;
      this.snapshots.set(sc, next);
      for (const l of [...(this.listeners.get(sc) ?? [])]) l();
    }
  }
}

// Per client, per subject. Stores are kept (they hold no connection while
// no hook uses them) so a remount finds the same one: React's StrictMode
// unmounts and remounts at once.
const stores = new WeakMap<TaskleaseClient, Map<string, SubjectStore>>();

function storeFor(client: TaskleaseClient, subject: string): SubjectStore {
  let bySubject = stores.get(client);
  if (!bySubject) stores.set(client, (bySubject = new Map()));
  let s = bySubject.get(subject);
  if (!s) bySubject.set(subject, (s = new SubjectStore(client, subject)));
  return s;
}

/**
 * The live view of `<subject>|<scope>`, with `syncNow()` and `cancel()`.
 * Every hook of one subject under one client shares one event stream.
 */
export function useTask(subject: string, scope: string): UseTaskResult {
  const client = useTaskleaseClient();
  const store = storeFor(client, subject);
  const subscribe = useCallback((l: () => void) => store.subscribe(scope, l), [store, scope]);
  const getSnapshot = useCallback(() => store.snapshot(scope), [store, scope]);
  const snap = useSyncExternalStore(subscribe, getSnapshot, getSnapshot);
  const [lastSubmit, setLastSubmit] = useState<SubmitResponse | null>(null);

  const syncNow = useCallback(async () => {
    const r = await client.submit(subject, scope, { source: "manual" });
    setLastSubmit(r);
    store.offer(r.task);
    return r;
  }, [client, store, subject, scope]);
  const cancel = useCallback(() => client.cancel(subject, scope), [client, subject, scope]);

  return { view: snap.view, status: snap.status, error: snap.error, syncNow, cancel, lastSubmit };
}
