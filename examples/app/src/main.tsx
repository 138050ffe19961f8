// The seed's page in an end user's app: the user's course sync, live, with
// "Sync now", "Cancel" and "Retry", talking to the runner directly with the
// user's own subject token (docs/example-app.md).
//
// The backend (../server.go) knows who is logged in and mints the token
// (GET /token); the page keeps it in the client's memory only and sends it
// in the Authorization header. Switching account unmounts the user's part
// of the page, and with it the client holding the old token and its event
// stream: the next user's page starts from a new client.
import { StrictMode, useEffect, useMemo, useState } from "react";
import type { FormEvent } from "react";
import { createRoot } from "react-dom/client";
import { createClient, describeSubmit, describeTask } from "@tasklease/client";
import type { SubmitResponse, TaskView } from "@tasklease/client";
import { TaskleaseProvider, useTask } from "@tasklease/client/react";

const SCOPE = "course_sync";

type Lang = "en" | "zh";

const text = {
  en: {
    title: "Course sync",
    signedIn: "Signed in as",
    switchAccount: "Switch account",
    loginTitle: "Sign in",
    loginHint: "Any user name: this example has no passwords. Names starting with “fail” fail at pushing.",
    user: "User name",
    login: "Sign in",
    syncNow: "Sync now",
    retry: "Retry",
    cancel: "Cancel",
    stages: "Stages",
    run: "Run",
    requestedBy: "requested by",
    connecting: "connecting…",
    live: "live",
    reconnecting: "reconnecting…",
    error: "not connected",
  },
  zh: {
    title: "课程同步",
    signedIn: "当前用户",
    switchAccount: "切换账号",
    loginTitle: "登录",
    loginHint: "任意用户名即可：示例没有密码。以 “fail” 开头的用户在推送阶段失败。",
    user: "用户名",
    login: "登录",
    syncNow: "立即同步",
    retry: "重试",
    cancel: "取消",
    stages: "阶段",
    run: "运行",
    requestedBy: "来源",
    connecting: "连接中…",
    live: "实时",
    reconnecting: "重新连接中…",
    error: "未连接",
  },
} as const;

interface Session {
  user: string;
  runnerUrl: string;
}

async function backend<T>(path: string, init?: RequestInit): Promise<T> {
  const res = await fetch(path, { credentials: "same-origin", ...init });
  const body = res.status === 204 ? null : await res.json();
  if (!res.ok) throw Object.assign(new Error(body?.error ?? `HTTP ${res.status}`), { status: res.status });
  return body as T;
}

function App() {
  const [session, setSession] = useState<Session | null | undefined>(undefined);
  const [lang, setLang] = useState<Lang>(() => (localStorage.getItem("lang") === "zh" ? "zh" : "en"));
  useEffect(() => {
    backend<Session>("/session").then(setSession, () => setSession(null));
  }, []);
  useEffect(() => {
    localStorage.setItem("lang", lang);
    document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
  }, [lang]);

  const switchAccount = async () => {
    await backend("/logout", { method: "POST" });
    setSession(null);
  };

  const t = text[lang];
  return (
    <main className="phone" data-ready={session === undefined ? "0" : "1"}>
      <header>
        <h1>{t.title}</h1>
        <div className="langs" role="group" aria-label="language">
          {(["en", "zh"] as const).map((l) => (
            <button key={l} id={`lang-${l}`} className={l === lang ? "on" : ""} aria-pressed={l === lang} onClick={() => setLang(l)}>
              {l === "en" ? "EN" : "中文"}
            </button>
          ))}
        </div>
      </header>
      {session === undefined ? null : session === null ? (
        <Login lang={lang} onLogin={setSession} />
      ) : (
        // key: another user is another tree, with its own client and token.
        <Account key={session.user} session={session} lang={lang} onSwitch={switchAccount} />
      )}
    </main>
  );
}

function Login({ lang, onLogin }: { lang: Lang; onLogin: (s: Session) => void }) {
  const t = text[lang];
  const [user, setUser] = useState("");
  const [error, setError] = useState("");
  const login = async (name: string) => {
    setError("");
    try {
      onLogin(await backend<Session>("/login", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ user: name }),
      }));
    } catch (e) {
      setError(String((e as Error).message));
    }
  };
  const submit = (e: FormEvent) => {
    e.preventDefault();
    void login(user.trim());
  };
  return (
    <form id="login" className="card" onSubmit={submit}>
      <h2>{t.loginTitle}</h2>
      <p className="hint">{t.loginHint}</p>
      <label>
        {t.user}
        <input id="user" value={user} onChange={(e) => setUser(e.target.value)} autoComplete="username" placeholder="u42" autoFocus />
      </label>
      <button id="login-btn" type="submit" className="primary">{t.login}</button>
      <div className="quick">
        {["u42", "u4", "fail7"].map((u) => (
          <button key={u} type="button" data-user={u} onClick={() => void login(u)}>{u}</button>
        ))}
      </div>
      {error && <p id="login-error" className="error">{error}</p>}
    </form>
  );
}

function Account({ session, lang, onSwitch }: { session: Session; lang: Lang; onSwitch: () => void }) {
  // One client per signed-in user. Its token function asks the backend
  // for a fresh token whenever the client needs one (the first call, a
  // 401, a stream ended by the token's expiry); the token lives in the
  // client's memory and nowhere else.
  const client = useMemo(
    () =>
      createClient({
        baseUrl: session.runnerUrl,
        token: async () => (await backend<{ token: string }>("/token")).token,
      }),
    [session.runnerUrl, session.user],
  );
  const t = text[lang];
  return (
    <TaskleaseProvider client={client}>
      <section className="account">
        <span>
          {t.signedIn} <b id="who">{session.user}</b>
        </span>
        <button id="switch" onClick={onSwitch}>{t.switchAccount}</button>
      </section>
      <CourseSync subject={session.user} lang={lang} />
    </TaskleaseProvider>
  );
}

const active = (v: TaskView | null) => v?.status === "running" || v?.status === "queued" || v?.status === "retrying";

function CourseSync({ subject, lang }: { subject: string; lang: Lang }) {
  const t = text[lang];
  const { view, status, error, syncNow, cancel, lastSubmit } = useTask(subject, SCOPE);
  const [busy, setBusy] = useState(false);
  const [actionError, setActionError] = useState("");

  const act = async (f: () => Promise<unknown>) => {
    setBusy(true);
    setActionError("");
    try {
      await f();
    } catch (e) {
      setActionError(String((e as Error).message ?? e));
    } finally {
      setBusy(false);
    }
  };

  // The answer to the last tap, kept current while its run is the one
  // shown: "Already running since 14:03, stage pushing".
  const feedback = submitFeedback(lastSubmit, view, lang);
  const failed = view?.status === "failed";
  const done = new Set(view?.completedStages ?? []);
  // The stage shown as current: the running one, or where a run that
  // ended without finishing stopped (the first stage not completed).
  const at = active(view) ? view?.stage : view?.stages.find((s) => !done.has(s));

  return (
    <section
      id="task"
      className={`card status-${view?.status ?? "loading"}`}
      data-status={view?.status ?? ""}
      data-stage={view?.stage ?? ""}
      data-run-id={view?.runId ?? ""}
      data-subject={view?.subject ?? ""}
    >
      <p id="conn" className={`conn ${status}`} data-state={status}>
        ● {t[status === "live" ? "live" : status === "loading" ? "connecting" : status === "reconnecting" ? "reconnecting" : "error"]}
      </p>
      <p id="status" className="status" aria-live="polite">
        {view ? describeTask(view, lang) : "…"}
      </p>
      {feedback && (
        <p id="feedback" className="feedback" data-outcome={lastSubmit?.outcome}>
          {feedback}
        </p>
      )}
      {view && view.stages.length > 0 && (
        <ol className="stages" aria-label={t.stages}>
          {view.stages.map((s) => (
            <li key={s} data-stage={s} className={done.has(s) ? "done" : s !== at ? "" : active(view) ? "current" : failed ? "failed" : "stopped"}>
              {s}
            </li>
          ))}
        </ol>
      )}
      {view && view.runId && (
        <p id="run" className="run">
          {t.run} <code>{view.runId.slice(0, 8)}</code>
          {view.sources.length > 0 && (
            <>
              {" · "}
              {t.requestedBy} <span id="sources">{view.sources.join(", ")}</span>
            </>
          )}
        </p>
      )}
      {failed && view.lastError && <p className="last-error">{view.lastError}</p>}
      <div className="actions">
        {failed ? (
          <button id="retry" className="primary" disabled={busy} onClick={() => void act(syncNow)}>
            {t.retry}
          </button>
        ) : (
          <button id="sync" className="primary" disabled={busy || !view} onClick={() => void act(syncNow)}>
            {t.syncNow}
          </button>
        )}
        {view?.canCancel && (
          <button id="cancel" disabled={busy} onClick={() => void act(cancel)}>
            {t.cancel}
          </button>
        )}
      </div>
      {(actionError || error) && (
        <p id="error" className="error">
          {actionError || String((error as Error)?.message ?? error)}
        </p>
      )}
    </section>
  );
}

// submitFeedback describes the last submit while its run is still the one
// on screen and active, with the run's live stage.
function submitFeedback(last: SubmitResponse | null, view: TaskView | null, lang: Lang): string {
  if (!last || !view || last.task.runId !== view.runId || !active(view) || last.outcome === "started") return "";
  return describeSubmit({ outcome: last.outcome, task: view }, lang);
}

createRoot(document.getElementById("root")!).render(
  <StrictMode>
    <App />
  </StrictMode>,
);
