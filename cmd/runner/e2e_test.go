package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/config"
	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/triggers"
)

// buildRunner builds this command into dir (the test's cwd is cmd/runner).
func buildRunner(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "runner")
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	start := time.Now()
	cmd := exec.CommandContext(t.Context(), "go", "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Logf("built %s in %v", bin, time.Since(start).Round(time.Millisecond))
	return bin
}

// runnerProc is one `runner serve` process.
type runnerProc struct {
	id   string
	url  string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{} // closed once the process has been reaped
	err  error         // cmd.Wait's result, valid after done
}

func (p *runnerProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// startRunner starts `runner serve` on a free loopback port and waits for
// /readyz. A port lost to another process between picking and binding is
// retried on another one.
func startRunner(t *testing.T, bin, cfgPath, redisURL, id string, env ...string) *runnerProc {
	t.Helper()
	for attempt := 1; ; attempt++ {
		addr := fmt.Sprintf("127.0.0.1:%d", deadPort(t))
		p := &runnerProc{id: id, url: "http://" + addr, out: &syncBuffer{}, done: make(chan struct{})}
		p.cmd = exec.Command(bin, "serve", "--config", cfgPath, "--redis", redisURL, "--listen", addr)
		p.cmd.Env = append(os.Environ(), "TASKLEASE_RUNNER_ID="+id, "TASKLEASE_TOKEN=")
		p.cmd.Env = append(p.cmd.Env, env...)
		p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
		p.cmd.SysProcAttr = runnerProcAttr()
		if err := p.cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", id, err)
		}
		go func() { p.err = p.cmd.Wait(); close(p.done) }()
		t.Cleanup(func() {
			if !p.exited() {
				_ = p.cmd.Process.Kill()
				<-p.done
			}
			if t.Failed() {
				t.Logf("--- output of %s:\n%s", p.id, p.out)
			}
		})

		deadline := time.Now().Add(15 * time.Second)
		for {
			if p.exited() {
				if attempt < 3 && strings.Contains(p.out.String(), "address already in use") {
					break // lost the port race: try another port
				}
				t.Fatalf("%s exited before it was ready: %v\n%s", id, p.err, p.out)
			}
			if code, err := getJSON(p.url+"/readyz", "", nil); err == nil && code == http.StatusOK {
				return p
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not ready within 15s:\n%s", id, p.out)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// postJSON POSTs body to url and decodes a 200 answer into out.
func postJSON(url, body string, out any) error {
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return fmt.Errorf("POST %s: %s: %s", url, resp.Status, b.String())
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// stageLine is one line an exec stage appended to the shared log.
type stageLine struct {
	stage, subject, runID, phase string
	token                        int64
}

func readStageLog(t *testing.T, path string) []stageLine {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("stage log: %v", err)
	}
	defer f.Close()
	var lines []stageLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 5 {
			t.Fatalf("malformed stage log line %q", sc.Text())
		}
		tok, err := strconv.ParseInt(fs[2], 10, 64)
		if err != nil || tok <= 0 || fs[3] == "" {
			t.Fatalf("stage log line %q: bad fencing token or run id", sc.Text())
		}
		lines = append(lines, stageLine{stage: fs[0], subject: fs[1], token: tok, runID: fs[3], phase: fs[4]})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}

// checkStageLog checks the invariants visible in the shared log, for every
// subject: each (run, stage) started and ended exactly once; a subject's
// stages never overlap (one executor per key, one run at a time); fencing
// tokens never go back, and a later run has a larger token.
func checkStageLog(t *testing.T, lines []stageLine) {
	t.Helper()
	type runStage struct{ runID, stage string }
	type subjState struct {
		open    *stageLine
		lastTok int64
		lastRun string
	}
	starts, ends := map[runStage]int{}, map[runStage]int{}
	subjects := map[string]*subjState{}
	for i, l := range lines {
		rs := runStage{l.runID, l.stage}
		st := subjects[l.subject]
		if st == nil {
			st = &subjState{}
			subjects[l.subject] = st
		}
		switch l.phase {
		case "start":
			starts[rs]++
			if st.open != nil {
				t.Errorf("line %d: %s stage %s of run %s started while stage %s of run %s was running",
					i+1, l.subject, l.stage, l.runID, st.open.stage, st.open.runID)
			}
			if l.token < st.lastTok || (l.token == st.lastTok && l.runID != st.lastRun) {
				t.Errorf("line %d: %s run %s has fencing token %d after run %s had %d",
					i+1, l.subject, l.runID, l.token, st.lastRun, st.lastTok)
			}
			st.open, st.lastTok, st.lastRun = &l, l.token, l.runID
		case "end":
			ends[rs]++
			if st.open == nil || st.open.runID != l.runID || st.open.stage != l.stage || st.open.token != l.token {
				t.Errorf("line %d: %s end of stage %s run %s does not match the running stage %+v", i+1, l.subject, l.stage, l.runID, st.open)
			}
			st.open = nil
		default:
			t.Errorf("line %d: bad phase %q", i+1, l.phase)
		}
	}
	for rs, n := range starts {
		if n != 1 || ends[rs] != 1 {
			t.Errorf("run %s stage %s: started %d times, ended %d times; want once each", rs.runID, rs.stage, n, ends[rs])
		}
	}
	for subj, st := range subjects {
		if st.open != nil {
			t.Errorf("%s: stage %s of run %s never ended", subj, st.open.stage, st.open.runID)
		}
	}
}

// TestE2EThreeRunners runs three `runner serve` processes against one real
// Redis: a foreground hook and an API submit for the same key at once make
// one run whose stages each execute once; a 1s cron schedule fires each
// occurrence once across the three; SIGTERM stops all three with exit 0.
func TestE2EThreeRunners(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("exec stages use sh and SIGTERM")
	}
	if testing.Short() {
		t.Skip("builds the binary and starts three processes")
	}
	rs := redistest.StartServer(t) // skips without redis-server unless TASKLEASE_REQUIRE_REDIS=1
	dir := t.TempDir()
	bin := buildRunner(t, dir)
	stageLog := filepath.Join(dir, "stages.log")
	const stageScript = `echo "$TASKLEASE_STAGE $TASKLEASE_SUBJECT $TASKLEASE_FENCING_TOKEN $TASKLEASE_RUN_ID start" >> "$E2E_LOG"; ` +
		`sleep 0.3; echo "$TASKLEASE_STAGE $TASKLEASE_SUBJECT $TASKLEASE_FENCING_TOKEN $TASKLEASE_RUN_ID end" >> "$E2E_LOG"`
	const schedule = "e2e-every-1s"
	cfgText := fmt.Sprintf(`
runner:
  id: "${TASKLEASE_RUNNER_ID}"
  leaseTTL: 5s
  shutdownGrace: 5s
log:
  level: info
jobs:
  course_sync:
    foreground: true
    onConflict: join
    retry: {maxAttempts: 3, backoff: 100ms, maxBackoff: 1s}
    stages:
      - name: pulling
        exec: ["sh", "-c", %[1]q]
        env: {E2E_LOG: %[2]q}
      - name: pushing
        exec: ["sh", "-c", %[1]q]
        env: {E2E_LOG: %[2]q}
schedules:
  - name: %[3]s
    cron: "@every 1s"
    scope: course_sync
    subjects: [cronuser]
`, stageScript, stageLog, schedule)
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := runCmd(t, "validate", "--config", cfgPath); r.code != exitOK {
		t.Fatalf("e2e config invalid: %s", r)
	}
	redisURL := "redis://" + rs.Addr() + "/0"

	var procs [3]*runnerProc
	for i := range procs {
		procs[i] = startRunner(t, bin, cfgPath, redisURL, fmt.Sprintf("pod-%c", 'a'+i))
	}
	r1, r2, r3 := procs[0], procs[1], procs[2]

	// The foreground hook on runner 1 and a manual submit on runner 2 at
	// (nearly) the same time: one starts the run, the other joins it.
	var fg struct {
		Results []triggers.ForegroundResult `json:"results"`
	}
	var sub jobs.SubmitResult
	var fgErr, subErr error
	var wg sync.WaitGroup
	gate := make(chan struct{})
	wg.Go(func() { <-gate; fgErr = postJSON(r1.url+"/v1/hooks/foreground", `{"subject":"u42"}`, &fg) })
	wg.Go(func() {
		<-gate
		subErr = postJSON(r2.url+"/v1/tasks/u42/course_sync/runs", `{"source":"manual"}`, &sub)
	})
	close(gate)
	wg.Wait()
	if fgErr != nil || subErr != nil {
		t.Fatalf("foreground: %v; submit: %v", fgErr, subErr)
	}
	if len(fg.Results) != 1 || fg.Results[0].Scope != "course_sync" {
		t.Fatalf("foreground results: %+v", fg.Results)
	}
	outcomes := []jobs.Outcome{fg.Results[0].Outcome, sub.Outcome}
	slices.Sort(outcomes)
	if !slices.Equal(outcomes, []jobs.Outcome{jobs.OutcomeJoined, jobs.OutcomeStarted}) {
		t.Fatalf("outcomes %v, want one started and one joined", outcomes)
	}
	runID := sub.Task.RunID
	if fg.Results[0].Task.RunID != runID || runID == "" {
		t.Fatalf("foreground run %q, submit run %q: want the same run", fg.Results[0].Task.RunID, runID)
	}

	// The third runner's API shows the task (the CLI binary as a user runs it).
	st := exec.CommandContext(t.Context(), bin, "status", "u42", "course_sync", "--server", r3.url)
	st.Env = append(os.Environ(), "TASKLEASE_TOKEN=")
	out, err := st.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "u42|course_sync ") {
		t.Fatalf("runner status --server runner3: %v\n%s", err, out)
	}
	t.Logf("runner status: %s", bytes.TrimSpace(out))

	var final jobs.TaskView
	eventually(t, 15*time.Second, "u42 done", func() error {
		v, err := taskView(r3.url, "u42", "course_sync")
		if err != nil {
			return err
		}
		if v.Status.Active() {
			return fmt.Errorf("status %s stage %s", v.Status, v.Stage)
		}
		final = v
		return nil
	})
	if final.Status != jobs.StatusDone || final.RunID != runID ||
		!slices.Contains(final.Sources, jobs.SourceForeground) || !slices.Contains(final.Sources, jobs.SourceManual) {
		t.Errorf("u42 final view: %+v", final)
	}
	var u42 []string
	for _, l := range readStageLog(t, stageLog) {
		if l.subject == "u42" {
			if l.runID != runID || l.token != final.FencingToken {
				t.Errorf("u42 stage line %+v: want run %s token %d", l, runID, final.FencingToken)
			}
			u42 = append(u42, l.stage+" "+l.phase)
		}
	}
	if want := []string{"pulling start", "pulling end", "pushing start", "pushing end"}; !slices.Equal(u42, want) {
		t.Errorf("u42 stage log %q, want %q", u42, want)
	}

	// Let the schedule fire for a few seconds across the three runners.
	rdb := rs.Client(t)
	firedKeys := func() []string {
		keys, err := rdb.Keys(context.Background(), "{tasklease:cron:"+schedule+"}:fired:*").Result()
		if err != nil {
			t.Fatalf("fired keys: %v", err)
		}
		return keys
	}
	eventually(t, 20*time.Second, "3 cron occurrences fired", func() error {
		if n := len(firedKeys()); n < 3 {
			return fmt.Errorf("%d fired", n)
		}
		return nil
	})

	// SIGTERM all three: each drains and exits 0.
	stopStart := time.Now()
	for _, p := range procs {
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Errorf("SIGTERM %s: %v", p.id, err)
		}
	}
	for _, p := range procs {
		select {
		case <-p.done:
			var ee *exec.ExitError
			if p.err != nil && errors.As(p.err, &ee) {
				t.Errorf("%s exited %d after SIGTERM, want 0", p.id, ee.ExitCode())
			} else if p.err != nil {
				t.Errorf("%s: %v", p.id, p.err)
			}
		case <-time.After(15*time.Second - time.Since(stopStart)):
			t.Errorf("%s did not exit within 15s of SIGTERM", p.id)
		}
	}
	t.Logf("three runners stopped in %v", time.Since(stopStart).Round(time.Millisecond))

	// The whole log: every stage once per run, never two at once per key.
	lines := readStageLog(t, stageLog)
	checkStageLog(t, lines)

	// Cron: each fired occurrence is one schedule request for cronuser (no
	// occurrence fired twice by the three runners, none lost), and every
	// cronuser run in the log was started by one of them.
	fired := firedKeys()
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	rc := cfg.RegistryConfig()
	if rc.Jobs, err = cfg.BuildJobs(); err != nil {
		t.Fatal(err)
	}
	reg, err := jobs.NewRegistry(rdb, rc)
	if err != nil {
		t.Fatal(err)
	}
	hist, err := reg.History(context.Background(), "cronuser", "course_sync", 1000)
	if err != nil {
		t.Fatal(err)
	}
	schedRequests, started := 0, map[string]bool{}
	for _, e := range hist {
		if e.Source != string(jobs.SourceSchedule) {
			continue
		}
		switch e.Event {
		case "requested", "joined", "skipped", "throttled":
			schedRequests += e.Count // identical repeats are one event with a count
			if e.Outcome == string(jobs.OutcomeStarted) {
				started[e.RunID] = true
			}
		}
	}
	if schedRequests != len(fired) {
		t.Errorf("%d schedule requests for cronuser, %d occurrences fired: want one request per occurrence", schedRequests, len(fired))
	}
	cronRuns := map[string]bool{}
	for _, l := range lines {
		if l.subject == "cronuser" {
			cronRuns[l.runID] = true
			if !started[l.runID] {
				t.Errorf("cronuser run %s in the stage log was not started by a schedule request", l.runID)
			}
		}
	}
	if len(cronRuns) == 0 || len(cronRuns) > len(fired) {
		t.Errorf("%d cronuser runs executed for %d fired occurrences", len(cronRuns), len(fired))
	}
	t.Logf("cron: %d occurrences fired, %d schedule requests, %d runs started, %d runs executed; %d stage log lines",
		len(fired), schedRequests, len(started), len(cronRuns), len(lines))
	for _, p := range procs {
		if s := p.out.String(); strings.Contains(s, "panic") || strings.Contains(s, "level=ERROR") {
			t.Errorf("%s logged an error:\n%s", p.id, s)
		}
	}
}
