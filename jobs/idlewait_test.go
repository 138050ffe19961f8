package jobs

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/redistest"
)

// idleWaits records what the fetchers' idle waits did (testHooks).
type idleWaits struct {
	mu      sync.Mutex
	waiting map[int]bool // partition → a wait started since the last reset
	carried map[int]int  // partition → waits that held a slot for their read
	took    int          // entries the reads sent with waits took
}

func watchIdleWaits(rn *Runner) *idleWaits {
	w := &idleWaits{waiting: map[int]bool{}, carried: map[int]int{}}
	rn.testHooks.idleWait = func(p int, carried bool) {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.waiting[p] = true
		if carried {
			w.carried[p]++
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

// With a lease TTL under 6 × FetchBlock an idle wait holds no slot: a claim
// made by the read sent with it counts its lease from before the wait.
func TestIdleWaitHoldsNoSlotWhenLeasesAreShort(t *testing.T) {
	t.Parallel()
	m := redistest.StartMini(t)
	c := &counter{}
	e := newEnv(t, m.Client(t), Config{Prefix: "iw3", Partitions: 2, Jobs: []Job{clJob("sync", Stage{Name: "only", Handler: c})}})
	w := startWatched(t, e, RunnerConfig{ID: "iw", Concurrency: 8, FetchBlock: 100 * time.Millisecond, LeaseTTL: 500 * time.Millisecond}).w
	waitFor(t, 5*time.Second, "both partitions waiting", func() bool { return w.partitionsWaiting() == 2 })
	clSubmit(t, e.reg, "a", "sync", SourceManual, "")
	e.waitStatus("a", "sync", 5*time.Second, StatusDone)
	if w.carriedAny() {
		t.Fatal("an idle wait held a slot with a 500ms lease and a 100ms FetchBlock")
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
