package jobs

import (
	"context"
	"errors"
	"log/slog"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
)

// reclaimAll takes over entries idle for longer than the lease TTL: their
// holders stopped heartbeating. claim re-checks each against its lease.
func (r *Runner) reclaimAll(ctx context.Context) {
	for p := range r.reg.ks.Partitions() {
		n := r.tryAcquire(r.cfg.FetchBatch)
		if n == 0 {
			return
		}
		msgs, _, err := r.reg.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{
			Stream: r.reg.ks.Requests(p), Group: keyspace.Group, Consumer: r.owner,
			MinIdle: r.reclaimIdle, Start: "0-0", Count: int64(n),
		}).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			r.release(n)
			if ctx.Err() == nil && !strings.Contains(err.Error(), "NOGROUP") {
				r.log.Warn("reclaim failed", slog.Int("partition", p), slog.Any("error", err))
			}
			continue
		}
		r.release(n - len(msgs))
		for _, m := range msgs {
			r.dispatch(p, m)
		}
	}
}

// moveRetries moves due retries of every partition back into the streams.
func (r *Runner) moveRetries(ctx context.Context) {
	for p := range r.reg.ks.Partitions() {
		err := r.reg.scripts.retryMove.Run(ctx, r.reg.rdb,
			[]string{r.reg.ks.Retry(p), r.reg.ks.Requests(p)}, 100).Err()
		if err != nil && ctx.Err() == nil {
			r.log.Warn("retry mover failed", slog.Int("partition", p), slog.Any("error", err))
			return
		}
	}
}
