package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tasklease/tasklease/internal/browsertest"
)

// TestBrowserConsoleCounts checks the console's own functions on crafted
// answers: the header counts queued work as the scope cards do and running
// work apart (it counted the runners' taken entries as queued, and used to
// say "in stream"), and a gone runner's row shows no runs held.
func TestBrowserConsoleCounts(t *testing.T) {
	t.Setenv("TASKLEASE_TOKEN", "")
	browsertest.ChromiumPath(t)
	srv := startServe(t, browserConfig)
	b := browsertest.New(t, browsertest.Options{})
	b.Run("open the console", chromedp.Navigate(srv.url+"/"))
	b.Until(20*time.Second, "the first load", `document.body.dataset.ready === "1"`)

	// Five runs executing, none waiting: the partition queues hold their
	// five taken entries (queue.stream), every card shows 0 queued.
	header := func(overview string) string {
		t.Helper()
		text, err := chromedp.Run(b.Ctx, chromedp.Evaluate[string](`(() => { renderQueue(`+overview+`); return document.querySelector('#queue-depth').textContent })()`))
		if err != nil {
			t.Fatal(err)
		}
		return text
	}
	running := `{"queue": {"stream": 5, "retry": 0}, "scopes": [
		{"scope": "course_sync", "counts": {"queued": 0, "running": 3, "retrying": 0}},
		{"scope": "backup", "counts": {"queued": 0, "running": 2, "retrying": 0}}]}`
	if got, want := header(running), "queue: 0 queued · 5 running · 0 waiting to retry"; got != want {
		t.Errorf("header with 5 runs executing and none waiting: %q, want %q", got, want)
	}
	waiting := `{"queue": {"stream": 4, "retry": 1}, "scopes": [
		{"scope": "course_sync", "counts": {"queued": 2, "running": 1, "retrying": 1}},
		{"scope": "backup", "paused": true, "counts": {"queued": 1, "running": 0, "retrying": 0}}]}`
	if got, want := header(waiting), "queue: 3 queued · 1 running · 1 waiting to retry"; got != want {
		t.Errorf("header with queued, running and retrying runs: %q, want %q", got, want)
	}

	// A runner SIGKILLed with a run claimed: its last report said 1 of 16.
	active := func(runner string) string {
		t.Helper()
		text, err := chromedp.Run(b.Ctx, chromedp.Evaluate[string](`runnerRow(`+runner+`).querySelector('[data-field="active"]').textContent`))
		if err != nil {
			t.Fatal(err)
		}
		return text
	}
	const gone = `{"owner": "pod-k/aa34f5", "id": "pod-k", "alive": false, "active": 1, "concurrency": 16,
		"heartbeatAgeSeconds": 30, "startedAt": "2026-12-03T09:00:00Z"}`
	if got := active(gone); got != "—" {
		t.Errorf("gone runner's active: %q, want — (a gone runner holds nothing)", got)
	}
	const alive = `{"owner": "pod-a/f8a637", "id": "pod-a", "alive": true, "active": 1, "concurrency": 16,
		"heartbeatAgeSeconds": 1, "startedAt": "2026-12-03T09:00:00Z"}`
	if got := active(alive); got != "1 / 16" {
		t.Errorf("alive runner's active: %q, want 1 / 16", got)
	}
}

// TestBrowserConsoleLimiters: the Limiters section lists each limiter's
// slots in use of its limit, rate, waiting runs and hold, and is hidden
// while there is none.
func TestBrowserConsoleLimiters(t *testing.T) {
	t.Setenv("TASKLEASE_TOKEN", "")
	browsertest.ChromiumPath(t)
	srv := startServe(t, limitedConfig)
	b := browsertest.New(t, browsertest.Options{})
	b.Run("open the console", chromedp.Navigate(srv.url+"/"))
	b.Until(20*time.Second, "the first load", `document.body.dataset.ready === "1"`)
	b.Until(10*time.Second, "the limiters listed",
		`!$("limiters-section").hidden && document.querySelector('#limiters tr[data-limiter="remote_store"]') !== null`)
	cell := func(limiter, f string) string {
		t.Helper()
		text, err := chromedp.Run(b.Ctx, chromedp.Evaluate[string](fmt.Sprintf(
			`(document.querySelector('#limiters tr[data-limiter=%q] [data-field=%q]')?.textContent ?? "").trim()`, limiter, f)))
		if err != nil {
			t.Fatal(err)
		}
		return text
	}
	if got := cell("remote_store", "in-use"); got != "0 / 2" {
		t.Errorf("remote_store in use: %q, want 0 / 2", got)
	}
	if got := cell("remote_store", "rate"); got != "20/sburst 5" {
		t.Errorf("remote_store rate: %q", got)
	}
	if got := cell("job.slowjob", "in-use"); got != "0 / 3" {
		t.Errorf("job.slowjob in use: %q, want 0 / 3", got)
	}
	// Crafted answers: a full limiter held by a retry-after, one without a
	// cap; then none at all.
	b.Run("render crafted limiters", browsertest.JS(`renderLimiters([
		{name: "remote_store", concurrency: 50, inUse: 50, rate: "20/s", burst: 10, waiting: 7,
		 heldUntil: new Date(Date.now() + 60000).toISOString(), jobs: ["okjob"]},
		{name: "slow", rate: "5/m", burst: 1, inUse: 0, waiting: 1, jobs: []}])`))
	if got := cell("remote_store", "in-use"); got != "50 / 50" {
		t.Errorf("full limiter: %q, want 50 / 50", got)
	}
	if got := cell("remote_store", "waiting"); got != "7" {
		t.Errorf("waiting: %q, want 7", got)
	}
	if got := cell("remote_store", "held"); !strings.Contains(got, "in ") {
		t.Errorf("held until: %q, want a time and how soon", got)
	}
	if got := cell("slow", "in-use"); got != "no cap" {
		t.Errorf("limiter without a concurrency: %q, want no cap", got)
	}
	note, err := chromedp.Run(b.Ctx, chromedp.Evaluate[string](`$("limiters-note").textContent`))
	if err != nil || note != "2 limiters · 8 runs waiting · 1 held" {
		t.Errorf("note: %q, %v", note, err)
	}
	b.Run("render no limiters", browsertest.JS(`renderLimiters([])`))
	b.Until(5*time.Second, "the section hidden", `$("limiters-section").hidden`)

	// Five runs of slowjob (they run until cancelled) for its own limit of
	// three: three hold a slot, two wait.
	for i := range 5 {
		res, err := http.Post(fmt.Sprintf("%s/v1/tasks/u%d/slowjob/runs", srv.url, i), "application/json", strings.NewReader(`{"source":"schedule"}`))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
	}
	b.Until(20*time.Second, "three in use, two waiting",
		`(document.querySelector('#limiters tr[data-limiter="job.slowjob"] [data-field="in-use"]')?.textContent ?? "").trim() === "3 / 3" &&
		 (document.querySelector('#limiters tr[data-limiter="job.slowjob"] [data-field="waiting"]')?.textContent ?? "").trim() === "2"`)
	b.Shot("console-limiters")
}
