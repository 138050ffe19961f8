package jobs

import (
	"context"
	"log/slog"

	"github.com/tasklease/tasklease/internal/keyspace"
)

// reclaimAll takes over, in every partition, the entries whose time in the
// taken set is up: their holders stopped heartbeating (or a claim left
// them for later: busy, foreign, handed back). claim re-checks each against
// its lease. Entries come oldest-due first and are rescored as they are
// taken, so the entries of a dead runner are reached however many others
// are due, and entries nobody here can execute go behind them.
// A Redis Cluster's runners pass every ReclaimInterval; elsewhere the
// timer (timers.go) asks only the partitions the due index names, and
// the fleet's janitor pass sweeps them all (sweepAll).
func (r *Runner) reclaimAll(ctx context.Context) {
	drain := r.reclaimPasses%legacyDrainEvery == 0
	r.reclaimPasses++
	for p := range r.reg.ks.Partitions() {
		if _, ok := r.reclaimPartition(ctx, p, drain); !ok {
			return // no free slot: the next pass starts over
		}
	}
}

// reclaimMaxRounds bounds one partition's share of a pass.
const reclaimMaxRounds = 8

// legacyDrainEvery: every how many reclaim passes (the first included) a
// runner also drains the legacy request streams of older versions. Their
// requests are served by their own runners while any is left, so the drain
// matters only once they are gone; asking every pass cost two EXISTS per
// partition a second, a fifth of what an idle runner sent Redis.
const legacyDrainEvery = 10

// drainConsumer is the consumer name under which this version drains the
// legacy request streams of older versions (lua/reclaim.lua).
const drainConsumer = "tasklease-drain"

// reclaimPartition reclaims due entries of partition p while it has free
// slots (with drain, its first round also drains the legacy streams);
// more when its last round took all it asked for (more may be due), ok
// false when it ran out of slots.
func (r *Runner) reclaimPartition(ctx context.Context, p int, drain bool) (more, ok bool) {
	ks := r.reg.ks
	keys := append(append(make([]string, 0, 6), ks.QueueKeys(p)...),
		ks.LegacyStream(p, keyspace.LaneBulk), ks.LegacyStream(p, keyspace.LanePeople))
	for round := range reclaimMaxRounds {
		if ctx.Err() != nil { // stopping: what a round took was handed back
			return false, false
		}
		n := r.tryAcquire(r.cfg.FetchBatch)
		if n == 0 {
			return false, false
		}
		// Not cancelled with ctx (granting): the entries it takes are
		// handed back at once when the runner is stopping (claimAndStart),
		// not left for a reclaim idle time.
		rctx, cancel := granting(ctx, r.cfg.LeaseTTL)
		res, err := r.reg.scripts.reclaim.Run(rctx, r.reg.gc, keys, n, r.reclaimIdle.Milliseconds(),
			keyspace.LegacyGroup, drainConsumer, boolFlag(drain && round == 0)).Slice()
		cancel()
		if err != nil {
			r.release(n)
			if ctx.Err() == nil {
				r.log.Warn("reclaim failed", slog.Int("partition", p), slog.Any("error", err))
			}
			return false, true
		}
		es := r.decodeEntries(ctx, p, res)
		r.release(n - len(es))
		if len(es) > 0 {
			r.claimAndStart(ctx, p, es)
		}
		if len(res) < n {
			return false, true
		}
	}
	return true, true
}

// moveRetries moves due retries back into the bulk lanes, asking every
// partition: a Redis Cluster's runners do so every RetryPoll; elsewhere the
// timer asks the partitions the due index names.
func (r *Runner) moveRetries(ctx context.Context) {
	for p := range r.reg.ks.Partitions() {
		if _, ok := r.moveRetriesOf(ctx, p); !ok {
			return
		}
	}
}

// retryMoveBatch bounds the retries one retry_move.lua call moves.
const retryMoveBatch = 100

// moveRetriesOf moves partition p's due retries (retry_move.lua; with the
// due index it also sets the partition's entry there); more when it moved
// a full batch (more may be due), ok false after an error.
func (r *Runner) moveRetriesOf(ctx context.Context, p int) (more, ok bool) {
	keys := append([]string{r.reg.ks.Retry(p)}, r.reg.ks.QueueKeys(p)...)
	n, err := r.reg.scripts.retryMove.Run(ctx, r.reg.gc, keys, retryMoveBatch).Int()
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("retry mover failed", slog.Int("partition", p), slog.Any("error", err))
		}
		return false, false
	}
	return n >= retryMoveBatch, true
}
