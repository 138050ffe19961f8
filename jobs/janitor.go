package jobs

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/taskkey"
)

// Janitor defaults.
const (
	// JanitorIntervalDefault: how often a runner prunes the bookkeeping of
	// every partition (lua/janitor.lua).
	JanitorIntervalDefault = time.Minute
	// ConsumerIdleLimit: a consumer-group member with no pending entries
	// that has not read for this long belongs to a runner that is gone
	// (live runners read every partition at least every FetchBlock).
	ConsumerIdleLimit = 5 * time.Minute
	// janitorBatch bounds the index candidates one script examines.
	janitorBatch = 200
)

// janitorCounts is what one pass removed.
type janitorCounts struct{ subjects, index, consumers int64 }

// janitorPass prunes every partition once: subjects not requested within
// the retention, index entries of expired records, and consumer-group
// members of runners that are gone. Everything tasklease writes is thereby
// bounded by live work or the retention (DESIGN §2.6).
func (r *Runner) janitorPass(ctx context.Context) {
	var total janitorCounts
	for p := range r.reg.ks.Partitions() {
		c, err := r.reg.janitor(ctx, p, r.owner, r.consumerIdle)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("janitor failed", slog.String("component", "janitor"), slog.Int("partition", p), slog.Any("error", err))
			}
			return
		}
		total.subjects += c.subjects
		total.index += c.index
		total.consumers += c.consumers
	}
	if total != (janitorCounts{}) {
		r.log.Info("janitor pruned", slog.String("component", "janitor"), slog.Int64("subjects", total.subjects),
			slog.Int64("index", total.index), slog.Int64("consumers", total.consumers))
	}
}

// janitor runs lua/janitor.lua on partition p; consumer is the caller's
// own consumer name, never deleted; members idle longer than idleLimit
// with nothing pending are.
func (r *Registry) janitor(ctx context.Context, p int, consumer string, idleLimit time.Duration) (janitorCounts, error) {
	ks := r.ks
	cutoff := time.Now().Add(-r.retention).UnixMilli() // candidates only: the script decides by EXISTS
	cands, err := r.rdb.ZRangeByScore(ctx, ks.Index(p), &redis.ZRangeBy{
		Min: "-inf", Max: "(" + strconv.FormatInt(cutoff, 10), Count: janitorBatch,
	}).Result()
	if err != nil {
		return janitorCounts{}, err
	}
	keys := make([]string, 0, 3+len(r.scopes)+len(cands))
	keys = append(keys, ks.Index(p), ks.Requests(p), ks.PeopleRequests(p))
	for _, scope := range r.scopes {
		keys = append(keys, ks.Subjects(p, scope))
	}
	args := make([]any, 0, 5+len(cands))
	args = append(args, r.retention.Milliseconds(), len(r.scopes), idleLimit.Milliseconds(), keyspace.Group, consumer)
	for _, c := range cands {
		k, err := taskkey.Parse(c)
		if err != nil { // not ours: a task record name cannot be derived; drop it
			r.rdb.ZRem(ctx, ks.Index(p), c)
			continue
		}
		keys = append(keys, ks.Task(k))
		args = append(args, c)
	}
	res, err := r.scripts.janitor.Run(ctx, r.gc, keys, args...).Int64Slice()
	if err != nil {
		return janitorCounts{}, err
	}
	if len(res) != 3 {
		return janitorCounts{}, nil
	}
	return janitorCounts{subjects: res[0], index: res[1], consumers: res[2]}, nil
}
