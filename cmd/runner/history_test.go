package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// gatedJob is a job whose every run waits until the test writes a file
// named by its run id in dir, and then exits with the code the file holds:
// the test decides when and how each run ends.
func gatedJob(dir string) string {
	return fmt.Sprintf(`
jobs:
  gated:
    onConflict: queue
    retry: {maxAttempts: 1}
    stages:
      - name: only
        exec: ["sh", "-c", "while [ ! -e %[1]s/$TASKLEASE_RUN_ID ]; do sleep 0.02; done; exit $(cat %[1]s/$TASKLEASE_RUN_ID)"]
        killGrace: 1s
`, dir)
}

// TestHistoryPrintsCoalescedCounts: `runner history` shows how many
// requests a coalesced event stands for, as the API's count does.
func TestHistoryPrintsCoalescedCounts(t *testing.T) {
	srv, dir := startGatedServe(t, "history-test")
	S := []string{"--server", srv.url}
	cmd := func(args ...string) result {
		t.Helper()
		r := runCmd(t, append(args, S...)...)
		wantCode(t, r, exitOK, strings.Join(args, " "))
		return r
	}
	cmd("submit", "u1", "gated")
	for range 3 {
		cmd("submit", "u1", "gated", "--policy", "join", "--source", "foreground")
	}
	r := cmd("history", "u1", "gated")
	if !regexp.MustCompile(`(?m)^.*joined .*source=foreground.* ×3\b.*$`).MatchString(r.stdout) {
		t.Errorf("history does not show the three joins as one event ×3:\n%s", r.stdout)
	}
	if !regexp.MustCompile(`(?m)^.*requested .*source=manual outcome=started$`).MatchString(r.stdout) {
		t.Errorf("history shows a count on a single request, or lost it:\n%s", r.stdout)
	}
	v, err := taskView(srv.url, "u1", "gated")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, v.RunID), []byte("0"), 0o644); err != nil {
		t.Fatal(err)
	}
}
