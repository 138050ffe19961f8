package jobs

import (
	"context"
	"fmt"
	"strings"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/taskkey"
)

// Concurrent Submits of one Registry are combined: those waiting while
// earlier ones are in flight go to Redis together, one submit.lua call per
// partition (up to submitChunk requests each), all in one round trip. A
// Submit on an idle registry is sent at once.
const (
	submitsInFlight = 2   // combined flushes in flight at once
	submitBatchMax  = 512 // requests per flush
	submitChunk     = 64  // requests per script call (bounds one script's run time)
)

// submitReq is one Submit on its way to Redis.
type submitReq struct {
	k    taskkey.Key
	p    int
	args [8]any // submit.lua's per-request ARGV
	// results, set by flushSubmits
	outcome, view string
	err           error
}

// flushSubmits sends reqs, grouped by partition, and sets their results.
func (r *Registry) flushSubmits(reqs []*submitReq) {
	byPart := map[int][]*submitReq{}
	var order []int
	for _, q := range reqs {
		if _, ok := byPart[q.p]; !ok {
			order = append(order, q.p)
		}
		byPart[q.p] = append(byPart[q.p], q)
	}
	var calls []*scriptCall
	var of [][]*submitReq
	for _, p := range order {
		part := byPart[p]
		for len(part) > 0 {
			chunk := part[:min(len(part), submitChunk)]
			part = part[len(chunk):]
			c := &scriptCall{script: r.scripts.submit,
				keys: make([]string, 0, 5+3*len(chunk)), args: make([]any, 0, 5+8*len(chunk))}
			c.keys = append(c.keys, r.ks.Requests(p), r.ks.Index(p), r.ks.Retry(p), r.ks.Watch(p), r.ks.PeopleRequests(p))
			c.args = append(c.args, r.histCap, r.ks.Events(p), r.ks.Cancels(p), keyspace.Group, r.retention.Milliseconds())
			for _, q := range chunk {
				c.keys = append(c.keys, r.ks.Task(q.k), r.ks.History(q.k), r.ks.Subjects(p, q.k.Scope()))
				c.args = append(c.args, q.args[:]...)
			}
			calls = append(calls, c)
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
			q.outcome, q.view = replyString(res[2*j]), replyString(res[2*j+1])
		}
	}
}

// viewFromReply builds the TaskView of k from submit.lua's encoded view
// (the values of viewFieldNames, separated by histSep).
func viewFromReply(k taskkey.Key, s string) TaskView {
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
