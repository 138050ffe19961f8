package jobs

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/internal/wait"
)

// without blocking, as many entries as it has slots; when the stream is
// empty it blocks for one entry without holding a slot, so idle partitions
// never hold capacity another partition could use.
func (r *Runner) fetchLoop(ctx context.Context, p int) {
	stream := r.reg.ks.Requests(p)
	failures := 0
	read := func(count int, block time.Duration) ([]redis.XMessage, error) {
		res, err := r.reg.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: keyspace.Group, Consumer: r.owner, Streams: []string{stream, ">"},
			Count: int64(count), Block: block,
		}).Result()
		if errors.Is(err, redis.Nil) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		if len(res) == 0 {
			return nil, nil
		}
		return res[0].Messages, nil
	}
	onErr := func(err error) bool {
		if ctx.Err() != nil {
			return false
		}
		failures++
		if strings.Contains(err.Error(), "NOGROUP") {
			_ = r.ensureGroup(ctx, p) // the stream was deleted (e.g. Redis restarted empty)
		}
		if failures == 1 || failures%50 == 0 {
			r.log.Warn("stream read failed", slog.String("stream", stream), slog.Any("error", err))
		}
		return wait.Sleep(ctx, backoff(redisErrorBackoffBase, 5*time.Second, failures))
	}
	for ctx.Err() == nil {
		if !r.acquire(ctx) {
			return
		}
		n := 1 + r.tryAcquire(r.cfg.FetchBatch-1)
		msgs, err := read(n, -1)
		r.release(n - len(msgs))
		if err != nil {
			if !onErr(err) {
				return
			}
			continue
		}
		failures = 0
		for _, m := range msgs {
			r.dispatch(p, m)
		}
		if len(msgs) > 0 {
			continue
		}
		msgs, err = read(1, r.cfg.FetchBlock)
		if err != nil {
			if !onErr(err) {
				return
			}
			continue
		}
		for _, m := range msgs {
			// Wait for a slot; on shutdown the entry stays pending and is
			// reclaimed by another runner.
			if !r.acquire(ctx) {
				return
			}
			r.dispatch(p, m)
		}
	}
}

// dispatch executes one entry in its own goroutine; the caller holds a slot
// for it, which the goroutine releases.
func (r *Runner) dispatch(p int, m redis.XMessage) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer r.release(1)
		r.process(p, m)
	}()
}

func (r *Runner) every(ctx context.Context, d time.Duration, f func(context.Context)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f(ctx)
		}
	}
}
