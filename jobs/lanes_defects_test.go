package jobs

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/lua"
	"github.com/tasklease/tasklease/taskkey"
)

// TestReadOfAnUnknownJobBurnsNothing: during a rolling deploy an older
// runner defines only sync; one read takes a person's request for u1|sync
// (maxAttempts 1) and then one for a1|alien. u1 must run once and end
// done — the read must not raise after granting it — and a1 must be left,
// queued and saying why, to a runner that defines alien, which then runs
// it.
func TestReadOfAnUnknownJobBurnsNothing(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			c := &counter{}
			syncJob := Job{Scope: "sync", Stages: []Stage{{Name: "pull", Handler: c}}, Retry: RetryPolicy{MaxAttempts: 1}}
			alien := Job{Scope: "alien", Stages: []Stage{{Name: "probe", Handler: c}}}
			newer := newEnv(t, b.Client, Config{Prefix: "ud", Partitions: 1, Jobs: []Job{syncJob, alien}})
			older := newEnv(t, b.Client, Config{Prefix: "ud", Partitions: 1, Jobs: []Job{syncJob}})
			clSubmit(t, newer.reg, "u1", "sync", SourceManual, "")
			clSubmit(t, newer.reg, "a1", "alien", SourceManual, "")

			old, _ := older.startRunner(RunnerConfig{ID: "ud-old", LeaseTTL: time.Second})
			v := older.waitStatus("u1", "sync", 10*time.Second, StatusDone, StatusFailed)
			if v.Status != StatusDone || c.get("u1/pull") != 1 {
				t.Fatalf("u1|sync: %s (%s), stage ran %d times; want done, run once", v.Status, v.LastError, c.get("u1/pull"))
			}
			a := newer.waitStatus("a1", "alien", 5*time.Second, StatusQueued)
			want := "waiting for a runner that defines this job (" + old.Owner() + " does not)"
			if a.Waiting != want || c.get("a1/probe") != 0 {
				t.Errorf("a1|alien: waiting %q, probe ran %d times; want %q, never run", a.Waiting, c.get("a1/probe"), want)
			}

			// The newer runner serves it once it comes up.
			newer.startRunner(RunnerConfig{ID: "ud-new", LeaseTTL: time.Second, ReclaimInterval: 20 * time.Millisecond})
			if v := newer.waitStatus("a1", "alien", 10*time.Second, StatusDone, StatusFailed); v.Status != StatusDone {
				t.Errorf("a1|alien: %s (%s), want done", v.Status, v.LastError)
			}
			if n := c.get("a1/probe"); n != 1 {
				t.Errorf("a1|alien: probe ran %d times, want 1", n)
			}
		})
	}
}

// beforeScript is a go-redis hook that calls fn once, just before the
// first call of script name is sent (EVALSHA of its hash, or FCALL of its
// function in the library).
type beforeScript struct {
	name string
	once sync.Once
	fn   func()
}

func (h *beforeScript) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *beforeScript) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.check(cmd)
		}
		return next(ctx, cmds)
	}
}
func (h *beforeScript) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.check(cmd)
		return next(ctx, cmd)
	}
}
func (h *beforeScript) check(cmd redis.Cmder) {
	args := cmd.Args()
	if len(args) < 2 {
		return
	}
	verb, body := fmt.Sprint(args[0]), fmt.Sprint(args[1])
	script, _ := lua.ScriptOfFunction(body)
	if verb == "evalsha" && body == lua.MustScript(h.name).Hash() || verb == "fcall" && script == h.name {
		h.once.Do(h.fn)
	}
}

// TestClaimInFlightAtShutdownIsHandedBack: the reclaimer's claim is in
// flight when the runner is told to stop. Redis grants it; the runner must
// hand the run back (lease released, run re-queued) instead of dropping
// it with its lease held, so another runner runs it at once — not after
// the lease expired, as a crashed attempt (maxAttempts 1: failed).
func TestClaimInFlightAtShutdownIsHandedBack(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			bg := context.Background()
			c := &counter{}
			job := Job{Scope: "sync", Stages: []Stage{{Name: "pull", Handler: c}}, Retry: RetryPolicy{MaxAttempts: 1}}
			ctx, stop := context.WithCancel(bg)
			defer stop()
			rc := redis.NewClient(b.Client.(*redis.Client).Options())
			t.Cleanup(func() { _ = rc.Close() })
			rc.AddHook(&beforeScript{name: "claim", fn: stop})
			e := newEnv(t, rc, Config{Prefix: "sd", Partitions: 1, Jobs: []Job{job}})
			clSubmit(t, e.reg, "u1", "sync", SourceManual, "")
			// A runner read it and died before claiming it; its entry is due.
			es := takeEntries(t, e.reg, 0, 1)
			if len(es) != 1 {
				t.Fatalf("took %d entries, want 1", len(es))
			}
			if err := b.Client.ZAdd(bg, e.reg.ks.Taken(0), redis.Z{Score: 0, Member: es[0].id}).Err(); err != nil {
				t.Fatal(err)
			}

			// Loaded, so that the call the hook sees is the one that runs
			// (a NOSCRIPT answer is sent again, and not once stopping).
			if err := e.reg.scripts.claim.Load(bg, b.Client).Err(); err != nil {
				t.Fatal(err)
			}
			rn, err := NewRunner(e.reg, RunnerConfig{ID: "sd-old", LeaseTTL: time.Second, FetchBlock: 50 * time.Millisecond,
				ReclaimInterval: 20 * time.Millisecond, ShutdownGrace: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- rn.Run(ctx) }()
			if err := clRecv(t, done, 10*time.Second, "the runner's shutdown"); err != nil {
				t.Fatal(err)
			}
			k := taskkey.MustNew("u1", "sync")
			if n := b.Client.Exists(bg, e.reg.ks.Lease(k)).Val(); n != 0 {
				t.Errorf("the stopped runner left u1's lease held (%q)", b.Client.Get(bg, e.reg.ks.Lease(k)).Val())
			}

			next := newEnv(t, b.Client, Config{Prefix: "sd", Partitions: 1, Jobs: []Job{job}})
			next.startRunner(RunnerConfig{ID: "sd-new", LeaseTTL: time.Second, ReclaimInterval: 20 * time.Millisecond})
			v := next.waitStatus("u1", "sync", 10*time.Second, StatusDone, StatusFailed)
			if v.Status != StatusDone || c.get("u1/pull") != 1 {
				t.Errorf("u1|sync: %s (%s), stage ran %d times; want done, run once", v.Status, v.LastError, c.get("u1/pull"))
			}
		})
	}
}

// TestClaimOfNextRunInFlightAtGraceEndIsHandedBack: the same on the path
// where a finish took its slot's next entry (another job's, so the finish
// did not claim it) and the runner claims it: the shutdown grace ends
// while that claim is in flight.
func TestClaimOfNextRunInFlightAtGraceEndIsHandedBack(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			bg := context.Background()
			c := &counter{}
			jobs := []Job{
				{Scope: "sync", Stages: []Stage{{Name: "pull", Handler: c}}, Retry: RetryPolicy{MaxAttempts: 1}},
				{Scope: "other", Stages: []Stage{{Name: "push", Handler: c}}, Retry: RetryPolicy{MaxAttempts: 1}},
			}
			ctx, stop := context.WithCancel(bg)
			defer stop()
			var rn *Runner
			rc := redis.NewClient(b.Client.(*redis.Client).Options())
			t.Cleanup(func() { _ = rc.Close() })
			rc.AddHook(&beforeScript{name: "claim", fn: func() {
				stop()
				<-rn.workCtx.Done() // the grace is over
			}})
			e := newEnv(t, rc, Config{Prefix: "sn", Partitions: 1, Jobs: jobs})
			clSubmit(t, e.reg, "u1", "sync", SourceManual, "")
			clSubmit(t, e.reg, "u2", "other", SourceManual, "")
			if err := e.reg.scripts.claim.Load(bg, b.Client).Err(); err != nil {
				t.Fatal(err)
			}
			var err error
			rn, err = NewRunner(e.reg, RunnerConfig{ID: "sn-old", Concurrency: 1, FetchBatch: 1, LeaseTTL: time.Second,
				FetchBlock: 50 * time.Millisecond, ShutdownGrace: 10 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- rn.Run(ctx) }()
			if err := clRecv(t, done, 10*time.Second, "the runner's shutdown"); err != nil {
				t.Fatal(err)
			}
			k := taskkey.MustNew("u2", "other")
			if n := b.Client.Exists(bg, e.reg.ks.Lease(k)).Val(); n != 0 {
				t.Errorf("the stopped runner left u2's lease held (%q)", b.Client.Get(bg, e.reg.ks.Lease(k)).Val())
			}

			next := newEnv(t, b.Client, Config{Prefix: "sn", Partitions: 1, Jobs: jobs})
			next.startRunner(RunnerConfig{ID: "sn-new", LeaseTTL: time.Second, ReclaimInterval: 20 * time.Millisecond})
			v := next.waitStatus("u2", "other", 10*time.Second, StatusDone, StatusFailed)
			if v.Status != StatusDone || c.get("u2/push") != 1 {
				t.Errorf("u2|other: %s (%s), stage ran %d times; want done, run once", v.Status, v.LastError, c.get("u2/push"))
			}
		})
	}
}
