package jobs

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
)

// reclaimAll takes over entries idle for longer than the shortest lease
// TTL: their holders stopped heartbeating. claim re-checks each against its
// lease. Each partition is scanned from where the previous pass stopped
// (XPENDING … IDLE from a cursor), so the entries of a dead runner are
// reached however many live, heartbeating entries precede them, and
// entries nobody here can execute (a job or stage this runner does not
// define) cannot hold the scan at the same place.
func (r *Runner) reclaimAll(ctx context.Context) {
	for p := range r.reg.ks.Partitions() {
		for _, l := range keyspace.Lanes() {
			if !r.reclaimLane(ctx, p, l) {
				return // no free slot: the next pass continues where this stopped
			}
		}
	}
}

// reclaimMaxRounds bounds one partition's share of a pass.
const reclaimMaxRounds = 8

// reclaimLane reclaims idle entries of lane l of partition p while it has
// free slots, at most one full sweep of the pending list; false when it ran
// out of slots.
func (r *Runner) reclaimLane(ctx context.Context, p int, l keyspace.Lane) bool {
	stream := r.reg.ks.Stream(p, l)
	cur := &r.reclaimFrom[p*len(keyspace.Lanes())+int(l)]
	for range reclaimMaxRounds {
		n := r.tryAcquire(r.cfg.FetchBatch)
		if n == 0 {
			return false
		}
		start := *cur
		if start == "" {
			start = "-"
		}
		pend, err := r.reg.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
			Stream: stream, Group: keyspace.Group, Idle: r.reclaimIdle, Start: start, End: "+", Count: int64(n),
		}).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			r.release(n)
			if ctx.Err() == nil && !strings.Contains(err.Error(), "NOGROUP") {
				r.log.Warn("reclaim failed", slog.Int("partition", p), slog.Any("error", err))
			}
			return true
		}
		if len(pend) < n {
			*cur = "" // swept to the end: start over next pass
		} else {
			*cur = nextStreamID(pend[len(pend)-1].ID)
		}
		var msgs []redis.XMessage
		if len(pend) > 0 {
			ids := make([]string, len(pend))
			for i, e := range pend {
				ids[i] = e.ID
			}
			// XCLAIM re-checks the idle time atomically: of two runners
			// reclaiming at once, one gets each entry.
			msgs, err = r.reg.rdb.XClaim(ctx, &redis.XClaimArgs{
				Stream: stream, Group: keyspace.Group, Consumer: r.owner, MinIdle: r.reclaimIdle, Messages: ids,
			}).Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				msgs = nil
				if ctx.Err() == nil {
					r.log.Warn("reclaim failed", slog.Int("partition", p), slog.Any("error", err))
				}
			}
		}
		var es []entry
		for _, m := range msgs {
			if m.Values == nil { // deleted from the stream meanwhile
				continue
			}
			if e, ok := entryFrom(p, l, m.ID, m.Values); ok {
				es = append(es, e)
			} else {
				r.dropEntry(ctx, e)
			}
		}
		r.release(n - len(es))
		if len(es) > 0 {
			r.claimAndStart(ctx, p, es)
		}
		if *cur == "" {
			return true
		}
	}
	return true
}

// nextStreamID returns the smallest stream id after id ("ms-seq").
func nextStreamID(id string) string {
	ms, seq, ok := strings.Cut(id, "-")
	n, err := strconv.ParseUint(seq, 10, 64)
	if !ok || err != nil {
		return id
	}
	return ms + "-" + strconv.FormatUint(n+1, 10)
}

// moveRetries moves due retries of every partition back into the streams.
func (r *Runner) moveRetries(ctx context.Context) {
	for p := range r.reg.ks.Partitions() {
		err := r.reg.scripts.retryMove.Run(ctx, r.reg.gc,
			[]string{r.reg.ks.Retry(p), r.reg.ks.Requests(p)}, 100).Err()
		if err != nil && ctx.Err() == nil {
			r.log.Warn("retry mover failed", slog.Int("partition", p), slog.Any("error", err))
			return
		}
	}
}
