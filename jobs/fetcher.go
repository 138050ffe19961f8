package jobs

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/groupcommit"
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
	// the bulk lane's hash tag names the partition's other keys (read_next.lua)
	keys := []string{r.reg.ks.Queue(p, keyspace.LaneBulk)}
	return &scriptCall{script: r.reg.scripts.readNext, keys: keys, args: []any{n, first.Letter(), r.readConf, r.grantFloor()}}
}

// confArgs builds the arguments that carry what is constant about this
// runner (read_next.lua's ARGV[3], finish.lua's ARGV[1] per job), fields
// separated by histSep: owner, reclaim idle (ms), history cap, retention
// (ms); then for a read the number of jobs this runner defines and each
// one's scope, stages, maxAttempts and lease TTL (ms), for a finish its
// job's stages, maxAttempts and lease TTL (ms). One argument instead of
// up to eleven: the library splits each value once (~800 instructions saved
// per argument not sent).
func (r *Runner) confArgs() (read string, finish map[string]string) {
	common := []string{r.owner, strconv.FormatInt(r.reclaimIdle.Milliseconds(), 10), strconv.Itoa(r.reg.histCap),
		strconv.FormatInt(r.reg.retention.Milliseconds(), 10)}
	def := func(scope string) []string {
		return []string{r.reg.stagesCSV[scope], strconv.Itoa(r.reg.jobs[scope].Retry.MaxAttempts),
			strconv.FormatInt(r.leaseTTL(scope).Milliseconds(), 10)}
	}
	// a read claims the entries of a job with limiters only after they
	// admit it: 'L' (read_next.lua)
	limitedFlag := func(scope string) string {
		if r.limitedJob(scope) {
			return "L"
		}
		return ""
	}
	scopes := slices.Sorted(maps.Keys(r.reg.jobs))
	fields := append(slices.Clone(common), strconv.Itoa(len(scopes)))
	finish = make(map[string]string, len(scopes))
	for _, scope := range scopes {
		fields = append(fields, scope)
		fields = append(fields, def(scope)...)
		fields = append(fields, limitedFlag(scope))
		finish[scope] = strings.Join(append(append(slices.Clone(common), def(scope)...), limitedFlag(scope)), histSep)
	}
	return strings.Join(fields, histSep), finish
}

// decodeEntries decodes the entries read_lanes (lua/lib/queues.lua) took. Entries
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
// first), claimed in the same script. When both lanes are empty it waits on
// the partition's bell: with a slot of its own when enough are free
// (waitAndRead: the read that follows the wait is sent with it, so a
// request to an idle runner starts one round trip sooner), else without one
// (a plain wait, then a read), so idle partitions hold at most half of the
// runner's capacity, and only until the wait ends (at most FetchBlock). A
// ring lost to a runner that died before reading costs at most FetchBlock.
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
	waited := false // the last wait carried its read, and it found nothing
	for ctx.Err() == nil {
		if !waited {
			if !r.acquire(ctx) {
				return
			}
			n := 1 + r.tryAcquire(r.cfg.FetchBatch-1)
			next, err := r.read(ctx, p, n)
			if err != nil {
				r.release(n)
				if !onErr(err) {
					return
				}
				continue
			}
			failures = 0
			if len(next) > 0 {
				r.startTaken(ctx, next, n)
				continue
			}
			r.release(n)
		}
		waited = false
		if r.nodeWait != nil { // one wait for every idle partition (nodewait.go)
			if !r.nodeWait.park(ctx, p) {
				return
			}
			continue
		}
		carried := r.holdIdleSlot()
		if h := r.testHooks.idleWait; h != nil {
			h(p, carried)
		}
		if carried {
			next, err := r.waitAndRead(ctx, p, bell, blockSeconds)
			if h := r.testHooks.waitRead; h != nil && err == nil {
				h(p, len(next))
			}
			switch {
			case err != nil:
				r.release(1)
				if !errors.Is(err, errReadNotRun) && !onErr(err) {
					return
				}
			case len(next) > 0:
				failures = 0
				r.startTaken(ctx, next, 1)
				// Let the run someone may be waiting for start before
				// this goroutine's next read takes the processor.
				runtime.Gosched()
			default:
				failures = 0
				r.release(1)
				waited = true
			}
			continue
		}
		// BLPOP through Do: go-redis's BLPop rounds timeouts up to whole
		// seconds, and Redis takes fractions.
		err := r.reg.rdb.Do(ctx, "BLPOP", bell, blockSeconds).Err()
		if err != nil && !errors.Is(err, redis.Nil) && !onErr(err) {
			return
		}
	}
}

// granting returns the context of a call that may grant this runner
// leases (a read, a claim): not cancelled with ctx, bounded by d. A call
// cancelled in flight may still be sent and granted, and its reply would
// be dropped with the leases held until they expired — then the runs
// count a crashed attempt. Instead every granted run is started, and a
// stopping runner hands it back at once (execute).
func granting(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}

// read runs a read_next.lua call taking up to n entries of partition p.
// Not cancelled with ctx (granting).
func (r *Runner) read(ctx context.Context, p, n int) ([]nextEntry, error) {
	rctx, cancel := granting(ctx, r.cfg.LeaseTTL)
	defer cancel()
	sent := time.Now()
	res, err := evalOne(rctx, r.reg.gc, r.readCall(p, n))
	return r.decodeNext(rctx, p, res, sent), err
}

// holdIdleSlot takes a slot for an idle wait's read when at least half of
// the runner's slots stay free with it taken. On a Cluster, where each
// partition waits (waitAndRead), also only when FetchBlock is at most a
// sixth of the shortest lease TTL: a claim made by the read sent with a
// wait counts its lease from when the wait was sent, up to FetchBlock
// before it was granted, so the first renewal still comes at least TTL/6
// after the grant. (The node's one wait measures the time it blocked:
// nodeWaiter.wait.)
func (r *Runner) holdIdleSlot() bool {
	if r.nodeWait == nil && r.cfg.FetchBlock*6 > r.reclaimIdle {
		return false
	}
	free := r.freeSlots()
	return free-1 >= cap(r.slots)/2 && r.tryAcquire(1) == 1
}

// errReadNotRun: the read sent with a wait did not run (its script or the
// library was not loaded); the next plain read loads it.
var errReadNotRun = errors.New("jobs: the read sent with the wait did not run")

// waitAndRead waits on partition p's bell and reads one entry, in one
// pipeline: Redis keeps the read queued behind the blocked BLPOP and runs
// it as soon as the wait ends, in the same turn as the request that rang
// the bell, and both answers come back together — one round trip for the
// wait and the claim instead of two. The caller holds the slot the read
// may fill.
func (r *Runner) waitAndRead(ctx context.Context, p int, bell, blockSeconds string) ([]nextEntry, error) {
	// Not cancelled with ctx (see read); go-redis does not interrupt a
	// blocked read on cancellation anyway, so shutdown waits for the wait.
	rctx, cancel := granting(ctx, r.cfg.FetchBlock+r.cfg.LeaseTTL)
	defer cancel()
	call := r.readCall(p, 1)
	cmd := r.reg.gc.ScriptCmd(rctx, call.script.Hash(), call.keys, call.args...)
	pipe := r.reg.rdb.Pipeline()
	pipe.Do(rctx, "BLPOP", bell, blockSeconds)
	_ = pipe.Process(rctx, cmd)
	sent := time.Now()
	_, _ = pipe.Exec(rctx) // each command's error is in its Cmd
	res, err := cmd.Slice()
	switch {
	case err == nil:
		// A claim's lease counts from sent: the read ran after the wait,
		// so the runner's view of the lease is conservative (holdIdleSlot).
		return r.decodeNext(rctx, p, res, sent), nil
	case groupcommit.IsFunctionMissing(err) || redis.HasErrorPrefix(err, "NOSCRIPT"):
		return nil, errReadNotRun
	default:
		return nil, err
	}
}

// startTaken starts the runs a read claimed for this runner, and takes
// the entries of limited jobs through their limiters. The caller holds n
// slots: one stays with each run started or admitted, the rest are
// released.
func (r *Runner) startTaken(ctx context.Context, next []nextEntry, n int) {
	used := 0
	var limited []entry
	defer func() {
		if len(limited) > 0 {
			r.admitAndStart(ctx, limited)
		}
	}()
	for _, t := range next {
		switch {
		case t.claim == nil: // unreadable: the entry is reclaimed when due
		case t.claim.kind == claimLimited:
			used++
			limited = append(limited, t.e)
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
// the slots of entries not granted are released here. Once ctx (taking
// work) has ended it claims nothing and hands the entries back; a claim
// already sent is not cancelled with ctx (granting): what it was granted
// is started, and handed back by execute.
func (r *Runner) claimAndStart(ctx context.Context, p int, es []entry) {
	if ctx.Err() != nil {
		r.handBackEntries(ctx, es)
		r.release(len(es))
		return
	}
	if len(r.reg.jobLimits) > 0 {
		var limited []entry
		plain := es[:0:0]
		for _, e := range es {
			if r.limitedJob(e.key.Scope()) {
				limited = append(limited, e)
			} else {
				plain = append(plain, e)
			}
		}
		if len(limited) > 0 {
			r.admitAndStart(ctx, limited)
			if es = plain; len(es) == 0 {
				return
			}
		}
	}
	runs := make([]*localRun, len(es))
	for i, e := range es {
		runs[i] = r.newLocalRun(e)
	}
	cctx, cancel := granting(ctx, r.cfg.LeaseTTL)
	defer cancel()
	claims, err := r.claim(cctx, p, es)
	if err != nil {
		r.log.Warn("claim failed; the entries will be reclaimed", slog.Int("partition", p), slog.Any("error", err))
		if ctx.Err() != nil {
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
		if r.reg.singleNode { // the due index, as lua/lib/queues.lua mark_due keeps it
			pipe.ZAddLT(ctx, r.reg.ks.Due(), redis.Z{Score: 0, Member: "t" + r.reg.ks.Tag(e.p)})
		}
	}
	if r.reg.singleNode && len(es) > 0 {
		pipe.Publish(ctx, r.reg.ks.Due(), "t")
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
