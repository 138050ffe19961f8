package main

import (
	"strings"
	"testing"

	"github.com/tasklease/tasklease/jobs"
)

// `runner submit --delay` creates a delayed run and says when it starts;
// a submit without a delay joins it and starts it now; a bad delay is a
// usage error of the server's (400: exit 2) and writes nothing.
func TestSubmitDelay(t *testing.T) {
	t.Setenv("TASKLEASE_TOKEN", "")
	srv := startServe(t, `
runner: {id: delay-test, leaseTTL: 3s, shutdownGrace: 1s}
log: {level: warn}
jobs:
  quick:
    stages: [{name: only, exec: ["true"]}]
`)
	S := []string{"--server", srv.url}
	r := runCmd(t, append([]string{"submit", "u1", "quick", "--delay", "1h", "--source", "schedule"}, S...)...)
	wantCode(t, r, exitOK, "submit --delay 1h")
	if !strings.Contains(r.stdout, "started: u1|quick queued") || !strings.Contains(r.stdout, "not before") {
		t.Fatalf("submit --delay printed %q, want a queued run and when it starts", r.stdout)
	}
	r = runCmd(t, append([]string{"submit", "u1", "quick", "--wait"}, S...)...)
	wantCode(t, r, exitOK, "submit --wait without a delay")
	if !strings.HasPrefix(r.stdout, "joined: ") {
		t.Errorf("submit without a delay printed %q, want joined", r.stdout)
	}
	v, err := taskView(srv.url, "u1", "quick")
	if err != nil || v.Status != jobs.StatusDone || v.NotBefore != nil {
		t.Fatalf("after the join: %s, notBefore %v (%v); want done, an hour early", v.Status, v.NotBefore, err)
	}
	r = runCmd(t, append([]string{"submit", "u2", "quick", "--delay", "soon"}, S...)...)
	wantCode(t, r, exitUsage, "submit --delay soon")
	if _, err := taskView(srv.url, "u2", "quick"); err == nil {
		t.Error("a refused delay created u2|quick")
	}
}
