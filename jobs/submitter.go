package jobs

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/tasklease/tasklease/taskkey"
)

// Concurrent Submits of one Registry are combined: those waiting while
// earlier ones are in flight go to Redis together, one submit.lua call per
// partition (up to submitChunk requests each), all in one round trip. A
// Submit on an idle registry is sent at once; beside a flush in flight,
// another starts only with as many requests (groupcommit.CombinerConfig's
// Balanced: small calls beside big ones cost Redis a call's fixed cost for
// a few requests).
const (
	submitsInFlight = 2   // combined flushes in flight at once
	submitBatchMax  = 512 // requests per flush
	submitChunk     = 64  // requests per script call (bounds one script's run time)
)

// submitReq is one Submit on its way to Redis.
type submitReq struct {
	k           taskkey.Key
	p           int
	source      Source
	policy      Policy
	runID       string // of the run it starts, if it starts one
	stages      string // comma list
	maxAttempts int
	minInterval int64  // ms
	delay       int64  // ms; 0: none
	notBefore   int64  // unix ms; 0: none
	debounceMax int64  // ms; a debounced request (Job.Debounce) moves its delayed run's start up to this after its first request
	traceparent string // the submit span's context, when tracing is on
	group       string // SubmitOptions.Group; "" none
	// results, set by flushSubmits; served is the follow-up's id that
	// submit.lua names after a queued or replaced outcome
	outcome, view, served string
	err                   error
}

// flushSubmits sends reqs and sets their results: one submit.lua call
// per partition, or — on a single Redis, where a script may touch any key —
// one call for the requests of several partitions, up to submitChunk
// requests a call.
func (r *Registry) flushSubmits(reqs []*submitReq) {
	groups := map[int][]*submitReq{}
	var order []int
	for _, q := range reqs {
		g := q.p
		if r.singleNode {
			g = 0
		}
		if _, ok := groups[g]; !ok {
			order = append(order, g)
		}
		groups[g] = append(groups[g], q)
	}
	var calls []*scriptCall
	var of [][]*submitReq
	for _, g := range order {
		part := groups[g]
		for len(part) > 0 {
			chunk := part[:min(len(part), submitChunk)]
			part = part[len(chunk):]
			calls = append(calls, r.submitCall(chunk))
			of = append(of, chunk)
		}
	}
	_ = evalGrouped(context.Background(), r.gc, calls) // each call's error is read below
	for i, c := range calls {
		res, err := c.cmd.Slice()
		if err == nil && len(res) != 2*len(of[i]) {
			err = fmt.Errorf("unexpected reply %v", res)
		}
		for j, q := range of[i] {
			if err != nil {
				q.err = err
				continue
			}
			q.outcome, q.served, _ = strings.Cut(replyString(res[2*j]), " ")
			q.view = replyString(res[2*j+1])
		}
	}
}

// submitCall builds one submit.lua call for reqs: per request its record's
// key (the script derives the partition's keys from its hash tag) and its
// arguments.
func (r *Registry) submitCall(reqs []*submitReq) *scriptCall {
	traced := r.tracer != nil // submit.lua's traced layout: two keys more per request, and its traceparent
	kr := 1
	if traced {
		kr = 3
	}
	c := &scriptCall{script: r.scripts.submit,
		keys: make([]string, 0, kr*len(reqs)), args: make([]any, 0, 3+len(reqs))}
	c.args = append(c.args, r.histCap, r.retention.Milliseconds(), boolFlag(traced))
	for _, q := range reqs {
		c.keys = append(c.keys, r.ks.Task(q.k))
		c.args = append(c.args, q.requestArg(traced))
		if traced {
			c.keys = append(c.keys, r.ks.FollowUpLinks(q.k), r.ks.Links(q.k, q.runID))
		}
	}
	return c
}

// requestArg is the request as submit.lua's one argument for it: the first
// letters of its policy and source, then the new run's id, stages,
// maxAttempts and timing (with the group, when there is one, after a '|':
// a request without one sends nothing more), and, traced, the traceparent,
// separated by histSep. A repeated join reads the two letters only; as six
// arguments, Redis made a Lua string of each (~900 instructions apiece).
func (q *submitReq) requestArg(traced bool) string {
	b := make([]byte, 0, 2+len(q.runID)+len(q.stages)+len(q.traceparent)+len(q.group)+25)
	b = append(b, q.policy[0], q.source[0])
	b = append(b, q.runID...)
	b = append(b, histSep...)
	b = append(b, q.stages...)
	b = append(b, histSep...)
	b = strconv.AppendInt(b, int64(q.maxAttempts), 10)
	b = append(b, histSep...)
	b = appendTiming(b, q.minInterval, q.delay, q.debounceMax, q.notBefore)
	if q.group != "" { // lib/submitting.lua request_timing
		b = append(b, '|')
		b = append(b, q.group...)
	}
	if traced {
		b = append(b, histSep...)
		b = append(b, q.traceparent...)
	}
	return string(b)
}

// appendTiming appends a request's timing field (lib/submitting.lua
// request_timing): the min interval (ms), then for a delayed request
// "+<delay ms>", "~<debounceMax ms>" when it is debounced, and
// "@<not before, unix ms>".
func appendTiming(b []byte, minInterval, delay, debounceMax, notBefore int64) []byte {
	b = strconv.AppendInt(b, minInterval, 10)
	if delay > 0 {
		b = append(b, '+')
		b = strconv.AppendInt(b, delay, 10)
		if debounceMax > 0 {
			b = append(b, '~')
			b = strconv.AppendInt(b, debounceMax, 10)
		}
	}
	if notBefore > 0 {
		b = append(b, '@')
		b = strconv.AppendInt(b, notBefore, 10)
	}
	return b
}

// boolFlag is a script's boolean argument.
func boolFlag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// taskView is the view submit.lua replied with. For a run it started the
// reply is only the server time: the rest is what this request asked for.
func (q *submitReq) taskView() TaskView {
	if Outcome(q.outcome) != OutcomeStarted {
		return viewFromReply(q.k, q.view)
	}
	var vals [vfCount]string
	vals[vfRunID], vals[vfStatus], vals[vfStages] = q.runID, string(StatusQueued), q.stages
	vals[vfDone], vals[vfAttempt], vals[vfMaxAttempts] = "0", "0", strconv.Itoa(q.maxAttempts)
	vals[vfSources], vals[vfRequestedAt], vals[vfUpdatedAt] = string(q.source), q.view, q.view
	if q.delay > 0 || q.notBefore > 0 { // as submit.lua decides it
		now, _ := strconv.ParseInt(q.view, 10, 64)
		if nb := max(now+q.delay, q.notBefore); nb > now {
			vals[vfWaiting] = delayedPrefix + strconv.FormatInt(nb, 10)
		}
	}
	return viewFromValues(q.k.String(), q.k.Subject(), q.k.Scope(), vals[:])
}

// servedBy is the id of the run that serves the request: the run it
// started or joined, or the follow-up it queued (or that replaces the
// active run); none when it was skipped or throttled.
func (q *submitReq) servedBy(v TaskView) string {
	switch Outcome(q.outcome) {
	case OutcomeStarted:
		return q.runID
	case OutcomeJoined:
		return v.RunID
	case OutcomeQueued, OutcomeReplaced:
		return q.served
	}
	return ""
}

// viewFromReply builds the TaskView of k from submit.lua's encoded view:
// a stamp (lib/submitting.lua view_stamp) up to the first RS (0x1E), then the values
// of viewFieldNames, separated by histSep.
func viewFromReply(k taskkey.Key, s string) TaskView {
	if _, view, ok := strings.Cut(s, "\x1e"); ok {
		s = view
	}
	var vals [vfCount]string
	for i := range vals {
		v, rest, ok := strings.Cut(s, histSep)
		vals[i] = v
		if !ok {
			break
		}
		s = rest
	}
	return viewFromValues(k.String(), k.Subject(), k.Scope(), vals[:])
}
