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

// claimResult is the decoded reply of claim.lua.
type claimResult struct {
	kind       string // ack, busy, granted
	token      int64
	done       int
	cursor     []byte
	attempt    int
	stages     []string
	sources    []Source
	prevStatus Status
}

func (r *Runner) claim(ctx context.Context, k taskkey.Key, p int, m redis.XMessage, runID, source string, ttl time.Duration) (claimResult, error) {
	ks := r.reg.ks
	res, err := r.reg.scripts.claim.Run(ctx, r.reg.rdb,
		[]string{ks.Task(k), ks.Lease(k), ks.Fence(k), ks.Requests(p), ks.History(k), ks.Index(p), ks.Watch(p)},
		m.ID, runID, source, r.owner, ttl.Milliseconds(), keyspace.Group, r.reg.histCap,
		ks.Events(p), r.reg.retention.Milliseconds(), r.reclaimIdle.Milliseconds(), newRunID()).Slice()
	if err != nil {
		return claimResult{}, err
	}
	c := claimResult{kind: fmt.Sprint(res[0])}
	if c.kind != "granted" {
		return c, nil
	}
	if len(res) < 9 {
		return claimResult{}, fmt.Errorf("claim: unexpected reply %v", res)
	}
	c.token, _ = res[1].(int64)
	c.done = int(toInt(res[2]))
	if s := fmt.Sprint(res[3]); s != "" {
		c.cursor = []byte(s)
	}
	c.attempt = int(toInt(res[4]))
	c.stages = splitList(fmt.Sprint(res[5]))
	for _, s := range splitList(fmt.Sprint(res[6])) {
		c.sources = append(c.sources, Source(s))
	}
	c.prevStatus = Status(fmt.Sprint(res[8]))
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
