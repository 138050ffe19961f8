package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/checkpoints"
	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/leasing"
	"github.com/tasklease/tasklease/taskkey"
)

// Runner defaults.
const (
	ConcurrencyDefault    = 16
	LeaseTTLDefault       = 15 * time.Second
	ShutdownGraceDefault  = 10 * time.Second
	FetchBlockDefault     = time.Second
	FetchBatchDefault     = 16
	RetryPollDefault      = 500 * time.Millisecond
	ReclaimIntervalMax    = time.Second
	redisErrorBackoffBase = 100 * time.Millisecond
)

// RunnerConfig configures a Runner.
type RunnerConfig struct {
	// ID names the runner (e.g. the pod name); the lease owner and consumer
	// name are ID + "/" + a random suffix per process, so a restarted pod is
	// told apart from its previous life. Default: the hostname.
	ID string
	// Concurrency bounds the runs executing at once (default 16). Keep it at
	// least the partition count for the lowest pick-up latency, and size the
	// Redis pool to Concurrency + partitions + a few (blocking reads hold a
	// connection each).
	Concurrency int
	// LeaseTTL of runs whose job sets none (default 15s). The lease is
	// renewed every TTL/3 and given up after 2/3 TTL without a confirmed
	// renewal, so a stage gets TTL/3 to stop before anyone else can run it.
	LeaseTTL time.Duration
	// ShutdownGrace: on shutdown, running stages get this long to finish;
	// the rest are stopped and handed back (default 10s).
	ShutdownGrace time.Duration
	// FetchBlock is how long one blocking stream read waits (default 1s);
	// shutdown waits for the reads in flight, so keep it short.
	FetchBlock time.Duration
	// FetchBatch bounds the entries read per stream read (default 16).
	FetchBatch int
	// ReclaimInterval: how often crashed runners' entries are reclaimed
	// (default min(LeaseTTL/4, 1s)); a crashed run is taken over within its
	// lease TTL + ReclaimInterval.
	ReclaimInterval time.Duration
	// RetryPoll: how often due retries are moved back to the streams
	// (default 500ms).
	RetryPoll time.Duration
}

func (c *RunnerConfig) normalize() error {
	if c.ID == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			h = "runner"
		}
		c.ID = h
	}
	if strings.ContainsAny(c.ID, " |") || len(c.ID) > 100 {
		return fmt.Errorf("%w: runner id %q: no spaces or '|', at most 100 bytes", ErrConfig, c.ID)
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
	def(&c.LeaseTTL, LeaseTTLDefault)
	def(&c.ShutdownGrace, ShutdownGraceDefault)
	def(&c.FetchBlock, FetchBlockDefault)
	def(&c.RetryPoll, RetryPollDefault)
	def(&c.ReclaimInterval, min(c.LeaseTTL/4, ReclaimIntervalMax))
	switch {
	case c.Concurrency < 1 || c.FetchBatch < 1:
		return fmt.Errorf("%w: concurrency and fetch batch must be >= 1", ErrConfig)
	case c.LeaseTTL < 30*time.Millisecond:
		return fmt.Errorf("%w: lease TTL %s below 30ms", ErrConfig, c.LeaseTTL)
	case c.ShutdownGrace < 0 || c.FetchBlock <= 0 || c.RetryPoll <= 0 || c.ReclaimInterval <= 0:
		return fmt.Errorf("%w: durations must be positive", ErrConfig)
	}
	return nil
}

// Runner consumes the partition streams and executes runs: it claims a
// request and its lease in one script, resumes from the checkpoint, runs the
// remaining stages under a context cancelled on lease loss, cancel, timeout
// or shutdown, and finishes in one fenced script. Any number of Runners
// share one Redis.
type Runner struct {
	reg   *Registry
	cfg   RunnerConfig
	owner string
	// reclaimIdle: entries idle this long are re-examined by claim; the
	// shortest lease TTL of any job, so no expired lease waits for longer.
	reclaimIdle time.Duration
	log         *slog.Logger
	slots       chan struct{}

	workCtx    context.Context // runs; cancelled with ErrShutdown after the grace
	workCancel context.CancelCauseFunc

	mu     sync.Mutex
	active map[string]map[*context.CancelCauseFunc]struct{} // task key → cancels of local claims/runs
	wg     sync.WaitGroup
}

// NewRunner validates cfg and returns a Runner for reg's jobs.
func NewRunner(reg *Registry, cfg RunnerConfig) (*Runner, error) {
	if reg == nil {
		return nil, fmt.Errorf("%w: nil registry", ErrConfig)
	}
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	reclaimIdle := cfg.LeaseTTL
	for _, j := range reg.jobs {
		ttl := cmp0(j.LeaseTTL, cfg.LeaseTTL)
		reclaimIdle = min(reclaimIdle, ttl)
		if err := (leasing.KeeperConfig{TTL: ttl}).Validate(); err != nil {
			return nil, fmt.Errorf("job %s: %w", j.Scope, err)
		}
	}
	owner := cfg.ID + "/" + newRunID()[:6]
	return &Runner{
		reg: reg, cfg: cfg, owner: owner, reclaimIdle: reclaimIdle,
		log:    reg.log.With(slog.String("owner", owner)),
		slots:  make(chan struct{}, cfg.Concurrency),
		active: make(map[string]map[*context.CancelCauseFunc]struct{}),
	}, nil
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
	if err := r.ensureGroups(ctx); err != nil {
		return err
	}
	// Subscribe before taking work: a cancel published in between would
	// otherwise only be seen at the next heartbeat.
	cancels, err := r.subscribeCancels(ctx)
	if err != nil {
		return err
	}
	r.workCtx, r.workCancel = context.WithCancelCause(context.WithoutCancel(ctx))
	defer r.workCancel(nil)

	var loops sync.WaitGroup
	for p := range r.reg.ks.Partitions() {
		loops.Go(func() { r.fetchLoop(ctx, p) })
	}
	loops.Go(func() { r.every(ctx, r.cfg.ReclaimInterval, r.reclaimAll) })
	loops.Go(func() { r.every(ctx, r.cfg.RetryPoll, r.moveRetries) })
	loops.Go(func() { r.cancelListener(ctx, cancels) })
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
	r.log.Info("runner stopped")
	return nil
}

func (r *Runner) ensureGroups(ctx context.Context) error {
	for p := range r.reg.ks.Partitions() {
		if err := r.ensureGroup(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

func (r *Runner) ensureGroup(ctx context.Context, p int) error {
	err := r.reg.rdb.XGroupCreateMkStream(ctx, r.reg.ks.Requests(p), keyspace.Group, "0").Err()
	if err != nil && !strings.Contains(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("jobs: create consumer group on %s: %w", r.reg.ks.Requests(p), err)
	}
	return nil
}

// acquire takes one slot, blocking; false when ctx ended.
func (r *Runner) acquire(ctx context.Context) bool {
	select {
	case r.slots <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// tryAcquire takes up to n slots without blocking.
func (r *Runner) tryAcquire(n int) int {
	got := 0
	for got < n {
		select {
		case r.slots <- struct{}{}:
			got++
		default:
			return got
		}
	}
	return got
}

func (r *Runner) release(n int) {
	for range n {
		<-r.slots
	}
}

// fetchLoop reads partition p's stream. While slots are free it reads
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
		return sleepCtx(ctx, backoff(redisErrorBackoffBase, 5*time.Second, failures))
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

// subscribeCancels subscribes to every partition's cancel channel and
// waits for Redis to confirm.
func (r *Runner) subscribeCancels(ctx context.Context) (*redis.PubSub, error) {
	chans := make([]string, r.reg.ks.Partitions())
	for p := range chans {
		chans[p] = r.reg.ks.Cancels(p)
	}
	ps := r.reg.rdb.Subscribe(ctx, chans...)
	if _, err := ps.Receive(ctx); err != nil {
		ps.Close()
		return nil, fmt.Errorf("jobs: subscribe to cancels: %w", err)
	}
	return ps, nil
}

// cancelListener stops local runs as soon as their cancel is published.
// Missed messages are covered by the heartbeat, which returns the flag.
func (r *Runner) cancelListener(ctx context.Context, ps *redis.PubSub) {
	defer ps.Close()
	msgs := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-msgs:
			if !ok {
				return
			}
			r.mu.Lock()
			for cancel := range r.active[m.Payload] {
				(*cancel)(ErrCancelled)
			}
			r.mu.Unlock()
		}
	}
}

// track registers cancel for key's cancel messages until the returned
// func is called. It is registered before the claim, so a cancel published
// between the claim and the first stage is not missed.
func (r *Runner) track(key string, cancel context.CancelCauseFunc) (untrack func()) {
	h := &cancel
	r.mu.Lock()
	if r.active[key] == nil {
		r.active[key] = make(map[*context.CancelCauseFunc]struct{})
	}
	r.active[key][h] = struct{}{}
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		delete(r.active[key], h)
		if len(r.active[key]) == 0 {
			delete(r.active, key)
		}
		r.mu.Unlock()
	}
}

// claimResult is the decoded reply of claim.lua.
type claimResult struct {
	kind       string // ack, busy, granted
	token      int64
	done       int
	cursor     []byte
	attempt    int
	stages     []string
	sources    []Source
	prevStatus Status
}

func (r *Runner) claim(ctx context.Context, k taskkey.Key, p int, m redis.XMessage, runID, source string, ttl time.Duration) (claimResult, error) {
	ks := r.reg.ks
	res, err := r.reg.scripts.claim.Run(ctx, r.reg.rdb,
		[]string{ks.Task(k), ks.Lease(k), ks.Fence(k), ks.Requests(p), ks.History(k), ks.Index(p), ks.Watch(p)},
		m.ID, runID, source, r.owner, ttl.Milliseconds(), keyspace.Group, r.reg.histCap,
		ks.Events(p), r.reg.retention.Milliseconds(), r.reclaimIdle.Milliseconds(), newRunID()).Slice()
	if err != nil {
		return claimResult{}, err
	}
	c := claimResult{kind: fmt.Sprint(res[0])}
	if c.kind != "granted" {
		return c, nil
	}
	if len(res) < 9 {
		return claimResult{}, fmt.Errorf("claim: unexpected reply %v", res)
	}
	c.token, _ = res[1].(int64)
	c.done = int(toInt(res[2]))
	if s := fmt.Sprint(res[3]); s != "" {
		c.cursor = []byte(s)
	}
	c.attempt = int(toInt(res[4]))
	c.stages = splitList(fmt.Sprint(res[5]))
	for _, s := range splitList(fmt.Sprint(res[6])) {
		c.sources = append(c.sources, Source(s))
	}
	c.prevStatus = Status(fmt.Sprint(res[8]))
	return c, nil
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

// finish results (ARGV[4] of finish.lua).
const (
	resultDone      = "done"      // every stage completed
	resultFailed    = "failed"    // permanent failure, or attempts exhausted
	resultCancelled = "cancelled" // cancelled through the registry
	resultRetry     = "retry"     // attempt failed; retry after a backoff (or fail at maxAttempts)
	resultHandback  = "handback"  // shutdown: release, keep the checkpoint, re-queue
)

// process handles one stream entry end to end.
func (r *Runner) process(p int, m redis.XMessage) {
	ctx := r.workCtx
	str := func(f string) string { s, _ := m.Values[f].(string); return s }
	k, err := taskkey.Parse(str("key"))
	if err != nil {
		// Not written by tasklease: drop it so it is not reclaimed forever.
		r.reg.rdb.XAck(ctx, r.reg.ks.Requests(p), keyspace.Group, m.ID)
		r.reg.rdb.XDel(ctx, r.reg.ks.Requests(p), m.ID)
		return
	}
	runID, source := str("runId"), str("source")
	job, ok := r.reg.jobs[k.Scope()]
	if !ok {
		// Another runner may have this job; leave the entry to be reclaimed.
		r.log.Warn("request for a scope this runner does not know", slog.String("task_key", k.String()))
		return
	}
	runCtx, cancelRun := context.WithCancelCause(r.workCtx)
	defer cancelRun(nil)
	defer r.track(k.String(), cancelRun)()
	ttl := cmp0(job.LeaseTTL, r.cfg.LeaseTTL)
	sent := time.Now()
	c, err := r.claim(ctx, k, p, m, runID, source, ttl)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("claim failed; the entry will be reclaimed", slog.String("task_key", k.String()), slog.Any("error", err))
		}
		return
	}
	if c.kind != "granted" {
		return
	}
	lease := leasing.Lease{Key: k, Owner: r.owner, Token: c.token, TTL: ttl, GrantedAt: sent}
	r.execute(runCtx, cancelRun, job, p, m.ID, runID, Source(source), lease, c)
}

// execute runs a granted attempt under runCtx (cancelled by cancelRun on a
// registry cancel).
func (r *Runner) execute(runCtx context.Context, cancelRun context.CancelCauseFunc, job *Job, p int, entryID, runID string, source Source, lease leasing.Lease, c claimResult) {
	k := lease.Key
	log := r.log.With(slog.String("task_key", k.String()), slog.String("run_id", runID),
		slog.String("source", string(source)), slog.Int("attempt", c.attempt), slog.Int64("fencing_token", lease.Token))
	m := r.reg.metrics
	m.leaseGrants.WithLabelValues(k.Scope()).Inc()
	m.active.Inc()
	defer m.active.Dec()

	cp := &checkpoints.Checkpoint{RunID: runID, Stages: c.stages, Completed: c.done, Cursor: c.cursor, Attempt: c.attempt}
	rec := checkpoints.Decide(cp)
	if c.prevStatus == StatusRunning {
		m.takeovers.WithLabelValues(k.Scope(), string(rec.Mode)).Inc()
		log.Info("recovered run", slog.String("outcome", string(rec.Mode)))
	}

	ks := r.reg.ks
	keeper, err := leasing.NewKeeper(runCtx, lease.GrantedAt, leasing.KeeperConfig{TTL: lease.TTL,
		Renew: func(ctx context.Context) error {
			res, err := r.reg.scripts.heartbeat.Run(ctx, r.reg.rdb,
				[]string{ks.Lease(k), ks.Task(k), ks.Requests(p)},
				lease.Owner, lease.Token, runID, lease.TTL.Milliseconds(), keyspace.Group, entryID).Slice()
			if err != nil {
				return err
			}
			if len(res) == 0 || res[0] != int64(1) {
				return leasing.ErrNotHeld
			}
			if len(res) > 1 && res[1] == "1" {
				cancelRun(ErrCancelled)
			}
			return nil
		}})
	if err != nil { // timing validated in NewRunner; unreachable in practice
		log.Error("keeper", slog.Any("error", err))
		return
	}
	defer keeper.Stop()
	kctx := keeper.Context()

	run := &Run{key: k, runID: runID, attempt: c.attempt, sources: c.sources, source: source,
		lease: lease, recovery: rec, stages: c.stages, cursor: rec.Cursor,
		stopBy: lease.TTL / 3, store: r.reg.store, leases: r.reg.leases}

	result, completed, stageErr := resultDone, "", error(nil)
	for i := rec.StageIndex; i < len(c.stages); i++ {
		if kctx.Err() != nil { // cancelled, shut down or lease lost since the last stage
			result, stageErr = r.classify(kctx, context.Cause(kctx))
			break
		}
		name := c.stages[i]
		st := job.stage(name)
		if st == nil {
			result, stageErr = resultFailed, fmt.Errorf("stage %q is no longer defined for job %s", name, job.Scope)
			break
		}
		run.stage = name
		if i > rec.StageIndex {
			run.cursor = nil
		}
		err := r.runStage(kctx, st, run, log)
		if err == nil && kctx.Err() == nil {
			if i == len(c.stages)-1 {
				completed = name // finish marks the last stage done, saving a round trip
				break
			}
			if _, err = r.reg.store.Advance(kctx, lease, runID, name); err == nil {
				continue
			}
		}
		result, stageErr = r.classify(kctx, err)
		break
	}

	if result == "" { // lease lost: nothing may be written
		m.leaseLosses.WithLabelValues(k.Scope()).Inc()
		log.Warn("lease lost; stopped without writing", slog.String("stage", run.stage), slog.Any("error", keeper.Err()))
		return
	}
	r.finish(job, p, lease, runID, result, completed, stageErr, c.attempt, log)
}

func (j *Job) stage(name string) *Stage {
	for i := range j.Stages {
		if j.Stages[i].Name == name {
			return &j.Stages[i]
		}
	}
	return nil
}

func (r *Runner) runStage(kctx context.Context, st *Stage, run *Run, log *slog.Logger) (err error) {
	sctx, cancel := kctx, context.CancelFunc(func() {})
	if st.Timeout > 0 {
		sctx, cancel = context.WithTimeoutCause(kctx, st.Timeout, fmt.Errorf("stage %s timed out after %s", st.Name, st.Timeout))
	}
	defer cancel()
	start := time.Now()
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("stage %s panicked: %v", st.Name, p)
		}
		res := "done"
		if err != nil {
			res = "error"
		}
		r.reg.metrics.stageDuration.WithLabelValues(run.Scope(), st.Name, res).Observe(time.Since(start).Seconds())
		log.Debug("stage", slog.String("stage", st.Name), slog.String("outcome", res), slog.Any("error", err))
	}()
	err = st.Handler.RunStage(sctx, run)
	if err == nil && sctx.Err() != nil && kctx.Err() == nil {
		err = context.Cause(sctx) // a timed-out stage that returned nil did not finish in time
	}
	return err
}

// classify decides how an attempt that did not complete ends. "" means the
// lease is lost and nothing may be written.
func (r *Runner) classify(kctx context.Context, err error) (string, error) {
	cause := context.Cause(kctx)
	switch {
	case errors.Is(err, leasing.ErrNotHeld) || errors.Is(cause, leasing.ErrLost):
		return "", err
	case errors.Is(cause, ErrCancelled):
		return resultCancelled, ErrCancelled
	case errors.Is(cause, ErrShutdown):
		return resultHandback, nil
	case errors.Is(err, ErrStaleToken) || errors.Is(err, ErrPermanent):
		return resultFailed, err
	case err == nil:
		return resultRetry, errors.New("stage returned without error after its context ended")
	default:
		return resultRetry, err
	}
}

func (r *Runner) finish(job *Job, p int, lease leasing.Lease, runID, result, completed string, stageErr error, attempt int, log *slog.Logger) {
	k := lease.Key
	ks := r.reg.ks
	errText := ""
	if stageErr != nil {
		errText = truncateErr(stageErr.Error(), 1000)
	}
	delay := time.Duration(0)
	if result == resultRetry {
		delay = jitter(backoff(job.Retry.Backoff, job.Retry.MaxBackoff, attempt))
	}
	// Finish must land even when the run's context was cancelled (cancel,
	// shutdown); it is bounded by the lease instead.
	ctx, cancel := context.WithTimeout(context.Background(), lease.TTL)
	defer cancel()
	res, err := r.reg.scripts.finish.Run(ctx, r.reg.rdb,
		[]string{ks.Task(k), ks.Lease(k), ks.Requests(p), ks.History(k), ks.Index(p), ks.Retry(p), ks.Watch(p)},
		lease.Owner, lease.Token, runID, result, completed, errText, delay.Milliseconds(), keyspace.Group,
		r.reg.histCap, ks.Events(p), r.reg.retention.Milliseconds(), newRunID()).Slice()
	if err != nil {
		log.Warn("finish failed; the run will be recovered when its lease expires", slog.Any("error", err))
		return
	}
	if len(res) < 2 || res[0] != int64(1) {
		r.reg.metrics.leaseLosses.WithLabelValues(k.Scope()).Inc()
		log.Warn("lease lost before finish", slog.String("outcome", result))
		return
	}
	status := fmt.Sprint(res[1])
	switch Status(status) {
	case StatusRetrying:
		r.reg.metrics.retries.WithLabelValues(k.Scope()).Inc()
	case StatusDone, StatusFailed, StatusCancelled:
		r.reg.metrics.runs.WithLabelValues(k.Scope(), status).Inc()
	case StatusQueued:
		// handed back, or a queued follow-up started
		if result != resultHandback {
			r.reg.metrics.runs.WithLabelValues(k.Scope(), result).Inc()
		}
	}
	lvl := slog.LevelInfo
	if stageErr != nil && result != resultCancelled {
		lvl = slog.LevelWarn
	}
	log.LogAttrs(context.Background(), lvl, "run finished", slog.String("outcome", result), slog.String("status", status), slog.String("error", errText))
}

// backoff returns base·2^(attempt-1), capped at max.
func backoff(base, max time.Duration, attempt int) time.Duration {
	d := base
	for i := 1; i < attempt && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}

// jitter spreads d over [d/2, d) so retries of many keys do not align.
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2)
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func truncateErr(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
