package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/redistest"
)

// TestGoneRunnerHoldsNothing: a runner killed with runs active (no stop
// recorded, its refreshes just end) is listed gone with no active runs —
// its leases expire and others recover the runs; its last report is not
// what it holds now.
func TestGoneRunnerHoldsNothing(t *testing.T) {
	t.Parallel()
	mini := redistest.StartMini(t)
	rdb := mini.Client(t)
	ctx := context.Background()
	e := newEnv(t, rdb, Config{Prefix: "rg", Partitions: 1, Jobs: []Job{clJob("quick", Stage{Name: "only", Handler: &counter{}})}})
	rn, err := NewRunner(e.reg, RunnerConfig{ID: "pod-k", Concurrency: 16, PresenceInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// One run claimed here at the last refresh, as the runner records it.
	cancel := context.CancelCauseFunc(func(error) {})
	rn.mu.Lock()
	rn.active["u1|quick run-1"] = map[*context.CancelCauseFunc]struct{}{&cancel: {}}
	rn.mu.Unlock()
	if err := rn.beat(ctx); err != nil {
		t.Fatal(err)
	}
	infos, err := e.reg.Runners(ctx)
	if err != nil || len(infos) != 1 || !infos[0].Alive || infos[0].Active != 1 {
		t.Fatalf("alive with one run: %+v %v", infos, err)
	}
	mini.Advance(3*time.Second + 100*time.Millisecond) // three refreshes missed: SIGKILLed
	infos, err = e.reg.Runners(ctx)
	if err != nil || len(infos) != 1 || infos[0].Alive {
		t.Fatalf("after missed refreshes: %+v %v, want gone", infos, err)
	}
	if infos[0].Active != 0 {
		t.Fatalf("gone runner listed with %d/%d active, want 0: a gone runner holds nothing", infos[0].Active, infos[0].Concurrency)
	}
}
