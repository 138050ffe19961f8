package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/jobs"
)

// cliJobs are the jobs of the in-process servers: okjob (two short exec
// stages), badjob (fails, no retry) and slowjob (runs until cancelled).
const cliJobs = `
jobs:
  okjob:
    stages:
      - name: pulling
        exec: ["sh", "-c", "sleep 0.2"]
      - name: pushing
        exec: ["sh", "-c", "sleep 0.2"]
  badjob:
    retry: {maxAttempts: 1}
    stages:
      - name: only
        exec: ["sh", "-c", "exit 1"]
  slowjob:
    stages:
      - name: waiting
        exec: ["sh", "-c", "sleep 30"]
        killGrace: 1s
`

// cliConfig has no redis section: serve starts an embedded Redis.
const cliConfig = `
runner:
  id: cli-test
  leaseTTL: 3s
  shutdownGrace: 1s
log:
  level: warn
` + cliJobs

// brokenPaths are the problem paths of testdata/broken.yaml.
var brokenPaths = []string{
	"partitions",
	"runner.leaseTTL",
	"jobs.course_sync.onConflict",
	"jobs.course_sync.stages[0].name",
	"schedules[0].cron",
	"schedules[0].scope",
}

// jsonValues decodes a stream of JSON values (what --json prints) and fails
// the test if s is anything else.
func jsonValues(t *testing.T, s string) []json.RawMessage {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	var vals []json.RawMessage
	for {
		var v json.RawMessage
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("output is not a stream of JSON values: %v\n%s", err, s)
		}
		vals = append(vals, v)
	}
	if len(vals) == 0 {
		t.Fatalf("no JSON in output %q", s)
	}
	return vals
}

func TestCLIAgainstServer(t *testing.T) {
	t.Setenv("TASKLEASE_TOKEN", "")
	srv := startServe(t, cliConfig)
	S := []string{"--server", srv.url}
	cmd := func(args ...string) result {
		t.Helper()
		return runCmd(t, append(args, S...)...)
	}

	t.Run("submit wait done", func(t *testing.T) {
		r := cmd("submit", "u1", "okjob", "--wait")
		wantCode(t, r, exitOK, "submit u1 okjob --wait")
		out := r.stdout
		if !strings.HasPrefix(out, "started: u1|okjob") {
			t.Errorf("first line should say started: %s", r)
		}
		pull := strings.Index(out, "stage pulling")
		push := strings.Index(out, "stage pushing")
		done := strings.Index(out, "u1|okjob done (2/2 stages done)")
		if pull < 0 || push < pull || done < push {
			t.Errorf("want progress pulling → pushing → done in order: %s", r)
		}
		if strings.Count(out, "u1|okjob done") != 1 {
			t.Errorf("done printed more than once: %s", r)
		}
	})

	t.Run("submit wait failed", func(t *testing.T) {
		r := cmd("submit", "u1", "badjob", "--wait")
		wantCode(t, r, exitRunFailed, "submit u1 badjob --wait")
		if !strings.Contains(r.stdout, "u1|badjob failed") || !strings.Contains(r.err, "failed") {
			t.Errorf("want the failure in the output: %s", r)
		}
		if !strings.Contains(r.stdout, "exit 1") {
			t.Errorf("want the last error (exit 1) shown: %s", r)
		}
	})

	t.Run("status tasks history cancel", func(t *testing.T) {
		r := cmd("status", "u1", "okjob")
		wantCode(t, r, exitOK, "status")
		if !strings.Contains(r.stdout, "u1|okjob done (2/2 stages done)") || !strings.Contains(r.stdout, "sources manual") {
			t.Errorf("status: %s", r)
		}

		r = cmd("tasks")
		wantCode(t, r, exitOK, "tasks")
		if !strings.Contains(r.stdout, "u1|okjob done") || !strings.Contains(r.stdout, "u1|badjob failed") {
			t.Errorf("tasks should list both tasks: %s", r)
		}
		r = cmd("tasks", "--scope", "badjob", "--status", "failed")
		wantCode(t, r, exitOK, "tasks --scope badjob --status failed")
		if !strings.Contains(r.stdout, "u1|badjob") || strings.Contains(r.stdout, "okjob") {
			t.Errorf("tasks filter: %s", r)
		}
		r = cmd("tasks", "--subject", "nobody")
		wantCode(t, r, exitOK, "tasks --subject nobody")
		if strings.TrimSpace(r.stdout) != "" {
			t.Errorf("tasks of an unknown subject should print nothing: %s", r)
		}

		r = cmd("history", "u1", "okjob")
		wantCode(t, r, exitOK, "history")
		for _, ev := range []string{"requested", "started", "stage=pulling", "stage=pushing", "done", "source=manual"} {
			if !strings.Contains(r.stdout, ev) {
				t.Errorf("history lacks %q: %s", ev, r)
			}
		}
		if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); !strings.Contains(lines[0], "done") {
			t.Errorf("history should be newest first: %s", r)
		}
		r = cmd("history", "u1", "okjob", "--limit", "2")
		wantCode(t, r, exitOK, "history --limit 2")
		if n := len(strings.Split(strings.TrimSpace(r.stdout), "\n")); n != 2 {
			t.Errorf("history --limit 2 printed %d lines: %s", n, r)
		}

		r = cmd("cancel", "u1", "okjob")
		wantCode(t, r, exitOK, "cancel")
		if strings.TrimSpace(r.stdout) != "not_running" {
			t.Errorf("cancel of a finished task: %s", r)
		}
	})

	t.Run("json", func(t *testing.T) {
		r := cmd("status", "u1", "okjob", "--json")
		wantCode(t, r, exitOK, "status --json")
		var v jobs.TaskView
		if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.Key != "u1|okjob" || v.Status != jobs.StatusDone {
			t.Errorf("status --json: %v: %s", err, r)
		}

		r = cmd("tasks", "--json")
		wantCode(t, r, exitOK, "tasks --json")
		var tasks struct {
			Tasks []jobs.TaskView `json:"tasks"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &tasks); err != nil || len(tasks.Tasks) < 2 {
			t.Errorf("tasks --json: %v: %s", err, r)
		}

		r = cmd("history", "u1", "okjob", "--json")
		wantCode(t, r, exitOK, "history --json")
		var hist struct {
			Events []jobs.Event `json:"events"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &hist); err != nil || len(hist.Events) == 0 || hist.Events[0].RunID != v.RunID {
			t.Errorf("history --json: %v: %s", err, r)
		}

		r = cmd("cancel", "u1", "okjob", "--json")
		wantCode(t, r, exitOK, "cancel --json")
		var c struct{ Outcome string }
		if err := json.Unmarshal([]byte(r.stdout), &c); err != nil || c.Outcome != "not_running" {
			t.Errorf("cancel --json: %v: %s", err, r)
		}

		// --wait --json: the submit result, then one TaskView per change.
		r = cmd("submit", "u3", "okjob", "--wait", "--json")
		wantCode(t, r, exitOK, "submit --wait --json")
		vals := jsonValues(t, r.stdout)
		var res jobs.SubmitResult
		if err := json.Unmarshal(vals[0], &res); err != nil || res.Outcome != jobs.OutcomeStarted {
			t.Errorf("first value should be the submit result: %v: %s", err, vals[0])
		}
		var last jobs.TaskView
		if err := json.Unmarshal(vals[len(vals)-1], &last); err != nil || last.Status != jobs.StatusDone || last.RunID != res.Task.RunID {
			t.Errorf("last value should be the done view of run %s: %v: %s", res.Task.RunID, err, vals[len(vals)-1])
		}
	})

	t.Run("join", func(t *testing.T) {
		// While a run is active a second submit joins it (the job's default
		// policy) and --wait follows that same run.
		r := cmd("submit", "u4", "okjob", "--json")
		wantCode(t, r, exitOK, "submit u4 okjob")
		var first, second jobs.SubmitResult
		if err := json.Unmarshal([]byte(r.stdout), &first); err != nil || first.Outcome != jobs.OutcomeStarted {
			t.Fatalf("first submit: %v: %s", err, r)
		}
		r = cmd("submit", "u4", "okjob", "--source", "foreground", "--wait", "--json")
		wantCode(t, r, exitOK, "submit u4 okjob --source foreground --wait")
		vals := jsonValues(t, r.stdout)
		if err := json.Unmarshal(vals[0], &second); err != nil {
			t.Fatal(err)
		}
		if second.Outcome != jobs.OutcomeJoined || second.Task.RunID != first.Task.RunID {
			t.Errorf("second submit: outcome %s run %s, want joined run %s", second.Outcome, second.Task.RunID, first.Task.RunID)
		}
		v, err := taskView(srv.url, "u4", "okjob")
		if err != nil {
			t.Fatal(err)
		}
		if v.RunID != first.Task.RunID || v.Status != jobs.StatusDone || strings.Join(srcs(v.Sources), ",") != "manual,foreground" {
			t.Errorf("joined run: %+v", v)
		}
	})

	t.Run("cancel running", func(t *testing.T) {
		waited := make(chan result, 1)
		go func() {
			waited <- runCmdCtx(t.Context(), append([]string{"submit", "u2", "slowjob", "--wait"}, S...)...)
		}()
		eventually(t, 10*time.Second, "slowjob running", func() error {
			v, err := taskView(srv.url, "u2", "slowjob")
			if err != nil {
				return err
			}
			if v.Status != jobs.StatusRunning || v.Stage != "waiting" {
				return fmt.Errorf("status %s stage %q", v.Status, v.Stage)
			}
			return nil
		})
		r := cmd("status", "u2", "slowjob")
		wantCode(t, r, exitOK, "status u2 slowjob")
		if !strings.Contains(r.stdout, "u2|slowjob running, stage waiting (0/1 stages done), started ") ||
			!strings.Contains(r.stdout, "owner cli-test") {
			t.Errorf("status of a running task: %s", r)
		}
		r = cmd("cancel", "u2", "slowjob")
		wantCode(t, r, exitOK, "cancel u2 slowjob")
		if o := strings.TrimSpace(r.stdout); o != "cancelling" && o != "cancelled" {
			t.Errorf("cancel of a running task: %s", r)
		}
		select {
		case w := <-waited:
			wantCode(t, w, exitRunFailed, "submit u2 slowjob --wait (cancelled)")
			if !strings.Contains(w.err, "cancelled") {
				t.Errorf("want the cancel reported: %s", w)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("submit --wait did not return within 15s of the cancel")
		}
		v, err := taskView(srv.url, "u2", "slowjob")
		if err != nil || v.Status != jobs.StatusCancelled {
			t.Errorf("after cancel: %v %+v", err, v)
		}
	})

	t.Run("wait for a superseded run", func(t *testing.T) {
		// submit --wait must not hang when its run ended before the client
		// saw it and a newer run already holds the task's record: the
		// history tells how the run ended.
		c := &client{base: srv.url, http: http.DefaultClient}
		for _, tc := range []struct {
			scope string
			want  int
		}{{"okjob", exitOK}, {"badjob", exitRunFailed}} {
			r := cmd("submit", "u5", tc.scope, "--wait", "--json")
			wantCode(t, r, tc.want, "submit u5 "+tc.scope+" --wait")
			var old jobs.SubmitResult
			if err := json.Unmarshal(jsonValues(t, r.stdout)[0], &old); err != nil {
				t.Fatal(err)
			}
			r = cmd("submit", "u5", tc.scope, "--json")
			wantCode(t, r, exitOK, "submit u5 "+tc.scope+" (newer run)")

			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			err := c.wait(ctx, "u5", tc.scope, old, func(jobs.TaskView) {})
			timedOut := ctx.Err() != nil
			cancel()
			code := exitOK
			var ee *exitError
			if errors.As(err, &ee) {
				code = ee.code
			} else if err != nil {
				code = -1
			}
			if code != tc.want || timedOut {
				t.Errorf("wait for superseded %s run %s: %v (code %d), want exit %d", tc.scope, old.Task.RunID, err, code, tc.want)
			}
		}
	})

	t.Run("api errors exit 2", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"submit", "u1", "okjob", "--policy", "bogus"}, "400"},
			{[]string{"submit", "u1", "okjob", "--source", "bogus"}, "400"},
			{[]string{"submit", "u1", "nosuchscope"}, "404"},
			{[]string{"status", "u1", "nosuchscope"}, "404"},
			{[]string{"status", "nobody", "okjob"}, "404"},
			{[]string{"status", "bad subject", "okjob"}, "400"},
			{[]string{"history", "u1", "nosuchscope"}, "404"},
			{[]string{"cancel", "u1", "nosuchscope"}, "404"},
			{[]string{"tasks", "--status", "bogus"}, "400"},
		} {
			r := cmd(tc.args...)
			wantCode(t, r, exitUsage, strings.Join(tc.args, " "))
			if !strings.Contains(r.err, tc.want) {
				t.Errorf("runner %s: want %s in stderr: %s", strings.Join(tc.args, " "), tc.want, r)
			}
		}
	})
}

func srcs(ss []jobs.Source) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return out
}

func TestCLIUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string // in stderr (or stdout for help)
	}{
		{nil, exitUsage, "usage: runner"},
		{[]string{"bogus"}, exitUsage, `unknown command "bogus"`},
		{[]string{"help"}, exitOK, "usage: runner"},
		{[]string{"--help"}, exitOK, "usage: runner"},
		{[]string{"submit", "--nope"}, exitUsage, "-nope"},
		{[]string{"submit", "u1", "okjob", "--wait=maybe"}, exitUsage, "invalid boolean"},
		{[]string{"submit", "-h"}, exitUsage, "Usage of submit"},
		{[]string{"submit"}, exitUsage, "wants 2 arguments"},
		{[]string{"submit", "u1"}, exitUsage, "wants 2 arguments"},
		{[]string{"submit", "u1", "okjob", "extra"}, exitUsage, "wants 2 arguments"},
		{[]string{"status", "u1"}, exitUsage, "wants 2 arguments"},
		{[]string{"history", "u1", "okjob", "x"}, exitUsage, "wants 2 arguments"},
		{[]string{"cancel"}, exitUsage, "wants 2 arguments"},
		{[]string{"tasks", "extra"}, exitUsage, "takes no arguments"},
		{[]string{"tasks", "--limit", "many"}, exitUsage, "invalid value"},
		{[]string{"status", "u1", "okjob", "--server", "not a url"}, exitUsage, "--server"},
		{[]string{"status", "u1", "okjob", "--server", "localhost:8080"}, exitUsage, "--server"},
		{[]string{"tasks", "--server", "ftp://127.0.0.1:8080"}, exitUsage, "--server"},
		{[]string{"tasks", "--server", "http://"}, exitUsage, "--server"},
		{[]string{"serve", "extra"}, exitUsage, "serve takes no arguments"},
		{[]string{"serve", "--nope"}, exitUsage, "-nope"},
		{[]string{"validate"}, exitUsage, "validate needs --config"},
		{[]string{"validate", "--nope"}, exitUsage, "-nope"},
	} {
		r := runCmd(t, tc.args...)
		wantCode(t, r, tc.code, tc.args...)
		if !strings.Contains(r.err+r.stdout, tc.want) {
			t.Errorf("runner %s: want %q in the output: %s", strings.Join(tc.args, " "), tc.want, r)
		}
	}
}

func TestCLIUnreachable(t *testing.T) {
	t.Setenv("TASKLEASE_TOKEN", "")
	server := fmt.Sprintf("http://127.0.0.1:%d", deadPort(t))
	for _, args := range [][]string{
		{"status", "u1", "okjob"},
		{"submit", "u1", "okjob"},
		{"submit", "u1", "okjob", "--wait"},
		{"tasks"},
		{"history", "u1", "okjob"},
		{"cancel", "u1", "okjob"},
	} {
		args = append(args, "--server", server)
		r := runCmd(t, args...)
		wantCode(t, r, exitUnreachable, args...)
		if !strings.Contains(r.err, "unreachable") {
			t.Errorf("runner %s: want 'unreachable' in stderr: %s", strings.Join(args, " "), r)
		}
	}
}

func TestCLIToken(t *testing.T) {
	srv := startServe(t, cliConfig+`
http:
  token: s3cret
`)
	S := []string{"--server", srv.url}

	t.Setenv("TASKLEASE_TOKEN", "")
	for _, args := range [][]string{{"status", "u1", "okjob"}, {"tasks"}, {"submit", "u1", "okjob"}} {
		r := runCmd(t, append(args, S...)...)
		wantCode(t, r, exitUsage, args...)
		if !strings.Contains(r.err, "401") {
			t.Errorf("runner %s without token: want 401: %s", strings.Join(args, " "), r)
		}
	}
	t.Setenv("TASKLEASE_TOKEN", "wrong")
	r := runCmd(t, append([]string{"tasks"}, S...)...)
	wantCode(t, r, exitUsage, "tasks (wrong token)")

	t.Setenv("TASKLEASE_TOKEN", "s3cret")
	// --wait also needs the token on the event stream.
	r = runCmd(t, append([]string{"submit", "u1", "okjob", "--wait"}, S...)...)
	wantCode(t, r, exitOK, "submit u1 okjob --wait (token)")
	if !strings.Contains(r.stdout, "u1|okjob done") {
		t.Errorf("submit --wait with token: %s", r)
	}
	for _, args := range [][]string{{"status", "u1", "okjob"}, {"tasks"}, {"history", "u1", "okjob"}, {"cancel", "u1", "okjob"}} {
		r := runCmd(t, append(args, S...)...)
		wantCode(t, r, exitOK, args...)
	}
}

func TestCLIValidate(t *testing.T) {
	r := runCmd(t, "validate", "--config", "../../config.example.yaml")
	wantCode(t, r, exitOK, "validate --config ../../config.example.yaml")
	if !strings.Contains(r.stdout, "ok (3 jobs, 2 schedules)") {
		t.Errorf("validate ok: %s", r)
	}

	for _, args := range [][]string{
		{"validate", "--config", "testdata/broken.yaml"},
		{"validate", "testdata/broken.yaml"},
	} {
		r = runCmd(t, args...)
		wantCode(t, r, exitUsage, args...)
		if !strings.Contains(r.stdout, fmt.Sprintf("%d problem(s)", len(brokenPaths))) {
			t.Errorf("validate broken: want %d problems: %s", len(brokenPaths), r)
		}
		for _, p := range brokenPaths {
			if !regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(p) + `: `).MatchString(r.stdout) {
				t.Errorf("validate broken: problem %s not listed: %s", p, r)
			}
		}
	}

	r = runCmd(t, "validate", "--config", "testdata/does-not-exist.yaml")
	wantCode(t, r, exitUsage, "validate missing file")
}

func TestServeBadConfig(t *testing.T) {
	r := runCmd(t, "serve", "--config", "testdata/broken.yaml")
	wantCode(t, r, exitUsage, "serve --config testdata/broken.yaml")
	for _, p := range brokenPaths {
		if !strings.Contains(r.err, p+": ") {
			t.Errorf("serve broken: problem %s not reported: %s", p, r)
		}
	}
	for _, args := range [][]string{
		{"serve", "--config", "testdata/does-not-exist.yaml"},
		{"serve", "--redis", "http://127.0.0.1:6379"},
		{"serve", "--listen", "localhost"},
	} {
		r := runCmd(t, args...)
		wantCode(t, r, exitUsage, args...)
	}
}

func TestServeRedisUnreachable(t *testing.T) {
	old := redisWait
	redisWait = 300 * time.Millisecond
	t.Cleanup(func() { redisWait = old })

	url := fmt.Sprintf("redis://127.0.0.1:%d/0", deadPort(t))
	start := time.Now()
	r := runCmd(t, "serve", "--redis", url, "--listen", "127.0.0.1:0")
	wantCode(t, r, exitUnreachable, "serve --redis "+url)
	if !strings.Contains(r.err, "redis unreachable") {
		t.Errorf("want 'redis unreachable': %s", r)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("serve took %v to give up on a dead Redis with redisWait %v", d, redisWait)
	}
}

// TestServeCommand runs `runner serve` itself (no config: embedded Redis and
// the demo jobs) until its context ends, which must exit 0.
func TestServeCommand(t *testing.T) {
	t.Setenv("TASKLEASE_TOKEN", "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr syncBuffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"serve", "--listen", "127.0.0.1:0"}, io.Discard, &stderr) }()

	urlRE := regexp.MustCompile(`url=(http://127\.0\.0\.1:\d+)`)
	var server string
	eventually(t, 15*time.Second, "serve listening", func() error {
		select {
		case code := <-done:
			t.Fatalf("serve exited %d early: %s", code, stderr.String())
		default:
		}
		m := urlRE.FindStringSubmatch(stderr.String())
		if m == nil {
			return errors.New("no 'serving url=' log line yet")
		}
		server = m[1]
		return nil
	})
	if !strings.Contains(stderr.String(), "embedded") {
		t.Errorf("serve without redis should say it uses an embedded Redis: %s", stderr.String())
	}
	S := []string{"--server", server}

	r := runCmd(t, append([]string{"status", "u42", "course_sync"}, S...)...)
	wantCode(t, r, exitUsage, "status of a never-run demo task (404)")
	r = runCmd(t, append([]string{"submit", "u42", "course_sync", "--json"}, S...)...)
	wantCode(t, r, exitOK, "submit u42 course_sync (demo job)")
	var res jobs.SubmitResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.Outcome != jobs.OutcomeStarted ||
		strings.Join(res.Task.Stages, ",") != "pulling,pushing" {
		t.Errorf("demo submit: %v: %s", err, r)
	}
	for _, scope := range []string{"message_sync", "backup"} {
		r := runCmd(t, append([]string{"history", "u42", scope}, S...)...)
		wantCode(t, r, exitOK, "history of demo job "+scope)
	}
	// Cancel once the run is well into its first stage: a cancel published
	// right after the claim can be missed until the next heartbeat (see the
	// report: jobs/runner.go registers the run's cancel func only after
	// claim.lua returned), and the demo run would then end done.
	eventually(t, 10*time.Second, "demo run saved progress", func() error {
		var h struct{ Events []jobs.Event }
		if _, err := getJSON(server+taskPath("u42", "course_sync")+"/history", "", &h); err != nil {
			return err
		}
		for _, e := range h.Events {
			if e.Event == "progress" {
				return nil
			}
		}
		return fmt.Errorf("no progress event yet: %+v", h.Events)
	})
	cr := runCmd(t, append([]string{"cancel", "u42", "course_sync"}, S...)...)
	wantCode(t, cr, exitOK, "cancel u42 course_sync")
	eventually(t, 10*time.Second, "demo run cancelled", func() error {
		v, err := taskView(server, "u42", "course_sync")
		if err == nil && v.Status != jobs.StatusCancelled {
			h := runCmd(t, append([]string{"history", "u42", "course_sync"}, S...)...)
			err = fmt.Errorf("status %s, cancel said %q; history:\n%s", v.Status, strings.TrimSpace(cr.stdout), h.stdout)
		}
		return err
	})

	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Errorf("serve exited %d after its context ended, want 0: %s", code, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("serve did not return within 15s of its context ending")
	}
}

// TestCLIRedisDown: a server whose Redis is gone answers 503, which the
// client reports as exit 3.
func TestCLIRedisDown(t *testing.T) {
	t.Setenv("TASKLEASE_TOKEN", "")
	rs := redistest.StartServer(t)
	srv := startServe(t, fmt.Sprintf(`
redis:
  url: redis://%s/0
runner:
  id: cli-redis
  shutdownGrace: 1s
log:
  level: error
`, rs.Addr())+cliJobs)
	S := []string{"--server", srv.url}
	r := runCmd(t, append([]string{"submit", "u1", "okjob", "--wait"}, S...)...)
	wantCode(t, r, exitOK, "submit --wait on a real Redis")

	rs.Stop()
	for _, args := range [][]string{{"status", "u1", "okjob"}, {"submit", "u1", "okjob"}, {"tasks"}} {
		r := runCmd(t, append(args, S...)...)
		wantCode(t, r, exitUnreachable, args...)
		if !strings.Contains(r.err, "503") {
			t.Errorf("runner %s: want 503 in stderr: %s", strings.Join(args, " "), r)
		}
	}
	code, err := getJSON(srv.url+"/readyz", "", nil)
	if err != nil || code != 503 {
		t.Errorf("/readyz with Redis down: %d %v", code, err)
	}
}
