package main

import (
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestBrowserConsoleCounts checks the console's own functions on crafted
// answers: the header counts queued work as the scope cards do and running
// work apart (it counted the runners' taken entries as queued, and used to
// say "in stream"), and a gone runner's row shows no runs held.
func TestBrowserConsoleCounts(t *testing.T) {
	t.Setenv("TASKLEASE_TOKEN", "")
	chromiumPath(t)
	srv := startServe(t, browserConfig)
	b := newBrowser(t, srv.url)
	b.run("open the console", chromedp.Navigate(srv.url+"/"))
	b.until(20*time.Second, "the first load", `document.body.dataset.ready === "1"`)

	// Five runs executing, none waiting: the partition queues hold their
	// five taken entries (queue.stream), every card shows 0 queued.
	header := func(overview string) string {
		t.Helper()
		text, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](`(() => { renderQueue(`+overview+`); return document.querySelector('#queue-depth').textContent })()`))
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
		text, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](`runnerRow(`+runner+`).querySelector('[data-field="active"]').textContent`))
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
