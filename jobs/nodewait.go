package jobs

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/tasklease/tasklease/internal/groupcommit"
	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/internal/wait"
)

// nodeWaiter is a runner's one wait for work on a single Redis server (or a
// Sentinel's primary): where every partition's fetcher used to block on its
// own bell with a connection of its own — P blocking connections and
// about 6 commands a second per partition on an idle runner — the
// fetchers of idle partitions park here, and one BLPOP waits on all their
// bells. The bell that rings wakes its partition's fetcher, which reads as
// it does while busy. When a slot is free for it, the read is sent with
// the wait (read_idle.lua, in the same pipeline), so a request to an idle
// runner is claimed in the turn of the submit that rang, as the
// per-partition wait's carried read did.
//
// A partition that parks while a wait is in flight is not in that wait: a
// token pushed to the runner's nudge list, which every wait also watches,
// ends it, and the next wait covers the partition. Its bell keeps any ring
// in between (a bell holds its token until popped), so none is lost.
//
// Redis Cluster refuses one command over keys of several slots, so there
// each partition keeps its own wait (fetchLoop).
type nodeWaiter struct {
	r        *Runner
	rdb      *redis.Client // the wait's own connection (waitClient)
	nudgeKey string
	wake     []chan struct{} // per partition, 1 buffered: its fetcher is woken

	mu       sync.Mutex
	parked   map[int]bool // partitions whose fetcher waits for a wake-up
	inFlight []int        // partitions the wait in flight covers (nil: none)
	nudged   bool         // a nudge token was pushed and not yet popped
	// floorSent is the token floor the read of the wait in flight carries
	// (tokenfloor.go): a floor raised since — by a presence beat: another
	// runner's token, or what Redis forgot — ends the wait (raisedFloor).
	floorSent int64
	kick      chan struct{}
	turn      int // rotates the order of the carried read's lanes
}

// nudgeTTL bounds how long a nudge token outlives a runner that died.
const nudgeTTL = time.Minute

func newNodeWaiter(r *Runner) *nodeWaiter {
	w := &nodeWaiter{r: r, nudgeKey: r.reg.ks.Nudge(r.owner), parked: map[int]bool{}, kick: make(chan struct{}, 1),
		wake: make([]chan struct{}, r.reg.ks.Partitions())}
	if r.reg.clientOpts != nil {
		w.rdb = waitClient(r.reg.clientOpts, r.cfg.FetchBlock)
	}
	for p := range w.wake {
		w.wake[p] = make(chan struct{}, 1)
	}
	return w
}

// park makes partition p's fetcher wait until its bell rings (or the wait
// it is in times out); false when ctx ended first.
func (w *nodeWaiter) park(ctx context.Context, p int) bool {
	w.mu.Lock()
	w.parked[p] = true
	nudge := w.inFlight != nil && !slices.Contains(w.inFlight, p) && !w.nudged
	if nudge {
		w.nudged = true
	}
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
	if nudge {
		w.nudge(ctx)
	}
	select {
	case <-w.wake[p]:
		return true
	case <-ctx.Done():
		return false
	}
}

// raisedFloor ends the wait in flight when its read carries a token floor
// below floor, so the read sent next carries floor: a read sent with a wait
// runs when the wait ends, up to FetchBlock later. Asked by each presence
// beat: an idle fleet's floor does not move, so it costs an idle runner
// nothing.
func (w *nodeWaiter) raisedFloor(ctx context.Context, floor int64) {
	w.mu.Lock()
	nudge := w.inFlight != nil && w.floorSent < floor && !w.nudged
	if nudge {
		w.nudged = true
	}
	w.mu.Unlock()
	if nudge {
		w.nudge(ctx)
	}
}

// nudge ends the wait in flight early (best effort: a wait not ended
// times out after FetchBlock).
func (w *nodeWaiter) nudge(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), handBackTimeout)
	defer cancel()
	pipe := w.r.reg.rdb.Pipeline()
	pipe.RPush(ctx, w.nudgeKey, "1")
	pipe.PExpire(ctx, w.nudgeKey, nudgeTTL)
	if _, err := pipe.Exec(ctx); err != nil && ctx.Err() == nil {
		w.r.log.Debug("idle wait: nudge failed; the wait ends at its timeout", slog.Any("error", err))
	}
}

// next returns the partitions the next wait covers, in the order the
// carried read looks at them (rotated each wait, so no partition's lanes
// are always looked at first), and marks them in flight; nil when none is
// parked.
func (w *nodeWaiter) next() []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.parked) == 0 {
		return nil
	}
	ps := make([]int, 0, len(w.parked))
	for p := range w.parked {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	w.turn++
	k := w.turn % len(ps)
	ps = append(ps[k:], ps[:k]...)
	w.inFlight = ps
	return ps
}

// ended records that the wait over ps ended with ring (a bell key, the
// nudge key, or "" on a timeout): the rung partition's fetcher is woken,
// and every covered one when the wait failed (each reads once, as after
// a per-partition wait's error). A timeout wakes none: its carried read
// looked at every covered lane, so a ring lost to a runner that died
// between its wait and its read costs at most FetchBlock.
func (w *nodeWaiter) ended(ps []int, ring string, all bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.inFlight = nil
	if ring == w.nudgeKey {
		w.nudged = false
	}
	for _, p := range ps {
		if w.parked[p] && (all || w.r.reg.ks.Bell(p) == ring) {
			delete(w.parked, p)
			w.wake[p] <- struct{}{}
		}
	}
}

// afterRead returns the bell whose partition's fetcher is woken after a
// wait that rang and the read sent with it, which claimed next from
// partition p: none when the read found every covered lane empty (the
// rung one too, so the ring was served elsewhere); the rung partition's
// fetcher when this runner has a slot free for it; else none, and the
// bell rings again for another runner when its lane still holds the entry
// that rang it (the read took another partition's, and a bell rings only
// when its lane fills, so the token this wait popped was the one for it).
// A fetcher woken on a full runner waited for one of its runs to end, and
// then parked again and nudged the wait: three commands and a wait for
// nothing, and the entry waited for that run.
func (w *nodeWaiter) afterRead(ctx context.Context, ring string, next []nextEntry, p int) string {
	switch {
	case ring == "" || ring == w.nudgeKey:
		return ring
	case len(next) == 0:
		return ""
	case w.r.freeSlots() > 0:
		return ring
	}
	if ring != w.r.reg.ks.Bell(p) { // read_idle rang p's bell itself when it left more
		w.ringAgain(ctx, ring)
	}
	return ""
}

// ringAgain pushes a token to bell, for another runner's wait.
func (w *nodeWaiter) ringAgain(ctx context.Context, bell string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), handBackTimeout)
	defer cancel()
	if err := w.r.reg.rdb.RPush(ctx, bell, "1").Err(); err != nil {
		// the entry is read by the next wait's read of any runner, at the
		// latest when its wait times out (FetchBlock)
		w.r.log.Debug("idle wait: ring again failed", slog.Any("error", err))
	}
}

// waitClient is a client of the server of opts (the registry's client's) for the idle wait alone: a
// pipeline's replies are read within the client's ReadTimeout, which a
// wait blocking FetchBlock (10 s by default) would outlast, so the wait
// gets a connection whose timeout is FetchBlock longer. One connection:
// what the wait held of the pool before, so a pod's connections do not
// grow with it.
func waitClient(opts *redis.Options, block time.Duration) *redis.Client {
	o := *opts
	switch {
	case o.ReadTimeout > 0:
		o.ReadTimeout += block
	case o.ReadTimeout == 0: // go-redis's default
		o.ReadTimeout = 3*time.Second + block
	} // -1: no timeout at all
	o.PoolSize, o.MinIdleConns, o.MaxIdleConns = 1, 0, 1
	o.ConnMaxIdleTime = -1 // its connection is busy blocking, not idle
	// A config of its own: go-redis writes the shared one's Mode (under a
	// lock of the client's) when a server refuses maintenance
	// notifications, and NewClient reads it to clone it: a data race
	// (seen under -race in CI). A blocking wait needs no notifications.
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	return redis.NewClient(&o)
}

// run waits for work on the parked partitions until ctx ends, and only
// while the runner has a slot free: a full runner that waited would take
// rings it cannot serve — Redis wakes the client that has blocked longest,
// which is the busy runner — and the request would wait for one of its runs
// to end while idle runners of the fleet slept (100 pods of concurrency 1
// then reached 0.4× one pod of concurrency 100). A bell keeps its token
// until popped, so what rings while the runner is full is there when a slot
// frees (or is taken by another runner's wait first).
func (w *nodeWaiter) run(ctx context.Context) {
	if w.rdb != nil {
		defer w.rdb.Close()
	}
	stop := context.AfterFunc(ctx, func() { w.nudge(ctx) }) // a stopping runner does not wait out the block
	defer stop()
	blockSeconds := strconv.FormatFloat(w.r.cfg.FetchBlock.Seconds(), 'f', 3, 64)
	// Without Functions the read goes as EVALSHA, which does not load a
	// script: load it now rather than lose the first wait's read to NOSCRIPT
	// (a failed load is done again on the first NOSCRIPT). Asked after the
	// library's load, not beside another goroutine's: a script loaded for
	// nothing also left the pool a connection open until its idle timeout.
	if !w.r.reg.gc.FunctionsLoaded(ctx) {
		_ = w.r.reg.gc.LoadFunctions(ctx)
	}
	if !w.r.reg.gc.FunctionsLoaded(ctx) {
		_ = w.r.reg.scripts.readIdle.Load(ctx, w.r.reg.rdb).Err()
	}
	failures := 0
	for ctx.Err() == nil {
		if !w.r.awaitFreeSlot(ctx) {
			return
		}
		ps := w.next()
		if ps == nil {
			select {
			case <-w.kick:
				continue
			case <-ctx.Done():
				return
			}
		}
		carried := w.r.holdIdleSlot()
		if h := w.r.testHooks.idleWait; h != nil {
			for _, p := range ps {
				h(p, carried)
			}
		}
		ring, next, p, err := w.wait(ctx, ps, blockSeconds, carried)
		if h := w.r.testHooks.waitRead; h != nil && carried && err == nil {
			h(p, len(next))
		}
		if carried && err == nil {
			ring = w.afterRead(ctx, ring, next, p)
		}
		w.ended(ps, ring, err != nil)
		switch {
		case !carried:
		case len(next) > 0:
			w.r.startTaken(ctx, next, 1)
		default:
			w.r.release(1)
		}
		if err == nil || errors.Is(err, errReadNotRun) {
			failures = 0
			continue
		}
		if ctx.Err() != nil {
			return
		}
		failures++
		if failures == 1 || failures%50 == 0 {
			w.r.log.Warn("idle wait failed", slog.Any("error", err))
		}
		if !wait.Sleep(ctx, backoff(redisErrorBackoffBase, 5*time.Second, failures)) {
			return
		}
	}
}

// wait blocks on the bells of partitions ps and the nudge list for at most
// FetchBlock. With carried, read_idle.lua goes in the same pipeline and
// takes one entry of ps, claimed: its partition p and the claim come back
// with the ring. The claim's lease counts from when the wait was sent plus
// the time it blocked, by Redis's clock: a TIME before the BLPOP and one
// after it, in the same pipeline, so the runner counts the lease from no
// later than Redis granted it, however long the wait blocked.
func (w *nodeWaiter) wait(ctx context.Context, ps []int, blockSeconds string, carried bool) (ring string, next []nextEntry, p int, err error) {
	// Not cancelled with ctx (granting): a claim that was sent is started,
	// and handed back by execute when the runner is stopping.
	rctx, cancel := granting(ctx, w.r.cfg.FetchBlock+w.r.cfg.LeaseTTL)
	defer cancel()
	ks := w.r.reg.ks
	args := make([]any, 0, len(ps)+3)
	args = append(args, "BLPOP")
	for _, p := range ps {
		args = append(args, ks.Bell(p))
	}
	args = append(args, w.nudgeKey, blockSeconds)
	pipe := w.rdb.Pipeline()
	if !carried { // nothing a floor could be stale in
		w.mu.Lock()
		w.floorSent = math.MaxInt64
		w.mu.Unlock()
	}
	var before, after *redis.TimeCmd
	if carried {
		before = pipe.Time(rctx)
	}
	blpop := pipe.Do(rctx, args...)
	var cmd *redis.Cmd
	if carried {
		after = pipe.Time(rctx)
		lanes := make([]string, len(ps))
		for i, p := range ps {
			lanes[i] = ks.Queue(p, keyspace.LaneBulk)
		}
		floor := w.r.grantFloor()
		w.mu.Lock()
		w.floorSent = floor
		w.mu.Unlock()
		cmd = w.r.reg.gc.ScriptCmd(rctx, w.r.reg.scripts.readIdle.Hash(), lanes, w.r.readConf, floor)
		_ = pipe.Process(rctx, cmd)
	}
	sent := time.Now()
	_, _ = pipe.Exec(rctx) // each command's error is in its Cmd
	if r, berr := blpop.StringSlice(); berr == nil && len(r) == 2 {
		ring = r[0]
	} else if berr != nil && !errors.Is(berr, redis.Nil) {
		return "", nil, 0, berr
	}
	if cmd == nil {
		return ring, nil, 0, nil
	}
	res, err := cmd.Slice()
	switch {
	case err == nil:
	case groupcommit.IsFunctionMissing(err):
		// The covered fetchers' reads load the library again.
		return "", nil, 0, errReadNotRun
	case redis.HasErrorPrefix(err, "NOSCRIPT"):
		if lerr := w.r.reg.scripts.readIdle.Load(rctx, w.r.reg.rdb).Err(); lerr != nil {
			return "", nil, 0, lerr
		}
		return "", nil, 0, errReadNotRun
	default:
		return ring, nil, 0, err
	}
	if len(res) < 3 {
		return ring, nil, 0, nil
	}
	i, ok := res[0].(int64)
	if !ok || i < 1 || int(i) > len(ps) {
		return ring, nil, 0, errors.New("jobs: read_idle answered an unknown partition")
	}
	p = ps[i-1]
	if more, _ := res[1].(int64); more == 0 && ring == ks.Bell(p) {
		// The ring was this request's and the read took it: nothing is
		// left for the partition's fetcher, which stays parked.
		ring = ""
	}
	return ring, w.r.decodeNext(rctx, p, res[2:], leaseStart(sent, before, after)), p, nil
}

// leaseStart is when a claim made by the read that followed a blocking
// wait counts its lease from, on this runner's clock: the wait was sent at
// sent, and Redis's clock moved from before to after while the wait
// blocked. Redis served before no sooner than sent, so the grant, after
// after, came no sooner than sent + (after - before): a lease counted from
// there ends no later than Redis's. Without both times (an error) it is
// sent, which is no later still.
func leaseStart(sent time.Time, before, after *redis.TimeCmd) time.Time {
	if before == nil || after == nil || before.Err() != nil || after.Err() != nil {
		return sent
	}
	blocked := after.Val().Sub(before.Val())
	if blocked <= 0 {
		return sent
	}
	// Never later than now (the reply is here): a Redis clock stepped
	// forward while the wait blocked would otherwise date the grant after
	// its reply.
	start := sent.Add(blocked)
	if now := time.Now(); now.Before(start) {
		return now
	}
	return start
}
