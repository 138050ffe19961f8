package jobs

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/taskkey"
)

// Janitor defaults.
const (
	// JanitorIntervalDefault: how often a runner prunes the bookkeeping of
	// every partition (lua/janitor.lua).
	JanitorIntervalDefault = time.Minute
	// janitorBatch bounds the index candidates one script examines.
	janitorBatch = 200
)

// janitorCounts is what one pass removed.
type janitorCounts struct{ subjects, index int64 }

// janitorPass prunes every partition once: subjects not requested within
// the retention and index entries of expired records. Everything
// tasklease writes is thereby
// bounded by live work or the retention (docs/concepts.md).
// On a single Redis server the pass also has the timer sweep every
// partition's taken set and retries (sweepAll), behind the due index.
// The pass is the fleet's, not each runner's: the runner that takes the
// turn key (SET NX, expiring within the interval) prunes; the others send
// that one SET. A turn taken by a runner that dies mid-pass passes on when
// the key expires.
func (r *Runner) janitorPass(ctx context.Context) {
	_, err := r.reg.rdb.SetArgs(ctx, r.reg.ks.JanitorTurn(), r.owner,
		redis.SetArgs{Mode: "NX", TTL: r.cfg.JanitorInterval * 9 / 10}).Result()
	if errors.Is(err, redis.Nil) {
		return // another runner's turn
	}
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("janitor failed", slog.String("component", "janitor"), slog.Any("error", err))
		}
		return
	}
	if r.reg.singleNode {
		r.sweepDue.Store(true) // the timer's next pass sweeps
	}
	var total janitorCounts
	for p := range r.reg.ks.Partitions() {
		c, err := r.reg.janitor(ctx, p)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("janitor failed", slog.String("component", "janitor"), slog.Int("partition", p), slog.Any("error", err))
			}
			return
		}
		total.subjects += c.subjects
		total.index += c.index
	}
	if total != (janitorCounts{}) {
		r.log.Info("janitor pruned", slog.String("component", "janitor"), slog.Int64("subjects", total.subjects),
			slog.Int64("index", total.index))
	}
}

// janitor runs lua/janitor.lua on partition p.
func (r *Registry) janitor(ctx context.Context, p int) (janitorCounts, error) {
	ks := r.ks
	cutoff := time.Now().Add(-r.retention).UnixMilli() // candidates only: the script decides by EXISTS
	cands, err := r.rdb.ZRangeByScore(ctx, ks.Index(p), &redis.ZRangeBy{
		Min: "-inf", Max: "(" + strconv.FormatInt(cutoff, 10), Count: janitorBatch,
	}).Result()
	if err != nil {
		return janitorCounts{}, err
	}
	keys := make([]string, 0, 1+len(r.scopes)+len(cands))
	keys = append(keys, ks.Index(p))
	for _, scope := range r.scopes {
		keys = append(keys, ks.Subjects(p, scope))
	}
	args := make([]any, 0, 2+len(cands))
	args = append(args, r.retention.Milliseconds(), len(r.scopes))
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
	if len(res) != 2 {
		return janitorCounts{}, nil
	}
	return janitorCounts{subjects: res[0], index: res[1]}, nil
}
