package jobs

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/redistest"
)

// TestEngineOnCluster runs the engine's scripts — combined submits (new
// runs, joins, a promotion), multi-entry claims, advances, finishes that
// read the next entry, history — on a 3-master Redis Cluster, through the
// group-commit pipelines: no CROSSSLOT or other error, every run done with
// its history, and the work spread over every master (DESIGN §2.7).
func TestEngineOnCluster(t *testing.T) {
	cl := redistest.StartCluster(t)
	rdb := cl.Client(t)
	ctx := context.Background()
	c := &counter{}
	e := newEnv(t, rdb, Config{Prefix: "cl", Jobs: []Job{clJob("course_sync",
		Stage{Name: "pulling", Handler: c}, Stage{Name: "pushing", Handler: c})}})
	const n = 200
	// Queued before any runner: half of them bulk, half people.
	var wg sync.WaitGroup
	for i := range n {
		src := []Source{SourceSchedule, SourceManual}[i%2]
		wg.Go(func() {
			if _, err := e.reg.Submit(ctx, fmt.Sprintf("u%d", i), "course_sync", SubmitOptions{Source: src}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	// Joins (repeats, and a person's join that promotes a bulk run).
	for i := range 20 {
		for _, src := range []Source{SourceSchedule, SourceForeground} {
			r, err := e.reg.Submit(ctx, fmt.Sprintf("u%d", i), "course_sync", SubmitOptions{Source: src})
			if err != nil || r.Outcome != OutcomeJoined {
				t.Fatalf("join u%d from %s: %v %v", i, src, r.Outcome, err)
			}
		}
	}
	e.startRunner(RunnerConfig{ID: "cl", Concurrency: 16})
	for i := range n {
		if v := e.waitStatus(fmt.Sprintf("u%d", i), "course_sync", 30*time.Second, StatusDone, StatusFailed, StatusCancelled); v.Status != StatusDone {
			t.Fatalf("u%d: %s (%s)", i, v.Status, v.LastError)
		}
	}
	if got := c.get("u0/pushing"); got != 1 {
		t.Errorf("u0 pushing ran %d times, want 1", got)
	}
	evs := clHistory(t, e.reg, "u0", "course_sync")
	if clRequests(evs, "requested") != 1 || clRequests(evs, "joined") != 2 || clCount(evs, "done") != 1 {
		t.Errorf("u0 history %v, want one request, two joins, done", clEventNames(evs))
	}
	var masters atomic.Int64 // ForEachMaster calls concurrently
	err := rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		n, err := m.DBSize(ctx).Result()
		if err == nil && n > 0 {
			masters.Add(1)
		}
		return err
	})
	if err != nil || masters.Load() != 3 {
		t.Fatalf("work on %d masters (%v), want 3", masters.Load(), err)
	}
}
