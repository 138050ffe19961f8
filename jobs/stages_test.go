//go:build unix

package jobs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tasklease/tasklease/checkpoints"
	"github.com/tasklease/tasklease/leasing"
	"github.com/tasklease/tasklease/taskkey"
)

// testStageRun builds a Run without Redis: the stage kinds only read it.
func testStageRun() *Run {
	key := taskkey.MustNew("u42", "course_sync")
	return &Run{
		key:      key,
		runID:    "r1",
		attempt:  2,
		sources:  []Source{SourceManual},
		source:   SourceManual,
		lease:    leasing.Lease{Key: key, Owner: "pod-a/x", Token: 7},
		recovery: checkpoints.Recovery{Mode: checkpoints.Resume},
		stage:    "pulling",
		stages:   []string{"pulling", "saving"},
		cursor:   []byte("c1"),
		stopBy:   2 * time.Second,
	}
}

// readEnvFile parses `env` output into a map.
func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			m[k] = v
		}
	}
	return m
}

// waitPIDFile polls until path holds a complete pid line.
func waitPIDFile(t *testing.T, path string) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(path)
		if err == nil && strings.HasSuffix(string(b), "\n") {
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not written in time (err %v)", path, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// processGone reports whether pid no longer runs. A zombie counts as gone:
// it is dead, and reaping an orphan is up to PID 1, which in a container may
// not do it.
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}

// waitGone fails the test unless pid is gone before a deadline.
func waitGone(t *testing.T, what string, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !processGone(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL) // do not leak it past the test
			t.Fatalf("%s (pid %d) still alive", what, pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestExecEnvAndDir(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "env.txt")
	var stdout bytes.Buffer
	e := &ExecStage{
		Command: []string{"sh", "-c", `env > "$OUT"; pwd > "$OUT.pwd"; echo hello`},
		Dir:     dir,
		Env:     []string{"OUT=" + out, "EXTRA=yes", "TASKLEASE_STAGE=spoofed"},
		Stdout:  &stdout,
	}
	if err := e.RunStage(context.Background(), testStageRun()); err != nil {
		t.Fatalf("RunStage: %v", err)
	}
	env := readEnvFile(t, out)
	want := map[string]string{
		"TASKLEASE_KEY":           "u42|course_sync",
		"TASKLEASE_SUBJECT":       "u42",
		"TASKLEASE_SCOPE":         "course_sync",
		"TASKLEASE_STAGE":         "pulling",
		"TASKLEASE_SOURCE":        "manual",
		"TASKLEASE_RUN_ID":        "r1",
		"TASKLEASE_ATTEMPT":       "2",
		"TASKLEASE_FENCING_TOKEN": "7",
		"TASKLEASE_RESUMED":       "1",
		"TASKLEASE_CURSOR":        "YzE=", // base64("c1")
		"EXTRA":                   "yes",
	}
	for k, v := range want {
		if got, ok := env[k]; !ok || got != v {
			t.Errorf("%s = %q (set %v), want %q", k, got, ok, v)
		}
	}
	if _, ok := env["PATH"]; !ok {
		t.Error("os.Environ() not inherited: PATH missing")
	}
	pwd, err := os.ReadFile(out + ".pwd")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := filepath.EvalSymlinks(strings.TrimSpace(string(pwd))); got != mustEvalSymlinks(t, dir) {
		t.Errorf("pwd = %q, want %q", got, dir)
	}
	if stdout.String() != "hello\n" {
		t.Errorf("stdout = %q", stdout.String())
	}
}

func mustEvalSymlinks(t *testing.T, p string) string {
	t.Helper()
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestExecEnvNotResumedNoCursor(t *testing.T) {
	out := filepath.Join(t.TempDir(), "env.txt")
	run := testStageRun()
	run.recovery = checkpoints.Recovery{Mode: checkpoints.Restart}
	run.cursor = nil
	e := &ExecStage{Command: []string{"sh", "-c", `env > "$OUT"`}, Env: []string{"OUT=" + out}}
	if err := e.RunStage(context.Background(), run); err != nil {
		t.Fatal(err)
	}
	env := readEnvFile(t, out)
	if env["TASKLEASE_RESUMED"] != "0" {
		t.Errorf("TASKLEASE_RESUMED = %q, want 0", env["TASKLEASE_RESUMED"])
	}
	if v, ok := env["TASKLEASE_CURSOR"]; !ok || v != "" {
		t.Errorf("TASKLEASE_CURSOR = %q (set %v), want empty", v, ok)
	}
}

func TestExecExitCode(t *testing.T) {
	var stderr bytes.Buffer
	e := &ExecStage{Command: []string{"sh", "-c", "echo boom-detail >&2; exit 3"}, Stderr: &stderr}
	err := e.RunStage(context.Background(), testStageRun())
	if err == nil {
		t.Fatal("want error")
	}
	if !strings.Contains(err.Error(), "exit 3") || !strings.Contains(err.Error(), "boom-detail") {
		t.Errorf("error %q should mention exit 3 and the stderr text", err)
	}
	if errors.Is(err, ErrPermanent) {
		t.Errorf("exit 3 must be retryable: %v", err)
	}
	if stderr.String() != "boom-detail\n" {
		t.Errorf("Stderr writer got %q", stderr.String())
	}
}

func TestExecStderrTailBounded(t *testing.T) {
	// 20000 'x' then a marker: the message keeps the end, at most 4 KiB.
	e := &ExecStage{Command: []string{"sh", "-c", `i=0; while [ $i -lt 200 ]; do printf '%0100d' 0 >&2; i=$((i+1)); done; echo END-MARK >&2; exit 1`}}
	err := e.RunStage(context.Background(), testStageRun())
	if err == nil {
		t.Fatal("want error")
	}
	msg := err.Error()
	if !strings.HasSuffix(msg, "END-MARK") {
		t.Errorf("error should end with the last stderr line: ...%q", msg[max(0, len(msg)-40):])
	}
	if len(msg) > execStderrTail+200 {
		t.Errorf("error is %d bytes, want the stderr tail bounded to %d", len(msg), execStderrTail)
	}
}

func TestExecMissingBinaryPermanent(t *testing.T) {
	e := &ExecStage{Command: []string{"tasklease-no-such-binary-9f3a"}}
	err := e.RunStage(context.Background(), testStageRun())
	if !errors.Is(err, ErrPermanent) {
		t.Fatalf("err = %v, want ErrPermanent", err)
	}
}

func TestExecKillGroupOnCancel(t *testing.T) {
	dir := t.TempDir()
	// The shell and its child both ignore SIGTERM (the ignore disposition is
	// inherited), so only the group SIGKILL after the grace stops them.
	script := `trap '' TERM; sleep 60 & echo $! > child.pid; echo $$ > shell.pid; wait`
	const grace = 500 * time.Millisecond
	e := &ExecStage{Command: []string{"sh", "-c", script}, Dir: dir, KillGrace: grace}

	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	errc := make(chan error, 1)
	go func() { errc <- e.RunStage(ctx, testStageRun()) }()

	shell := waitPIDFile(t, filepath.Join(dir, "shell.pid"))
	child := waitPIDFile(t, filepath.Join(dir, "child.pid"))
	start := time.Now()
	cancel(ErrCancelled)

	select {
	case err := <-errc:
		elapsed := time.Since(start)
		if !errors.Is(err, ErrCancelled) {
			t.Errorf("err = %v, want ErrCancelled", err)
		}
		if elapsed < grace*9/10 {
			t.Errorf("returned after %v: SIGKILL came before the %v grace", elapsed, grace)
		}
	case <-time.After(grace + 3*time.Second):
		_ = syscall.Kill(child, syscall.SIGKILL)
		_ = syscall.Kill(shell, syscall.SIGKILL)
		t.Fatal("RunStage did not return within the grace")
	}
	waitGone(t, "shell", shell)
	waitGone(t, "child", child)
}

func TestExecTermWithinGrace(t *testing.T) {
	// sleep exits on SIGTERM at once: RunStage must not wait out the grace.
	e := &ExecStage{Command: []string{"sleep", "60"}, KillGrace: time.Minute}
	run := testStageRun()
	run.stopBy = 0 // no cap: the 1 minute grace applies
	ctx, cancel := context.WithCancelCause(context.Background())
	time.AfterFunc(100*time.Millisecond, func() { cancel(ErrShutdown) })
	start := time.Now()
	err := e.RunStage(ctx, run)
	if !errors.Is(err, ErrShutdown) {
		t.Errorf("err = %v, want ErrShutdown", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v; SIGTERM should have stopped sleep", d)
	}
}

func TestExecTimeout(t *testing.T) {
	dir := t.TempDir()
	// Ignores SIGTERM; KillGrace is far above StopGrace, so the cap must
	// bring the SIGKILL in time.
	e := &ExecStage{
		Command:   []string{"sh", "-c", `trap '' TERM; echo $$ > shell.pid; while :; do sleep 1; done`},
		Dir:       dir,
		KillGrace: time.Minute,
	}
	run := testStageRun()
	run.stopBy = 300 * time.Millisecond
	// The timeout fires once the shell runs, however slow its start.
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	errc := runStageAsync(ctx, e, run)
	shell := waitPIDFile(t, filepath.Join(dir, "shell.pid"))
	start := time.Now()
	cancel(context.DeadlineExceeded)
	err := recvStage(t, errc, 5*time.Second)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("took %v; KillGrace should be capped by StopGrace (300ms)", d)
	}
	waitGone(t, "shell", shell)
}

func TestExecKillsLeftoversOnExit(t *testing.T) {
	dir := t.TempDir()
	// The command succeeds but leaves a background child holding stderr.
	e := &ExecStage{Command: []string{"sh", "-c", `sleep 60 & echo $! > child.pid; exit 0`}, Dir: dir}
	start := time.Now()
	if err := e.RunStage(context.Background(), testStageRun()); err != nil {
		t.Fatalf("RunStage: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
	waitGone(t, "leftover child", waitPIDFile(t, filepath.Join(dir, "child.pid")))
}

func TestExecAlreadyCancelled(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(ErrCancelled)
	out := filepath.Join(t.TempDir(), "ran")
	e := &ExecStage{Command: []string{"sh", "-c", `touch "$OUT"`}, Env: []string{"OUT=" + out}}
	if err := e.RunStage(ctx, testStageRun()); !errors.Is(err, ErrCancelled) {
		t.Errorf("err = %v, want ErrCancelled", err)
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("command ran on a cancelled context")
	}
}

func TestExecKillGrace(t *testing.T) {
	run := testStageRun() // StopGrace 2s
	for _, c := range []struct {
		grace, stopBy, want time.Duration
	}{
		{0, 2 * time.Second, 2 * time.Second},
		{time.Second, 2 * time.Second, time.Second},
		{10 * time.Second, 2 * time.Second, 2 * time.Second},
		{0, 0, ExecKillGraceDefault},
		{time.Minute, 0, time.Minute},
	} {
		run.stopBy = c.stopBy
		e := &ExecStage{Command: []string{"true"}, KillGrace: c.grace}
		if got := e.killGrace(run); got != c.want {
			t.Errorf("KillGrace %v StopGrace %v: got %v, want %v", c.grace, c.stopBy, got, c.want)
		}
	}
}

func TestExecValidate(t *testing.T) {
	for _, e := range []*ExecStage{
		{},
		{Command: []string{""}},
		{Command: []string{"true"}, KillGrace: -time.Second},
		{Command: []string{"true"}, Env: []string{"NOEQUALS"}},
	} {
		if err := e.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("Validate(%+v) = %v, want ErrConfig", e, err)
		}
	}
	if err := (&ExecStage{Command: []string{"true"}, Env: []string{"A="}}).Validate(); err != nil {
		t.Errorf("valid stage: %v", err)
	}
	err := (&ExecStage{}).RunStage(context.Background(), testStageRun())
	if !errors.Is(err, ErrConfig) || !errors.Is(err, ErrPermanent) {
		t.Errorf("RunStage on invalid config = %v, want ErrConfig and ErrPermanent", err)
	}
}

// httpRecorder is a test server handler that records the last request.
type httpRecorder struct {
	mu     sync.Mutex
	header http.Header
	method string
	body   []byte
	status int
	reply  string
}

func (h *httpRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	h.header, h.method, h.body = r.Header.Clone(), r.Method, b
	status, reply := h.status, h.reply
	h.mu.Unlock()
	w.WriteHeader(status)
	_, _ = io.WriteString(w, reply)
}

func TestHTTPStageSuccess(t *testing.T) {
	rec := &httpRecorder{status: http.StatusOK, reply: "ok"}
	srv := httptest.NewServer(rec)
	defer srv.Close()

	h := &HTTPStage{URL: srv.URL + "/hook", Header: map[string]string{"Authorization": "Bearer t0k"}}
	if err := h.RunStage(context.Background(), testStageRun()); err != nil {
		t.Fatalf("RunStage: %v", err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.method != http.MethodPost {
		t.Errorf("method %s", rec.method)
	}
	for k, v := range map[string]string{
		"Content-Type":            "application/json",
		"Tasklease-Fencing-Token": "7",
		"Tasklease-Key":           "u42|course_sync",
		"Authorization":           "Bearer t0k",
	} {
		if got := rec.header.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(rec.body))
	dec.UseNumber()
	var got map[string]any
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("body %s: %v", rec.body, err)
	}
	want := map[string]any{
		"key":          "u42|course_sync",
		"subject":      "u42",
		"scope":        "course_sync",
		"stage":        "pulling",
		"runId":        "r1",
		"attempt":      json.Number("2"),
		"source":       "manual",
		"fencingToken": json.Number("7"),
		"resumed":      true,
	}
	if len(got) != len(want) {
		t.Errorf("body has %d fields, want %d: %s", len(got), len(want), rec.body)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("body %s = %#v, want %#v", k, got[k], v)
		}
	}
}

func TestHTTPStageStatus(t *testing.T) {
	rec := &httpRecorder{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	h := &HTTPStage{URL: srv.URL}
	run := testStageRun()

	for _, c := range []struct {
		status int
		reply  string
		stale  bool
		ok     bool
	}{
		{status: http.StatusNoContent, ok: true},
		{status: http.StatusAccepted, ok: true},
		{status: http.StatusConflict, reply: "token 9 seen", stale: true},
		{status: http.StatusInternalServerError, reply: "kaboom"},
		{status: http.StatusNotFound, reply: "nope"},
	} {
		rec.mu.Lock()
		rec.status, rec.reply = c.status, c.reply
		rec.mu.Unlock()
		err := h.RunStage(context.Background(), run)
		if c.ok {
			if err != nil {
				t.Errorf("%d: %v", c.status, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%d: want error", c.status)
			continue
		}
		if errors.Is(err, ErrStaleToken) != c.stale {
			t.Errorf("%d: errors.Is(ErrStaleToken) = %v: %v", c.status, !c.stale, err)
		}
		if errors.Is(err, ErrPermanent) {
			t.Errorf("%d: must not be ErrPermanent: %v", c.status, err)
		}
		if !strings.Contains(err.Error(), strconv.Itoa(c.status)) || !strings.Contains(err.Error(), c.reply) {
			t.Errorf("%d: error %q should mention the status and body", c.status, err)
		}
	}
}

func TestHTTPStageErrorBodyBounded(t *testing.T) {
	rec := &httpRecorder{status: http.StatusBadGateway, reply: strings.Repeat("y", 100<<10)}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	err := (&HTTPStage{URL: srv.URL}).RunStage(context.Background(), testStageRun())
	if err == nil || !strings.Contains(err.Error(), "502") {
		t.Fatalf("err = %v, want status 502", err)
	}
	if n := strings.Count(err.Error(), "y"); n != httpErrBodyMax {
		t.Errorf("error holds %d body bytes, want %d", n, httpErrBodyMax)
	}
}

func TestHTTPStageCancelWhileBlocked(t *testing.T) {
	entered := make(chan struct{})
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	defer close(release) // runs before srv.Close, which waits for handlers

	ctx, cancel := context.WithCancelCause(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- (&HTTPStage{URL: srv.URL}).RunStage(ctx, testStageRun()) }()
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("request never reached the server")
	}
	cancel(ErrCancelled)
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("want error")
		}
		if !errors.Is(err, ErrCancelled) {
			t.Errorf("err = %v, want cause ErrCancelled", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("RunStage did not return after cancel")
	}
}

func TestHTTPStageClientTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	defer close(release)

	h := &HTTPStage{URL: srv.URL, Client: &http.Client{Timeout: 100 * time.Millisecond}}
	err := h.RunStage(context.Background(), testStageRun())
	if err == nil || errors.Is(err, ErrPermanent) || errors.Is(err, ErrStaleToken) {
		t.Fatalf("err = %v, want a retryable transport error", err)
	}
}

func TestHTTPStageRedactsPassword(t *testing.T) {
	srv := httptest.NewServer(&httpRecorder{status: http.StatusInternalServerError})
	defer srv.Close()
	u := strings.Replace(srv.URL, "http://", "http://user:s3cret@", 1)
	err := (&HTTPStage{URL: u}).RunStage(context.Background(), testStageRun())
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("err = %v: want an error without the password", err)
	}
}

func TestHTTPStageValidate(t *testing.T) {
	for _, u := range []string{"", "ftp://example.com/x", "://bad", "http://", "/relative", "example.com/hook", "http://[::1"} {
		if err := (&HTTPStage{URL: u}).Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("Validate(%q) = %v, want ErrConfig", u, err)
		}
	}
	for _, u := range []string{"http://example.com/hook", "https://example.com:8443/x?y=1"} {
		if err := (&HTTPStage{URL: u}).Validate(); err != nil {
			t.Errorf("Validate(%q) = %v", u, err)
		}
	}
	err := (&HTTPStage{}).RunStage(context.Background(), testStageRun())
	if !errors.Is(err, ErrConfig) || !errors.Is(err, ErrPermanent) {
		t.Errorf("RunStage on invalid config = %v, want ErrConfig and ErrPermanent", err)
	}
}
