package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tasklease/tasklease/internal/apptoken"
	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/triggers"
)

// taskViewFields are the TaskView field names of DESIGN §5.
var taskViewFields = []string{
	"key", "subject", "scope", "runId", "status", "stage", "stages", "completedStages",
	"attempt", "maxAttempts", "sources", "owner", "fencingToken", "startedAt", "updatedAt",
	"finishedAt", "nextAttemptAt", "lastError", "canCancel", "followUpQueued",
}

// eventFields are the history event field names of DESIGN §5.
var eventFields = []string{"at", "runId", "event", "source", "stage", "outcome", "error", "owner", "fencingToken"}

// env is an API server on a Registry on miniredis with two jobs:
// course_sync (foreground, stages pulling → pushing) and backup (dumping).
// Stages block while hold is closed-over unreleased, so tests can observe a
// running run.
type env struct {
	t    testing.TB
	mini *redistest.Mini
	reg  *jobs.Registry
	h    http.Handler
	srv  *httptest.Server
	logs *logSink

	mu      sync.Mutex
	release chan struct{} // closed: stages finish at once

	// Mismatches with openapi.json found in fuzz targets, reported when
	// the *testing.F ends (checkSpec, openapi_test.go).
	specMu   sync.Mutex
	specLate []string
}

type envOpts struct {
	token           string
	bodyLimit       int64
	noServer        bool // fuzzing calls the handler directly
	noMetrics       bool
	allowedOrigins  []string
	allowedHosts    []string
	maxEventClients int
	schedules       func(context.Context) ([]triggers.ScheduleStatus, error)
	// limited: a limiter remote_store (50 slots, 20/s, burst 10, held on
	// retry-after) that course_sync uses, with a concurrency of its own
	// (100) and fair share by request; backup stays unlimited.
	limited bool
	// readToken, subjects, maxSubjectStreams: Options' fields.
	readToken         string
	subjects          *apptoken.Verifier
	maxSubjectStreams int
}

// testHost is the Host of in-process requests (serve, serveWith):
// httptest.NewRequest's default, example.com, is a foreign host to an API
// without a token. Requests through e.srv carry the server's 127.0.0.1.
const testHost = "127.0.0.1:8080"

func newEnv(t testing.TB, o envOpts) *env {
	t.Helper()
	e := &env{t: t, mini: redistest.StartMini(t), logs: &logSink{}, release: make(chan struct{})}
	if f, ok := t.(*testing.F); ok {
		f.Cleanup(func() { e.reportLateSpec(f) })
	}
	logger := slog.New(e.logs)
	if os.Getenv("TASKLEASE_TEST_LOG") != "" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	stage := func(name string) jobs.Stage {
		return jobs.Stage{Name: name, Handler: jobs.HandlerFunc(func(ctx context.Context, run *jobs.Run) error {
			e.mu.Lock()
			rel := e.release
			e.mu.Unlock()
			select {
			case <-rel:
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		})}
	}
	preg := prometheus.NewRegistry()
	cfg := jobs.Config{
		Partitions: 4,
		Logger:     logger,
		Metrics:    preg,
		Jobs: []jobs.Job{
			{Scope: "course_sync", Foreground: true, Stages: []jobs.Stage{stage("pulling"), stage("pushing")}},
			{Scope: "backup", Stages: []jobs.Stage{stage("dumping")}},
		},
	}
	if o.limited {
		cfg.Limiters = []jobs.Limiter{{Name: "remote_store", Concurrency: 50,
			Rate: jobs.Rate{Count: 20, Per: time.Second, Burst: 10}, HoldOnRetryAfter: true}}
		cs := &cfg.Jobs[0]
		cs.Limiters, cs.Concurrency, cs.Fairness = []string{"remote_store"}, 100, jobs.Fairness{GroupBy: jobs.FairnessRequest}
	}
	reg, err := jobs.NewRegistry(e.mini.Client(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.reg = reg
	opts := Options{Token: o.token, BodyLimit: o.bodyLimit, Logger: logger,
		AllowedOrigins: o.allowedOrigins, AllowedHosts: o.allowedHosts, MaxEventClients: o.maxEventClients, Schedules: o.schedules,
		ReadToken: o.readToken, Subjects: o.subjects, MaxSubjectStreams: o.maxSubjectStreams}
	if !o.noMetrics {
		opts.Metrics = promhttp.HandlerFor(preg, promhttp.HandlerOpts{})
	}
	e.h = newAPI(reg, opts, settings{keepAlive: 50 * time.Millisecond, requestTimeout: 5 * time.Second, writeGrace: time.Second})
	if !o.noServer {
		e.srv = httptest.NewServer(e.h)
		t.Cleanup(e.srv.Close)
	}
	return e
}

// releaseStages lets every current and future stage finish at once.
func (e *env) releaseStages() {
	e.mu.Lock()
	defer e.mu.Unlock()
	select {
	case <-e.release:
	default:
		close(e.release)
	}
}

// startRunner runs a Runner until the test ends.
func (e *env) startRunner() {
	e.t.Helper()
	rn, err := jobs.NewRunner(e.reg, jobs.RunnerConfig{
		ID: "pod-test", FetchBlock: 50 * time.Millisecond, RetryPoll: 20 * time.Millisecond,
		ShutdownGrace: 2 * time.Second,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rn.Run(ctx) }()
	e.t.Cleanup(func() {
		e.releaseStages()
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("runner: %v", err)
		}
	})
}

// response is a decoded API answer.
type response struct {
	status int
	header http.Header
	raw    []byte
	body   map[string]any
}

// do sends a request to the test server; hdr holds extra headers ("Host"
// sets the request's Host, an empty value removes the header). A body is
// sent as application/json, as API clients do, unless hdr sets another
// Content-Type. An event stream answer is not read (it does not end).
func (e *env) do(method, path, body string, hdr ...string) response {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		switch k, v := http.CanonicalHeaderKey(hdr[i]), hdr[i+1]; {
		case k == "Host":
			req.Host = v
		case v == "":
			req.Header.Del(k)
		default:
			req.Header.Set(k, v)
		}
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	var raw []byte
	if res.Header.Get("Content-Type") != "text/event-stream" {
		if raw, err = io.ReadAll(res.Body); err != nil {
			e.t.Fatal(err)
		}
	}
	// Every answer must match openapi.json (an event stream's body is not read).
	e.checkSpec(req, res.StatusCode, res.Header, raw)
	r := response{status: res.StatusCode, header: res.Header, raw: raw}
	if strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&r.body); err != nil {
			e.t.Fatalf("%s %s: decode %q: %v", method, path, raw, err)
		}
	}
	return r
}

// newRequest is httptest.NewRequest as the CLI would send it: Host
// testHost, and a body (not nil) as application/json.
func newRequest(method, target string, body []byte) *http.Request {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req := httptest.NewRequest(method, target, rd)
	req.Host = testHost
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req
}

// serve calls the handler in-process (fuzzing: no sockets).
func (e *env) serve(method, target string, body []byte) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	req := newRequest(method, target, body)
	e.h.ServeHTTP(w, req)
	e.checkSpec(req, w.Code, w.Result().Header, w.Body.Bytes()) // must match openapi.json
	return w
}

// serveWith calls another handler in-process.
func (e *env) serveWith(h http.Handler, method, target string) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	req := newRequest(method, target, nil)
	h.ServeHTTP(w, req)
	e.checkSpec(req, w.Code, w.Result().Header, w.Body.Bytes()) // must match openapi.json
	return w
}

// keys lists every Redis key, sorted.
func (e *env) keys() []string {
	k := e.mini.Keys()
	slices.Sort(k)
	return k
}

// mustStatus fails unless r has the status (and, for errors, the code).
func mustStatus(t testing.TB, r response, status int, code string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d; body %s", r.status, status, r.raw)
	}
	if code == "" {
		return
	}
	errObj, ok := r.body["error"].(map[string]any)
	if !ok {
		t.Fatalf("no error object in %s", r.raw)
	}
	if errObj["code"] != code {
		t.Fatalf("error code %v, want %s (body %s)", errObj["code"], code, r.raw)
	}
	if m, _ := errObj["message"].(string); m == "" {
		t.Fatalf("error without message: %s", r.raw)
	}
	if len(errObj) != 2 {
		t.Fatalf("error object has fields beyond code and message: %s", r.raw)
	}
}

// checkTaskView checks the DESIGN §5 field names and JSON types of a view.
func checkTaskView(t testing.TB, v any) map[string]any {
	t.Helper()
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("task view is %T, not an object", v)
	}
	for _, f := range taskViewFields {
		if _, ok := m[f]; !ok {
			t.Errorf("task view lacks %q: %v", f, m)
		}
	}
	if _, ok := m["fencingToken"].(json.Number); !ok {
		t.Errorf("fencingToken is %T, want a JSON number", m["fencingToken"])
	}
	for _, f := range []string{"attempt", "maxAttempts"} {
		if _, ok := m[f].(json.Number); !ok {
			t.Errorf("%s is %T, want a JSON number", f, m[f])
		}
	}
	for _, f := range []string{"stages", "completedStages", "sources"} {
		if _, ok := m[f].([]any); !ok {
			t.Errorf("%s is %T, want an array", f, m[f])
		}
	}
	for _, f := range []string{"canCancel", "followUpQueued"} {
		if _, ok := m[f].(bool); !ok {
			t.Errorf("%s is %T, want a bool", f, m[f])
		}
	}
	for _, f := range []string{"startedAt", "updatedAt", "finishedAt", "nextAttemptAt"} {
		switch x := m[f].(type) {
		case nil:
		case string:
			ts, err := time.Parse(time.RFC3339Nano, x)
			if err != nil || ts.Location() != time.UTC {
				t.Errorf("%s = %q: not RFC 3339 UTC (%v)", f, x, err)
			}
		default:
			t.Errorf("%s is %T, want a string or null", f, x)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	return m
}

func strs(v any) []string {
	a, _ := v.([]any)
	out := make([]string, 0, len(a))
	for _, x := range a {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}

// waitFor polls cond until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// logSink records log records for assertions.
type logSink struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (s *logSink) Enabled(context.Context, slog.Level) bool { return true }
func (s *logSink) Handle(_ context.Context, r slog.Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recs = append(s.recs, r.Clone())
	return nil
}
func (s *logSink) WithAttrs([]slog.Attr) slog.Handler { return s }
func (s *logSink) WithGroup(string) slog.Handler      { return s }

// find returns the attributes of the first record with msg and level whose
// attributes include want.
func (s *logSink) find(level slog.Level, msg string, want map[string]string) (map[string]slog.Value, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.recs {
		if r.Level != level || r.Message != msg {
			continue
		}
		attrs := map[string]slog.Value{}
		r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value; return true })
		ok := true
		for k, v := range want {
			if attrs[k].String() != v {
				ok = false
			}
		}
		if ok {
			return attrs, true
		}
	}
	return nil, false
}
