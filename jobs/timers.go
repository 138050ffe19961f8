package jobs

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"
)

// The timer: on a single Redis server or a Sentinel's primary, one loop a
// runner does what the reclaimer and the retry mover do on a Cluster by
// asking every partition every second — it reads the due index
// (keyspace.Space.Due: the partitions that have leases to reclaim, delayed
// runs to start or retries to move, each scored by when the earliest is
// due) and asks only the partitions due now, then sleeps until the next
// one is due, at most dueHorizon, or until a script announces something
// due sooner on the index's channel (lua/lib/queues.lua mark_due). An
// idle runner sends Redis two commands every dueHorizon for all of this,
// however many partitions it has.
const (
	// dueHorizon bounds the timer's sleep: a script announces only what
	// is due sooner than this (lua/lib/queues.lua DUE_HORIZON_MS, pinned
	// by TestDueHorizonMatches).
	dueHorizon = 5 * time.Second
	// dueReadMax bounds the index members one read looks at (the index
	// holds at most two a partition).
	dueReadMax = 64
	// dueSpread: the timer wakes up to this long after a due time, at
	// random, so a fleet's timers do not all ask the partition at once —
	// the first rescores it, and the others' read finds it later.
	dueSpread = 20 * time.Millisecond
)

// timerLoop runs the timer until ctx ends. A ReclaimInterval after it
// starts it sweeps every partition (sweepAll), which also enters into the
// index what an older version or a lost write left out of it; it sweeps
// again after each of the fleet's janitor passes, every JanitorInterval,
// but never twice within a ReclaimInterval. A sweep cut short (no free
// slot) goes on every ReclaimInterval until it is done.
func (r *Runner) timerLoop(ctx context.Context) {
	var wake <-chan *redis.Message // nil without a subscription: the horizon still bounds the sleep
	if sub, err := r.reg.hub.subscribe(ctx, []string{r.reg.ks.Due()}); err != nil {
		if ctx.Err() != nil {
			return
		}
		r.log.Warn("timer: no wake-ups from the due index; it is read every horizon", slog.Any("error", err))
	} else {
		defer sub.Close()
		wake = sub.C
	}
	r.sweepDue.Store(true)
	// asked: taken-set members, when this runner last asked their
	// partition; one not asked yet counts as asked when the timer started
	// (a runner's ReclaimInterval holds from its start).
	start := time.Now()
	asked := map[string]time.Time{"": start}
	sweptAt := start
	failures := 0
	t := time.NewTimer(0)
	defer t.Stop()
	for ctx.Err() == nil {
		// What was announced before this read, the read sees.
		for drained := false; !drained; {
			select {
			case <-wake:
			default:
				drained = true
			}
		}
		swept, hold := true, r.cfg.ReclaimInterval
		if r.sweepDue.Load() {
			// A sweep asks every taken set, so it too waits out
			// ReclaimInterval from the timer's start and from the last
			// sweep: a runner configured never to reclaim does not take
			// runs back because the janitor passed.
			if wait := r.cfg.ReclaimInterval - time.Since(sweptAt); wait > 0 {
				swept, hold = false, wait
			} else if swept = r.sweepAll(ctx); swept {
				r.sweepDue.Store(false)
				sweptAt = time.Now()
			}
		}
		d, err := r.timerPass(ctx, asked)
		if !swept {
			d = min(d, hold)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			if failures == 1 || failures%50 == 0 {
				r.log.Warn("timer: due index read failed", slog.Any("error", err))
			}
			d = backoff(redisErrorBackoffBase, r.cfg.ReclaimInterval, failures)
		} else {
			failures = 0
		}
		if h := r.testHooks.timerSleeps; h != nil {
			h(d)
		}
		if d <= 0 {
			continue
		}
		t.Reset(d)
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-t.C:
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
	}
}

// timerPass reads the due index, asks the partitions due now, and returns
// how long to sleep before the next read (0: at once, more may be due).
// A partition's taken set is asked at most every ReclaimInterval (asked;
// the "" member: when the timer started), as the reclaimer asks on a
// Cluster: its entries that only another runner can run are due again at
// once, and would otherwise be asked for in a loop.
func (r *Runner) timerPass(ctx context.Context, asked map[string]time.Time) (time.Duration, error) {
	idx := r.reg.ks.Due()
	pipe := r.reg.rdb.Pipeline()
	now := pipe.Time(ctx)
	firsts := pipe.ZRangeWithScores(ctx, idx, 0, dueReadMax-1)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, err
	}
	nowMS := float64(now.Val().UnixMilli())
	local := time.Now()
	for m, at := range asked {
		if m != "" && local.Sub(at) >= r.cfg.ReclaimInterval {
			delete(asked, m)
		}
	}
	sleep, worked := dueHorizon, false
	for _, z := range firsts.Val() {
		if z.Score > nowMS { // by score: the rest are later
			in := time.Duration(z.Score-nowMS) * time.Millisecond
			sleep = min(sleep, in+rand.N(dueSpread))
			break
		}
		m, _ := z.Member.(string)
		p, ok := r.reg.ks.PartitionOfTag(m[min(1, len(m)):])
		if !ok || (m[0] != 't' && m[0] != 'r') { // not this keyspace's: nothing would clear it
			r.reg.rdb.ZRem(ctx, idx, m)
			continue
		}
		if m[0] == 'r' {
			if _, ok := r.moveRetriesOf(ctx, p); !ok {
				sleep = min(sleep, r.cfg.RetryPoll)
				continue
			}
			worked = true
			continue
		}
		at, ok := asked[m]
		if !ok {
			at = asked[""]
		}
		if wait := r.cfg.ReclaimInterval - local.Sub(at); wait > 0 {
			sleep = min(sleep, wait)
			continue
		}
		asked[m] = local
		more, ok := r.reclaimPartition(ctx, p, false)
		if more {
			delete(asked, m) // it took all it asked for: ask again now
		}
		worked = worked || ok
	}
	if worked {
		// What was asked moved its entries in the index: read it again
		// (members just asked wait out ReclaimInterval).
		return 0, nil
	}
	return max(sleep, time.Millisecond), nil
}

// sweepAll asks every partition, as a Cluster's reclaimer and retry mover
// do every pass, draining the legacy request streams too: on a single
// Redis server it covers what the due index does not name — entries an
// older version took, a write the index lost with a failover — and sets
// the index right for each partition. A timer sweeps when it starts and
// after each of the fleet's janitor passes (Runner.sweepDue); false when
// it ran out of free slots (or Redis failed) before the last partition:
// the next call goes on from there (Runner.sweepFrom).
func (r *Runner) sweepAll(ctx context.Context) bool {
	// What a reclaim takes is started: only while Run runs (retries move
	// in any case).
	taking := r.taking()
	n := r.reg.ks.Partitions()
	for ; r.sweepFrom < n; r.sweepFrom++ {
		p := r.sweepFrom
		if _, ok := r.moveRetriesOf(ctx, p); !ok {
			return false
		}
		if !taking {
			continue
		}
		if _, ok := r.reclaimPartition(ctx, p, true); !ok {
			return false
		}
	}
	r.sweepFrom = 0
	return taking
}
