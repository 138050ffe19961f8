package jobs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/taskkey"
)

// TestLimiterSlotTokensMonotonicWhenRedisRestartsEmpty: a limiter slot's
// token "grows with every holder" (docs/flow-control.md), and a fencing
// downstream refuses a write whose slot token is below the highest it
// accepted for that slot. Redis restarts without its data after three
// runs have held slot 0: the next holder of slot 0 must get a token above
// theirs, as a key's fencing token does (TestTokensMonotonicWhenRedisRestartsEmpty),
// or the downstream refuses every write of the limiter's jobs until the
// counter catches up — and a token handed out again may let two holders
// of one slot through at once.
//
// Found by the chaos soak's limited job (go run ./cmd/chaos --topology
// single): after its redisRestartEmpty, every write of the limited job
// was refused by the slot fence ("remote:0:1" after token 115 of remote).
// It fails today: lim_take (lua/lib/limiters.lua) draws the token with
// HINCRBY on the limiter's hash, which the restart lost.
func TestLimiterSlotTokensMonotonicWhenRedisRestartsEmpty(t *testing.T) {
	s := redistest.StartServer(t)
	rdb := s.Client(t)
	ctx := context.Background()
	slots := make(chan []LimiterSlot, 8)
	h := HandlerFunc(func(ctx context.Context, run *Run) error {
		slots <- run.LimiterSlots()
		return nil
	})
	e := newEnv(t, rdb, Config{Prefix: "limdl", Limiters: []Limiter{{Name: "remote", Concurrency: 1}},
		Jobs: []Job{{Scope: "sync", Limiters: []string{"remote"}, Stages: []Stage{{Name: "push", Handler: h}}}}})
	e.startRunner(RunnerConfig{ID: "limdl", LeaseTTL: time.Second})
	var before int64
	for i := range 3 {
		clSubmit(t, e.reg, "u1", "sync", SourceManual, "")
		got := clRecv(t, slots, 10*time.Second, "a run to start")
		if len(got) != 1 || got[0].Slot != 0 {
			t.Fatalf("run %d held %v, want slot 0 of remote", i+1, got)
		}
		before = max(before, got[0].Token)
		waitFor(t, 10*time.Second, "the run to end", func() bool {
			v, err := e.reg.Get(ctx, "u1", "sync")
			return err == nil && !v.Status.Active()
		})
	}

	s.Kill()
	s.Restart(t)
	waitFor(t, 10*time.Second, "Redis to answer after the restart", func() bool { return rdb.Ping(ctx).Err() == nil })
	// The submit may meet the runner's connections still reconnecting.
	waitFor(t, 10*time.Second, "a submit after the restart", func() bool {
		_, err := e.reg.Submit(ctx, "u1", "sync", SubmitOptions{Source: SourceManual})
		return err == nil
	})
	after := clRecv(t, slots, 20*time.Second, "a run to start after the restart")
	if len(after) != 1 || after[0].Slot != 0 {
		t.Fatalf("the run after the restart held %v, want slot 0 of remote", after)
	}
	if after[0].Token <= before {
		t.Fatalf("slot 0 of remote: token %d after Redis lost its data, want above %d, the highest before it: a fencing downstream refuses this holder", after[0].Token, before)
	}
}

// TestLimiterWaitedRunTakenOverWithinTheLeaseTTL: a run of a limited job
// that waited in its limiter, and whose holder dies right after the claim
// (before its first heartbeat), is taken over by another runner within
// its lease TTL and a reclaim, as any run whose holder died is
// (docs/flow-control.md: "the limiter is back ... within the lease TTL").
//
// Found by the chaos soak's limited job (go run ./cmd/chaos --topology
// sentinel and cluster): runs stayed "running" with no holder for the
// whole 45 s drain, their taken entries "reclaimable in 160–198 s", the
// limiter free with nobody waiting. It fails today: limiter_wait.lua
// scores a waiting run's taken entry limiterRecheck (5 min) ahead; the
// claim that follows the limiter's reservation keeps that score (claim.lua
// leaves it "as the read scored it: the holder's heartbeat moves it on"),
// so a holder that never heartbeats leaves the run to the 5-minute
// recheck.
func TestLimiterWaitedRunTakenOverWithinTheLeaseTTL(t *testing.T) {
	s := redistest.StartServer(t)
	ctx := context.Background()
	cut := &clPartition{}
	clientA := redis.NewClient(&redis.Options{Addr: s.Addr()})
	clientA.AddHook(cut)
	t.Cleanup(func() { _ = clientA.Close() })
	const ttl = time.Second
	release, hang := make(chan struct{}), make(chan struct{})
	entered := make(chan string, 4)
	h := HandlerFunc(func(ctx context.Context, run *Run) error {
		entered <- run.Subject() + " " + run.Owner()
		switch run.Subject() {
		case "u1":
			<-release // holds the only slot until the test lets it go
		case "u2":
			if run.Attempt() == 1 {
				<-hang // a hung holder: ignores its context
			}
		}
		return nil
	})
	cfg := func() Config {
		return Config{Prefix: "limwait", Limiters: []Limiter{{Name: "remote", Concurrency: 1}},
			Jobs: []Job{{Scope: "sync", Limiters: []string{"remote"}, Stages: []Stage{{Name: "push", Handler: h}}}}}
	}
	envA := newEnv(t, clientA, cfg())
	envB := newEnv(t, s.Client(t), cfg())
	_, _ = envA.startRunner(RunnerConfig{ID: "pod-a", LeaseTTL: ttl})
	t.Cleanup(func() { close(hang) })

	clSubmit(t, envA.reg, "u1", "sync", SourceManual, "")
	clRecv(t, entered, 10*time.Second, "u1 to start")
	clSubmit(t, envA.reg, "u2", "sync", SourceManual, "")
	waitFor(t, 10*time.Second, "u2 to wait for the limiter", func() bool {
		v, err := envB.reg.Get(ctx, "u2", "sync")
		return err == nil && v.Status == StatusQueued && v.Waiting == "limiter remote: 1 of 1 in use"
	})
	// u1 ends: pod-a frees the slot and runs u2, the waiting run, itself.
	close(release)
	if got := clRecv(t, entered, 10*time.Second, "u2 to start on pod-a"); got[:2] != "u2" {
		t.Fatalf("%s started, want u2", got)
	}
	cut.down.Store(true) // pod-a is gone for Redis before its first heartbeat
	// Where its entry is: a run read from a lane is reclaimable a lease
	// TTL after the read (the holder's heartbeat moves it on).
	rdb := envB.rdb
	p := envB.reg.ks.Partition(taskkey.MustNew("u2", "sync"))
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	reclaimIn := time.Duration(-1)
	zs, err := rdb.ZRangeWithScores(ctx, envB.reg.ks.Taken(p), 0, -1).Result()
	for _, z := range zs {
		if e, _ := z.Member.(string); strings.Contains(e, "u2|sync") {
			reclaimIn = time.Duration(int64(z.Score)-now.UnixMilli()) * time.Millisecond
		}
	}

	_, _ = envB.startRunner(RunnerConfig{ID: "pod-b", LeaseTTL: ttl, ReclaimInterval: 50 * time.Millisecond})
	deadline := time.Now().Add(10 * ttl)
	var v TaskView
	for time.Now().Before(deadline) {
		if v, err = envB.reg.Get(ctx, "u2", "sync"); err == nil && !v.Status.Active() {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if v.Status != StatusDone {
		t.Fatalf("u2 is %s (last error %q) %v after its holder died right after the claim, want done: taken over within a few lease TTLs (%v); its taken entry was reclaimable in %v (err %v)",
			v.Status, v.LastError, 10*ttl, ttl, reclaimIn, err)
	}
}

// failScript fails the first call of script name once armed: before it
// reaches Redis, or (applied) after, its reply lost.
type failScript struct {
	name    string
	applied bool
	armed   atomic.Bool
	fired   atomic.Int32
}

func (h *failScript) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *failScript) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return h.run(ctx, []redis.Cmder{cmd}, func(ctx context.Context) error { return next(ctx, cmd) })
	}
}
func (h *failScript) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		return h.run(ctx, cmds, func(ctx context.Context) error { return next(ctx, cmds) })
	}
}
func (h *failScript) run(ctx context.Context, cmds []redis.Cmder, next func(context.Context) error) error {
	hit := false
	for _, cmd := range cmds {
		hit = hit || callsScript(cmd, h.name)
	}
	if !hit || !h.armed.CompareAndSwap(true, false) {
		return next(ctx)
	}
	h.fired.Add(1)
	err := errors.New("failScript: connection reset (injected)")
	if h.applied {
		_ = next(ctx)
	}
	for _, cmd := range cmds {
		cmd.SetErr(err)
	}
	return err
}

// TestLimiterReservedRunStartsWhenItsReservationFails: a run waiting in a
// limiter, reserved a freed slot by a runner whose next call about it
// fails — its claim (the partition's node failed over, the reply was
// lost) or the release that reserved it (the reply was lost) — starts
// within seconds: its request waits again first in line, or its
// reservation expires back into line, or its entry is reclaimed; not
// after limiterRecheck (5 min), its entry's score while it waits.
//
// Found by the chaos run on Cluster with network faults (go run ./cmd/chaos
// --topology cluster --net-faults all, seed 1796674017618113267): six
// limited keys "still queued ... 1m30s after the faults stopped", waiting
// "limiter remote: 5 of 5 in use" with the limiter free and nobody waiting
// in it, their entries "reclaimable in 192 s". The claim case fails
// without limiter_release's 'w' (waitAgain): the failed claim gave the
// slot back as for a claim not granted, and the run was in neither the
// limiter nor a lane. The release case fails without lim_unreserve and
// pumpAfterLostReply: the expired reservation's waiter was found only by
// an acquire once every other slot was taken.
func TestLimiterReservedRunStartsWhenItsReservationFails(t *testing.T) {
	for _, tc := range []struct {
		script  string
		applied bool
	}{{"claim", false}, {"claim", true}, {"limiter_release", true}} {
		t.Run(fmt.Sprintf("%s/applied=%v", tc.script, tc.applied), func(t *testing.T) {
			s := redistest.StartServer(t)
			ctx := context.Background()
			fail := &failScript{name: tc.script, applied: tc.applied}
			client := redis.NewClient(&redis.Options{Addr: s.Addr()})
			client.AddHook(fail)
			t.Cleanup(func() { _ = client.Close() })
			release := make(chan struct{})
			entered := make(chan string, 8)
			h := HandlerFunc(func(ctx context.Context, run *Run) error {
				entered <- run.Subject()
				if run.Subject() == "u1" {
					<-release // holds the only slot until the test lets it go
				}
				return nil
			})
			e := newEnv(t, client, Config{Prefix: "limagain", Limiters: []Limiter{{Name: "remote", Concurrency: 1}},
				Jobs: []Job{{Scope: "sync", Limiters: []string{"remote"}, Stages: []Stage{{Name: "push", Handler: h}}}}})
			e.startRunner(RunnerConfig{ID: "pod-a", LeaseTTL: time.Second})

			clSubmit(t, e.reg, "u1", "sync", SourceManual, "")
			clRecv(t, entered, 10*time.Second, "u1 to start")
			clSubmit(t, e.reg, "u2", "sync", SourceManual, "")
			waitFor(t, 10*time.Second, "u2 to wait for the limiter", func() bool {
				v, err := e.reg.Get(ctx, "u2", "sync")
				return err == nil && v.Status == StatusQueued && v.Waiting == "limiter remote: 1 of 1 in use"
			})
			fail.armed.Store(true) // the call that reserves u2 the slot u1 frees, or u2's claim, fails
			close(release)
			start := time.Now()
			const within = 20 * time.Second // limiterRecheck is 5 min
			var v TaskView
			var err error
			for time.Since(start) < within {
				if v, err = e.reg.Get(ctx, "u2", "sync"); err == nil && v.Status == StatusDone {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if fail.fired.Load() != 1 {
				t.Fatalf("%s failed %d times, want once: the test did not reach the reserved run", tc.script, fail.fired.Load())
			}
			if v.Status != StatusDone {
				t.Fatalf("u2 is %s (waiting %q, err %v) %v after %s about its reservation failed, want done", v.Status, v.Waiting, err, within, tc.script)
			}
			t.Logf("u2 done %v after u1 ended", time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestLimiterSlotTokensAboveAfterDataLossAndALaggingClock: a limiter's
// slot tokens keep growing when Redis loses the limiter and its clock is
// an hour behind the clock that issued them (lagAndLose): the acquire and
// the pump carry the runner's token floor (lim_open). It fails with
// lim_open's floor removed: the next holder of slot 0 gets a token an
// hour below, and a downstream fencing by slot refuses all its writes.
func TestLimiterSlotTokensAboveAfterDataLossAndALaggingClock(t *testing.T) {
	t.Parallel()
	clk := redistest.NewClock(t)
	srv := redistest.StartServerWithClock(t, clk)
	slots := make(chan []LimiterSlot, 8)
	h := HandlerFunc(func(ctx context.Context, run *Run) error {
		slots <- run.LimiterSlots()
		return nil
	})
	e := newEnv(t, srv.Client(t), Config{Prefix: "limlag", Partitions: 1, Limiters: []Limiter{{Name: "remote", Concurrency: 1}},
		Jobs: []Job{{Scope: "sync", Limiters: []string{"remote"}, Stages: []Stage{{Name: "push", Handler: h}}}}})
	e.startRunner(RunnerConfig{ID: "limlag", LeaseTTL: 10 * time.Second})
	clSubmit(t, e.reg, "u1", "sync", SourceManual, "")
	before := clRecv(t, slots, 10*time.Second, "a run to start")
	e.waitStatus("u1", "sync", 10*time.Second, StatusDone)

	lagAndLose(t, clk, e.rdb)
	clSubmit(t, e.reg, "u1", "sync", SourceManual, "")
	after := clRecv(t, slots, 10*time.Second, "a run to start after the loss")
	if len(before) != 1 || len(after) != 1 || after[0].Slot != before[0].Slot {
		t.Fatalf("slots %v then %v, want slot 0 of remote both times", before, after)
	}
	if after[0].Token <= before[0].Token {
		t.Fatalf("slot 0 of remote: token %d after the loss, below %d before it (%s): a fencing downstream refuses this holder",
			after[0].Token, before[0].Token, time.Duration(before[0].Token-after[0].Token)*time.Microsecond)
	}
}
