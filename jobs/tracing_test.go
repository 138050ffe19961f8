package jobs

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tasklease/tasklease/internal/redistest"
)

// A manual submit starts a run and a foreground request joins it while it
// executes: the one run's span links both submit spans (their contexts
// travelled through Redis), its stages are child spans, and the HTTP and
// exec stages receive the stage span's trace context.
func TestTracingLinksEveryMergedRequestToTheRun(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			tp, rec := recordingProvider(t)

			var mu sync.Mutex
			var gotHeader string
			downstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				gotHeader = r.Header.Get("traceparent")
				mu.Unlock()
			}))
			t.Cleanup(downstream.Close)
			envFile := filepath.Join(t.TempDir(), "traceparent")
			g := newGate()
			e := newEnv(t, b.Client, Config{Prefix: "tr", Partitions: 2, TracerProvider: tp, Jobs: []Job{clJob("traced",
				Stage{Name: "held", Handler: g},
				Stage{Name: "pushing", Handler: &HTTPStage{URL: downstream.URL}},
				Stage{Name: "exec", Handler: &ExecStage{Command: []string{"sh", "-c", `printf %s "$TRACEPARENT" > "$OUT"`}, Env: []string{"OUT=" + envFile}}},
			)}})
			e.startRunner(RunnerConfig{ID: "tr"})

			// Each request comes with its caller's span, as from an instrumented HTTP API.
			caller := tp.Tracer("test")
			mctx, manual := caller.Start(ctx, "tap sync now")
			res, err := e.reg.Submit(mctx, "u42", "traced", SubmitOptions{Source: SourceManual})
			manual.End()
			if err != nil || res.Outcome != OutcomeStarted {
				t.Fatalf("manual: %+v %v", res.Outcome, err)
			}
			waitFor(t, 10*time.Second, "the run to execute", func() bool { return g.count() == 1 })
			fctx, fg := caller.Start(ctx, "app foreground")
			res2, err := e.reg.Submit(fctx, "u42", "traced", SubmitOptions{Source: SourceForeground})
			fg.End()
			if err != nil || res2.Outcome != OutcomeJoined || res2.Task.RunID != res.Task.RunID {
				t.Fatalf("foreground: %+v %v", res2.Outcome, err)
			}
			g.open()
			e.waitStatus("u42", "traced", 10*time.Second, StatusDone)

			var submits, runs, stages []sdktrace.ReadOnlySpan
			waitFor(t, 10*time.Second, "the run span to end", func() bool {
				submits, runs, stages = nil, nil, nil
				for _, s := range rec.Ended() {
					switch {
					case s.Name() == "tasklease.submit":
						submits = append(submits, s)
					case s.Name() == "tasklease.run":
						runs = append(runs, s)
					case strings.HasPrefix(s.Name(), "tasklease.stage "):
						stages = append(stages, s)
					}
				}
				return len(runs) == 1
			})
			if len(submits) != 2 {
				t.Fatalf("%d submit spans, want 2", len(submits))
			}
			run := runs[0]
			linked := map[trace.SpanID]bool{}
			for _, l := range run.Links() {
				linked[l.SpanContext.SpanID()] = true
			}
			for _, s := range submits {
				if !linked[s.SpanContext().SpanID()] {
					t.Errorf("the run's span does not link submit span %s (source %v); links %v", s.SpanContext().SpanID(), s.Attributes(), run.Links())
				}
				if s.Parent().SpanID() != manual.SpanContext().SpanID() && s.Parent().SpanID() != fg.SpanContext().SpanID() {
					t.Errorf("submit span not a child of its caller's span")
				}
			}
			if len(stages) != 3 {
				t.Fatalf("%d stage spans, want 3", len(stages))
			}
			byName := map[string]sdktrace.ReadOnlySpan{}
			for _, s := range stages {
				if s.Parent().SpanID() != run.SpanContext().SpanID() {
					t.Errorf("stage span %s is not a child of the run's", s.Name())
				}
				byName[s.Name()] = s
			}
			want := func(what, tp string, stage sdktrace.ReadOnlySpan) {
				t.Helper()
				sc := spanContextOf(tp)
				if stage == nil || !sc.IsValid() || sc.SpanID() != stage.SpanContext().SpanID() || sc.TraceID() != run.SpanContext().TraceID() {
					t.Errorf("%s: traceparent %q, want the stage span's context", what, tp)
				}
			}
			mu.Lock()
			want("http stage header", gotHeader, byName["tasklease.stage pushing"])
			mu.Unlock()
			b, err := os.ReadFile(envFile)
			if err != nil {
				t.Fatal(err)
			}
			want("exec stage TRACEPARENT", string(b), byName["tasklease.stage exec"])
			for _, kv := range run.Attributes() {
				if kv.Key == attrFencingToken && kv.Value.AsInt64() <= 0 {
					t.Errorf("run span token %v", kv.Value)
				}
			}
		})
	}
}

// recordingProvider is a tracer provider that keeps every ended span.
func recordingProvider(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, rec
}

// tracedSubmit submits under a caller's span named name, as an
// instrumented API would, checks the outcome and returns the result and
// the caller span's context.
func tracedSubmit(t *testing.T, e *testEnv, tp trace.TracerProvider, name, subject, scope string, src Source, policy Policy, want Outcome) (SubmitResult, trace.SpanContext) {
	t.Helper()
	ctx, span := tp.Tracer("test").Start(context.Background(), name)
	res, err := e.reg.Submit(ctx, subject, scope, SubmitOptions{Source: src, Policy: policy})
	span.End()
	if err != nil || res.Outcome != want {
		t.Fatalf("%s: %v %v, want %s", name, res.Outcome, err, want)
	}
	return res, span.SpanContext()
}

// endedSpans waits until cond holds of the spans ended so far: the
// submit span of each request by its caller's span id, and the run spans
// by run id.
func endedSpans(t *testing.T, rec *tracetest.SpanRecorder, what string, cond func(submitOf map[trace.SpanID]trace.SpanID, runs map[string]sdktrace.ReadOnlySpan) bool) (map[trace.SpanID]trace.SpanID, map[string]sdktrace.ReadOnlySpan) {
	t.Helper()
	var submitOf map[trace.SpanID]trace.SpanID
	var runs map[string]sdktrace.ReadOnlySpan
	waitFor(t, 10*time.Second, what, func() bool {
		submitOf, runs = map[trace.SpanID]trace.SpanID{}, map[string]sdktrace.ReadOnlySpan{}
		for _, s := range rec.Ended() {
			switch s.Name() {
			case "tasklease.submit":
				submitOf[s.Parent().SpanID()] = s.SpanContext().SpanID()
			case "tasklease.run":
				for _, kv := range s.Attributes() {
					if kv.Key == attrRunID {
						runs[kv.Value.AsString()] = s
					}
				}
			}
		}
		return cond(submitOf, runs)
	})
	return submitOf, runs
}

// linkedIDs is the span ids s links.
func linkedIDs(s sdktrace.ReadOnlySpan) map[trace.SpanID]bool {
	out := map[trace.SpanID]bool{}
	for _, l := range s.Links() {
		out[l.SpanContext.SpanID()] = true
	}
	return out
}

// A request queued behind a running run and one replacing it are merged
// into the run that follows it: that run's span links both (submit.lua
// keeps their trace contexts in the key's follow-up links, which the
// finish that starts the follow-up renames into place), and the replaced
// run's span links neither.
func TestTracingLinksQueuedAndReplacingRequestsToTheFollowUp(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			tp, rec := recordingProvider(t)
			g := newGate()
			e := newEnv(t, b.Client, Config{Prefix: "trq", Partitions: 2, TracerProvider: tp,
				Jobs: []Job{clJob("traced", Stage{Name: "held", Handler: g})}})
			e.startRunner(RunnerConfig{ID: "trq"})
			first, _ := tracedSubmit(t, e, tp, "sync now", "u7", "traced", SourceManual, PolicyJoin, OutcomeStarted)
			waitFor(t, 10*time.Second, "the first run to execute", func() bool { return g.count() == 1 })
			_, queued := tracedSubmit(t, e, tp, "sync again later", "u7", "traced", SourceForeground, PolicyQueue, OutcomeQueued)
			_, replacing := tracedSubmit(t, e, tp, "start over", "u7", "traced", SourceManual, PolicyReplace, OutcomeReplaced)
			waitFor(t, 10*time.Second, "the follow-up to execute", func() bool { return g.count() == 2 })
			g.open()
			e.waitStatus("u7", "traced", 10*time.Second, StatusDone)

			submitOf, runs := endedSpans(t, rec, "both run spans to end", func(_ map[trace.SpanID]trace.SpanID, runs map[string]sdktrace.ReadOnlySpan) bool {
				return len(runs) == 2
			})
			replaced := runs[first.Task.RunID]
			if replaced == nil {
				t.Fatalf("no span of the first run %s among %v", first.Task.RunID, runs)
			}
			var followUp sdktrace.ReadOnlySpan
			for id, s := range runs {
				if id != first.Task.RunID {
					followUp = s
				}
			}
			for name, caller := range map[string]trace.SpanContext{"queued": queued, "replacing": replacing} {
				sub, ok := submitOf[caller.SpanID()]
				if !ok {
					t.Fatalf("no submit span for the %s request", name)
				}
				if !linkedIDs(followUp)[sub] {
					t.Errorf("the follow-up run's span does not link the %s request; links %v", name, followUp.Links())
				}
				if linkedIDs(replaced)[sub] {
					t.Errorf("the replaced run's span links the %s request", name)
				}
			}
		})
	}
}

// A run nobody executed yet is replaced: the replace ends it and starts
// the follow-up in one script, and the follow-up's span links both the
// replacing request and one queued behind the replaced run before.
func TestTracingLinksRequestsMergedIntoARunStartedByAReplace(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			tp, rec := recordingProvider(t)
			e := newEnv(t, b.Client, Config{Prefix: "trr", Partitions: 2, TracerProvider: tp,
				Jobs: []Job{clJob("traced", Stage{Name: "only", Handler: &counter{}})}})
			// no runner yet: the first run stays queued
			first, started := tracedSubmit(t, e, tp, "sync now", "u9", "traced", SourceManual, PolicyJoin, OutcomeStarted)
			_, queued := tracedSubmit(t, e, tp, "sync again after", "u9", "traced", SourceManual, PolicyQueue, OutcomeQueued)
			replaced, replacing := tracedSubmit(t, e, tp, "start over", "u9", "traced", SourceManual, PolicyReplace, OutcomeReplaced)
			if replaced.Task.RunID == first.Task.RunID || replaced.Task.Status != StatusQueued {
				t.Fatalf("the replace answered %+v, want the follow-up it started", replaced.Task)
			}
			e.startRunner(RunnerConfig{ID: "trr"})
			e.waitStatus("u9", "traced", 10*time.Second, StatusDone)

			submitOf, runs := endedSpans(t, rec, "the follow-up's run span", func(_ map[trace.SpanID]trace.SpanID, runs map[string]sdktrace.ReadOnlySpan) bool {
				return runs[replaced.Task.RunID] != nil
			})
			linked := linkedIDs(runs[replaced.Task.RunID])
			for name, caller := range map[string]trace.SpanContext{"queued": queued, "replacing": replacing} {
				if !linked[submitOf[caller.SpanID()]] {
					t.Errorf("the follow-up's span does not link the %s request; links %v", name, runs[replaced.Task.RunID].Links())
				}
			}
			if linked[submitOf[started.SpanID()]] {
				t.Error("the follow-up's span links the request of the run it replaced")
			}
		})
	}
}

// Off (no TracerProvider), tracing writes nothing to Redis and stages get
// no trace context.
func TestTracingOffWritesNothing(t *testing.T) {
	mini := redistest.StartMini(t)
	rdb := mini.Client(t)
	e := newEnv(t, rdb, Config{Prefix: "tro", Partitions: 1, Jobs: []Job{clJob("plain", Stage{Name: "only", Handler: &counter{}})}})
	e.startRunner(RunnerConfig{ID: "tro"})
	clSubmit(t, e.reg, "u1", "plain", SourceManual, "")
	e.waitStatus("u1", "plain", 10*time.Second, StatusDone)
	if keys := mini.Keys(); strings.Contains(strings.Join(keys, " "), ":links:") {
		t.Fatalf("links written with tracing off: %v", keys)
	}
}
