package jobs

import (
	"context"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// LimiterView is a limiter's state (GET /v1/limiters, runner limiters).
type LimiterView struct {
	Name string `json:"name"`
	// Concurrency is the limit (0: none) and InUse the slots held now.
	Concurrency int `json:"concurrency"`
	InUse       int `json:"inUse"`
	// Rate ("20/s", "" none) and Burst pace the starts.
	Rate  string `json:"rate,omitempty"`
	Burst int    `json:"burst,omitempty"`
	// Waiting counts the runs waiting for the limiter.
	Waiting int `json:"waiting"`
	// HeldUntil: a retry-after holds the limiter's starts until then
	// (holdOnRetryAfter); nil when not held.
	HeldUntil *time.Time `json:"heldUntil,omitempty"`
	// Jobs are the scopes whose runs hold it.
	Jobs []string `json:"jobs"`
}

// Limiters returns the state of every limiter this registry knows (named
// ones and the jobs' own), by name.
func (r *Registry) Limiters(ctx context.Context) ([]LimiterView, error) {
	names := make([]string, 0, len(r.limiters))
	for n := range r.limiters {
		names = append(names, n)
	}
	slices.Sort(names)
	now := time.Now()
	nowMS := strconv.FormatInt(now.UnixMilli(), 10)
	type cmds struct {
		hold    *redis.SliceCmd
		inUse   *redis.IntCmd
		waiting *redis.IntCmd
	}
	cs := make([]cmds, len(names))
	pipe := r.rdb.Pipeline()
	for i, n := range names {
		k := r.limiters[n].key
		cs[i] = cmds{hold: pipe.HMGet(ctx, k, "holdUntil"), inUse: pipe.ZCount(ctx, k+":slots", "("+nowMS, "+inf"),
			waiting: pipe.HLen(ctx, k+":wmeta")}
	}
	if len(names) > 0 {
		if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
			return nil, err
		}
	}
	out := make([]LimiterView, 0, len(names))
	for i, n := range names {
		d := r.limiters[n]
		v := LimiterView{Name: n, Concurrency: d.Concurrency, Rate: d.Rate.String(), Jobs: []string{}}
		if !d.Rate.IsZero() {
			v.Burst = d.Rate.Burst
		}
		v.InUse = int(cs[i].inUse.Val())
		v.Waiting = int(cs[i].waiting.Val())
		if h := cs[i].hold.Val(); len(h) == 1 && h[0] != nil {
			if ms, err := strconv.ParseFloat(h[0].(string), 64); err == nil && int64(ms) > now.UnixMilli() {
				t := time.UnixMilli(int64(ms)).UTC()
				v.HeldUntil = &t
			}
		}
		for _, scope := range r.scopes {
			if slices.Contains(r.jobLimits[scope], d) {
				v.Jobs = append(v.Jobs, scope)
			}
		}
		out = append(out, v)
	}
	return out, nil
}
