package main

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/tasklease/tasklease/jobs"
)

// otlpSink is an OTLP/HTTP trace receiver: it keeps every span exported to
// it.
type otlpSink struct {
	mu    sync.Mutex
	spans []*tracepb.Span
}

func (s *otlpSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var req coltrace.ExportTraceServiceRequest
	if r.URL.Path != "/v1/traces" || proto.Unmarshal(b, &req) != nil {
		http.Error(w, "bad export", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			s.spans = append(s.spans, ss.Spans...)
		}
	}
	s.mu.Unlock()
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (s *otlpSink) named(name string) []*tracepb.Span {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*tracepb.Span
	for _, sp := range s.spans {
		if sp.Name == name {
			out = append(out, sp)
		}
	}
	return out
}

// A runner with tracing on (config tracing.enabled, OTLP endpoint from
// OTEL_EXPORTER_OTLP_ENDPOINT) exports: the API's server spans continuing
// the caller's traceparent, submit spans under them, and one run span
// linked to both the manual submit and the foreground hook that joined it.
func TestTracingExportsLinkedSpansOverOTLP(t *testing.T) {
	sink := &otlpSink{}
	col := httptest.NewServer(sink)
	t.Cleanup(col.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.URL)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	t.Setenv("TASKLEASE_TOKEN", "")
	srv := startServe(t, cliConfig+"tracing:\n  enabled: true\n  serviceName: tasklease-test\n")

	// The app's own trace: trace id 0af7…, its span b7ad….
	const traceID, parentID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	req, _ := http.NewRequest(http.MethodPost, srv.url+"/v1/tasks/u42/okjob/runs", bytes.NewReader([]byte(`{"source":"manual"}`)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+traceID+"-"+parentID+"-01")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	var fg struct {
		Results []struct {
			Outcome jobs.Outcome `json:"outcome"`
		} `json:"results"`
	}
	if err := postJSON(srv.url+"/v1/hooks/foreground", `{"subject":"u42","scopes":["okjob"]}`, &fg); err != nil || len(fg.Results) != 1 || fg.Results[0].Outcome != jobs.OutcomeJoined {
		t.Fatalf("foreground: %+v %v", fg, err)
	}
	eventually(t, 20*time.Second, "the run's span exported", func() error {
		if n := len(sink.named("tasklease.run")); n != 1 {
			return fmt.Errorf("%d run spans", n)
		}
		return nil
	})
	submits := sink.named("tasklease.submit")
	servers := sink.named("POST /v1/tasks/{subject}/{scope}/runs")
	if len(submits) != 2 || len(servers) != 1 {
		t.Fatalf("%d submit spans and %d submit-route server spans, want 2 and 1", len(submits), len(servers))
	}
	if hex.EncodeToString(servers[0].TraceId) != traceID || hex.EncodeToString(servers[0].ParentSpanId) != parentID {
		t.Errorf("the API's server span does not continue the caller's traceparent")
	}
	run := sink.named("tasklease.run")[0]
	var linked []string
	for _, l := range run.Links {
		linked = append(linked, hex.EncodeToString(l.SpanId))
	}
	for _, s := range submits {
		if !slices.Contains(linked, hex.EncodeToString(s.SpanId)) {
			t.Errorf("run span links %v, not submit span %x", linked, s.SpanId)
		}
	}
	manualInAppTrace := false
	for _, s := range submits {
		if hex.EncodeToString(s.TraceId) == traceID && bytes.Equal(s.ParentSpanId, servers[0].SpanId) {
			manualInAppTrace = true
		}
	}
	if !manualInAppTrace {
		t.Error("the manual submit span is not a child of the API's server span in the app's trace")
	}
	eventually(t, 10*time.Second, "both stage spans exported", func() error {
		if len(sink.named("tasklease.stage pulling")) != 1 || len(sink.named("tasklease.stage pushing")) != 1 {
			return fmt.Errorf("stage spans not exported yet")
		}
		return nil
	})
}
