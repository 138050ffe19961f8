package jobs

// The seed's pre-release checklist ("发布前并发验证"), one test per row:
//
//  1. manual and schedule triggered in the same second get one lease;
//  2. a foreground trigger while a manual sync runs shows the running task;
//  3. a runner crashing mid-stage is recovered from the checkpoint once its
//     lease expires;
//  4. after an account switch the old account's run cannot write the new
//     account's data (and does not block it);
//  5. a task key's history shows the run's sources, stages and result.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/checkpoints"
	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/leasing"
	"github.com/tasklease/tasklease/taskkey"
)

// ---- helpers shared by checklist_test.go, policy_test.go, badinput_test.go ----

// clHold is a stage handler that records every Run it is given and blocks
// the first n calls until release is closed or the stage context ends (the
// cause is recorded per run id and returned).
type clHold struct {
	mu      sync.Mutex
	n       int
	runs    []*Run
	causes  map[string]error
	release chan struct{}
	entered chan *Run
}

func newClHold(n int) *clHold {
	return &clHold{n: n, causes: map[string]error{}, release: make(chan struct{}), entered: make(chan *Run, 256)}
}

func (h *clHold) RunStage(ctx context.Context, run *Run) error {
	h.mu.Lock()
	i := len(h.runs)
	h.runs = append(h.runs, run)
	h.mu.Unlock()
	h.entered <- run
	if i >= h.n {
		return nil
	}
	select {
	case <-h.release:
		return nil
	case <-ctx.Done():
		cause := context.Cause(ctx)
		h.mu.Lock()
		h.causes[run.RunID()] = cause
		h.mu.Unlock()
		return cause
	}
}

func (h *clHold) calls() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.runs)
}

func (h *clHold) cause(runID string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.causes[runID]
}

func (h *clHold) open() { close(h.release) }

// clRecv receives one value from ch or fails the test after d.
func clRecv[T any](t testing.TB, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("timed out after %s waiting for %s", d, what)
	}
	var zero T
	return zero
}

// clStartRunner starts a runner and waits until its cancel subscription is
// live on every partition (PUBSUB NUMSUB), so a cancel published right away
// reaches it instead of waiting for the next heartbeat (see
// TestPolicyCancelRightAfterRunnerStart). want is the number of runners
// expected to be subscribed.
func clStartRunner(e *testEnv, cfg RunnerConfig, want int64) *Runner {
	e.t.Helper()
	rn, _ := e.startRunner(cfg)
	clWaitCancelSubscribers(e.t, e.reg, want)
	return rn
}

func clWaitCancelSubscribers(t testing.TB, reg *Registry, want int64) {
	t.Helper()
	chans := make([]string, reg.ks.Partitions())
	for p := range chans {
		chans[p] = reg.ks.Cancels(p)
	}
	waitFor(t, 10*time.Second, "runners subscribed to cancels", func() bool {
		n, err := clNumSub(context.Background(), reg.rdb, chans)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range chans {
			if n[c] < want {
				return false
			}
		}
		return true
	})
}

// clNumSub counts the subscribers of each channel. A single Redis counts
// them all (PUBSUB NUMSUB). On a Cluster a node counts only its own
// subscribers: shard channels (SSUBSCRIBE, Redis 7) are counted by PUBSUB
// SHARDNUMSUB on the master of their slot, plain ones by PUBSUB NUMSUB on
// whichever node the subscriber is connected to, so every master is asked.
func clNumSub(ctx context.Context, rdb redis.UniversalClient, chans []string) (map[string]int64, error) {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return rdb.PubSubNumSub(ctx, chans...).Result()
	}
	n := make(map[string]int64, len(chans))
	var mu sync.Mutex // ForEachMaster calls concurrently
	err := cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		plain, err := node.PubSubNumSub(ctx, chans...).Result()
		mu.Lock()
		defer mu.Unlock()
		for c, k := range plain {
			n[c] += k
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, c := range chans {
		node, err := cc.MasterForKey(ctx, c)
		if err != nil {
			return nil, err
		}
		shard, err := node.PubSubShardNumSub(ctx, c).Result()
		if err != nil {
			return nil, err
		}
		n[c] += shard[c]
	}
	return n, nil
}

// clJob is a job of named stages.
func clJob(scope string, stages ...Stage) Job { return Job{Scope: scope, Stages: stages} }

// clSubmit submits and fails the test on error.
func clSubmit(t testing.TB, reg *Registry, subject, scope string, src Source, pol Policy) SubmitResult {
	t.Helper()
	res, err := reg.Submit(context.Background(), subject, scope, SubmitOptions{Source: src, Policy: pol})
	if err != nil {
		t.Fatalf("submit %s|%s (%s, %s): %v", subject, scope, src, pol, err)
	}
	return res
}

// clHistory returns the key's whole history, newest first.
func clHistory(t testing.TB, reg *Registry, subject, scope string) []Event {
	t.Helper()
	ev, err := reg.History(context.Background(), subject, scope, 1000)
	if err != nil {
		t.Fatalf("history %s|%s: %v", subject, scope, err)
	}
	return ev
}

// clRaw returns the raw run record hash of a key.
func clRaw(t testing.TB, reg *Registry, subject, scope string) map[string]string {
	t.Helper()
	m, err := reg.rdb.HGetAll(context.Background(), reg.ks.Task(taskkey.MustNew(subject, scope))).Result()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// clEventNames lists the event names (with source/stage/outcome detail) of
// evs, for failure messages and exact comparisons.
func clEventNames(evs []Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		s := e.Event
		if e.Source != "" {
			s += " src=" + e.Source
		}
		if e.Stage != "" {
			s += " stage=" + e.Stage
		}
		if e.Outcome != "" {
			s += " outcome=" + e.Outcome
		}
		out[i] = s
	}
	return out
}

func clCount(evs []Event, name string) int {
	n := 0
	for _, e := range evs {
		if e.Event == name {
			n++
		}
	}
	return n
}

// clRequests sums the requests events named name stand for: coalesced
// repeats count as many as they were.
func clRequests(evs []Event, name string) int {
	n := 0
	for _, e := range evs {
		if e.Event == name {
			n += e.Count
		}
	}
	return n
}

func clFind(evs []Event, name string) (Event, bool) {
	for _, e := range evs {
		if e.Event == name {
			return e, true
		}
	}
	return Event{}, false
}

func clSources(ss ...Source) []Source { return ss }

func clSameSet(a, b []Source) bool {
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y)
}

// ---- 1. manual and schedule at the same instant: one lease, one execution ----

func TestChecklistManualAndScheduleSameInstantOneExecution(t *testing.T) {
	t.Parallel()
	t.Run("redis_2_runners", func(t *testing.T) {
		t.Parallel()
		s := redistest.StartServer(t)
		clSameInstant(t, []redis.UniversalClient{s.Client(t), s.Client(t)})
	})
	t.Run("miniredis_2_runners", func(t *testing.T) {
		t.Parallel()
		m := redistest.StartMini(t)
		clSameInstant(t, []redis.UniversalClient{m.Client(t), m.Client(t)})
	})
	t.Run("cluster_2_runners", func(t *testing.T) {
		t.Parallel()
		c := redistest.SharedCluster(t)
		clSameInstant(t, []redis.UniversalClient{c.Client(t), c.Client(t)})
	})
	t.Run("miniredis_1_runner", func(t *testing.T) {
		t.Parallel()
		m := redistest.StartMini(t)
		clSameInstant(t, []redis.UniversalClient{m.Client(t)})
	})
}

// clSameInstant submits manual and schedule requests for 50 keys, each pair
// released by one barrier, through one registry per client (one "pod"
// each), with one runner per client executing.
func clSameInstant(t *testing.T, clients []redis.UniversalClient) {
	const keys, scope = 50, "course_sync"
	release := make(chan struct{})
	var mu sync.Mutex
	pulls := map[string]int{}
	tokens := map[string][]int64{}
	pulling := HandlerFunc(func(ctx context.Context, run *Run) error {
		mu.Lock()
		pulls[run.Subject()]++
		tokens[run.Subject()] = append(tokens[run.Subject()], run.FencingToken())
		mu.Unlock()
		// Hold the run until every request was submitted, so no second run
		// can legitimately start after this one finished.
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	})
	pushes := &counter{}
	job := clJob(scope, Stage{Name: "pulling", Handler: pulling}, Stage{Name: "pushing", Handler: pushes})
	var envs []*testEnv
	for i, c := range clients {
		e := newEnv(t, c, Config{Prefix: "cl1", Jobs: []Job{job}})
		e.startRunner(RunnerConfig{ID: fmt.Sprintf("pod-%d", i), Concurrency: 2 * keys})
		envs = append(envs, e)
	}

	type res struct {
		subject string
		src     Source
		out     Outcome
		err     error
	}
	results := make(chan res, 2*keys)
	barrier := make(chan struct{})
	var wg sync.WaitGroup
	for i := range keys {
		subject := fmt.Sprintf("u%d", i)
		for j, src := range []Source{SourceManual, SourceSchedule} {
			reg := envs[(i+j)%len(envs)].reg // the two triggers live in different pods
			wg.Go(func() {
				<-barrier
				r, err := reg.Submit(context.Background(), subject, scope, SubmitOptions{Source: src})
				results <- res{subject, src, r.Outcome, err}
			})
		}
	}
	close(barrier)
	wg.Wait()
	close(results)
	outcomes := map[string][]Outcome{}
	for r := range results {
		if r.err != nil {
			t.Fatalf("submit %s %s: %v", r.subject, r.src, r.err)
		}
		outcomes[r.subject] = append(outcomes[r.subject], r.out)
	}
	for subject, outs := range outcomes {
		slices.Sort(outs)
		if !slices.Equal(outs, []Outcome{OutcomeJoined, OutcomeStarted}) {
			t.Errorf("%s: outcomes %v, want one started and one joined", subject, outs)
		}
	}
	close(release)

	e := envs[0]
	for i := range keys {
		subject := fmt.Sprintf("u%d", i)
		v := e.waitStatus(subject, scope, 20*time.Second, StatusDone, StatusFailed, StatusCancelled)
		if v.Status != StatusDone {
			t.Errorf("%s: status %s (%s), want done", subject, v.Status, v.LastError)
		}
		if v.FencingToken <= 0 {
			t.Errorf("%s: fencing token %d, want one lease grant's token", subject, v.FencingToken)
		}
		if !clSameSet(v.Sources, clSources(SourceManual, SourceSchedule)) {
			t.Errorf("%s: sources %v, want manual and schedule", subject, v.Sources)
		}
		// The key's fencing counter is the record's token: one grant.
		fence, err := e.rdb.HGet(context.Background(), e.reg.ks.Task(taskkey.MustNew(subject, scope)), "token").Result()
		if err != nil || fence != strconv.FormatInt(v.FencingToken, 10) {
			t.Errorf("%s: fence counter %q (%v), want the one grant's token %d", subject, fence, err, v.FencingToken)
		}
		evs := clHistory(t, e.reg, subject, scope)
		if n := clCount(evs, "started") + clCount(evs, "recovered"); n != 1 {
			t.Errorf("%s: %d lease grants in history, want 1: %v", subject, n, clEventNames(evs))
		}
		if clCount(evs, "requested") != 1 || clCount(evs, "joined") != 1 || clCount(evs, "done") != 1 {
			t.Errorf("%s: history %v, want one requested, one joined, one done", subject, clEventNames(evs))
		}
		mu.Lock()
		if pulls[subject] != 1 || !slices.Equal(tokens[subject], []int64{v.FencingToken}) {
			t.Errorf("%s: pulling ran %d times with tokens %v, want once with token %d", subject, pulls[subject], tokens[subject], v.FencingToken)
		}
		mu.Unlock()
		if n := pushes.get(subject + "/pushing"); n != 1 {
			t.Errorf("%s: pushing ran %d times, want 1", subject, n)
		}
	}
}

// ---- 2. foreground while a manual run is running: joined + the running view ----

func TestChecklistForegroundJoinsRunningManual(t *testing.T) {
	t.Parallel()
	const subject, scope = "u42", "course_sync"
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			g := newGate()
			push := &counter{}
			e := newEnv(t, b.Client, Config{Prefix: "cl2", Jobs: []Job{
				clJob(scope, Stage{Name: "pulling", Handler: g}, Stage{Name: "pushing", Handler: push}),
			}})
			e.startRunner(RunnerConfig{ID: "pod-a"})

			first := clSubmit(t, e.reg, subject, scope, SourceManual, "")
			if first.Outcome != OutcomeStarted {
				t.Fatalf("manual: outcome %s, want started", first.Outcome)
			}
			waitFor(t, 10*time.Second, "the manual run to enter pulling", func() bool { return g.count() == 1 })

			fg := clSubmit(t, e.reg, subject, scope, SourceForeground, "")
			if fg.Outcome != OutcomeJoined {
				t.Fatalf("foreground: outcome %s, want joined", fg.Outcome)
			}
			v := fg.Task
			if v.Status != StatusRunning || v.Stage != "pulling" || v.StartedAt == nil || !v.CanCancel {
				t.Errorf("joined view: status %s stage %q startedAt %v canCancel %v; want running, pulling, set, true",
					v.Status, v.Stage, v.StartedAt, v.CanCancel)
			}
			if !slices.Equal(v.Sources, clSources(SourceManual, SourceForeground)) {
				t.Errorf("joined view sources %v, want [manual foreground]", v.Sources)
			}
			if v.RunID != first.Task.RunID || v.Key != subject+"|"+scope || v.Owner == "" || v.FencingToken <= 0 {
				t.Errorf("joined view: runId %s (first %s) key %s owner %q token %d", v.RunID, first.Task.RunID, v.Key, v.Owner, v.FencingToken)
			}
			if v.StartedAt != nil && v.RequestedAt != nil && v.StartedAt.Before(*v.RequestedAt) {
				t.Errorf("startedAt %v before requestedAt %v", v.StartedAt, v.RequestedAt)
			}

			g.open()
			done := e.waitStatus(subject, scope, 10*time.Second, StatusDone, StatusFailed, StatusCancelled)
			if done.Status != StatusDone || done.RunID != first.Task.RunID {
				t.Errorf("final: status %s run %s, want done of run %s", done.Status, done.RunID, first.Task.RunID)
			}
			if g.count() != 1 || push.get(subject+"/pushing") != 1 {
				t.Errorf("pulling ran %d times, pushing %d times; want once each", g.count(), push.get(subject+"/pushing"))
			}
		})
	}
}

// ---- 3. a runner dies mid-stage: the lease expires, another resumes ----

func TestChecklistRunnerDiesMidStageResumesFromCheckpoint(t *testing.T) {
	t.Parallel()
	t.Run("miniredis_clock", func(t *testing.T) {
		t.Parallel()
		m := redistest.StartMini(t)
		const ttl = 3 * time.Second // Redis time only moves with Advance
		clCrashResume(t, m.Client(t), m.Client(t), ttl, nil, func() { m.Advance(2 * ttl) })
	})
	t.Run("redis_partition", func(t *testing.T) {
		t.Parallel()
		s := redistest.StartServer(t)
		cut := &clPartition{}
		a := s.Client(t)
		a.AddHook(cut)
		clCrashResume(t, a, s.Client(t), 2*time.Second, cut, nil)
	})
	t.Run("cluster_partition", func(t *testing.T) {
		t.Parallel()
		c := redistest.SharedCluster(t) // the partition is a hook on one client, not a node
		cut := &clPartition{}
		a := c.Client(t)
		a.AddHook(cut)
		clCrashResume(t, a, c.Client(t), 2*time.Second, cut, nil)
	})
}

// clPartition is a go-redis hook that makes every command of one client fail
// while down: the runner behind it is cut off from Redis (paused, crashed
// or partitioned) though its goroutines live on.
type clPartition struct{ down atomic.Bool }

var errClPartitioned = errors.New("test: partitioned from redis")

func (p *clPartition) DialHook(next redis.DialHook) redis.DialHook { return next }

func (p *clPartition) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if p.down.Load() {
			cmd.SetErr(errClPartitioned)
			return errClPartitioned
		}
		return next(ctx, cmd)
	}
}

func (p *clPartition) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if p.down.Load() {
			for _, c := range cmds {
				c.SetErr(errClPartitioned)
			}
			return errClPartitioned
		}
		return next(ctx, cmds)
	}
}

// clCrashResume: runner A (on clientA) completes stage 1, saves progress in
// stage 2 and hangs, ignoring its context. Then A loses the ability to renew:
// either advance (miniredis clock jumps past the TTL, so Redis forgets the
// lease and A's heartbeats are refused) or cut (A's client is partitioned).
// Runner B (on clientB, started afterwards) must take the run over.
func clCrashResume(t *testing.T, clientA, clientB redis.UniversalClient, ttl time.Duration, cut *clPartition, advance func()) {
	const subject, scope = "u7", "course_sync"
	saved := []byte("page=42")
	cnt := &counter{}

	type aEntry struct {
		run *Run
		ctx context.Context
	}
	aIn := make(chan aEntry, 1)
	hang := make(chan struct{})
	aPushing := HandlerFunc(func(ctx context.Context, run *Run) error {
		if err := run.SaveProgress(ctx, saved); err != nil {
			return err
		}
		aIn <- aEntry{run, ctx}
		<-hang // a hung process: ignores its context until the test ends
		return nil
	})
	var bMu sync.Mutex
	var bRuns []*Run
	var bCursor []byte
	bPushing := HandlerFunc(func(ctx context.Context, run *Run) error {
		bMu.Lock()
		bRuns = append(bRuns, run)
		bCursor = run.Cursor()
		bMu.Unlock()
		return nil
	})
	stages := func(pushing Handler) []Stage {
		return []Stage{{Name: "pulling", Handler: cnt}, {Name: "pushing", Handler: pushing}, {Name: "saving", Handler: cnt}}
	}
	envA := newEnv(t, clientA, Config{Prefix: "cl3", Jobs: []Job{clJob(scope, stages(aPushing)...)}})
	envB := newEnv(t, clientB, Config{Prefix: "cl3", Jobs: []Job{clJob(scope, stages(bPushing)...)}})

	// Concurrency 1: A's only slot is held by the hung stage, so A can
	// neither fetch nor reclaim anything (it cannot rescue its own run).
	ra, _ := envA.startRunner(RunnerConfig{ID: "pod-a", Concurrency: 1, LeaseTTL: ttl})
	t.Cleanup(func() { close(hang) }) // runs before A's shutdown cleanup

	if r := clSubmit(t, envA.reg, subject, scope, SourceManual, ""); r.Outcome != OutcomeStarted {
		t.Fatalf("outcome %s, want started", r.Outcome)
	}
	a := clRecv(t, aIn, 10*time.Second, "runner A to save progress in stage 2")
	if a.run.FencingToken() <= 0 || a.run.Owner() != ra.Owner() || a.run.Recovery().Mode != checkpoints.Restart {
		t.Fatalf("A's run: token %d owner %s recovery %s; want a token, %s, restart", a.run.FencingToken(), a.run.Owner(), a.run.Recovery().Mode, ra.Owner())
	}
	if n := cnt.get(subject + "/pulling"); n != 1 {
		t.Fatalf("pulling ran %d times before the crash, want 1", n)
	}

	// A dies without a graceful shutdown.
	if advance != nil {
		advance()
	} else {
		cut.down.Store(true)
	}
	// A's heartbeat cannot renew: its stage context is cancelled (stop on
	// lease loss) — the stage ignores it, like a hung process would.
	clRecv(t, a.ctx.Done(), 10*time.Second, "A's stage context to be cancelled on lease loss")
	cause := context.Cause(a.ctx)
	if !errors.Is(cause, leasing.ErrLost) {
		t.Errorf("A's stage context cause %v, want leasing.ErrLost", cause)
	}
	if advance != nil && !errors.Is(cause, leasing.ErrNotHeld) {
		t.Errorf("A's stage context cause %v, want leasing.ErrNotHeld (heartbeat refused)", cause)
	}

	rb, _ := envB.startRunner(RunnerConfig{ID: "pod-b", LeaseTTL: ttl, ReclaimInterval: 50 * time.Millisecond})
	v := envB.waitStatus(subject, scope, 110*time.Second, StatusDone, StatusFailed, StatusCancelled)
	if v.Status != StatusDone {
		t.Fatalf("final status %s (%s), want done", v.Status, v.LastError)
	}
	tokA := a.run.FencingToken()
	if v.FencingToken <= tokA || v.Attempt != 2 {
		t.Errorf("final view: token %d attempt %d, want a token above A's %d and attempt 2", v.FencingToken, v.Attempt, tokA)
	}
	bMu.Lock()
	if len(bRuns) != 1 {
		t.Fatalf("B's pushing ran %d times, want 1", len(bRuns))
	}
	b := bRuns[0]
	if b.Owner() != rb.Owner() || b.FencingToken() != v.FencingToken {
		t.Errorf("B's run: owner %s token %d, want %s and %d", b.Owner(), b.FencingToken(), rb.Owner(), v.FencingToken)
	}
	if rec := b.Recovery(); rec.Mode != checkpoints.Resume || rec.Stage != "pushing" || !b.Resumed() {
		t.Errorf("B's recovery %+v resumed %v, want resume at pushing", rec, b.Resumed())
	}
	if string(bCursor) != string(saved) {
		t.Errorf("B's pushing got cursor %q, want %q", bCursor, saved)
	}
	if b.RunID() != a.run.RunID() || b.Attempt() != 2 {
		t.Errorf("B's run id %s attempt %d, want A's run %s at attempt 2", b.RunID(), b.Attempt(), a.run.RunID())
	}
	bMu.Unlock()
	if n := cnt.get(subject + "/pulling"); n != 1 {
		t.Errorf("pulling ran %d times, want 1 (a done stage re-ran)", n)
	}
	if n := cnt.get(subject + "/saving"); n != 1 {
		t.Errorf("saving ran %d times, want 1", n)
	}

	evs := clHistory(t, envB.reg, subject, scope)
	lost, ok := clFind(evs, "lease-lost")
	if !ok || lost.Owner != ra.Owner() || lost.FencingToken != tokA {
		t.Errorf("lease-lost event %+v (found %v), want owner %s token %d; history %v", lost, ok, ra.Owner(), tokA, clEventNames(evs))
	}
	rec, ok := clFind(evs, "recovered")
	if !ok || rec.Outcome != "resume" || rec.FencingToken != v.FencingToken || rec.Owner != rb.Owner() || rec.Stage != "pushing" {
		t.Errorf("recovered event %+v (found %v), want resume at pushing by %s with token %d", rec, ok, rb.Owner(), v.FencingToken)
	}
	if clCount(evs, "started") != 1 || clCount(evs, "recovered") != 1 || clCount(evs, "done") != 1 {
		t.Errorf("history %v: want one started, one recovered, one done", clEventNames(evs))
	}
	for _, ev := range evs {
		if ev.Event == "stage" && ev.Stage == "pulling" && ev.FencingToken != tokA {
			t.Errorf("pulling completed under token %d, want A's %d", ev.FencingToken, tokA)
		}
	}

	// A wakes up (or the partition heals) and tries to write: fenced out.
	if cut != nil {
		cut.down.Store(false)
	}
	before := clRaw(t, envB.reg, subject, scope)
	if err := a.run.SaveProgress(context.Background(), []byte("stale")); !errors.Is(err, leasing.ErrNotHeld) {
		t.Errorf("A's late SaveProgress: %v, want leasing.ErrNotHeld", err)
	}
	if err := a.run.CheckLease(context.Background()); !errors.Is(err, leasing.ErrNotHeld) {
		t.Errorf("A's late CheckLease: %v, want leasing.ErrNotHeld", err)
	}
	if after := clRaw(t, envB.reg, subject, scope); !mapsEqual(before, after) {
		t.Errorf("A's late write changed the record:\nbefore %v\nafter  %v", before, after)
	}
}

// withoutCoalesced returns a record's fields without those that count
// coalesced requests ('co', 'c:<source>:<outcome>', 'n:<source>:<outcome>').
func withoutCoalesced(f map[string]string) map[string]string {
	out := make(map[string]string, len(f))
	for k, v := range f {
		if k != "co" && !strings.HasPrefix(k, "c:") && !strings.HasPrefix(k, "n:") {
			out[k] = v
		}
	}
	return out
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// ---- 4. account switch: the new account is not blocked, the old one is fenced ----

func TestChecklistAccountSwitchNotBlocked(t *testing.T) {
	t.Parallel()
	const scope = "course_sync"
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {

			var mu sync.Mutex
			seen := map[string]string{} // runId → subject seen by the stage
			keys := map[string]string{} // runId → key seen by the stage
			u1In := make(chan *Run, 1)
			u1Cause := make(chan error, 1)
			pulling := HandlerFunc(func(ctx context.Context, run *Run) error {
				mu.Lock()
				seen[run.RunID()] = run.Subject()
				keys[run.RunID()] = run.Key().String()
				mu.Unlock()
				if run.Subject() != "u1" {
					return nil
				}
				u1In <- run
				<-ctx.Done()
				u1Cause <- context.Cause(ctx)
				return context.Cause(ctx)
			})
			push := &counter{}
			e := newEnv(t, b.Client, Config{Prefix: "cl4", Jobs: []Job{
				clJob(scope, Stage{Name: "pulling", Handler: pulling}, Stage{Name: "pushing", Handler: push}),
				clJob("backup", Stage{Name: "copying", Handler: push}),
			}})
			clStartRunner(e, RunnerConfig{ID: "pod-a"}, 1)

			r1 := clSubmit(t, e.reg, "u1", scope, SourceManual, "")
			run1 := clRecv(t, u1In, 10*time.Second, "u1's run to start")

			r2 := clSubmit(t, e.reg, "u2", scope, SourceForeground, "")
			if r2.Outcome != OutcomeStarted || r2.Task.RunID == r1.Task.RunID {
				t.Fatalf("u2 after the switch: outcome %s run %s (u1's %s), want a new started run", r2.Outcome, r2.Task.RunID, r1.Task.RunID)
			}
			v2 := e.waitStatus("u2", scope, 10*time.Second, StatusDone, StatusFailed, StatusCancelled)
			if v2.Status != StatusDone {
				t.Fatalf("u2: status %s, want done", v2.Status)
			}
			if v1, err := e.reg.Get(context.Background(), "u1", scope); err != nil || v1.Status != StatusRunning {
				t.Fatalf("u1 while u2 ran: %v %v, want still running", v1.Status, err)
			}
			if push.get("u2/pushing") != 1 || push.get("u1/pushing") != 0 {
				t.Errorf("pushing: u2 %d, u1 %d; want 1 and 0", push.get("u2/pushing"), push.get("u1/pushing"))
			}

			out, err := e.reg.CancelSubject(context.Background(), "u1")
			if err != nil {
				t.Fatal(err)
			}
			if out[scope] != CancelCancelling || out["backup"] != CancelNotRunning {
				t.Errorf("CancelSubject(u1) = %v, want %s cancelling and backup not_running", out, scope)
			}
			if c := clRecv(t, u1Cause, 10*time.Second, "u1's stage context to end"); !errors.Is(c, ErrCancelled) {
				t.Errorf("u1's stage context cause %v, want ErrCancelled", c)
			}
			if v := e.waitStatus("u1", scope, 10*time.Second, StatusCancelled, StatusDone, StatusFailed); v.Status != StatusCancelled {
				t.Errorf("u1: status %s, want cancelled", v.Status)
			}

			// The old account's handle can write nothing, least of all u2's record.
			u2Before := clRaw(t, e.reg, "u2", scope)
			u2Hist := len(clHistory(t, e.reg, "u2", scope))
			u1Before := clRaw(t, e.reg, "u1", scope)
			if err := run1.SaveProgress(context.Background(), []byte("u1-cursor")); !errors.Is(err, leasing.ErrNotHeld) {
				t.Errorf("u1's SaveProgress after cancel: %v, want leasing.ErrNotHeld", err)
			}
			if after := clRaw(t, e.reg, "u2", scope); !mapsEqual(u2Before, after) {
				t.Errorf("u2's record changed by u1's write:\nbefore %v\nafter  %v", u2Before, after)
			}
			if after := clRaw(t, e.reg, "u1", scope); !mapsEqual(u1Before, after) {
				t.Errorf("u1's record changed by its stale write:\nbefore %v\nafter  %v", u1Before, after)
			}
			if n := len(clHistory(t, e.reg, "u2", scope)); n != u2Hist {
				t.Errorf("u2's history grew from %d to %d", u2Hist, n)
			}

			mu.Lock()
			defer mu.Unlock()
			want := map[string]string{r1.Task.RunID: "u1", v2.RunID: "u2"}
			if len(seen) != 2 {
				t.Errorf("stages saw runs %v, want exactly u1's and u2's", seen)
			}
			for id, subj := range want {
				if seen[id] != subj || keys[id] != subj+"|"+scope {
					t.Errorf("run %s: stage saw subject %q key %q, want %q", id, seen[id], keys[id], subj)
				}
			}
		})
	}
}

// ---- 5. history by task key: sources, stages, result ----

func TestChecklistHistoryShowsSourcesStagesResult(t *testing.T) {
	t.Parallel()
	const subject, scope = "u9", "course_sync"
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			c := &counter{}
			e := newEnv(t, b.Client, Config{Prefix: "cl5", Jobs: []Job{
				clJob(scope, Stage{Name: "pulling", Handler: c}, Stage{Name: "pushing", Handler: c}),
			}})
			// No runner yet: the three requests meet the same queued run.
			first := clSubmit(t, e.reg, subject, scope, SourceManual, "")
			if o := clSubmit(t, e.reg, subject, scope, SourceForeground, "").Outcome; first.Outcome != OutcomeStarted || o != OutcomeJoined {
				t.Fatalf("outcomes %s, %s; want started, joined", first.Outcome, o)
			}
			if o := clSubmit(t, e.reg, subject, scope, SourceSchedule, "").Outcome; o != OutcomeJoined {
				t.Fatalf("schedule: outcome %s, want joined", o)
			}
			rn, _ := e.startRunner(RunnerConfig{ID: "pod-h"})
			v := e.waitStatus(subject, scope, 10*time.Second, StatusDone, StatusFailed, StatusCancelled)
			if v.Status != StatusDone {
				t.Fatalf("status %s, want done", v.Status)
			}
			if !slices.Equal(v.Sources, clSources(SourceManual, SourceForeground, SourceSchedule)) {
				t.Errorf("view sources %v, want [manual foreground schedule]", v.Sources)
			}

			evs := clHistory(t, e.reg, subject, scope)
			want := []string{
				"done",
				"stage pushing done",
				"stage pulling done",
				"started manual",
				"joined schedule joined",
				"joined foreground joined",
				"requested manual started",
			}
			got := make([]string, len(evs))
			for i, ev := range evs {
				switch ev.Event {
				case "requested", "joined":
					got[i] = ev.Event + " " + ev.Source + " " + ev.Outcome
				case "started":
					got[i] = ev.Event + " " + ev.Source
				case "stage":
					got[i] = ev.Event + " " + ev.Stage + " " + ev.Outcome
				default:
					got[i] = ev.Event
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("history (newest first):\n got %q\nwant %q", got, want)
			}
			for i, ev := range evs {
				if ev.RunID != first.Task.RunID {
					t.Errorf("event %d %s: runId %q, want %q", i, ev.Event, ev.RunID, first.Task.RunID)
				}
				if ev.At.IsZero() {
					t.Errorf("event %d %s: no time", i, ev.Event)
				}
				if i > 0 && ev.At.After(evs[i-1].At) {
					t.Errorf("event %d %s at %v is after the newer %s at %v", i, ev.Event, ev.At, evs[i-1].Event, evs[i-1].At)
				}
				switch ev.Event {
				case "started", "stage", "done":
					if ev.Owner != rn.Owner() || ev.FencingToken != v.FencingToken {
						t.Errorf("%s event: owner %q token %d, want %q and %d", ev.Event, ev.Owner, ev.FencingToken, rn.Owner(), v.FencingToken)
					}
				}
				if ev.Error != "" {
					t.Errorf("%s event: error %q", ev.Event, ev.Error)
				}
			}
			// A limit pages from the newest.
			if top, err := e.reg.History(context.Background(), subject, scope, 2); err != nil || len(top) != 2 || top[0].Event != "done" {
				t.Errorf("History(limit 2) = %v, %v; want the 2 newest", clEventNames(top), err)
			}
		})
	}
}
