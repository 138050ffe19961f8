package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/redistest"
)

// TestSentinelFailoverMidRun: a primary, a replica and three Sentinels;
// the primary is killed while a run is in its first stage. The runner goes
// on through the failover (go-redis's failover client asks the Sentinels
// for the new primary): the run ends done within the failover time + the
// lease TTL + 2 s, no stage that finished before the kill runs again, and
// the registry answers as soon as the replica is promoted.
func TestSentinelFailoverMidRun(t *testing.T) {
	st := redistest.StartSentinel(t)
	rdb := st.Client(t)
	ctx := context.Background()
	const ttl = 3 * time.Second
	g := newGate()
	pulled, pushed := &counter{}, &counter{}
	e := newEnv(t, rdb, Config{Prefix: "sf", Jobs: []Job{{Scope: "course_sync", Retry: RetryPolicy{MaxAttempts: 5},
		Stages: []Stage{{Name: "pulling", Handler: pulled}, {Name: "waiting", Handler: g}, {Name: "pushing", Handler: pushed}}}}})
	e.startRunner(RunnerConfig{ID: "sf", LeaseTTL: ttl, ReclaimInterval: 200 * time.Millisecond})
	clSubmit(t, e.reg, "u1", "course_sync", SourceManual, "")
	waitFor(t, 20*time.Second, "stage waiting entered", func() bool { return g.count() == 1 })
	before, err := e.reg.Get(ctx, "u1", "course_sync")
	if err != nil {
		t.Fatal(err)
	}
	// Let the replica catch up with the run's state before the kill, as
	// min-replicas / WAIT would in production (asynchronous replication can
	// lose the last writes: README, Operations).
	waitReplicated(t, st.Primary.Addr(), "sf:replicated")

	old := st.Primary.Addr()
	killed := time.Now()
	st.Primary.Kill()
	var promoted time.Duration
	waitFor(t, 30*time.Second, "a Sentinel to promote the replica", func() bool {
		addr, err := st.MasterAddr(ctx)
		if err == nil && addr != old {
			promoted = time.Since(killed)
			return true
		}
		return false
	})
	// Until every Sentinel and connection has moved on, a call may still be
	// dialled to the dead primary: count the calls that fail after the
	// first one that succeeds again.
	var answering, lastErrAt time.Duration
	var failedAfter int
	g.open()
	var v TaskView
	waitFor(t, promoted+ttl+2*time.Second+10*time.Second, "the run to end", func() bool {
		got, err := e.reg.Get(ctx, "u1", "course_sync")
		switch {
		case err != nil && answering > 0:
			failedAfter++
			lastErrAt = time.Since(killed)
			return false
		case err != nil:
			return false
		case answering == 0:
			answering = time.Since(killed)
		}
		v = got
		return v.Status == StatusDone || v.Status == StatusFailed || v.Status == StatusCancelled
	})
	took := time.Since(killed)
	t.Logf("primary killed: replica promoted after %s, registry answering after %s (%d calls failed after that, the last %s after the kill), run %s after %s (token %d → %d, attempt %d)",
		promoted.Round(time.Millisecond), answering.Round(time.Millisecond), failedAfter, lastErrAt.Round(time.Millisecond),
		v.Status, took.Round(time.Millisecond), before.FencingToken, v.FencingToken, v.Attempt)
	if v.Status != StatusDone {
		t.Fatalf("status %s (%s), want done", v.Status, v.LastError)
	}
	if bound := promoted + ttl + 2*time.Second; took > bound {
		t.Errorf("run done %s after the kill, want within failover %s + lease TTL %s + 2 s", took, promoted, ttl)
	}
	if answering > promoted+2*time.Second || lastErrAt > promoted+2*time.Second {
		t.Errorf("registry answered %s after the kill and failed until %s; the replica was promoted after %s", answering, lastErrAt, promoted)
	}
	if v.FencingToken < before.FencingToken {
		t.Errorf("token went back from %d to %d across the failover", before.FencingToken, v.FencingToken)
	}
	if n := pulled.get("u1/pulling"); n != 1 {
		t.Errorf("pulling, done before the kill, ran %d times, want 1", n)
	}
	if n := pushed.get("u1/pushing"); n != 1 {
		t.Errorf("pushing ran %d times, want 1", n)
	}
}
