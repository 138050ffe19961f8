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

// readCall builds a read_next.lua call: up to n new entries of partition p,
// lane by lane.
func (r *Runner) readCall(p, n int) *scriptCall {
	first, second := r.readOrder(p)
	ks := r.reg.ks
	return &scriptCall{script: r.reg.scripts.readNext,
		keys: []string{ks.Stream(p, first), ks.Stream(p, second)},
		args: []any{keyspace.Group, r.owner, n, first.Letter(), second.Letter()}}
}

// decodeEntries decodes entries as read_lanes (lua/lib.lua) lists them:
// lane letter, id, field list. Entries not written by tasklease are
// acknowledged and deleted so they are not reclaimed forever.
func (r *Runner) decodeEntries(ctx context.Context, p int, res []any) []entry {
	var out []entry
	for i := 0; i+2 < len(res); i += 3 {
		lane := keyspace.LaneBulk
		if replyString(res[i]) == keyspace.LanePeople.Letter() {
			lane = keyspace.LanePeople
		}
		flat, _ := res[i+2].([]any)
		vals := make(map[string]any, len(flat)/2)
		for j := 0; j+1 < len(flat); j += 2 {
			vals[replyString(flat[j])] = replyString(flat[j+1])
		}
		e, ok := entryFrom(p, lane, replyString(res[i+1]), vals)
		if !ok {
			r.dropEntry(ctx, e)
			continue
		}
		out = append(out, e)
	}
	return out
}

// dropEntry acknowledges and deletes an entry tasklease did not write.
func (r *Runner) dropEntry(ctx context.Context, e entry) {
	stream := r.reg.ks.Stream(e.p, e.lane)
	r.reg.rdb.XAck(ctx, stream, keyspace.Group, e.id)
	r.reg.rdb.XDel(ctx, stream, e.id)
}

// fetchLoop reads partition p's streams. While slots are free it reads,
// without blocking, as many entries as it has slots (people's lane first)
// and claims them in one script; when both lanes are empty it blocks for an
// entry without holding a slot, so idle partitions never hold capacity
// another partition could use.
func (r *Runner) fetchLoop(ctx context.Context, p int) {
	ks := r.reg.ks
	failures := 0
	onErr := func(err error) bool {
		if ctx.Err() != nil {
			return false
		}
		failures++
		if strings.Contains(err.Error(), "NOGROUP") {
			_ = r.ensureGroup(ctx, p) // the stream was deleted (e.g. Redis restarted empty)
		}
		if failures == 1 || failures%50 == 0 {
			r.log.Warn("stream read failed", slog.Int("partition", p), slog.Any("error", err))
		}
		return wait.Sleep(ctx, backoff(redisErrorBackoffBase, 5*time.Second, failures))
	}
	for ctx.Err() == nil {
		if !r.acquire(ctx) {
			return
		}
		n := 1 + r.tryAcquire(r.cfg.FetchBatch-1)
		res, err := evalOne(ctx, r.reg.gc, r.readCall(p, n))
		es := r.decodeEntries(ctx, p, res)
		r.release(n - len(es))
		if err != nil {
			if !onErr(err) {
				return
			}
			continue
		}
		failures = 0
		if len(es) > 0 {
			r.claimAndStart(ctx, p, es)
			continue
		}
		streams, err := r.reg.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: keyspace.Group, Consumer: r.owner,
			Streams: []string{ks.PeopleRequests(p), ks.Requests(p), ">", ">"},
			Count:   1, Block: r.cfg.FetchBlock,
		}).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			if !onErr(err) {
				return
			}
			continue
		}
		es = es[:0]
		for _, s := range streams {
			lane := keyspace.LaneBulk
			if s.Stream == ks.PeopleRequests(p) {
				lane = keyspace.LanePeople
			}
			for _, m := range s.Messages {
				if e, ok := entryFrom(p, lane, m.ID, m.Values); ok {
					es = append(es, e)
				} else {
					r.dropEntry(ctx, e)
				}
			}
		}
		// Wait for a slot per entry (people's lane came first); on shutdown
		// the entries are handed back for another runner to reclaim.
		for i := range es {
			if !r.acquire(ctx) {
				r.release(i)
				r.handBackEntries(ctx, es)
				return
			}
		}
		if len(es) > 0 {
			r.claimAndStart(ctx, p, es)
		}
	}
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

// handBackEntries makes entries this runner read but never claimed — it
// was stopping — reclaimable by another runner at once (XCLAIM … IDLE the
// reclaim idle time) instead of after a whole idle period. Best effort:
// when Redis is unreachable the entries are reclaimed after that period.
func (r *Runner) handBackEntries(ctx context.Context, es []entry) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), handBackTimeout)
	defer cancel()
	for _, l := range keyspace.Lanes() {
		args := []any{"XCLAIM", "", keyspace.Group, r.owner, 0}
		for _, e := range es {
			if e.lane == l {
				args[1] = r.reg.ks.Stream(e.p, l)
				args = append(args, e.id)
			}
		}
		if len(args) == 5 {
			continue
		}
		args = append(args, "IDLE", r.reclaimIdle.Milliseconds(), "JUSTID")
		if err := r.reg.rdb.Do(ctx, args...).Err(); err != nil && !errors.Is(err, redis.Nil) {
			r.log.Warn("hand-back of unclaimed entries failed; they are reclaimed after the lease TTL", slog.Any("error", err))
		}
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
