package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tasklease/tasklease/jobs"
)

// limitedConfig: the CLI jobs, with a shared limiter for okjob (fair share
// by request) and a cap of its own for slowjob.
const limitedConfig = `
runner:
  id: cli-test
  leaseTTL: 3s
  shutdownGrace: 1s
log:
  level: warn
limiters:
  remote_store: {concurrency: 2, rate: 20/s, burst: 5, holdOnRetryAfter: true}
jobs:
  okjob:
    limiters: [remote_store]
    fairness: {groupBy: request}
    stages:
      - name: pulling
        exec: ["sh", "-c", "sleep 0.2"]
  slowjob:
    concurrency: 3
    stages:
      - name: waiting
        exec: ["sh", "-c", "sleep 30"]
        killGrace: 1s
`

// runner limiters against a runner configured with limiters, and submit
// --group through to the API's check.
func TestCLILimiters(t *testing.T) {
	t.Setenv("TASKLEASE_TOKEN", "")
	srv := startServe(t, limitedConfig)
	cmd := func(args ...string) result {
		t.Helper()
		return runCmd(t, append(args, "--server", srv.url)...)
	}
	r := cmd("limiters")
	wantCode(t, r, exitOK, "limiters")
	if !lineHas(r.stdout, "NAME", "CONCURRENCY", "IN-USE", "RATE", "BURST", "WAITING", "HELD-UNTIL", "JOBS") ||
		!lineHas(r.stdout, "job.slowjob", "3", "0", "-", "-", "0", "-", "slowjob") ||
		!lineHas(r.stdout, "remote_store", "2", "0", "20/s", "5", "0", "-", "okjob") {
		t.Errorf("limiters: %s", r)
	}
	r = cmd("limiters", "--json")
	wantCode(t, r, exitOK, "limiters --json")
	var out struct {
		Limiters []jobs.LimiterView `json:"limiters"`
	}
	if vals := jsonValues(t, r.stdout); len(vals) != 1 || json.Unmarshal(vals[0], &out) != nil ||
		len(out.Limiters) != 2 || out.Limiters[1].Name != "remote_store" || out.Limiters[1].Burst != 5 {
		t.Errorf("limiters --json: %s", r)
	}
	wantCode(t, cmd("limiters", "extra"), exitUsage, "limiters with an argument")

	wantCode(t, cmd("submit", "u1", "okjob", "--group", "acme"), exitOK, "submit --group acme")
	r = cmd("submit", "u2", "okjob", "--group", "a|b")
	wantCode(t, r, exitUsage, "submit --group a|b")
	if !strings.Contains(r.err, "bad_request") || !strings.Contains(r.err, "invalid group") {
		t.Errorf("submit with a bad group: %s", r)
	}
}

// What the client sends and shows, against a crafted API: submit --group
// puts the group in the body (and leaves it out when not given); the
// limiters table shows use, holds and missing limits.
func TestCLILimitersCrafted(t *testing.T) {
	t.Setenv("TASKLEASE_TOKEN", "")
	held := time.Date(2026, 12, 3, 14, 5, 0, 0, time.UTC)
	var mu sync.Mutex
	var bodies []map[string]string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/runs"):
			var b map[string]string
			data, _ := io.ReadAll(r.Body)
			if err := json.Unmarshal(data, &b); err != nil {
				t.Errorf("submit body %q: %v", data, err)
			}
			mu.Lock()
			bodies = append(bodies, b)
			mu.Unlock()
			_ = json.NewEncoder(w).Encode(jobs.SubmitResult{Outcome: jobs.OutcomeStarted, RunID: "r1",
				Task: jobs.TaskView{Key: "u1|okjob", Subject: "u1", Scope: "okjob", RunID: "r1", Status: jobs.StatusQueued}})
		case r.URL.Path == "/v1/limiters":
			_ = json.NewEncoder(w).Encode(map[string]any{"limiters": []jobs.LimiterView{
				{Name: "job.okjob", Concurrency: 4, InUse: 4, Waiting: 12, Jobs: []string{"okjob"}},
				{Name: "remote_store", Concurrency: 50, InUse: 17, Rate: "20/s", Burst: 10, Waiting: 3, HeldUntil: &held,
					Jobs: []string{"okjob", "slowjob"}},
				{Name: "unused", Rate: "5/m", Burst: 1, Jobs: []string{}},
			}})
		default:
			http.NotFound(w, r)
		}
	}))
	defer api.Close()

	wantCode(t, runCmd(t, "submit", "u1", "okjob", "--group", "acme:eu", "--server", api.URL), exitOK, "submit --group")
	wantCode(t, runCmd(t, "submit", "u1", "okjob", "--server", api.URL), exitOK, "submit")
	if len(bodies) != 2 || bodies[0]["group"] != "acme:eu" || len(bodies[0]) != 2 {
		t.Errorf("submit --group acme:eu sent %v, want source and group", bodies)
	} else if _, ok := bodies[1]["group"]; ok {
		t.Errorf("submit without --group sent a group: %v", bodies[1])
	}

	r := runCmd(t, "limiters", "--server", api.URL)
	wantCode(t, r, exitOK, "limiters")
	for _, want := range [][]string{
		{"job.okjob", "4", "4", "-", "-", "12", "-", "okjob"},
		{"remote_store", "50", "17", "20/s", "10", "3", held.Local().Format("15:04:05"), "okjob,slowjob"},
		{"unused", "-", "0", "5/m", "1", "0", "-", "-"},
	} {
		if !lineHas(r.stdout, want...) {
			t.Errorf("no line with %q: %s", want, r)
		}
	}
}

// With no limiter configured the command says so.
func TestCLILimitersNone(t *testing.T) {
	t.Setenv("TASKLEASE_TOKEN", "")
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"limiters":[]}`)
	}))
	defer api.Close()
	r := runCmd(t, "limiters", "--server", api.URL)
	wantCode(t, r, exitOK, "limiters")
	if strings.TrimSpace(r.stdout) != "no limiters configured" {
		t.Errorf("limiters with none: %s", r)
	}
}
