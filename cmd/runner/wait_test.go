package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tasklease/tasklease/jobs"
)

// TestSubmitWaitQueuedFollowsItsFollowUp: `submit --wait` of a request
// answered queued follows the follow-up that serves it and exits with its
// result — even when that run's finish starts the next follow-up (queued
// by a later request, as a cron's would be) in the same script, so the
// stream never shows the served run ended.
func TestSubmitWaitQueuedFollowsItsFollowUp(t *testing.T) {
	srv, dir := startGatedServe(t, "wait-test")
	S := []string{"--server", srv.url}
	end := func(runID string, code int) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, runID), []byte(fmt.Sprint(code)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	running := func(notRunID string) jobs.TaskView {
		t.Helper()
		var v jobs.TaskView
		eventually(t, 10*time.Second, "a run other than "+notRunID+" running", func() error {
			var err error
			if v, err = taskView(srv.url, "u1", "gated"); err != nil {
				return err
			}
			if v.RunID == notRunID || v.Status != jobs.StatusRunning {
				return fmt.Errorf("run %s %s", v.RunID, v.Status)
			}
			return nil
		})
		return v
	}

	wantCode(t, runCmd(t, append([]string{"submit", "u1", "gated"}, S...)...), exitOK, "submit u1 gated")
	first := running("")

	waited := make(chan result, 1)
	go func() {
		waited <- runCmdCtx(t.Context(), append([]string{"submit", "u1", "gated", "--wait", "--json"}, S...)...)
	}()
	eventually(t, 10*time.Second, "the follow-up queued", func() error {
		v, err := taskView(srv.url, "u1", "gated")
		if err == nil && !v.FollowUpQueued {
			err = fmt.Errorf("no follow-up queued: %+v", v)
		}
		return err
	})
	end(first.RunID, 0)
	follow := running(first.RunID)
	// a later request (the cron's next occurrence) queues the run after
	wantCode(t, runCmd(t, append([]string{"submit", "u1", "gated", "--source", "schedule"}, S...)...), exitOK, "submit u1 gated --source schedule")
	end(follow.RunID, 1) // the served run fails; its finish starts the next
	next := running(follow.RunID)
	t.Cleanup(func() { end(next.RunID, 0) })

	select {
	case r := <-waited:
		wantCode(t, r, exitRunFailed, "submit u1 gated --wait (its follow-up failed)")
		var res jobs.SubmitResult
		if err := json.Unmarshal(jsonValues(t, r.stdout)[0], &res); err != nil {
			t.Fatal(err)
		}
		if res.Outcome != jobs.OutcomeQueued {
			t.Errorf("submit outcome %s, want queued", res.Outcome)
		}
		if !strings.Contains(r.err, follow.RunID) || !strings.Contains(r.err, "failed") {
			t.Errorf("stderr does not say that run %s failed:\n%s", follow.RunID, r)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("submit --wait still following after its follow-up %s failed and run %s started", follow.RunID, next.RunID)
	}
}

// TestSubmitWaitQueuedEndsWhenItsFollowUpIsDropped: a cancel drops the
// queued follow-up with the run it waited behind; `submit --wait` of the
// queued request ends then, exit 1, instead of waiting for a run that
// never comes.
func TestSubmitWaitQueuedEndsWhenItsFollowUpIsDropped(t *testing.T) {
	srv, _ := startGatedServe(t, "wait-test")
	S := []string{"--server", srv.url}
	wantCode(t, runCmd(t, append([]string{"submit", "u1", "gated"}, S...)...), exitOK, "submit u1 gated")
	var first jobs.TaskView
	eventually(t, 10*time.Second, "the first run running", func() error {
		var err error
		if first, err = taskView(srv.url, "u1", "gated"); err == nil && first.Status != jobs.StatusRunning {
			err = fmt.Errorf("status %s", first.Status)
		}
		return err
	})
	waited := make(chan result, 1)
	go func() {
		waited <- runCmdCtx(t.Context(), append([]string{"submit", "u1", "gated", "--wait"}, S...)...)
	}()
	eventually(t, 10*time.Second, "the follow-up queued", func() error {
		v, err := taskView(srv.url, "u1", "gated")
		if err == nil && !v.FollowUpQueued {
			err = fmt.Errorf("no follow-up queued: %+v", v)
		}
		return err
	})
	wantCode(t, runCmd(t, append([]string{"cancel", "u1", "gated"}, S...)...), exitOK, "cancel u1 gated")
	select {
	case r := <-waited:
		wantCode(t, r, exitRunFailed, "submit u1 gated --wait (its follow-up dropped)")
		if !strings.Contains(r.err, "cancelled") || !strings.Contains(r.err, "before it started") {
			t.Errorf("stderr does not say the follow-up was cancelled before it started:\n%s", r)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("submit --wait still waiting after a cancel dropped its follow-up (run %s cancelled)", first.RunID)
	}
}

// startGatedServe runs `serve` (runner id id, no token) with the gated
// job, whose runs end when the test writes their exit code into dir
// (gatedJob).
func startGatedServe(t *testing.T, id string) (srv *testServer, dir string) {
	t.Helper()
	t.Setenv("TASKLEASE_TOKEN", "")
	dir = t.TempDir()
	srv = startServe(t, `
runner:
  id: `+id+`
  leaseTTL: 3s
  shutdownGrace: 1s
log:
  level: warn
`+gatedJob(dir))
	return srv, dir
}
