package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tasklease/tasklease/triggers"
)

// consoleConfig adds a schedule to the CLI jobs, so `runner schedules` has
// one to show (hourly: it does not fire during the test).
const consoleConfig = cliConfig + `
schedules:
  - name: ok-hourly
    cron: "@hourly"
    scope: okjob
    subjects: [u1, u2]
`

func TestCLIConsoleCommands(t *testing.T) {
	t.Setenv("TASKLEASE_TOKEN", "")
	srv := startServe(t, consoleConfig)
	cmd := func(args ...string) result {
		t.Helper()
		return runCmd(t, append(args, "--server", srv.url)...)
	}

	r := cmd("pause", "okjob")
	wantCode(t, r, exitOK, "pause okjob")
	if !strings.Contains(r.stdout, "okjob paused") {
		t.Errorf("pause: %s", r)
	}
	wantCode(t, cmd("submit", "p1", "okjob"), exitOK, "submit p1 okjob")
	eventually(t, 10*time.Second, "p1 shown waiting for the pause", func() error {
		r := cmd("tasks", "--scope", "okjob", "--prefix", "p")
		if !strings.Contains(r.stdout, "p1|okjob queued") || !strings.Contains(r.stdout, "scope okjob is paused") {
			return fmt.Errorf("tasks: %s", r)
		}
		return nil
	})
	r = cmd("scopes")
	wantCode(t, r, exitOK, "scopes")
	if !strings.Contains(r.stdout, "SCOPE") || !lineHas(r.stdout, "okjob", "PAUSED") || !lineHas(r.stdout, "badjob", "active") {
		t.Errorf("scopes: %s", r)
	}
	r = cmd("resume", "okjob")
	wantCode(t, r, exitOK, "resume okjob")
	if !strings.Contains(r.stdout, "okjob resumed; 1 waiting runs re-queued") {
		t.Errorf("resume: %s", r)
	}
	eventually(t, 10*time.Second, "p1 done", func() error {
		if r := cmd("status", "p1", "okjob"); !strings.Contains(r.stdout, "p1|okjob done") {
			return fmt.Errorf("status: %s", r)
		}
		return nil
	})

	eventually(t, 10*time.Second, "the runner listed", func() error {
		r := cmd("runners")
		if !lineHas(r.stdout, "cli-test/", "alive") {
			return fmt.Errorf("runners: %s", r)
		}
		return nil
	})
	r = cmd("schedules")
	wantCode(t, r, exitOK, "schedules")
	if !lineHas(r.stdout, "ok-hourly", "@hourly", "okjob", "2") {
		t.Errorf("schedules: %s", r)
	}
	if r := cmd("scopes", "--json"); !strings.HasPrefix(strings.TrimSpace(r.stdout), "{") || len(jsonValues(t, r.stdout)) != 1 {
		t.Errorf("scopes --json: %s", r)
	}

	wantCode(t, cmd("pause"), exitUsage, "pause without a scope")
	wantCode(t, cmd("runners", "extra"), exitUsage, "runners with an argument")
	wantCode(t, cmd("pause", "nope"), exitUsage, "pause of an unknown scope")
}

// lineHas reports whether one line of out holds every part, in order.
func lineHas(out string, parts ...string) bool {
	for _, line := range strings.Split(out, "\n") {
		rest, ok := line, true
		for _, p := range parts {
			i := strings.Index(rest, p)
			if i < 0 {
				ok = false
				break
			}
			rest = rest[i+len(p):]
		}
		if ok {
			return true
		}
	}
	return false
}

func TestEarlierFanOuts(t *testing.T) {
	at := time.Date(2026, 12, 3, 2, 0, 0, 0, time.UTC)
	fin := func(d time.Duration) *time.Time { f := at.Add(d); return &f }
	for _, tc := range []struct {
		rs   []*triggers.FanOutStatus
		want string
	}{
		{nil, "-"},
		{[]*triggers.FanOutStatus{{Done: true, StartedAt: at, FinishedAt: fin(1500 * time.Millisecond)},
			{Done: true, StartedAt: at, FinishedAt: fin(3 * time.Second)}}, "2 done (longest 3s)"},
		{[]*triggers.FanOutStatus{{Done: true, StartedAt: at, FinishedAt: fin(time.Second)},
			{Done: true, Abandoned: true, StartedAt: at, FinishedAt: fin(time.Hour)}}, "1 done, 1 abandoned (longest 1s)"},
	} {
		if got := earlierFanOuts(tc.rs); got != tc.want {
			t.Errorf("earlierFanOuts(%d fan-outs) = %q, want %q", len(tc.rs), got, tc.want)
		}
	}
}
