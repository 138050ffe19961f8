package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/jobs"
)

// TestE2EPauseAcrossThreeRunners: a scope paused through one runner's API
// is honoured by all three runner processes — requests submitted to any of
// them wait (parked, shown "paused"), none executes — and resumed through
// another, every waiting run executes exactly once. The runner registry of
// each lists all three.
func TestE2EPauseAcrossThreeRunners(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("exec stages use sh")
	}
	if testing.Short() {
		t.Skip("builds the binary and starts three processes")
	}
	rs := redistest.StartServer(t)
	dir := t.TempDir()
	bin := buildRunner(t, dir)
	stageLog := filepath.Join(dir, "stages.log")
	cfgText := fmt.Sprintf(`
runner:
  id: "${TASKLEASE_RUNNER_ID}"
  leaseTTL: 5s
  shutdownGrace: 2s
log:
  level: info
jobs:
  paced:
    stages:
      - name: only
        exec: ["sh", "-c", "echo $TASKLEASE_SUBJECT >> \"$E2E_LOG\""]
        env: {E2E_LOG: %q}
  other:
    stages:
      - name: only
        exec: ["true"]
`, stageLog)
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	redisURL := "redis://" + rs.Addr() + "/0"
	var procs [3]*runnerProc
	for i := range procs {
		procs[i] = startRunner(t, bin, cfgPath, redisURL, fmt.Sprintf("pod-%c", 'a'+i))
	}

	var paused struct {
		Paused bool `json:"paused"`
	}
	if err := postJSON(procs[0].url+"/v1/scopes/paced/pause", "", &paused); err != nil || !paused.Paused {
		t.Fatalf("pause: %+v %v", paused, err)
	}
	const n = 12
	for i := range n {
		var res jobs.SubmitResult
		if err := postJSON(fmt.Sprintf("%s/v1/tasks/s%02d/paced/runs", procs[i%3].url, i), "", &res); err != nil || res.Outcome != jobs.OutcomeStarted {
			t.Fatalf("submit s%02d: %+v %v", i, res.Outcome, err)
		}
	}
	var other jobs.SubmitResult
	if err := postJSON(procs[1].url+"/v1/tasks/x/other/runs", "", &other); err != nil {
		t.Fatal(err)
	}
	// Every request was read by some runner and parked: claims saw the pause.
	eventually(t, 20*time.Second, "every paced run parked", func() error {
		for i := range n {
			v, err := taskView(procs[2].url, fmt.Sprintf("s%02d", i), "paced")
			if err != nil {
				return err
			}
			if v.Status != jobs.StatusQueued || !strings.Contains(v.Waiting, "paused") {
				return fmt.Errorf("s%02d: %s %q", i, v.Status, v.Waiting)
			}
		}
		return nil
	})
	eventually(t, 20*time.Second, "the other scope's run done", func() error {
		if v, err := taskView(procs[0].url, "x", "other"); err != nil || v.Status != jobs.StatusDone {
			return fmt.Errorf("x|other: %s %v", v.Status, err)
		}
		return nil
	})
	if b, _ := os.ReadFile(stageLog); len(b) != 0 {
		t.Fatalf("paced stages ran while paused:\n%s", b)
	}
	for _, p := range procs {
		var out struct {
			Runners []jobs.RunnerInfo `json:"runners"`
		}
		if code, err := getJSON(p.url+"/v1/runners", "", &out); err != nil || code != 200 {
			t.Fatalf("%s runners: %d %v", p.id, code, err)
		}
		var ids []string
		for _, r := range out.Runners {
			if r.Alive {
				ids = append(ids, r.ID)
			}
		}
		slices.Sort(ids)
		if !slices.Equal(ids, []string{"pod-a", "pod-b", "pod-c"}) {
			t.Errorf("%s lists alive runners %v, want pod-a, pod-b, pod-c", p.id, ids)
		}
	}

	var resumed struct {
		Requeued int `json:"requeued"`
	}
	if err := postJSON(procs[2].url+"/v1/scopes/paced/resume", "", &resumed); err != nil || resumed.Requeued != n {
		t.Fatalf("resume: %+v %v, want %d re-queued", resumed, err, n)
	}
	eventually(t, 30*time.Second, "every paced run done", func() error {
		for i := range n {
			if v, err := taskView(procs[1].url, fmt.Sprintf("s%02d", i), "paced"); err != nil || v.Status != jobs.StatusDone {
				return fmt.Errorf("s%02d: %s %v", i, v.Status, err)
			}
		}
		return nil
	})
	b, err := os.ReadFile(stageLog)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(string(b))
	slices.Sort(lines)
	if len(lines) != n || len(slices.Compact(slices.Clone(lines))) != n {
		t.Fatalf("stage executions %v, want each of the %d runs exactly once", lines, n)
	}
}
