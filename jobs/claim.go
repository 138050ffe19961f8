package jobs

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/histories"
	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/taskkey"
)

// entry is a request taken from one lane of a partition's queue.
type entry struct {
	p      int
	lane   keyspace.Lane
	id     string // the entry as queued (lib/queues.lua enqueue): it names itself in the taken set
	key    taskkey.Key
	runID  string
	source string
}

// entrySep separates an entry's fields (lib/queues.lua enqueue).
const entrySep = "\x1f"

// entryFrom decodes an entry, "<lane letter><runId>US<task key>US<source>";
// ok is false for one not written by tasklease.
func entryFrom(p int, id string) (entry, bool) {
	e := entry{p: p, id: id}
	if id == "" {
		return e, false
	}
	switch id[:1] {
	case keyspace.LanePeople.Letter():
		e.lane = keyspace.LanePeople
	case keyspace.LaneBulk.Letter():
		e.lane = keyspace.LaneBulk
	default:
		return e, false
	}
	runID, rest, ok1 := strings.Cut(id[1:], entrySep)
	key, source, ok2 := strings.Cut(rest, entrySep)
	k, err := taskkey.Parse(key)
	if !ok1 || !ok2 || err != nil || runID == "" {
		return e, false
	}
	e.key, e.runID, e.source = k, runID, source
	return e, true
}

// claimKind is claim.lua's decision on an entry.
type claimKind string

const (
	// claimAck: the entry was stale, or the claim ended the run (cancel,
	// crash loop at maxAttempts); nothing to execute.
	claimAck claimKind = "ack"
	// claimBusy: a live lease exists or a retry is not due; the entry stays
	// taken and becomes reclaimable when the lease would expire.
	claimBusy claimKind = "busy"
	// claimForeign: the run needs a stage or job this runner does not
	// define (a rolling deploy); the entry is left to a runner that does.
	claimForeign claimKind = "foreign"
	// claimGranted: the lease is ours and the run entered its first
	// incomplete stage.
	claimGranted claimKind = "granted"
	// claimPaused: the run's scope is paused; the entry was acknowledged
	// and the run parked until the scope is resumed.
	claimPaused claimKind = "paused"
	// claimLimited: a read took the entry but did not claim it: its job
	// has limiters, which admit the run first (admitAndStart).
	claimLimited claimKind = "limited"
)

// claimResult is the decoded reply of claim.lua for one entry.
type claimResult struct {
	kind       claimKind
	missing    string // claimForeign: the stage not defined here ("" = the whole job)
	token      int64
	done       int
	cursor     []byte
	attempt    int
	stages     []string
	sources    []Source
	prevStatus Status
	sent       time.Time // when the claim was sent: the lease counts from here
	ttl        time.Duration
	slots      []slotGrant // the limiter starts the run holds (a limited job)
}

// leaseTTL is the lease TTL of runs of scope on this runner.
func (r *Runner) leaseTTL(scope string) time.Duration {
	if job := r.reg.jobs[scope]; job != nil {
		return cmp0(job.LeaseTTL, r.cfg.LeaseTTL)
	}
	return r.cfg.LeaseTTL
}

// claimCall builds one claim.lua call for entries of partition p (all of
// them from one partition: one hash tag).
func (r *Runner) claimCall(p int, es []entry) *scriptCall {
	ks := r.reg.ks
	c := &scriptCall{script: r.reg.scripts.claim,
		keys: make([]string, 0, 7+3*len(es)), args: make([]any, 0, 5+8*len(es))}
	c.keys = append(c.keys, ks.Watch(p))
	c.keys = append(c.keys, ks.QueueKeys(p)...)
	c.keys = append(c.keys, ks.Paused(p), ks.Parked(p))
	c.args = append(c.args, r.owner, r.reg.histCap, ks.Events(p), r.reg.retention.Milliseconds(), r.grantFloor())
	for _, e := range es {
		stages, maxAttempts := "", 0
		if job := r.reg.jobs[e.key.Scope()]; job != nil {
			stages, maxAttempts = r.reg.stagesCSV[job.Scope], job.Retry.MaxAttempts
		}
		c.keys = append(c.keys, ks.Task(e.key), ks.Lease(e.key), ks.History(e.key))
		c.args = append(c.args, e.lane.Letter(), e.id, e.runID, e.source, r.leaseTTL(e.key.Scope()).Milliseconds(),
			newRunID(), stages, maxAttempts)
	}
	return c
}

// claim runs claim.lua for entries of partition p in one round trip.
func (r *Runner) claim(ctx context.Context, p int, es []entry) ([]claimResult, error) {
	c := r.claimCall(p, es)
	sent := time.Now()
	if err := evalGrouped(ctx, r.reg.gc, []*scriptCall{c}); err != nil {
		return nil, err
	}
	return r.decodeClaims(c.cmd, es, sent)
}

// decodeClaims decodes claim.lua's reply for es.
func (r *Runner) decodeClaims(cmd *redis.Cmd, es []entry, sent time.Time) ([]claimResult, error) {
	res, err := cmd.Slice()
	if err != nil {
		return nil, err
	}
	if len(res) != len(es) {
		return nil, fmt.Errorf("claim: %d replies for %d entries", len(res), len(es))
	}
	out := make([]claimResult, len(es))
	for i, v := range res {
		c, err := r.decodeClaim(v, es[i], sent)
		if err != nil {
			return nil, err
		}
		out[i] = c
	}
	return out, nil
}

// decodeClaim decodes the claim reply v for entry e (claim.lua's contract).
func (r *Runner) decodeClaim(v any, e entry, sent time.Time) (claimResult, error) {
	one, _ := v.([]any)
	if len(one) == 0 {
		return claimResult{}, fmt.Errorf("claim: unexpected reply %v", v)
	}
	if s := replyString(one[0]); len(one) == 1 && strings.HasPrefix(s, string(claimGranted)+histSep) {
		return r.decodeGrant(s, e, sent)
	}
	c := claimResult{kind: claimKind(replyString(one[0])), sent: sent, ttl: r.leaseTTL(e.key.Scope())}
	switch c.kind {
	case claimGranted: // a grant is one string (decodeGrant); anything else is not one
		return claimResult{}, fmt.Errorf("claim: unexpected reply %v", v)
	case claimForeign:
		if len(one) > 1 {
			c.missing = replyString(one[1])
		}
	case claimBusy:
		if len(one) > 1 {
			r.sawHolder(replyString(one[1]))
		}
	}
	return c, nil
}

// decodeGrant decodes a grant, which claim.lua sends as one string (in a
// table, as every claim reply):
// "granted", token, done, attempt, stages, sources, startedAt, the status
// before and the cursor (last: it may hold any byte), separated by histSep.
func (r *Runner) decodeGrant(s string, e entry, sent time.Time) (claimResult, error) {
	f := strings.SplitN(s, histSep, 9)
	if len(f) != 9 || claimKind(f[0]) != claimGranted {
		return claimResult{}, fmt.Errorf("claim: unexpected reply %q", s)
	}
	c := claimResult{kind: claimGranted, sent: sent, ttl: r.leaseTTL(e.key.Scope()), prevStatus: Status(f[7])}
	var err error
	if c.token, err = strconv.ParseInt(f[1], 10, 64); err != nil {
		return claimResult{}, fmt.Errorf("claim: token %q: %w", f[1], err)
	}
	r.sawToken(c.token)
	if c.done, err = strconv.Atoi(f[2]); err != nil {
		return claimResult{}, fmt.Errorf("claim: done %q: %w", f[2], err)
	}
	if h := r.testHooks.history; h != nil {
		h(histories.Op{Key: e.key.String(), Kind: histories.Grant, Runner: r.owner, RunID: e.runID, Token: c.token, Done: c.done},
			histories.OK, sent, time.Now())
	}
	if c.attempt, err = strconv.Atoi(f[3]); err != nil {
		return claimResult{}, fmt.Errorf("claim: attempt %q: %w", f[3], err)
	}
	c.stages = splitList(f[4])
	for _, src := range splitList(f[5]) {
		c.sources = append(c.sources, Source(src))
	}
	if f[8] != "" {
		c.cursor = []byte(f[8])
	}
	return c, nil
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}
