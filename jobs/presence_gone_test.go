package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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

// TestBeatUpkeepOncePerInterval: a beat drops the records of runners gone
// longer than the keep time only on the runner's first beat and then once
// per presenceUpkeepEvery; the beats between are the record and its time.
func TestBeatUpkeepOncePerInterval(t *testing.T) {
	t.Parallel()
	mini := redistest.StartMini(t)
	rdb := mini.Client(t)
	ctx := context.Background()
	e := newEnv(t, rdb, Config{Prefix: "ru", Partitions: 1, Jobs: []Job{clJob("quick", Stage{Name: "only", Handler: &counter{}})}})
	rn, err := NewRunner(e.reg, RunnerConfig{ID: "pod-u", Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	ks := e.reg.ks
	gone := func(owner string) {
		t.Helper()
		if err := rdb.HSet(ctx, ks.Runners(), owner, `{}`).Err(); err != nil {
			t.Fatal(err)
		}
		// last beat two keep times ago (Redis time)
		old := float64(mini.Now().Add(-2 * presenceKeep).UnixMilli())
		if err := rdb.ZAdd(ctx, ks.RunnerBeats(), redis.Z{Score: old, Member: owner}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	listed := func(owner string) bool {
		t.Helper()
		ok, err := rdb.HExists(ctx, ks.Runners(), owner).Result()
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	gone("old-1")
	if err := rn.beat(ctx); err != nil {
		t.Fatal(err)
	}
	if listed("old-1") {
		t.Fatal("the first beat kept a runner gone longer than the keep time")
	}
	gone("old-2")
	if err := rn.beat(ctx); err != nil {
		t.Fatal(err)
	}
	if !listed("old-2") {
		t.Fatal("a beat within presenceUpkeepEvery of the last upkeep did the upkeep again")
	}
	rn.presence.mu.Lock()
	rn.presence.upkeepAt = rn.presence.upkeepAt.Add(-presenceUpkeepEvery)
	rn.presence.mu.Unlock()
	if err := rn.beat(ctx); err != nil {
		t.Fatal(err)
	}
	if listed("old-2") {
		t.Fatal("the beat presenceUpkeepEvery after the last upkeep kept a gone runner")
	}
}
