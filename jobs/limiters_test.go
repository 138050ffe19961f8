package jobs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/leasing"
)

// inFlight is a stage that counts the runs executing it at once, across
// jobs, and holds each for hold.
type inFlight struct {
	hold     time.Duration
	now, top atomic.Int64
	mu       sync.Mutex
	slots    map[string][]LimiterSlot // by key: the slots its run held
}

func (f *inFlight) RunStage(ctx context.Context, run *Run) error {
	n := f.now.Add(1)
	defer f.now.Add(-1)
	for {
		top := f.top.Load()
		if n <= top || f.top.CompareAndSwap(top, n) {
			break
		}
	}
	f.mu.Lock()
	if f.slots == nil {
		f.slots = map[string][]LimiterSlot{}
	}
	f.slots[run.Key().String()] = run.LimiterSlots()
	f.mu.Unlock()
	select {
	case <-time.After(f.hold): // the stage's work
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// A named limiter shared by two jobs caps their runs executing at once
// across runners; the runs over the limit stay queued with no attempt
// counted, say which limiter they wait for, and all run in the end.
func TestLimiterConcurrencyCap(t *testing.T) {
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			st := &inFlight{hold: 30 * time.Millisecond}
			job := func(scope string) Job {
				return Job{Scope: scope, Limiters: []string{"remote"}, Stages: []Stage{{Name: "push", Handler: st}}}
			}
			e := newEnv(t, b.Client, Config{Prefix: "limcap", Limiters: []Limiter{{Name: "remote", Concurrency: 3}},
				Jobs: []Job{job("sync_a"), job("sync_b")}})
			const keys = 24
			for i := range keys {
				scope := []string{"sync_a", "sync_b"}[i%2]
				if _, err := e.reg.Submit(ctx, fmt.Sprintf("u%d", i), scope, SubmitOptions{Source: SourceSchedule}); err != nil {
					t.Fatal(err)
				}
			}
			e.startRunner(RunnerConfig{ID: "r1", Concurrency: 8})
			e.startRunner(RunnerConfig{ID: "r2", Concurrency: 8})
			sawWaiting := false
			waitFor(t, 30*time.Second, "every run done", func() bool {
				done := 0
				for i := range keys {
					v, err := e.reg.Get(ctx, fmt.Sprintf("u%d", i), []string{"sync_a", "sync_b"}[i%2])
					if err != nil {
						t.Fatal(err)
					}
					if v.Status == StatusDone {
						done++
					}
					if v.Status == StatusQueued && strings.HasPrefix(v.Waiting, "limiter remote: ") {
						sawWaiting = true
						if v.Attempt != 0 {
							t.Errorf("%s waits for the limiter at attempt %d, want 0 (no attempt counted)", v.Key, v.Attempt)
						}
					}
				}
				return done == keys
			})
			if top := st.top.Load(); top != 3 {
				t.Errorf("at most %d runs executed at once, want exactly the limit 3", top)
			}
			if !sawWaiting {
				t.Error("no run was seen waiting for the limiter")
			}
			ls, err := e.reg.Limiters(ctx)
			if err != nil || len(ls) != 1 || ls[0].InUse != 0 || ls[0].Waiting != 0 || ls[0].Concurrency != 3 {
				t.Errorf("limiters after the runs: %+v %v", ls, err)
			}
			st.mu.Lock()
			defer st.mu.Unlock()
			for k, s := range st.slots {
				if len(s) != 1 || s[0].Limiter != "remote" || s[0].Slot < 0 || s[0].Slot > 2 || s[0].Token < 1 {
					t.Errorf("%s held slots %+v, want one of remote's 0..2", k, s)
				}
			}
		})
	}
}

// A runner that died between taking a slot and claiming its run (here: a
// slot taken through the script by an owner that never renews it) blocks
// the limiter only until the slot's TTL: the waiting run starts then.
func TestLimiterDeadHolderSlotFrees(t *testing.T) {
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			c := &counter{}
			e := newEnv(t, b.Client, Config{Prefix: "limdead", Jobs: []Job{{Scope: "sync", Concurrency: 1, LeaseTTL: 600 * time.Millisecond,
				Stages: []Stage{{Name: "push", Handler: c}}}}})
			d := e.reg.limiters[ownLimiterName("sync")]
			res, err := e.reg.scripts.limiterAcquire.Run(ctx, e.rdb, []string{d.key}, d.conf, "dead/abc", 600, 0, "", 0, 0, "ghost", "b", "", "").Slice()
			if err != nil {
				t.Fatal(err)
			}
			if one := res[0].([]any)[0].([]any); one[0] != "g" {
				t.Fatalf("the ghost's acquire: %v, want granted", one)
			}
			e.startRunner(RunnerConfig{ID: "r1", LeaseTTL: 600 * time.Millisecond})
			if _, err := e.reg.Submit(ctx, "u1", "sync", SubmitOptions{}); err != nil {
				t.Fatal(err)
			}
			v := e.waitStatus("u1", "sync", 5*time.Second, StatusQueued)
			waitFor(t, 5*time.Second, "u1 waiting for the limiter", func() bool {
				v, _ = e.reg.Get(ctx, "u1", "sync")
				return v.Waiting == "limiter job.sync: 1 of 1 in use" || v.Status == StatusDone
			})
			b.Advance(700 * time.Millisecond)
			e.waitStatus("u1", "sync", 10*time.Second, StatusDone)
			if n := c.get("u1/push"); n != 1 {
				t.Errorf("u1 ran %d times, want 1", n)
			}
		})
	}
}

// slotThief is a stage that blocks until its context ends and reports why.
type slotThief struct {
	started chan struct{}
	ended   chan error
}

func (s *slotThief) RunStage(ctx context.Context, run *Run) error {
	s.started <- struct{}{}
	<-ctx.Done()
	s.ended <- context.Cause(ctx)
	return ctx.Err()
}

// A run whose slot is no longer its own (expired and taken by another run)
// stops as on a lost lease at its next renewal: two runs must never hold
// one slot.
func TestLimiterSlotLostStopsTheStage(t *testing.T) {
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			st := &slotThief{started: make(chan struct{}, 4), ended: make(chan error, 4)}
			e := newEnv(t, b.Client, Config{Prefix: "limlost", Limiters: []Limiter{{Name: "remote", Concurrency: 1}},
				Jobs: []Job{{Scope: "sync", Limiters: []string{"remote"}, LeaseTTL: 900 * time.Millisecond,
					Retry: RetryPolicy{MaxAttempts: 1}, Stages: []Stage{{Name: "push", Handler: st}}}}})
			e.startRunner(RunnerConfig{ID: "r1", LeaseTTL: 900 * time.Millisecond})
			if _, err := e.reg.Submit(ctx, "u1", "sync", SubmitOptions{}); err != nil {
				t.Fatal(err)
			}
			<-st.started
			d := e.reg.limiters["remote"]
			if err := e.rdb.HSet(ctx, d.key+":holders", "0", "thief/x\x1f99\x1fh\x1fb\x1f\x1fother").Err(); err != nil {
				t.Fatal(err)
			}
			select {
			case cause := <-st.ended:
				if !errors.Is(cause, leasing.ErrLost) {
					t.Errorf("the stage stopped for %v, want the lease lost", cause)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the stage kept running after its slot was taken")
			}
		})
	}
}

// A limiter whose runs wait keeps starting them as runs end: each slot a
// finishing run gives back (in the acquire call of the next request its
// runner took) goes to the best waiting run. A regression test: the
// reason given to a request that waits took the slot given back in the
// same call, and the limiter stalled at its limit with every run waiting.
func TestLimiterDrainsWhileRunsWait(t *testing.T) {
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			st := &inFlight{hold: 2 * time.Millisecond}
			e := newEnv(t, b.Client, Config{Prefix: "limdrain", Jobs: []Job{{Scope: "sync", Concurrency: 5,
				Fairness: Fairness{GroupBy: FairnessSubjectPrefix}, Stages: []Stage{{Name: "push", Handler: st}}}}})
			subjects := make([]string, 300)
			for i := range subjects {
				subjects[i] = fmt.Sprintf("acme:u%d", i)
			}
			if _, err := e.reg.SubmitMany(ctx, "sync", subjects, SubmitManyOptions{Source: SourceSchedule}); err != nil {
				t.Fatal(err)
			}
			e.startRunner(RunnerConfig{ID: "r1", Concurrency: 20})
			waitFor(t, 60*time.Second, "every run done", func() bool {
				ls, err := e.reg.Limiters(ctx)
				if err != nil || len(ls) != 1 || ls[0].Waiting > 0 || ls[0].InUse > 0 {
					return false
				}
				for _, s := range subjects {
					if v, _ := e.reg.Get(ctx, s, "sync"); v.Status != StatusDone {
						return false
					}
				}
				return true
			})
			if top := st.top.Load(); top > 5 {
				t.Errorf("%d runs at once, want at most 5", top)
			}
		})
	}
}
