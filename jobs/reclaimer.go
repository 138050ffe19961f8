package jobs

import (
	"context"
	"errors"
	"log/slog"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
)

// reclaimAll takes over, in every partition, the entries whose time in the
// taken set is up: their holders stopped heartbeating (or a claim left
// them for later: busy, foreign, handed back). claim re-checks each against
// its lease. Entries come oldest-due first and are rescored as they are
// taken, so the entries of a dead runner are reached however many others
// are due, and entries nobody here can execute go behind them.
func (r *Runner) reclaimAll(ctx context.Context) {
	drain := r.reclaimPasses%legacyDrainEvery == 0
	r.reclaimPasses++
	for p := range r.reg.ks.Partitions() {
		if !r.reclaimPartition(ctx, p, drain) {
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
// false when it ran out of slots.
func (r *Runner) reclaimPartition(ctx context.Context, p int, drain bool) bool {
	ks := r.reg.ks
	keys := append(append(make([]string, 0, 6), ks.QueueKeys(p)...),
		ks.LegacyStream(p, keyspace.LaneBulk), ks.LegacyStream(p, keyspace.LanePeople))
	for round := range reclaimMaxRounds {
		if ctx.Err() != nil { // stopping: what a round took was handed back
			return false
		}
		n := r.tryAcquire(r.cfg.FetchBatch)
		if n == 0 {
			return false
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
			return true
		}
		es := r.decodeEntries(ctx, p, res)
		r.release(n - len(es))
		if len(es) > 0 {
			r.claimAndStart(ctx, p, es)
		}
		if len(res) < n {
			return true
		}
	}
	return true
}

// retrySweepEvery: every how many retry passes (the first included) a
// runner on a single Redis server moves the retries of every partition
// instead of only those its retry index names: the sweep also sets the
// index right for retries an older version scheduled without it.
const retrySweepEvery = 120

// moveRetries moves due retries back into the bulk lanes. On a Cluster it
// asks every partition. On a single Redis server one read of the retry
// index (keyspace.Space.RetryDue) names the partitions whose earliest retry
// is due, and only those are asked (every retrySweepEvery passes, all of
// them), so an idle runner sends one command a pass, not three a partition.
func (r *Runner) moveRetries(ctx context.Context) {
	index := r.retryIndex()
	sweep := index == "" || r.retryPasses%retrySweepEvery == 0
	r.retryPasses++
	if sweep {
		for p := range r.reg.ks.Partitions() {
			if !r.moveRetriesOf(ctx, p, index) {
				return
			}
		}
		return
	}
	// The index is scored in Redis time: read with it, in one round trip
	// (the index holds a member per partition with retries at most).
	pipe := r.reg.rdb.Pipeline()
	now := pipe.Time(ctx)
	firsts := pipe.ZRangeWithScores(ctx, index, 0, -1)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		if ctx.Err() == nil {
			r.log.Warn("retry mover failed", slog.Any("error", err))
		}
		return
	}
	nowMS := float64(now.Val().UnixMilli())
	for _, z := range firsts.Val() {
		if z.Score > nowMS {
			break // by score: the rest are later
		}
		tag, _ := z.Member.(string)
		p, ok := r.reg.ks.PartitionOfTag(tag)
		if !ok { // not a partition of this keyspace: nothing will clear it
			r.reg.rdb.ZRem(ctx, index, tag)
			continue
		}
		if !r.moveRetriesOf(ctx, p, index) {
			return
		}
	}
}

// moveRetriesOf moves partition p's due retries (retry_move.lua), keeping
// the retry index when there is one; false after an error.
func (r *Runner) moveRetriesOf(ctx context.Context, p int, index string) bool {
	keys := append([]string{r.reg.ks.Retry(p)}, r.reg.ks.QueueKeys(p)...)
	err := r.reg.scripts.retryMove.Run(ctx, r.reg.gc, keys, 100, index, r.reg.ks.Tag(p)).Err()
	if err != nil && ctx.Err() == nil {
		r.log.Warn("retry mover failed", slog.Int("partition", p), slog.Any("error", err))
		return false
	}
	return err == nil
}
