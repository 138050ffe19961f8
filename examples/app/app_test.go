package main

// The example end to end, from the user's side: `runner serve` with
// examples/app/runner.yaml (embedded Redis) as a process, this backend on
// another loopback port, and the page in real headless Chromium. It walks
// the seed's checklist — sync now shows the stage live, a second tap says
// already running since when, the app's foreground request joins the same
// run, cancel, a failing user's retry, switching account — and checks the
// page reached no other host and sent each user's token only for that
// user. Screenshots go to $TASKLEASE_ARTIFACTS (default: a temp dir);
// docs/example-app.png is the "already-running" one.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tasklease/tasklease/internal/browsertest"
)

// operatorToken is the runner's http.token in the test: the app's backend
// would use it for the foreground webhook; the page never sees it.
const operatorToken = "operator-token-of-the-example-test"

// syncBuffer is an io.Writer safe for a process's output and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// freePort returns a loopback port nothing listened on a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startRunner builds cmd/runner and serves examples/app/runner.yaml on a
// free port, with the page's origin allowed; it returns the runner's URL.
func startRunner(t *testing.T, appOrigin string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "runner")
	if out, err := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "../../cmd/runner").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/runner: %v\n%s", err, out)
	}
retry:
	for attempt := 1; ; attempt++ {
		addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		out := &syncBuffer{}
		cmd := exec.Command(bin, "serve", "--config", "runner.yaml", "--listen", addr)
		cmd.Env = append(os.Environ(),
			"TASKLEASE_APP_SECRET="+testSecret,
			"TASKLEASE_TOKEN="+operatorToken,
			"TASKLEASE_EXAMPLE_ORIGIN="+appOrigin,
			"TASKLEASE_LOG_LEVEL=warn",
			"TASKLEASE_REDIS_URL=")
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			<-done
			if t.Failed() {
				t.Logf("--- runner output:\n%s", out)
			}
		})
		url := "http://" + addr
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			select {
			case <-done:
				if attempt < 3 && strings.Contains(out.String(), "address already in use") {
					continue retry // lost the port to another process
				}
				t.Fatalf("runner serve exited:\n%s", out)
			default:
			}
			if resp, err := http.Get(url + "/readyz"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return url
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("runner not ready within 20s:\n%s", out)
			}
		}
	}
}

// runnerCall calls the runner's API as an operator (token "") or with a
// subject token, and decodes the answer into out.
func runnerCall(t *testing.T, method, url, token, body string, out any) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token == "" {
		token = operatorToken
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, url, err, b)
		}
	}
	return resp.StatusCode
}

// tokenSubject is the sub claim of a JWT (not verified: the test reads
// which user's token the page sent).
func tokenSubject(t *testing.T, authorization string) string {
	t.Helper()
	parts := strings.Split(strings.TrimPrefix(authorization, "Bearer "), ".")
	if len(parts) != 3 {
		t.Fatalf("Authorization %q is no bearer JWT", authorization[:min(len(authorization), 20)])
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var c struct{ Sub string }
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return c.Sub
}

// The page's selectors and conditions.
const (
	statusText = `(document.querySelector('#status')?.textContent ?? '')`
	taskAttr   = `document.querySelector('#task')?.dataset`
)

func js(format string, args ...any) string { return fmt.Sprintf(format, args...) }

func TestBrowserExampleApp(t *testing.T) {
	browsertest.ChromiumPath(t)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	app := "http://" + ln.Addr().String()
	runner := startRunner(t, app)
	srv, err := newServer(config{Secret: testSecret, RunnerURL: runner})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serveUntil(ctx, ln, srv) }()
	t.Cleanup(func() { stop(); <-served })

	b := browsertest.New(t, browsertest.Options{Width: 520, Height: 720})
	b.Run("open the app", chromedp.Navigate(app+"/"))
	b.Until(15*time.Second, "the sign-in form", `document.querySelector('#login') != null`)

	// Sign in as u42: the task never ran.
	b.Run("sign in as u42", chromedp.SendKeys(chromedp.CSS("#user"), "u42"), chromedp.Click(chromedp.CSS("#login-btn")))
	b.Until(10*time.Second, "u42 signed in, live", `document.querySelector('#who')?.textContent === "u42" && document.querySelector('#conn')?.dataset.state === "live"`)
	b.Until(10*time.Second, "u42's idle task", statusText+` === "Never synced"`)
	b.Shot("1-signed-in")

	// Sync now: running, the stage shown live, with the start time.
	b.Press("sync now", "#sync")
	b.Until(10*time.Second, "Syncing — started HH:MM, stage fetching",
		`/^Syncing — started \d\d:\d\d, stage fetching$/.test(`+statusText+`)`)
	runID := browsertest.Eval[string](b, taskAttr+`.runId`)
	if runID == "" {
		t.Fatal("no run id on the page")
	}
	started := regexp.MustCompile(`\d\d:\d\d`).FindString(b.Text("#status"))
	b.Shot("2-syncing")

	// A second tap: the submit joined the run; the page says so, with the
	// run's start time.
	b.Press("sync now again", "#sync")
	b.Until(5*time.Second, "Already running since HH:MM",
		js(`document.querySelector('#feedback')?.dataset.outcome === "joined" && /^Already running since %s, stage (fetching|pushing)$/.test(document.querySelector('#feedback').textContent)`, started))

	// The app's foreground webhook for u42 (its backend calls it with the
	// operator token): it joins the same run, and the page shows it.
	var fg struct {
		Results []struct{ Scope, Outcome, RunID string }
	}
	if code := runnerCall(t, "POST", runner+"/v1/hooks/foreground", "", `{"subject":"u42","scopes":["course_sync"]}`, &fg); code != http.StatusOK ||
		len(fg.Results) != 1 || fg.Results[0].Outcome != "joined" || fg.Results[0].RunID != runID {
		t.Fatalf("foreground hook: %d %+v, want joined run %s", code, fg, runID)
	}
	b.Until(5*time.Second, "the foreground request shown on the same run",
		js(`/foreground/.test(document.querySelector('#sources')?.textContent) && %s.runId === %q`, taskAttr, runID))

	// 中文: the same state in the other locale.
	b.Press("switch to zh", "#lang-zh")
	b.Until(5*time.Second, "正在同步，开始于 HH:MM",
		js(`/^正在同步，开始于 %s，阶段 (fetching|pushing)$/.test(%s) && document.querySelector('#sync').textContent === "立即同步"`, started, statusText))
	b.Shot("3-zh")
	b.Press("switch to en", "#lang-en")

	// Live through the stages: pushing, still the one run.
	b.Until(10*time.Second, "stage pushing, live", js(`/^Syncing — started %s, stage pushing$/.test(%s) && %s.runId === %q`, started, statusText, taskAttr, runID))
	b.Until(5*time.Second, "the feedback following the stage", `/stage pushing$/.test(document.querySelector('#feedback')?.textContent)`)
	b.Shot("already-running")

	// Cancel.
	b.Press("cancel", "#cancel")
	b.Until(10*time.Second, "Sync cancelled at HH:MM", `/^Sync cancelled at \d\d:\d\d$/.test(`+statusText+`) && `+taskAttr+`.status === "cancelled"`)
	b.Shot("4-cancelled")
	var hist struct {
		Events []struct{ Event, RunID string }
	}
	if code := runnerCall(t, "GET", runner+"/v1/tasks/u42/course_sync/history?limit=100", "", "", &hist); code != http.StatusOK {
		t.Fatalf("history: %d", code)
	}
	for _, e := range hist.Events {
		if e.Event == "started" && e.RunID != runID {
			t.Errorf("a second run of u42 started: %s (the page's %s)", e.RunID, runID)
		}
	}

	// u42's token, as the page gets it, for the check after switching.
	u42Token := browsertest.Eval[string](b, `fetch("/token").then(r => r.json()).then(j => j.token)`)

	// A failing user: the run fails, the page offers retry, retry is a new run.
	b.Press("switch account", "#switch")
	b.Press("sign in as fail7", `#login button[data-user="fail7"]`)
	b.Until(10*time.Second, "fail7 signed in", `document.querySelector('#who')?.textContent === "fail7" && `+taskAttr+`.subject === "fail7"`)
	b.Press("sync now fail7", "#sync")
	b.Until(20*time.Second, "Last sync failed at HH:MM — retry", `/^Last sync failed at \d\d:\d\d — retry$/.test(`+statusText+`) && document.querySelector('#retry') != null`)
	failedRun := browsertest.Eval[string](b, taskAttr+`.runId`)
	b.Shot("5-failed")
	b.Press("retry", "#retry")
	b.Until(10*time.Second, "a new run of fail7", js(`%s.status === "running" && %s.runId !== %q && %s.runId !== ""`, taskAttr, taskAttr, failedRun, taskAttr))

	// Switch to u4: only u4's task, never the others'.
	b.Press("switch account", "#switch")
	b.Press("sign in as u4", `#login button[data-user="u4"]`)
	b.Until(10*time.Second, "u4 signed in, live", `document.querySelector('#who')?.textContent === "u4" && document.querySelector('#conn')?.dataset.state === "live"`)
	b.Until(10*time.Second, "u4's idle task", statusText+` === "Never synced" && `+taskAttr+`.subject === "u4" && `+taskAttr+`.runId === ""`)
	b.Press("sync now u4", "#sync")
	b.Until(10*time.Second, "u4 syncing", `/^Syncing — started/.test(`+statusText+`) && `+taskAttr+`.subject === "u4"`)
	u4Run := browsertest.Eval[string](b, taskAttr+`.runId`)
	if u4Run == runID || u4Run == failedRun {
		t.Errorf("u4's page shows another user's run %s", u4Run)
	}
	b.Shot("6-u4")

	// u42's token opens nothing of u4's: from the page, as a script on it
	// holding the old token would try.
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/tasks/u4/course_sync"},
		{"POST", "/v1/tasks/u4/course_sync/cancel"},
		{"POST", "/v1/tasks/u4/course_sync/runs"},
		{"GET", "/v1/subjects/u4/events"},
	} {
		code := browsertest.Eval[int](b, js(`fetch(%q, {method: %q, headers: {Authorization: "Bearer " + %q}}).then(r => r.status)`, runner+c.path, c.method, u42Token))
		if code != http.StatusForbidden {
			t.Errorf("%s %s with u42's token from the page: %d, want 403", c.method, c.path, code)
		}
	}
	var u4 struct{ RunID, Status string }
	if code := runnerCall(t, "GET", runner+"/v1/tasks/u4/course_sync", "", "", &u4); code != http.StatusOK || u4.RunID != u4Run || u4.Status != "running" {
		t.Errorf("u4's task after u42's token tried it: %d %+v, want run %s running", code, u4, u4Run)
	}

	// What the page sent: every call to the runner with the token of the
	// user it is about (the test's own fetches with u42's token above
	// aside), and no request at all to another host.
	subjectOf := regexp.MustCompile(`^` + regexp.QuoteMeta(runner) + `/v1/(?:tasks|subjects)/([^/?]+)/`)
	n := 0
	for _, r := range b.Requests() {
		m := subjectOf.FindStringSubmatch(r.URL)
		if m == nil || r.Method == "OPTIONS" || r.Authorization == "Bearer "+u42Token && m[1] == "u4" {
			continue
		}
		n++
		if r.Authorization == "" {
			t.Errorf("%s %s without a token", r.Method, r.URL)
			continue
		}
		if sub := tokenSubject(t, r.Authorization); sub != m[1] {
			t.Errorf("%s %s with %s's token", r.Method, r.URL, sub)
		}
		if strings.Contains(r.URL, "access_token") {
			t.Errorf("a token in a URL: %s", r.URL[:strings.Index(r.URL, "?")])
		}
	}
	if n < 6 {
		t.Errorf("only %d token-bearing requests to the runner seen: is the request log working?", n)
	}
	if f := b.Foreign(app, runner); len(f) > 0 {
		t.Errorf("the page requested other hosts: %v", f)
	}
}
