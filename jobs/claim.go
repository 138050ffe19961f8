package jobs

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/taskkey"
)

// claimKind is claim.lua's decision on a stream entry.
type claimKind string

const (
	// claimAck: the entry was stale, or the claim ended the run (cancel,
	// crash loop at maxAttempts); nothing to execute.
	claimAck claimKind = "ack"
	// claimBusy: a live lease exists or a retry is not due; the entry stays
	// pending and becomes reclaimable when the lease would expire.
	claimBusy claimKind = "busy"
	// claimForeign: the run needs a stage or job this runner does not
	// define (a rolling deploy); the entry is left to a runner that does.
	claimForeign claimKind = "foreign"
	// claimGranted: the lease is ours and the run entered its first
	// incomplete stage.
	claimGranted claimKind = "granted"
)

// claimResult is the decoded reply of claim.lua.
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
}

// claim runs claim.lua for entry m. job is nil when this runner does not
// define the entry's scope.
func (r *Runner) claim(ctx context.Context, k taskkey.Key, p int, m redis.XMessage, job *Job, runID, source string, ttl time.Duration) (claimResult, error) {
	ks := r.reg.ks
	stages, maxAttempts := "", 0
	if job != nil {
		stages, maxAttempts = r.reg.stagesCSV[job.Scope], job.Retry.MaxAttempts
	}
	res, err := r.reg.scripts.claim.Run(ctx, r.reg.rdb,
		[]string{ks.Task(k), ks.Lease(k), ks.Fence(k), ks.Requests(p), ks.History(k), ks.Index(p), ks.Watch(p)},
		m.ID, runID, source, r.owner, ttl.Milliseconds(), keyspace.Group, r.reg.histCap,
		ks.Events(p), r.reg.retention.Milliseconds(), r.reclaimIdle.Milliseconds(), newRunID(),
		stages, maxAttempts, (r.reg.retention + ttl).Milliseconds()).Slice()
	if err != nil {
		return claimResult{}, err
	}
	c := claimResult{kind: claimKind(replyString(res[0]))}
	switch c.kind {
	case claimGranted:
	case claimForeign:
		if len(res) > 1 {
			c.missing = replyString(res[1])
		}
		return c, nil
	default:
		return c, nil
	}
	if len(res) < 9 {
		return claimResult{}, fmt.Errorf("claim: unexpected reply %v", res)
	}
	c.token, _ = res[1].(int64)
	c.done = int(toInt(res[2]))
	if s := replyString(res[3]); s != "" {
		c.cursor = []byte(s)
	}
	c.attempt = int(toInt(res[4]))
	c.stages = splitList(replyString(res[5]))
	for _, s := range splitList(replyString(res[6])) {
		c.sources = append(c.sources, Source(s))
	}
	c.prevStatus = Status(replyString(res[8]))
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
