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
	"github.com/tasklease/tasklease/taskkey"
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

// TestShardedPubSubOnCluster: on a Redis 7 Cluster views and cancels go
// over sharded pub/sub (DESIGN §2.7): a subscriber sees a run's views, a
// cancel stops a running stage at once (not at the next heartbeat), and
// each partition's channels are shard channels on the master of their slot
// only, not plain channels broadcast to every master.
func TestShardedPubSubOnCluster(t *testing.T) {
	cl := redistest.StartCluster(t)
	rdb := cl.Client(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := newGate()
	stopped := make(chan error, 1)
	blocking := HandlerFunc(func(ctx context.Context, run *Run) error {
		g.RunStage(ctx, run)
		<-ctx.Done()
		stopped <- context.Cause(ctx)
		return ctx.Err()
	})
	e := newEnv(t, rdb, Config{Prefix: "ps", Jobs: []Job{
		clJob("course_sync", Stage{Name: "pulling", Handler: &counter{}}),
		{Scope: "backup", Stages: []Stage{{Name: "dump", Handler: blocking}}},
	}})
	views, err := e.reg.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Heartbeats far apart: only the cancel message can stop the stage soon.
	e.startRunner(RunnerConfig{ID: "ps", Concurrency: 4, LeaseTTL: time.Minute})

	clSubmit(t, e.reg, "u1", "course_sync", SourceManual, "")
	deadline := time.After(20 * time.Second)
	for seen := false; !seen; {
		select {
		case v := <-views:
			seen = v.Key == "u1|course_sync" && v.Status == StatusDone
		case <-deadline:
			t.Fatal("no view of u1 done over sharded pub/sub")
		}
	}

	clSubmit(t, e.reg, "u2", "backup", SourceManual, "")
	waitFor(t, 20*time.Second, "the backup stage to start", func() bool { return g.count() == 1 })
	sent := time.Now()
	if _, err := e.reg.Cancel(ctx, "u2", "backup"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stopped:
		t.Logf("cancel reached the stage %s after it was sent", time.Since(sent).Round(time.Millisecond))
	case <-time.After(15 * time.Second): // a heartbeat (lease TTL 1 min) would take 20 s
		t.Fatal("the cancel message did not reach the runner")
	}
	if v := e.waitStatus("u2", "backup", 20*time.Second, StatusCancelled, StatusDone, StatusFailed); v.Status != StatusCancelled {
		t.Fatalf("u2: %s", v.Status)
	}

	// Where the channels are subscribed: as shard channels on the master
	// of their slot, and nowhere as plain channels.
	p := e.reg.ks.Partition(taskkey.MustNew("u2", "backup"))
	events, cancels := e.reg.ks.Events(p), e.reg.ks.Cancels(p)
	owner := ""
	var plain []string
	var mu sync.Mutex // ForEachMaster calls concurrently
	err = rdb.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		shard, err := node.PubSubShardChannels(ctx, "*").Result()
		if err != nil {
			return err
		}
		ch, err := node.PubSubChannels(ctx, "*").Result()
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		plain = append(plain, ch...)
		for _, c := range shard {
			if c == cancels || c == events {
				owner += node.Options().Addr + " "
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(plain) != 0 {
		t.Errorf("plain channels subscribed on the cluster: %v", plain)
	}
	slotOwner, err := rdb.MasterForKey(ctx, e.reg.ks.Task(taskkey.MustNew("u2", "backup")))
	if err != nil {
		t.Fatal(err)
	}
	if want := slotOwner.Options().Addr + " " + slotOwner.Options().Addr + " "; owner != want {
		t.Errorf("partition %d's shard channels subscribed on %q, want both on its slot's master %s", p, owner, slotOwner.Options().Addr)
	}
}
