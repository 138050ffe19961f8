package jobs

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/tasklease/tasklease/internal/histories"
	"github.com/tasklease/tasklease/leasing"
)

// Runner defaults: the values a zero RunnerConfig field takes.
const (
	ConcurrencyDefault   = 16               // RunnerConfig.Concurrency
	LeaseTTLDefault      = 15 * time.Second // RunnerConfig.LeaseTTL
	ShutdownGraceDefault = 10 * time.Second // RunnerConfig.ShutdownGrace
	FetchBlockDefault    = time.Second      // RunnerConfig.FetchBlock on a Redis Cluster
	// FetchBlockNodeDefault is RunnerConfig.FetchBlock's default on a
	// single Redis server or Sentinel, where one wait covers every idle
	// partition: an idle runner sends its five commands this often.
	FetchBlockNodeDefault = 10 * time.Second
	FetchBatchDefault     = 16                     // RunnerConfig.FetchBatch
	RetryPollDefault      = 500 * time.Millisecond // RunnerConfig.RetryPoll
	// ExecStartsPerCPU × GOMAXPROCS is the default ExecStarts.
	ExecStartsPerCPU = 2
	// ReclaimIntervalMax caps the default ReclaimInterval,
	// min(LeaseTTL/4, ReclaimIntervalMax).
	ReclaimIntervalMax    = time.Second
	redisErrorBackoffBase = 100 * time.Millisecond
	// PoolIdleTimeout is the ConnMaxIdleTime runner serve gives its pool,
	// with PoolFIFO: taken oldest first, the connections are each used in
	// turn, and one idle this long is closed when it comes up, so a busy
	// pod keeps what it uses and an idle one closes what its start opened
	// (go-redis's default keeps idle connections 30 minutes and, taking
	// the newest first, never looks at the oldest). An idle runner's timer
	// uses one at least every 5 s, so it keeps one or two. Give a client
	// of your own the same two options for the same effect.
	PoolIdleTimeout = 6 * time.Second
)

// RunnerConfig configures a Runner.
type RunnerConfig struct {
	// ID names the runner (e.g. the pod name); the lease owner and consumer
	// name are ID + "/" + a random suffix per process, so a restarted pod is
	// told apart from its previous life. Default: the hostname.
	ID string
	// Concurrency bounds the runs executing at once (default 16). Keep it at
	// least twice the partition count for the lowest pick-up latency: an
	// idle partition's wait on its bell holds a slot for the read sent
	// with it while at least half the slots stay free, and a partition
	// waiting without one needs a round trip more. Size the Redis pool to
	// Concurrency + partitions + a few (blocking reads hold a connection
	// each).
	Concurrency int
	// LeaseTTL of runs whose job sets none (default 15s). The lease is
	// renewed every TTL/3 and given up after 2/3 TTL without a confirmed
	// renewal, so a stage gets TTL/3 to stop before anyone else can run it.
	LeaseTTL time.Duration
	// ShutdownGrace: on shutdown, running stages get this long to finish;
	// the rest are stopped and handed back (default 10s).
	ShutdownGrace time.Duration
	// FetchBlock is how long an idle wait blocks: on a single Redis server
	// or Sentinel the runner's one wait on every idle partition's bell
	// (default FetchBlockNodeDefault, 10s; a stopping runner ends it at
	// once), on a Redis Cluster each partition's wait on its bell (default
	// 1s; shutdown waits for the waits in flight, so keep it short, and a
	// wait there carries its read only when FetchBlock is at most a sixth
	// of the shortest lease TTL). It also bounds how long a ring lost to a
	// runner that died between its wait and its read delays work, and how
	// long idle partitions hold slots.
	FetchBlock time.Duration
	// FetchBatch bounds the entries taken per read (default 16).
	FetchBatch int
	// ReclaimInterval: how often crashed runners' entries are reclaimed
	// (default min(LeaseTTL/4, 1s)); a crashed run is taken over within its
	// lease TTL + ReclaimInterval.
	ReclaimInterval time.Duration
	// RetryPoll: how often due retries are moved back to the bulk lanes
	// (default 500ms).
	RetryPoll time.Duration
	// JanitorInterval: how often this runner prunes expired subjects and
	// index entries (default JanitorIntervalDefault).
	JanitorInterval time.Duration
	// PresenceInterval: how often this runner refreshes its record in the
	// runner registry, GET /v1/runners (default PresenceIntervalDefault);
	// after three missed refreshes it is shown gone.
	PresenceInterval time.Duration
	// Version is shown in the runner registry (default: the main module's
	// version from the build info).
	Version string
	// ExecStarts bounds the exec stage processes being started at once
	// (default ExecStartsPerCPU × GOMAXPROCS). A supervised stage counts
	// until its supervisor reports the command started: about 10 ms of CPU
	// each (a Go runtime and the fork of the command). Without the bound, a
	// runner that takes over a dead peer's hundreds of runs starts as many
	// processes at once, and the CPU they queue for delays its own lease
	// renewals past their deadline; with it, the starts are spread over a
	// few hundred milliseconds while the renewals keep their pace.
	ExecStarts int
	// HistoryLog, when set, receives what this runner saw of its fenced
	// calls on runs: each grant it was told of with its token, each stage
	// advance and finish when sent and when answered (or never), one JSON
	// line each with wall-clock times, for checking histories across
	// processes with porcupine (cmd/chaos, runner serve --history-log;
	// docs/correctness.md#histories). Nil: off, a nil check per call.
	HistoryLog io.Writer
}

func (c *RunnerConfig) normalize() error {
	if c.ID == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			h = "runner"
		}
		c.ID = h
	}
	// The id is part of the lease owner, which lease values ('|'), history
	// events and the scripts' configuration argument (control characters
	// US and RS) carry as a field.
	if strings.ContainsAny(c.ID, " |") || strings.ContainsFunc(c.ID, unicode.IsControl) || len(c.ID) > 100 {
		return fmt.Errorf("%w: runner id %q: no spaces, '|' or control characters, at most 100 bytes", ErrConfig, c.ID)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.Concurrency == 0 {
		c.Concurrency = ConcurrencyDefault
	}
	if c.FetchBatch == 0 {
		c.FetchBatch = FetchBatchDefault
	}
	if c.ExecStarts == 0 {
		c.ExecStarts = ExecStartsPerCPU * runtime.GOMAXPROCS(0)
	}
	def(&c.LeaseTTL, LeaseTTLDefault)
	def(&c.ShutdownGrace, ShutdownGraceDefault)
	def(&c.FetchBlock, FetchBlockDefault)
	def(&c.RetryPoll, RetryPollDefault)
	def(&c.JanitorInterval, JanitorIntervalDefault)
	def(&c.PresenceInterval, PresenceIntervalDefault)
	def(&c.ReclaimInterval, min(c.LeaseTTL/4, ReclaimIntervalMax))
	switch {
	case c.Concurrency < 1 || c.FetchBatch < 1 || c.ExecStarts < 1:
		return fmt.Errorf("%w: concurrency, fetch batch and exec starts must be >= 1", ErrConfig)
	case c.LeaseTTL < 30*time.Millisecond:
		return fmt.Errorf("%w: lease TTL %s below 30ms", ErrConfig, c.LeaseTTL)
	case c.ShutdownGrace < 0 || c.FetchBlock <= 0 || c.RetryPoll <= 0 || c.ReclaimInterval <= 0 || c.JanitorInterval <= 0 || c.PresenceInterval <= 0:
		return fmt.Errorf("%w: durations must be positive", ErrConfig)
	}
	return nil
}

// Runner consumes the partition queues and executes runs: it claims a
// request and its lease in one script, resumes from the checkpoint, runs the
// remaining stages under a context cancelled on lease loss, cancel, timeout
// or shutdown, and finishes in one fenced script. Any number of Runners
// share one Redis.
type Runner struct {
	reg   *Registry
	cfg   RunnerConfig
	owner string
	// reclaimIdle: a taken entry nobody heartbeats for this long is
	// re-examined by claim; the shortest lease TTL of any job, so no
	// expired lease waits for longer.
	reclaimIdle time.Duration
	// reclaimPasses counts reclaimAll's passes (only its loop touches
	// it), which drain the legacy streams every legacyDrainEvery.
	reclaimPasses int
	// sweepDue asks the timer for a sweep of every partition (sweepAll),
	// which goes on from sweepFrom (only the timer touches it).
	sweepDue  atomic.Bool
	sweepFrom int
	// readConf and finishConf (by scope) are what is constant about this
	// runner in every read_next.lua and finish.lua call, as the one
	// argument those take for it (lua/lib/base.lua conf_fields), built once.
	readConf   string
	finishConf map[string]string
	claimConf  string           // limiter_acquire.lua's ARGV[5]: a claim's history cap and retention
	tokensSeen atomic.Int64     // the highest fencing token this runner has seen (tokenfloor.go)
	wallClock  func() time.Time // grantFloor's clock: time.Now (a test sets a lagging one)
	log        *slog.Logger
	slots      chan struct{}
	execStarts chan struct{} // RunnerConfig.ExecStarts: a token per exec stage being started
	presence   *presence     // this runner's record in the runner registry
	nodeWait   *nodeWaiter   // the idle partitions' one wait (nil on Redis Cluster: a wait per partition)

	workCtx    context.Context // runs; cancelled with ErrShutdown after the grace
	workCancel context.CancelCauseFunc
	fetchCtx   context.Context // taking work: Run's context

	reads []atomic.Uint64 // reads so far per partition (readOrder: one in bulkFirstEvery takes bulk first)

	// testHooks are set by this package's tests before Run; nil in
	// production.
	// historySent: an advance or finish is about to be sent
	// (RunnerConfig.HistoryLog); nil when off.
	historySent func(op histories.Op, call time.Time)

	testHooks struct {
		cancelHandled func(payload string) // after a cancel message was handled
		// idleWait: partition p's fetcher is about to wait on its bell,
		// holding a slot for the read sent with the wait (carried) or not.
		idleWait func(p int, carried bool)
		// waitRead: the read sent with a wait on partition p took n entries.
		waitRead func(p, n int)
		// history: a grant, advance or finish this runner made, as the
		// client saw it (histories_test.go checks them with porcupine;
		// RunnerConfig.HistoryLog sets it too).
		history func(op histories.Op, out histories.Outcome, call, ret time.Time)
		// timerSleeps: the timer read the due index and sleeps d.
		timerSleeps func(d time.Duration)
	}

	// pumps: a wake-up channel per limiter this runner's jobs use (pumpLoop)
	pumps map[*limiterDef]chan struct{}

	mu        sync.Mutex
	active    map[string]map[*context.CancelCauseFunc]struct{} // cancelID (key + run) → cancels of local claims/runs
	unmatched unmatchedCancels                                 // cancel messages that found no local run, for track
	wg        sync.WaitGroup
}

// NewRunner validates cfg and returns a Runner for reg's jobs.
func NewRunner(reg *Registry, cfg RunnerConfig) (*Runner, error) {
	if reg == nil {
		return nil, fmt.Errorf("%w: nil registry", ErrConfig)
	}
	if cfg.FetchBlock == 0 && reg.singleNode {
		cfg.FetchBlock = FetchBlockNodeDefault
	}
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	reclaimIdle, longestTTL := cfg.LeaseTTL, cfg.LeaseTTL
	for _, j := range reg.jobs {
		ttl := cmp0(j.LeaseTTL, cfg.LeaseTTL)
		reclaimIdle, longestTTL = min(reclaimIdle, ttl), max(longestTTL, ttl)
		if err := (leasing.KeeperConfig{TTL: ttl}).Validate(); err != nil {
			return nil, fmt.Errorf("job %s: %w", j.Scope, err)
		}
	}
	owner := cfg.ID + "/" + newRunID()[:6]
	r := &Runner{
		reg: reg, cfg: cfg, owner: owner, reclaimIdle: reclaimIdle,
		reads:      make([]atomic.Uint64, reg.ks.Partitions()),
		log:        reg.log.With(slog.String("owner", owner)),
		slots:      make(chan struct{}, cfg.Concurrency),
		execStarts: make(chan struct{}, cfg.ExecStarts),
		presence:   newPresence(cfg.PresenceInterval, cfg.Version),
		wallClock:  time.Now,
		active:     make(map[string]map[*context.CancelCauseFunc]struct{}),
		pumps:      newPumps(reg),
		// A claim's reply comes back within its call's bound (a lease TTL,
		// plus FetchBlock for a read sent with a wait), and the run is
		// registered right after.
		unmatched: newUnmatchedCancels(longestTTL + cfg.FetchBlock),
	}
	r.readConf, r.finishConf = r.confArgs()
	if cfg.HistoryLog != nil {
		l := histories.NewLog(cfg.HistoryLog)
		r.testHooks.history, r.historySent = l.Returned, l.Sent
	}
	if reg.singleNode {
		r.nodeWait = newNodeWaiter(r)
	}
	r.claimConf = strconv.Itoa(reg.histCap) + histSep + strconv.FormatInt(reg.retention.Milliseconds(), 10)
	return r, nil
}

func cmp0(v, def time.Duration) time.Duration {
	if v == 0 {
		return def
	}
	return v
}

// ID returns the configured runner id (hostname by default).
func (r *Runner) ID() string { return r.cfg.ID }

// Owner returns the lease owner / consumer name of this runner.
func (r *Runner) Owner() string { return r.owner }

// Run consumes and executes until ctx ends, then shuts down gracefully:
// it stops taking requests, lets running stages finish within
// ShutdownGrace, then stops the rest and hands their runs back (lease
// released, checkpoint kept, request re-queued) so another runner resumes
// at once. It returns after every run has returned.
func (r *Runner) Run(ctx context.Context) error {
	// Subscribe before taking work: a cancel published in between would
	// otherwise only be seen at the next heartbeat.
	cancels, err := r.subscribeCancels(ctx)
	if err != nil {
		if ctx.Err() != nil {
			// Stopped before it started: a shutdown, as when it ends later.
			return nil
		}
		return err
	}
	// The library is loaded before the loops start, not by whichever of
	// them calls first: beside a load in flight the others go out as
	// EVALSHA and load their scripts, each on a connection the pool then
	// keeps until its idle timeout. (A failed load is retried by the calls.)
	_ = r.reg.gc.LoadFunctions(ctx)
	r.fetchCtx = ctx
	r.workCtx, r.workCancel = context.WithCancelCause(context.WithoutCancel(ctx))
	defer r.workCancel(nil)

	var loops sync.WaitGroup
	for p := range r.reg.ks.Partitions() {
		loops.Go(func() { r.fetchLoop(ctx, p) })
	}
	if r.nodeWait != nil {
		loops.Go(func() { r.nodeWait.run(ctx) })
	}
	if r.reg.singleNode {
		loops.Go(func() { r.timerLoop(ctx) })
	} else {
		loops.Go(func() { r.every(ctx, r.cfg.ReclaimInterval, r.reclaimAll) })
		loops.Go(func() { r.every(ctx, r.cfg.RetryPoll, r.moveRetries) })
	}
	loops.Go(func() { r.every(ctx, r.cfg.JanitorInterval, r.janitorPass) })
	loops.Go(func() { r.cancelListener(ctx, cancels) })
	loops.Go(func() { r.presenceLoop(ctx) })
	r.startPumps(ctx, &loops)
	r.log.Info("runner started", slog.Int("concurrency", r.cfg.Concurrency), slog.Int("partitions", r.reg.ks.Partitions()))
	<-ctx.Done()
	loops.Wait()

	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(r.cfg.ShutdownGrace):
		r.log.Info("shutdown grace over; handing back running runs")
		r.workCancel(ErrShutdown)
		<-done
	}
	r.leave()
	r.log.Info("runner stopped")
	return nil
}

// taking reports whether the runner takes new work (Run is running and its
// context has not ended).
func (r *Runner) taking() bool { return r.fetchCtx != nil && r.fetchCtx.Err() == nil }
