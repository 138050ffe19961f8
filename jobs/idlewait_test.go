package jobs

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/redistest"
)

// idleWaits records what the fetchers' idle waits did (testHooks).
type idleWaits struct {
	mu      sync.Mutex
	waiting map[int]bool // partition → a wait started since the last reset
	carried map[int]int  // partition → waits that held a slot for their read
	took    int          // entries the reads sent with waits took
	// carriedAt: when the latest wait that carries its read was sent.
	carriedAt time.Time
}

func watchIdleWaits(rn *Runner) *idleWaits {
	w := &idleWaits{waiting: map[int]bool{}, carried: map[int]int{}}
	rn.testHooks.idleWait = func(p int, carried bool) {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.waiting[p] = true
		if carried {
			w.carried[p]++
			w.carriedAt = time.Now()
		}
	}
	rn.testHooks.waitRead = func(_, n int) {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.took += n
	}
	return w
}

// watched is a Runner started by startWatched, whose idle waits w records.
type watched struct {
	rn     *Runner
	w      *idleWaits
	cancel context.CancelFunc // starts the runner's shutdown
	done   chan error
	once   sync.Once
	err    error
}

// stopped waits for Run to return and returns its error.
func (x *watched) stopped() error {
	x.once.Do(func() { x.err = <-x.done })
	return x.err
}

// startWatched runs a Runner for e's registry until the test ends.
func startWatched(t *testing.T, e *testEnv, cfg RunnerConfig) *watched {
	t.Helper()
	rn, err := NewRunner(e.reg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	x := &watched{rn: rn, w: watchIdleWaits(rn), cancel: cancel, done: make(chan error, 1)}
	go func() { x.done <- rn.Run(ctx) }()
	t.Cleanup(func() { cancel(); _ = x.stopped() })
	return x
}

func (w *idleWaits) partitionsWaiting() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.waiting)
}

func (w *idleWaits) taken() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.took
}

func (w *idleWaits) carriedAny() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.carried) > 0
}

// A request to an idle runner is claimed by the read its fetcher sent with
// the wait on the bell (one round trip after the wake instead of two).
func TestIdleWaitCarriesTheRead(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			c := &counter{}
			e := newEnv(t, b.Client, Config{Prefix: "iw1", Partitions: 2, Jobs: []Job{clJob("sync", Stage{Name: "only", Handler: c})}})
			w := startWatched(t, e, RunnerConfig{ID: "iw", Concurrency: 8, FetchBlock: 2 * time.Second}).w
			waitFor(t, 5*time.Second, "both partitions waiting", func() bool { return w.partitionsWaiting() == 2 })
			for i, subject := range []string{"a", "b", "c"} {
				clSubmit(t, e.reg, subject, "sync", SourceManual, "")
				e.waitStatus(subject, "sync", 5*time.Second, StatusDone)
				// Each request woke a waiting fetcher whose own read took it:
				// within FetchBlock (2s), so no plain read after a timeout did.
				if got := w.taken(); got != i+1 {
					t.Fatalf("after %d requests the reads sent with waits took %d entries, want %d", i+1, got, i+1)
				}
			}
		})
	}
}

// Idle fetchers hold at most half of the runner's slots: a runner with 4
// slots and 4 idle partitions holds 2, and a burst on one partition still
// runs 4 at once.
func TestIdleWaitsHoldAtMostHalfTheSlots(t *testing.T) {
	t.Parallel()
	m := redistest.StartMini(t)
	g := newGate()
	e := newEnv(t, m.Client(t), Config{Prefix: "iw2", Partitions: 4, Jobs: []Job{clJob("sync", Stage{Name: "only", Handler: g})}})
	x := startWatched(t, e, RunnerConfig{ID: "iw", Concurrency: 4, FetchBlock: 100 * time.Millisecond, ShutdownGrace: time.Second})
	rn, w := x.rn, x.w
	waitFor(t, 5*time.Second, "all partitions waiting", func() bool { return w.partitionsWaiting() == 4 })
	if held := len(rn.slots); held > 2 {
		t.Fatalf("idle partitions hold %d of 4 slots, want at most 2", held)
	}
	if !w.carriedAny() {
		t.Fatal("no idle wait held a slot for its read")
	}
	// Four subjects of one partition.
	var subjects []string
	for i := 0; len(subjects) < 4; i++ {
		s := "s" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		k, _, err := e.reg.key(s, "sync")
		if err != nil {
			t.Fatal(err)
		}
		if e.reg.ks.Partition(k) == 0 {
			subjects = append(subjects, s)
		}
	}
	for _, s := range subjects {
		clSubmit(t, e.reg, s, "sync", SourceManual, "")
	}
	waitFor(t, 5*time.Second, "4 runs of one partition running at once", func() bool { return g.count() == 4 })
	g.open()
	for _, s := range subjects {
		e.waitStatus(s, "sync", 5*time.Second, StatusDone)
	}
}

// The node's one wait carries its read whatever FetchBlock is against the
// lease TTL: the claim counts its lease from when Redis granted it (the
// time the wait blocked, measured by Redis's clock), not from when the wait
// was sent. Here the wait blocks longer than the whole lease before the
// request comes: counted from the send, the lease would be over before it
// was granted, the stage stopped at once and the run taken over, a second
// attempt.
func TestNodeWaitCountsTheLeaseFromTheGrant(t *testing.T) {
	t.Parallel()
	// Real Redis only: the backends' miniredis keeps its clock still, so
	// no wait there seems to block at all.
	rdb := redistest.StartServer(t).Client(t)
	var calls atomic.Int32
	work := HandlerFunc(func(ctx context.Context, _ *Run) error { // long enough for a keeper to notice a lost lease
		calls.Add(1)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(150 * time.Millisecond):
			return nil
		}
	})
	e := newEnv(t, rdb, Config{Prefix: "iw3", Partitions: 2, Jobs: []Job{clJob("sync", Stage{Name: "only", Handler: work})}})
	const ttl = 600 * time.Millisecond
	x := startWatched(t, e, RunnerConfig{ID: "iw", Concurrency: 8, FetchBlock: 5 * time.Second, LeaseTTL: ttl})
	// The scenario needs the request to come a lease TTL into the block
	// of the wait that reads it (waits end early while partitions park).
	waitFor(t, 10*time.Second, "a wait carrying its read to block past a lease TTL", func() bool {
		x.w.mu.Lock()
		sent := x.w.carriedAt
		x.w.mu.Unlock()
		return x.w.partitionsWaiting() == 2 && !sent.IsZero() && time.Since(sent) > ttl+200*time.Millisecond
	})
	clSubmit(t, e.reg, "a", "sync", SourceManual, "")
	v := e.waitStatus("a", "sync", 10*time.Second, StatusDone)
	if x.w.taken() != 1 {
		t.Fatalf("the wait's read took %d entries, want the request's", x.w.taken())
	}
	if v.Attempt != 1 || calls.Load() != 1 {
		t.Fatalf("done at attempt %d after %d stage calls, want the first: the claim's lease was counted from before the wait", v.Attempt, calls.Load())
	}
}

// leaseStart never dates a grant after the reply that brought it, and
// without Redis's two times falls back to when the wait was sent.
func TestLeaseStartBounds(t *testing.T) {
	sent := time.Now().Add(-3 * time.Second)
	at := func(d time.Duration) *redis.TimeCmd {
		c := redis.NewTimeCmd(context.Background())
		c.SetVal(time.Unix(1_800_000_000, 0).Add(d))
		return c
	}
	if got := leaseStart(sent, at(0), at(2*time.Second)); !got.Equal(sent.Add(2 * time.Second)) {
		t.Errorf("blocked 2s: start %s after the send, want 2s", got.Sub(sent))
	}
	if got := leaseStart(sent, at(0), at(time.Minute)); got.After(time.Now()) {
		t.Errorf("a Redis clock stepped a minute forward dates the grant %s in the future", time.Until(got))
	}
	if got := leaseStart(sent, nil, at(time.Second)); !got.Equal(sent) {
		t.Errorf("without the first time: %s after the send, want the send", got.Sub(sent))
	}
	if got := leaseStart(sent, at(time.Second), at(0)); !got.Equal(sent) {
		t.Errorf("a clock that went back: %s after the send, want the send", got.Sub(sent))
	}
}

// A runner that begins to stop while a wait's read is pending hands back
// what that read claims instead of starting it (or its stop ends the wait
// first): another runner runs it.
func TestStoppingRunnerHandsBackWhatItsWaitClaims(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			var mu sync.Mutex
			var owners []string
			stage := HandlerFunc(func(_ context.Context, run *Run) error {
				mu.Lock()
				defer mu.Unlock()
				owners = append(owners, run.Owner())
				return nil
			})
			e := newEnv(t, b.Client, Config{Prefix: "iw4", Partitions: 2, Jobs: []Job{clJob("sync", Stage{Name: "only", Handler: stage})}})
			a := startWatched(t, e, RunnerConfig{ID: "iw-a", Concurrency: 8, FetchBlock: 2 * time.Second})
			w := a.w
			waitFor(t, 5*time.Second, "both partitions waiting", func() bool { return w.partitionsWaiting() == 2 })
			a.cancel() // runner A stops; its wait (up to 2s) may still be pending in Redis
			clSubmit(t, e.reg, "a", "sync", SourceManual, "")
			if err := a.stopped(); err != nil {
				t.Fatal(err)
			}
			// The stop nudges its node wait, so the wait usually ends before
			// the submit; when the submit comes first, its read claims the
			// run and the stopping runner hands it back.
			if w.taken() > 1 {
				t.Fatalf("the stopping runner's waits took %d entries, want at most the one submitted", w.taken())
			}
			t.Logf("the stopping runner's wait took %d entries", w.taken())
			e.startRunner(RunnerConfig{ID: "iw-b"})
			e.waitStatus("a", "sync", 5*time.Second, StatusDone)
			mu.Lock()
			defer mu.Unlock()
			if len(owners) != 1 || !strings.HasPrefix(owners[0], "iw-b/") {
				t.Fatalf("the stage ran on %v, want once on runner iw-b", owners)
			}
		})
	}
}
