package jobs

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/tasklease/tasklease/taskkey"
)

// Tracing (docs/operations.md), on when Config.TracerProvider is set: a span per
// submit; a span per run, linked to the submit span of every request that
// started or joined it — the W3C trace context travels through Redis, in a
// per-run list next to the run record, so the run's span links requests
// made on any pod —; a child span per stage, whose context exec stages get
// as TRACEPARENT and HTTP stages as the traceparent header. Off, none of it
// costs a Redis call.

// Span attribute names.
const (
	attrTaskKey      = attribute.Key("tasklease.task_key")
	attrRunID        = attribute.Key("tasklease.run_id")
	attrSource       = attribute.Key("tasklease.source")
	attrFencingToken = attribute.Key("tasklease.fencing_token")
	attrAttempt      = attribute.Key("tasklease.attempt")
	attrOutcome      = attribute.Key("tasklease.outcome")
	attrStage        = attribute.Key("tasklease.stage")
)

// linksMax bounds the request links a run keeps: a storm of joins is
// represented by its first linksMax requests (the history counts them all).
const linksMax = 32 // lua/lib/submitting.lua LINKS_MAX

// tracerName is the instrumentation scope of tasklease's spans.
const tracerName = "github.com/tasklease/tasklease/jobs"

var traceContext = propagation.TraceContext{}

// traceparent returns the W3C traceparent of ctx's span ("" without one).
func traceparent(ctx context.Context) string {
	c := propagation.MapCarrier{}
	traceContext.Inject(ctx, c)
	return c["traceparent"]
}

// spanContextOf parses a traceparent.
func spanContextOf(tp string) trace.SpanContext {
	ctx := traceContext.Extract(context.Background(), propagation.MapCarrier{"traceparent": tp})
	return trace.SpanContextFromContext(ctx)
}

// startSubmitSpan starts the span of one submit (nil tracer: no span).
func (r *Registry) startSubmitSpan(ctx context.Context, k taskkey.Key, src Source) (context.Context, trace.Span) {
	if r.tracer == nil {
		return ctx, nil
	}
	return r.tracer.Start(ctx, "tasklease.submit", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attrTaskKey.String(k.String()), attrSource.String(string(src))))
}

// endSubmitSpan records the outcome and, for a request that started or
// joined a run, the span's context in the run's link list (one pipelined
// RPUSH, LTRIM, PEXPIRE: only when tracing is on). A request merged into
// the key's next run (queued, or replacing the active one) left its context
// in the key's follow-up links inside submit.lua, atomically with its
// outcome, so the script that starts that run cannot miss it.
func (r *Registry) endSubmitSpan(ctx context.Context, span trace.Span, k taskkey.Key, res SubmitResult, err error) {
	if span == nil {
		return
	}
	defer span.End()
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return
	}
	// the run that serves the request (a queued one's follow-up), else the active one
	span.SetAttributes(attrRunID.String(cmp.Or(res.RunID, res.Task.RunID)), attrOutcome.String(string(res.Outcome)))
	if res.Outcome != OutcomeStarted && res.Outcome != OutcomeJoined {
		return
	}
	tp := traceparent(ctx)
	if tp == "" || res.Task.RunID == "" {
		return
	}
	key := r.ks.Links(k, res.Task.RunID)
	pipe := r.rdb.Pipeline()
	pipe.RPush(ctx, key, tp)
	pipe.LTrim(ctx, key, 0, linksMax-1)
	pipe.PExpire(ctx, key, r.retention)
	if _, err := pipe.Exec(ctx); err != nil {
		r.log.LogAttrs(ctx, slog.LevelWarn, "tracing: could not record the request's trace context",
			slog.String("task_key", k.String()), slog.Any("error", err))
	}
}

// runLinks reads the trace contexts of the requests merged into a run.
func (r *Registry) runLinks(ctx context.Context, k taskkey.Key, runID string, skip int) []trace.Link {
	tps, err := r.rdb.LRange(ctx, r.ks.Links(k, runID), int64(skip), -1).Result()
	if err != nil {
		return nil
	}
	links := make([]trace.Link, 0, len(tps))
	for _, tp := range tps {
		if sc := spanContextOf(tp); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	return links
}

// runSpan is the span of one attempt of a run.
type runSpan struct {
	span  trace.Span
	links int // links added so far
}

// startRunSpan starts a run's span, a new root linked to its requests.
func (r *Runner) startRunSpan(ctx context.Context, k taskkey.Key, runID string, c claimResult) (context.Context, *runSpan) {
	if r.reg.tracer == nil {
		return ctx, nil
	}
	links := r.reg.runLinks(ctx, k, runID, 0)
	ctx, span := r.reg.tracer.Start(ctx, "tasklease.run", trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(links...), trace.WithAttributes(attrTaskKey.String(k.String()), attrRunID.String(runID),
			attrFencingToken.Int64(c.token), attrAttempt.Int(c.attempt)))
	return ctx, &runSpan{span: span, links: len(links)}
}

// end links the requests that joined while the run executed and ends it.
func (s *runSpan) end(r *Runner, k taskkey.Key, runID, result string, err error) {
	if s == nil {
		return
	}
	for _, l := range r.reg.runLinks(context.Background(), k, runID, s.links) {
		s.span.AddLink(l)
	}
	s.span.SetAttributes(attrOutcome.String(result))
	if err != nil && result != resultDone {
		s.span.RecordError(err)
		s.span.SetStatus(codes.Error, fmt.Sprint(err))
	}
	s.span.End()
}

// startStageSpan starts a stage's span under the run's.
func (r *Runner) startStageSpan(ctx context.Context, stage string) (context.Context, trace.Span) {
	if r.reg.tracer == nil {
		return ctx, nil
	}
	return r.reg.tracer.Start(ctx, "tasklease.stage "+stage, trace.WithAttributes(attrStage.String(stage)))
}

func endStageSpan(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
