package jobs

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/redistest"
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
