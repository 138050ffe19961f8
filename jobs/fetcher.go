package jobs

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/internal/wait"
)

// bulkFirstEvery: one read of a partition in this many takes its bulk lane
// first, so bulk work keeps at least that share of the partition's reads
// however many people's requests arrive: it is never starved. Counted per
// partition: a runner-wide count could keep landing on partitions whose
// bulk lane is empty while another partition's bulk work waits.
const bulkFirstEvery = 8

// readOrder returns the lanes in the order the next read of partition p
// takes them.
func (r *Runner) readOrder(p int) (first, second keyspace.Lane) {
	if r.reads[p].Add(1)%bulkFirstEvery == 0 {
		return keyspace.LaneBulk, keyspace.LanePeople
	}
	return keyspace.LanePeople, keyspace.LaneBulk
}

// readCall builds a read_next.lua call: up to n entries of partition p,
// lane by lane, each claimed for this runner in the same call.
func (r *Runner) readCall(p, n int) *scriptCall {
	first, _ := r.readOrder(p)
	ks := r.reg.ks
	keys := make([]string, 0, 7)
	keys = append(keys, ks.QueueKeys(p)...)
	keys = append(keys, ks.Watch(p), ks.Paused(p), ks.Parked(p))
	args := make([]any, 0, 7+len(r.jobDefs))
	args = append(args, n, first.Letter(), r.reclaimIdle.Milliseconds(), r.owner, r.reg.histCap, ks.Events(p),
		r.reg.retention.Milliseconds())
	args = append(args, r.jobDefs...)
	return &scriptCall{script: r.reg.scripts.readNext, keys: keys, args: args}
}

// jobDefsArgs lists the jobs reg defines as read_next.lua takes them: their
// number, then scope, stages, maxAttempts and lease TTL (ms) of each.
func (r *Runner) jobDefsArgs() []any {
	scopes := slices.Sorted(maps.Keys(r.reg.jobs))
	out := make([]any, 0, 1+4*len(scopes))
	out = append(out, len(scopes))
	for _, scope := range scopes {
		out = append(out, scope, r.reg.stagesCSV[scope], r.reg.jobs[scope].Retry.MaxAttempts, r.leaseTTL(scope).Milliseconds())
	}
	return out
}

// decodeEntries decodes the entries read_lanes (lua/lib.lua) took. Entries
// not written by tasklease are dropped from the taken set so they are not
// reclaimed forever.
func (r *Runner) decodeEntries(ctx context.Context, p int, res []any) []entry {
	var out []entry
	for _, v := range res {
		e, ok := entryFrom(p, replyString(v))
		if !ok {
			r.dropEntry(ctx, e)
			continue
		}
		out = append(out, e)
	}
	return out
}

// decodeNext decodes what a finish took for its slot (finish.lua): entries,
// each followed by the finish's claim of it when the script claimed it.
// sent is when the finish was sent: a claimed lease counts from there.
func (r *Runner) decodeNext(ctx context.Context, p int, res []any, sent time.Time) []nextEntry {
	var out []nextEntry
	for i := 0; i < len(res); i++ {
		e, ok := entryFrom(p, replyString(res[i]))
		var claimed []any
		if i+1 < len(res) {
			claimed, _ = res[i+1].([]any)
		}
		if claimed != nil {
			i++
		}
		if !ok {
			r.dropEntry(ctx, e)
			continue
		}
		n := nextEntry{e: e}
		if claimed != nil {
			c, err := r.decodeClaim(claimed, e, sent)
			if err != nil {
				r.log.Warn("finish: claim of the next entry unreadable; it will be reclaimed", slog.Any("error", err))
				continue
			}
			n.claim = &c
		}
		out = append(out, n)
	}
	return out
}

// dropEntry removes an entry tasklease did not write from the taken set.
func (r *Runner) dropEntry(ctx context.Context, e entry) {
	r.reg.rdb.ZRem(ctx, r.reg.ks.Taken(e.p), e.id)
}

// fetchLoop takes work from partition p's lanes. While slots are free it
// takes, without blocking, as many entries as it has slots (people's lane
// first), claimed in the same script; when both lanes are empty it
// blocks on the partition's bell without holding a slot, so idle
// partitions never hold capacity another partition could use. A ring lost
// to a runner that died before reading costs at most FetchBlock.
func (r *Runner) fetchLoop(ctx context.Context, p int) {
	failures := 0
	onErr := func(err error) bool {
		if ctx.Err() != nil {
			return false
		}
		failures++
		if failures == 1 || failures%50 == 0 {
			r.log.Warn("queue read failed", slog.Int("partition", p), slog.Any("error", err))
		}
		return wait.Sleep(ctx, backoff(redisErrorBackoffBase, 5*time.Second, failures))
	}
	bell := r.reg.ks.Bell(p)
	blockSeconds := strconv.FormatFloat(r.cfg.FetchBlock.Seconds(), 'f', 3, 64)
	for ctx.Err() == nil {
		if !r.acquire(ctx) {
			return
		}
		n := 1 + r.tryAcquire(r.cfg.FetchBatch-1)
		// Not cancelled with ctx: runs this call claims must be started (a
		// stopping runner hands them back after the grace), not left to
		// wait out their lease.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.LeaseTTL)
		sent := time.Now()
		res, err := evalOne(rctx, r.reg.gc, r.readCall(p, n))
		next := r.decodeNext(rctx, p, res, sent)
		cancel()
		if err != nil {
			r.release(n)
			if !onErr(err) {
				return
			}
			continue
		}
		failures = 0
		if len(next) > 0 {
			r.startTaken(next, n)
			continue
		}
		r.release(n)
		// BLPOP through Do: go-redis's BLPop rounds timeouts up to whole
		// seconds, and Redis takes fractions.
		err = r.reg.rdb.Do(ctx, "BLPOP", bell, blockSeconds).Err()
		if err != nil && !errors.Is(err, redis.Nil) && !onErr(err) {
			return
		}
	}
}

// startTaken starts the runs a read claimed for this runner. The caller
// holds n slots: one stays with each run started, the rest are released.
func (r *Runner) startTaken(next []nextEntry, n int) {
	used := 0
	for _, t := range next {
		switch {
		case t.claim == nil: // unreadable: the entry is reclaimed when due
		case t.claim.kind != claimGranted:
			r.notGranted(t.e, *t.claim)
		default:
			used++
			r.start(r.newLocalRun(t.e), *t.claim)
		}
	}
	r.release(n - used)
}

// claimAndStart claims entries of partition p in one script and starts
// each granted run in its own goroutine. The caller holds a slot per entry;
// the slots of entries not granted are released here.
func (r *Runner) claimAndStart(ctx context.Context, p int, es []entry) {
	runs := make([]*localRun, len(es))
	for i, e := range es {
		runs[i] = r.newLocalRun(e)
	}
	claims, err := r.claim(ctx, p, es)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("claim failed; the entries will be reclaimed", slog.Int("partition", p), slog.Any("error", err))
		} else {
			r.handBackEntries(ctx, es)
		}
		for _, lr := range runs {
			lr.end()
		}
		r.release(len(es))
		return
	}
	for i, c := range claims {
		if c.kind != claimGranted {
			r.notGranted(es[i], c)
			runs[i].end()
			r.release(1)
			continue
		}
		r.start(runs[i], c)
	}
}

// handBackEntries makes entries this runner took but never claimed — it
// was stopping — reclaimable by another runner at once instead of after a
// reclaim idle time. Best effort: when Redis is unreachable the entries are
// reclaimed after that time.
func (r *Runner) handBackEntries(ctx context.Context, es []entry) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), handBackTimeout)
	defer cancel()
	pipe := r.reg.rdb.Pipeline()
	for _, e := range es {
		pipe.ZAddXX(ctx, r.reg.ks.Taken(e.p), redis.Z{Score: 0, Member: e.id})
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		r.log.Warn("hand-back of unclaimed entries failed; they are reclaimed after the lease TTL", slog.Any("error", err))
	}
}

// handBackTimeout bounds the hand-back of unclaimed entries on shutdown.
const handBackTimeout = 2 * time.Second

// notGranted logs why an entry was not granted.
func (r *Runner) notGranted(e entry, c claimResult) {
	if c.kind == claimForeign {
		r.log.Debug("run needs a stage or job this runner does not define; left to another runner",
			slog.String("task_key", e.key.String()), slog.String("run_id", e.runID), slog.String("stage", c.missing))
	}
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
