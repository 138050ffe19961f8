package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/triggers"
)

// openapi.json is checked three ways: it is a valid OpenAPI 3.0.3 document
// (TestOpenAPIDocument), it lists exactly the routes newAPI registers
// (TestOpenAPIRoutes), and every response the tests of this package receive
// through env.do, env.serve and env.serveWith must match it (checkSpec, called
// by those helpers), with undocumented status codes counting as mismatches.

// spec is openapi.json loaded, validated and routed once per test binary.
var spec struct {
	once   sync.Once
	doc    *openapi3.T
	router routers.Router
	err    error
}

func loadSpec() (*openapi3.T, routers.Router, error) {
	spec.once.Do(func() {
		// kin-openapi decodes text/plain bodies but not HTML: the dashboard
		// page is validated as a string like the metrics.
		openapi3filter.RegisterBodyDecoder("text/html", openapi3filter.PlainBodyDecoder)
		doc, err := openapi3.NewLoader().LoadFromData(openapiJSON)
		if err != nil {
			spec.err = fmt.Errorf("load openapi.json: %w", err)
			return
		}
		if err := doc.Validate(context.Background()); err != nil {
			spec.err = fmt.Errorf("validate openapi.json: %w", err)
			return
		}
		r, err := gorillamux.NewRouter(doc)
		if err != nil {
			spec.err = fmt.Errorf("route openapi.json: %w", err)
			return
		}
		spec.doc, spec.router = doc, r
	})
	return spec.doc, spec.router, spec.err
}

// specMismatch returns why a response does not match openapi.json, or "".
// A request the document has no operation for (an unknown path, a method
// the path does not serve, a CORS preflight) is checked only for the shape
// of a JSON error. Event streams never end, so their body is not checked.
func specMismatch(req *http.Request, status int, header http.Header, body []byte) string {
	doc, router, err := loadSpec()
	if err != nil {
		return err.Error()
	}
	where := fmt.Sprintf("%s %s answered %d", req.Method, req.URL.RequestURI(), status)
	mt, _, _ := mime.ParseMediaType(header.Get("Content-Type"))
	route, params, err := router.FindRoute(req)
	if err != nil {
		if status >= 400 && mt == "application/json" {
			var v any
			if err := json.Unmarshal(body, &v); err != nil {
				return fmt.Sprintf("%s: undecodable JSON error %q: %v", where, body, err)
			}
			if err := doc.Components.Schemas["Error"].Value.VisitJSON(v, openapi3.VisitAsResponse()); err != nil {
				return fmt.Sprintf("%s (no operation in openapi.json): not an Error: %v", where, err)
			}
		}
		return ""
	}
	sse := mt == "text/event-stream"
	// IncludeResponseStatus: a status the operation does not document is a
	// mismatch too.
	opts := &openapi3filter.Options{IncludeResponseStatus: true, ExcludeResponseBody: sse, MultiError: true}
	opts.WithCustomSchemaErrorFunc(shortSchemaError)
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route},
		Status:                 status,
		Header:                 header,
		Options:                opts,
	}
	in.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		return fmt.Sprintf("%s, which does not match openapi.json: %v", where, err)
	}
	if sse { // the body is skipped; the media type must still be documented
		if rr := route.Operation.Responses.Status(status); rr == nil || rr.Value.Content.Get(mt) == nil {
			return fmt.Sprintf("%s: %s is not documented", where, mt)
		}
	}
	return ""
}

// shortSchemaError is a schema mismatch in one line: where, why and the
// value found, without kin-openapi's dump of the whole schema.
func shortSchemaError(err *openapi3.SchemaError) string {
	v, _ := json.Marshal(err.Value)
	if len(v) > 200 {
		v = append(v[:200], "..."...)
	}
	return fmt.Sprintf("at %q: %s (value %s)", "/"+strings.Join(err.JSONPointer(), "/"), err.Reason, v)
}

// checkSpec fails the env's test if a response does not match openapi.json.
// A fuzz target must not call its *testing.F, so with one the mismatch is
// kept and reported when the F ends (see newEnv).
func (e *env) checkSpec(req *http.Request, status int, header http.Header, body []byte) {
	msg := specMismatch(req, status, header, body)
	if msg == "" {
		return
	}
	if _, ok := e.t.(*testing.F); ok {
		e.specMu.Lock()
		e.specLate = append(e.specLate, msg)
		e.specMu.Unlock()
		return
	}
	e.t.Helper()
	e.t.Errorf("%s", msg)
}

// reportLateSpec reports the mismatches checkSpec kept for a *testing.F.
func (e *env) reportLateSpec(f *testing.F) {
	e.specMu.Lock()
	defer e.specMu.Unlock()
	seen := map[string]bool{} // seeds often repeat one mismatch
	for _, msg := range e.specLate {
		if !seen[msg] {
			seen[msg] = true
			f.Errorf("%s", msg)
		}
	}
}

func TestOpenAPIDocument(t *testing.T) {
	doc, _, err := loadSpec()
	if err != nil {
		t.Fatal(err)
	}
	if doc.OpenAPI != "3.0.3" {
		t.Errorf("openapi %q, want 3.0.3", doc.OpenAPI)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, openapiJSON); err != nil {
		t.Fatalf("openapi.json is not JSON: %v", err)
	}

	// The DESIGN §5 field lists (helpers_test.go) are all documented and
	// required.
	for name, fields := range map[string][]string{"TaskView": taskViewFields, "Event": eventFields} {
		s := doc.Components.Schemas[name].Value
		for _, f := range fields {
			if s.Properties[f] == nil || !slices.Contains(s.Required, f) {
				t.Errorf("%s.%s: not a required property", name, f)
			}
		}
		if tok := s.Properties["fencingToken"].Value; !tok.Type.Is("integer") || tok.Format != "int64" {
			t.Errorf("%s.fencingToken: want an int64 integer", name)
		}
	}

	// Security: every /v1 operation takes the bearer token or nothing (a
	// runner without http.token); the rest never asks for one.
	ops := 0
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			ops++
			sec := doc.Security
			if op.Security != nil {
				sec = *op.Security
			}
			v1 := strings.HasPrefix(path, "/v1/")
			hasBearer := slices.ContainsFunc(sec, func(r openapi3.SecurityRequirement) bool { _, ok := r["bearer"]; return ok })
			hasOpen := slices.ContainsFunc(sec, func(r openapi3.SecurityRequirement) bool { return len(r) == 0 })
			if v1 && (!hasBearer || !hasOpen) {
				t.Errorf("%s %s: security %v, want [{}, {bearer: []}]", method, path, sec)
			}
			if !v1 && len(sec) != 0 {
				t.Errorf("%s %s: security %v, want none", method, path, sec)
			}
			// The answers every /v1 route can give before routing.
			var want []string
			if v1 {
				want = append(want, "401", "403")
				if method == http.MethodPost {
					want = append(want, "415")
				}
			}
			for _, code := range want {
				if op.Responses.Value(code) == nil {
					t.Errorf("%s %s: no %s response", method, path, code)
				}
			}
		}
	}
	t.Logf("openapi.json: %d paths, %d operations, %d schemas", doc.Paths.Len(), ops, len(doc.Components.Schemas))
}

// muxPatterns lists the patterns newAPI registers, read from httpapi.go:
// m.Handle("GET /x", ...) or m.HandleFunc("GET "+eventsPath, ...).
func muxPatterns(t *testing.T) []string {
	t.Helper()
	src, err := os.ReadFile("httpapi.go")
	if err != nil {
		t.Fatal(err)
	}
	consts := map[string]string{"eventsPath": eventsPath}
	re := regexp.MustCompile(`\bm\.Handle(?:Func)?\("([^"]*)"(?:\s*\+\s*(\w+))?\s*,`)
	var out []string
	for _, m := range re.FindAllStringSubmatch(string(src), -1) {
		p := m[1]
		if m[2] != "" {
			v, ok := consts[m[2]]
			if !ok {
				t.Fatalf("route pattern %q + %s: add the constant to muxPatterns", m[1], m[2])
			}
			p += v
		}
		out = append(out, p)
	}
	if len(out) < 10 {
		t.Fatalf("found only %d routes in httpapi.go: %q", len(out), out)
	}
	return out
}

func TestOpenAPIRoutes(t *testing.T) {
	doc, _, err := loadSpec()
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, envOpts{}) // with Metrics: every route registered
	mux := e.h.(*api).mux

	// "GET /v1/tasks/{subject}/{scope}" in the mux is the same in the
	// document; "GET /{$}" (exactly /) is "GET /".
	registered := map[string]string{} // "METHOD /openapi/path" -> mux pattern
	for _, p := range muxPatterns(t) {
		method, path, ok := strings.Cut(p, " ")
		if !ok {
			t.Fatalf("route %q has no method: every route must name one", p)
		}
		path = strings.TrimSuffix(path, "{$}")
		if path != "/" {
			path = strings.TrimSuffix(path, "/")
		}
		registered[method+" "+path] = p
	}
	documented := map[string]bool{}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			documented[method+" "+path] = true
		}
	}
	for op, pattern := range registered {
		if !documented[op] {
			t.Errorf("route %q (%s) is not in openapi.json", pattern, op)
		}
	}
	for op := range documented {
		if _, ok := registered[op]; !ok {
			t.Errorf("openapi.json documents %s, which httpapi.go does not register", op)
		}
	}

	// And the mux really routes each documented operation to that pattern.
	fill := strings.NewReplacer("{subject}", "u1", "{scope}", "course_sync")
	for op, pattern := range registered {
		method, path, _ := strings.Cut(op, " ")
		req := newRequest(method, fill.Replace(path), nil)
		if _, got := mux.Handler(req); got != pattern {
			t.Errorf("%s routes to %q, want %q", op, got, pattern)
		}
	}
}

func TestOpenAPIServed(t *testing.T) {
	e := newEnv(t, envOpts{})
	r := e.do("GET", "/v1/openapi.json", "")
	mustStatus(t, r, http.StatusOK, "")
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	file, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r.raw, file) {
		t.Errorf("GET /v1/openapi.json (%d bytes) differs from openapi.json (%d bytes)", len(r.raw), len(file))
	}

	// A /v1 route: the token is required when set, and the browser rules apply.
	te := newEnv(t, envOpts{token: "s3cret"})
	mustStatus(t, te.do("GET", "/v1/openapi.json", ""), http.StatusUnauthorized, "unauthorized")
	if r := te.do("GET", "/v1/openapi.json", "", "Authorization", "Bearer s3cret"); r.status != http.StatusOK || !bytes.Equal(r.raw, file) {
		t.Errorf("with the token: %d, %d bytes", r.status, len(r.raw))
	}
	mustStatus(t, e.do("GET", "/v1/openapi.json", "", "Sec-Fetch-Site", "cross-site"), http.StatusForbidden, "forbidden")
	mustStatus(t, e.do("POST", "/v1/openapi.json", ""), http.StatusMethodNotAllowed, "method_not_allowed")
}

// TestOpenAPISchemasOfGoTypes validates the Go types the API encodes, with
// every optional field set, against their schemas: the API tests above
// never see some of them (a fan-out in progress, a stopped runner,
// coalesced history events, truncated scans).
func TestOpenAPISchemasOfGoTypes(t *testing.T) {
	doc, _, err := loadSpec()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 3, 1, 12, 30, 0, 0, time.UTC)
	later := now.Add(time.Minute)
	view := jobs.TaskView{Key: "u1|backup", Subject: "u1", Scope: "backup", RunID: "r1", Status: jobs.StatusRetrying,
		Stage: "dumping", Stages: []string{"dumping"}, CompletedStages: []string{}, Attempt: 2, MaxAttempts: 3,
		Sources: []jobs.Source{jobs.SourceSchedule, jobs.SourceRetry}, Owner: "pod-a/1f2e", FencingToken: 1 << 40,
		RequestedAt: &now, StartedAt: &now, UpdatedAt: &later, NextAttemptAt: &later, LastError: "boom",
		CanCancel: true, FollowUpQueued: true, Waiting: "waiting for a runner that defines stage dumping"}
	fanOut := triggers.FanOutStatus{Occurrence: now, Owner: "pod-a/1f2e", Term: 3, Submitted: 10, Duplicates: 1,
		Batches: 2, Partition: 4, Partitions: 4, Done: true, Abandoned: true, Resumes: 1, StartedAt: now,
		UpdatedAt: later, FinishedAt: &later}
	listed := fanOut
	listed.Partitions, listed.Partition, listed.Index, listed.Total, listed.FinishedAt, listed.Done = 0, 0, 3, 7, nil, false
	summary := jobs.ScopeSummary{Scope: "backup", Stages: []string{"dumping"}, Policy: jobs.PolicyQueue, Paused: true,
		Counts: map[jobs.Status]int{jobs.StatusQueued: 1, jobs.StatusRunning: 0, jobs.StatusRetrying: 0,
			jobs.StatusDone: 2, jobs.StatusFailed: 0, jobs.StatusCancelled: 0},
		LastHour: jobs.FinishedTotals{Done: 2}, Throughput: make([]jobs.MinuteTotals, jobs.ThroughputMinutes)}
	for i := range summary.Throughput {
		summary.Throughput[i].Minute = now.Add(time.Duration(i-jobs.ThroughputMinutes+1) * time.Minute)
	}
	for _, tc := range []struct {
		schema string
		v      any
	}{
		{"TaskView", view},
		{"SubmitResponse", submitResponse{Outcome: jobs.OutcomeThrottled, Task: view}},
		{"ListResponse", listResponse{Tasks: []jobs.TaskView{view}, Total: 1, Limit: 100, Truncated: true}},
		{"HistoryResponse", historyResponse{Events: []jobs.Event{
			{At: now, Count: 3, LastAt: &later, RunID: "r1", Event: "joined", Source: "foreground", Outcome: "joined"},
			{At: now, Count: 1, RunID: "r1", Event: "retry-scheduled", Stage: "dumping", Outcome: "attempt 1 of 3",
				Error: "boom", Owner: "pod-a/1f2e", FencingToken: 1 << 40},
		}}},
		{"CancelResponse", cancelResponse{Outcome: jobs.CancelNotRunning}},
		{"CancelSummary", jobs.CancelSummary{Matched: 3, Cancelling: 1, Cancelled: 1, NotRunning: 1, Truncated: true}},
		{"ForegroundResponse", foregroundResponse{Results: []triggers.ForegroundResult{{Scope: "backup", Outcome: jobs.OutcomeJoined, Task: view}}}},
		{"Overview", jobs.Overview{Scopes: []jobs.ScopeSummary{summary}, Queue: jobs.QueueDepths{Stream: 5, Retry: 1},
			CountsTruncated: true, At: now}},
		{"PauseResponse", pauseResponse{Scope: "backup", Paused: true}},
		{"ResumeResponse", pauseResponse{Scope: "backup", Paused: false, Requeued: new(int)}},
		{"RunnersResponse", runnersResponse{Runners: []jobs.RunnerInfo{{Owner: "pod-a/1f2e", ID: "pod-a", Version: "(devel)",
			Concurrency: 8, Active: 2, StartedAt: now, HeartbeatAt: later, HeartbeatAgeSeconds: 1.5, StoppedAt: &later,
			IntervalSeconds: 2, Finished: []jobs.FinishedCount{{Minute: now.Unix(), Scope: "backup", Done: 1, Failed: 1}}}}}},
		{"LimitersResponse", limitersResponse{Limiters: []jobs.LimiterView{
			{Name: "job.backup", Concurrency: 4, InUse: 4, Waiting: 7, Jobs: []string{"backup"}},
			{Name: "remote_store", Concurrency: 50, InUse: 2, Rate: "20/s", Burst: 10, Waiting: 3, HeldUntil: &later,
				Jobs: []string{"backup", "course_sync"}},
			{Name: "slow", Rate: "5/m", Burst: 1, Jobs: []string{}},
		}}},
		{"SchedulesResponse", schedulesResponse{Schedules: []triggers.ScheduleStatus{
			{Name: "all", Cron: "*/15 * * * *", Scope: "backup", Subjects: triggers.SubjectsCount{All: true},
				NextOccurrence: &later, LastOccurrence: &fanOut, RecentOccurrences: []*triggers.FanOutStatus{&fanOut, &fanOut},
				Leader: "pod-a/1f2e"},
			{Name: "list", Cron: "@hourly", Scope: "backup", Subjects: triggers.SubjectsCount{Count: 7}, LastOccurrence: &listed},
			{Name: "none", Cron: "0 0 30 2 *", Scope: "backup"},
		}}},
		{"Error", errorBody{Error: errorDetail{Code: "too_many_clients", Message: "retry in 5 seconds"}}},
	} {
		b, err := json.Marshal(tc.v)
		if err != nil {
			t.Fatal(err)
		}
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		if err := doc.Components.Schemas[tc.schema].Value.VisitJSON(v, openapi3.VisitAsResponse(), openapi3.MultiErrors()); err != nil {
			t.Errorf("%s %s: %v", tc.schema, b, err)
		}
	}
}
