package main

// The operator console in real headless Chromium (Debian's chromium
// package; .ci/run installs it; internal/browsertest drives it): a runner
// on the embedded default, driven through the page as an operator would,
// with every request the page makes checked to go to the runner itself.
// Screenshots are saved to $TASKLEASE_ARTIFACTS (or the test's temp dir);
// README's screenshot is the "console" one.

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tasklease/tasklease/internal/browsertest"
	"github.com/tasklease/tasklease/jobs"
)

// browserConfig: the embedded default (no redis, no jobs: the demo jobs)
// plus a schedule for the schedules view, hourly so it does not fire
// during the test.
const browserConfig = `
runner:
  id: console-test
log:
  level: warn
schedules:
  - name: demo-hourly
    cron: "@hourly"
    scope: course_sync
    subjects: all
`

// row is the JavaScript for a task row's element (or null).
func row(key string) string {
	return fmt.Sprintf("document.querySelector('#tasks tr[data-key=%q]')", key)
}

func field(key, name string) string {
	return fmt.Sprintf("(%s?.querySelector('[data-field=%q]')?.textContent ?? '').trim()", row(key), name)
}

// rowButton is the CSS selector of a button in a task row.
func rowButton(key, action string) string {
	return fmt.Sprintf("#tasks tr[data-key=%q] button[data-action=%q]", key, action)
}

// postAPI submits through the API, as another entry point would.
func postAPI(t *testing.T, base, path, body string) {
	t.Helper()
	var out map[string]any
	if err := postJSON(base+path, body, &out); err != nil {
		t.Fatal(err)
	}
}

func TestBrowserConsole(t *testing.T) {
	t.Setenv("TASKLEASE_TOKEN", "")
	browsertest.ChromiumPath(t)
	srv := startServe(t, browserConfig)
	b := browsertest.New(t, browsertest.Options{})
	b.Run("open the console", chromedp.Navigate(srv.url+"/"))
	b.Until(20*time.Second, "the first load", `document.body.dataset.ready === "1"`)
	b.Until(10*time.Second, "the live feed", `document.querySelector('#conn').dataset.state === "live"`)

	// Sync now: the row appears and its stage changes live, pulling → pushing.
	b.Run("sync now u42", chromedp.SetValue(chromedp.CSS("#submit-subject"), "u42"),
		chromedp.SetValue(chromedp.CSS("#submit-scope"), "course_sync"), chromedp.Click(chromedp.CSS("#submit-btn")))
	b.Until(10*time.Second, "u42 pulling", field("u42|course_sync", "stage")+` === "pulling"`)
	// Again while it runs: the page says it is already running.
	b.Run("sync now u42 again", chromedp.Click(chromedp.CSS("#submit-btn")))
	b.Until(5*time.Second, "already running", `/already (running|queued) since/.test(document.querySelector('#submit-result').textContent)`)
	b.Until(10*time.Second, "u42 pushing, live", field("u42|course_sync", "stage")+` === "pushing"`)
	b.Until(10*time.Second, "u42 done", field("u42|course_sync", "status")+` === "done"`)

	// Cancel a running run from its row.
	b.Run("sync now u43", chromedp.SetValue(chromedp.CSS("#submit-subject"), "u43"), chromedp.Click(chromedp.CSS("#submit-btn")))
	b.Until(10*time.Second, "u43 running", field("u43|course_sync", "status")+` === "running"`)
	b.Press("cancel u43", rowButton("u43|course_sync", "cancel"))
	b.Until(10*time.Second, "u43 cancelled", field("u43|course_sync", "status")+` === "cancelled"`)

	// A failing run (demo subjects fail*) retried from the page: a new run.
	b.Run("sync now fail-1", chromedp.SetValue(chromedp.CSS("#submit-subject"), "fail-1"), chromedp.Click(chromedp.CSS("#submit-btn")))
	b.Until(15*time.Second, "fail-1 failed", field("fail-1|course_sync", "status")+` === "failed"`)
	first, err := taskView(srv.url, "fail-1", "course_sync")
	if err != nil {
		t.Fatal(err)
	}
	b.Press("retry fail-1", rowButton("fail-1|course_sync", "retry"))
	eventually(t, 10*time.Second, "a new run of fail-1", func() error {
		v, err := taskView(srv.url, "fail-1", "course_sync")
		if err == nil && v.RunID == first.RunID {
			err = fmt.Errorf("still run %s (%s)", v.RunID, v.Status)
		}
		return err
	})
	b.Until(15*time.Second, "fail-1 failed again", field("fail-1|course_sync", "status")+` === "failed"`)

	// Pause a scope: a new request waits; resume: it runs.
	card := `document.querySelector('[data-scope-card="backup"]')`
	b.Press("pause backup", `[data-scope-card="backup"] button[data-action="pause"]`)
	b.Until(10*time.Second, "backup shown paused", card+`?.querySelector('.paused-badge') != null`)
	b.Run("sync now backup", chromedp.SetValue(chromedp.CSS("#submit-subject"), "nightly"),
		chromedp.SetValue(chromedp.CSS("#submit-scope"), "backup"), chromedp.Click(chromedp.CSS("#submit-btn")))
	eventually(t, 10*time.Second, "nightly parked by the pause", func() error {
		v, err := taskView(srv.url, "nightly", "backup")
		if err == nil && (v.Status != jobs.StatusQueued || !strings.Contains(v.Waiting, "paused")) {
			err = fmt.Errorf("%s %q", v.Status, v.Waiting)
		}
		return err
	})
	b.Until(10*time.Second, "nightly shown queued", field("nightly|backup", "status")+` === "queued"`)
	b.Press("resume backup", `[data-scope-card="backup"] button[data-action="resume"]`)
	b.Until(10*time.Second, "backup shown active", card+`?.querySelector('.paused-badge') == null`)
	b.Until(15*time.Second, "nightly running", `["running", "done"].includes(`+field("nightly|backup", "status")+`)`)

	// The detail timeline shows coalesced repeats: five schedule joins.
	postAPI(t, srv.url, "/v1/tasks/u77/course_sync/runs", `{"source":"manual"}`)
	for range 5 {
		postAPI(t, srv.url, "/v1/tasks/u77/course_sync/runs", `{"source":"schedule"}`)
	}
	b.Until(10*time.Second, "u77 listed", row("u77|course_sync")+` != null`)
	b.Press("open u77's detail", rowButton("u77|course_sync", "detail"))
	b.Until(10*time.Second, "the timeline with joined ×5",
		`document.querySelector('#detail').dataset.key === "u77|course_sync" && [...document.querySelectorAll('#timeline > li')].some(li => /joined/.test(li.textContent) && /×5/.test(li.textContent) && /schedule/.test(li.textContent))`)
	b.Until(10*time.Second, "the lease holder shown", `/console-test\//.test(document.querySelector('#detail [data-field="holder"]')?.textContent ?? '')`)
	b.Shot("detail")
	b.Run("close the detail", chromedp.Click(chromedp.CSS("#detail-close")))

	// Runners and schedules list what is really there.
	b.Until(10*time.Second, "this runner alive", `[...document.querySelectorAll('#runners tr[data-owner]')].some(tr => tr.dataset.owner.startsWith("console-test/") && tr.querySelector('[data-field="state"]').textContent.trim() === "alive")`)
	b.Until(10*time.Second, "the schedule listed", `document.querySelector('#schedules tr[data-schedule="demo-hourly"] [data-field="next"]')?.textContent.trim() !== ""`)
	// The hourly schedule never fires twice here: the summary of a
	// schedule's earlier fan-outs is checked on the page's own function.
	b.Until(5*time.Second, "earlier fan-outs summed up", `earlierFanOuts([
		{done: true, startedAt: "2026-12-03T02:00:00Z", finishedAt: "2026-12-03T02:00:03.5Z"},
		{done: true, abandoned: true, startedAt: "2026-12-03T01:00:00Z", finishedAt: "2026-12-03T01:30:00Z"},
		{done: true, startedAt: "2026-12-03T00:00:00Z", finishedAt: "2026-12-03T00:00:01Z"}]).textContent === "earlier: 2 done · 1 abandoned · longest 3.5 s" && earlierFanOuts([]) === null`)

	// Cancel all matching the filter, with a confirmation naming the count.
	for _, s := range []string{"m1", "m2", "m3"} {
		postAPI(t, srv.url, "/v1/tasks/"+s+"/message_sync/runs", `{"source":"schedule"}`)
	}
	b.Run("filter message_sync", chromedp.SetValue(chromedp.CSS("#filter-scope"), "message_sync"),
		browsertest.JS(`document.querySelector('#filter-scope').dispatchEvent(new Event('change', {bubbles: true}))`))
	b.Until(10*time.Second, "only message_sync rows", `[...document.querySelectorAll('#tasks tr[data-key]')].length === 3 && [...document.querySelectorAll('#tasks tr[data-key]')].every(tr => tr.dataset.key.endsWith("|message_sync"))`)
	b.Run("cancel all matching", chromedp.Click(chromedp.CSS("#cancel-matching")))
	b.Until(10*time.Second, "the confirmation naming 3 tasks", `document.querySelector('#confirm-dialog').open && /\b3\b/.test(document.querySelector('#confirm-text').textContent)`)
	b.Run("confirm", chromedp.Click(chromedp.CSS("#confirm-ok")))
	for _, s := range []string{"m1", "m2", "m3"} {
		b.Until(10*time.Second, s+" cancelled", field(s+"|message_sync", "status")+` === "cancelled"`)
	}
	b.Run("clear the filter", chromedp.SetValue(chromedp.CSS("#filter-scope"), ""),
		browsertest.JS(`document.querySelector('#filter-scope').dispatchEvent(new Event('change', {bubbles: true}))`))

	// The README screenshot: running, done, failed and paused work at once.
	b.Press("pause message_sync", `[data-scope-card="message_sync"] button[data-action="pause"]`)
	b.Until(10*time.Second, "message_sync shown paused", `document.querySelector('[data-scope-card="message_sync"] .paused-badge') != null`)
	postAPI(t, srv.url, "/v1/tasks/inbox-7/message_sync/runs", `{"source":"foreground"}`)
	for _, s := range []string{"u100", "u101", "u102"} {
		postAPI(t, srv.url, "/v1/tasks/"+s+"/course_sync/runs", `{"source":"manual"}`)
	}
	postAPI(t, srv.url, "/v1/tasks/fail-2/backup/runs", `{"source":"schedule"}`)
	b.Until(15*time.Second, "running, done, failed and paused rows",
		`["running", "done", "failed"].every(s => [...document.querySelectorAll('#tasks [data-field="status"]')].some(td => td.textContent.trim() === s)) && /paused/i.test(`+row("inbox-7|message_sync")+`?.textContent ?? '')`)
	// Cosmetic, so not a failure: the overview and runners views refresh
	// every few seconds, and the demo runs may end before they show them.
	b.Soon(6*time.Second, `Number(document.querySelector('[data-scope-card="course_sync"] [data-count="running"]').textContent) >= 3 && `+
		`parseInt(document.querySelector('#runners [data-field="active"]')?.textContent ?? '0') >= 3`)
	b.Run("dismiss the toasts", browsertest.JS(`document.querySelector('#toasts').replaceChildren()`))
	b.Shot("console")

	if f := b.Foreign(srv.url); len(f) > 0 {
		t.Errorf("the page requested other hosts: %v", f)
	}
}

// With http.token set, the page asks for the token (kept in the tab),
// shows the feed disconnected until it has it, then loads.
func TestBrowserConsoleToken(t *testing.T) {
	t.Setenv("TASKLEASE_TOKEN", "")
	browsertest.ChromiumPath(t)
	srv := startServe(t, browserConfig+"http:\n  token: s3cret-token\n")
	b := browsertest.New(t, browsertest.Options{})
	b.Run("open the console", chromedp.Navigate(srv.url+"/"))
	b.Until(10*time.Second, "the token prompt", `document.querySelector('#token-dialog').open`)
	b.Until(10*time.Second, "the feed shown disconnected",
		`document.querySelector('#conn').dataset.state === "reconnecting" && /disconnected, reconnecting/.test(document.querySelector('#conn').textContent)`)
	b.Shot("token-prompt")
	b.Run("enter the token", chromedp.SetValue(chromedp.CSS("#token-input"), "s3cret-token"), chromedp.Click(chromedp.CSS("#token-save")))
	b.Until(20*time.Second, "the first load", `document.body.dataset.ready === "1"`)
	b.Until(15*time.Second, "the live feed", `document.querySelector('#conn').dataset.state === "live"`)
	stored, err := chromedp.Run(b.Ctx, chromedp.Evaluate[string](`JSON.stringify(Object.keys(localStorage)) + JSON.stringify(document.cookie)`))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stored, "token") || strings.Contains(stored, "s3cret") {
		t.Errorf("the token left the tab: localStorage/cookies %s", stored)
	}
	// The API really needs it: the page's success is not an open API.
	if code, err := getJSON(srv.url+"/v1/scopes", "", nil); err != nil || code != http.StatusUnauthorized {
		t.Errorf("GET /v1/scopes without the token: %d %v, want 401", code, err)
	}
	if f := b.Foreign(srv.url); len(f) > 0 {
		t.Errorf("the page requested other hosts: %v", f)
	}
}
