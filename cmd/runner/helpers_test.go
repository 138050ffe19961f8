package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/config"
	"github.com/tasklease/tasklease/jobs"
)

// syncBuffer is a bytes.Buffer safe for concurrent writers and readers
// (loggers, child processes' output, goroutines running commands).
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// result is one in-process command line's outcome.
type result struct {
	code        int
	stdout, err string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout:\n%s--- stderr:\n%s", r.code, r.stdout, r.err)
}

// runCmd calls run with args and captures its output.
func runCmd(t *testing.T, args ...string) result {
	t.Helper()
	return runCmdCtx(t.Context(), args...)
}

func runCmdCtx(ctx context.Context, args ...string) result {
	var out, errOut syncBuffer
	code := run(ctx, args, &out, &errOut)
	return result{code: code, stdout: out.String(), err: errOut.String()}
}

// wantCode fails the test unless r exited with code.
func wantCode(t *testing.T, r result, code int, args ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("runner %s: want exit %d, got %s", strings.Join(args, " "), code, r)
	}
}

// eventually polls cond every 20ms until it returns nil or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// deadPort returns a loopback port nothing listens on (it was free a moment
// ago; nothing in these tests binds fixed ports).
func deadPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return port
}

// testServer is serve running in-process on an embedded Redis.
type testServer struct {
	url string
	log *syncBuffer
}

// startServe parses yamlText, listens on a free loopback port and runs serve
// until the test ends; cleanup cancels it and waits for it to return.
func startServe(t *testing.T, yamlText string) *testServer {
	t.Helper()
	cfg, err := config.Parse([]byte(yamlText))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	cfg.HTTP.Listen = "127.0.0.1:0"
	logBuf := &syncBuffer{}
	log := cfg.Log.NewLogger(logBuf)

	ctx, cancel := context.WithCancel(context.Background())
	addrc := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, log, io.Discard, nil, func(addr string) { addrc <- addr }) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve returned %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("serve did not return within 20s after cancel; log:\n%s", logBuf)
		}
	})
	select {
	case addr := <-addrc:
		host, _, _ := net.SplitHostPort(addr)
		if host != "127.0.0.1" {
			t.Fatalf("serve listens on %s, want 127.0.0.1 only", addr)
		}
		return &testServer{url: "http://" + addr, log: logBuf}
	case err := <-done:
		t.Fatalf("serve returned before listening: %v; log:\n%s", err, logBuf)
	case <-time.After(15 * time.Second):
		t.Fatalf("serve did not listen within 15s; log:\n%s", logBuf)
	}
	return nil
}

// getJSON GETs url (with token, if any) into out and returns the status.
func getJSON(url, token string, out any) (int, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if out != nil && resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return resp.StatusCode, err
		}
	}
	return resp.StatusCode, nil
}

// taskView GETs a task's view.
func taskView(base, subject, scope string) (jobs.TaskView, error) {
	var v jobs.TaskView
	code, err := getJSON(base+taskPath(subject, scope), "", &v)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("GET %s: status %d", taskPath(subject, scope), code)
	}
	return v, err
}

// submitSpread posts body to path(i) for i in 0..n-1, spread over pods
// (request i to pod i mod len(pods)) by six concurrent clients.
func submitSpread(t *testing.T, pods []*runnerProc, n int, path func(i int) string, body string) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for w := range 6 {
		wg.Go(func() {
			for i := w; i < n; i += 6 {
				var res jobs.SubmitResult
				if err := postJSON(pods[i%len(pods)].url+path(i), body, &res); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
