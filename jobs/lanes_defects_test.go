package jobs

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
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
	if callsScript(cmd, h.name) {
		h.once.Do(h.fn)
	}
}

// callsScript reports whether cmd calls the script called name (an EVALSHA
// of either build of it, or an FCALL of its function).
func callsScript(cmd redis.Cmder, name string) bool {
	args := cmd.Args()
	if len(args) < 2 {
		return false
	}
	verb, body := fmt.Sprint(args[0]), fmt.Sprint(args[1])
	script, _ := lua.ScriptOfFunction(body)
	return verb == "evalsha" && slices.Contains(scriptSHAs(name), body) || verb == "fcall" && script == name
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

// afterGrant is a go-redis hook that calls fn once, when the first reply
// of script name that grants a lease (claim.lua's grant, in a read's or a
// finish's reply) has come back, before the runner sees it.
type afterGrant struct {
	name string
	once sync.Once
	fn   func()
}

func (h *afterGrant) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *afterGrant) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.check(cmd)
		return err
	}
}
func (h *afterGrant) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			h.check(cmd)
		}
		return err
	}
}
func (h *afterGrant) check(cmd redis.Cmder) {
	args := cmd.Args()
	c, ok := cmd.(*redis.Cmd)
	if len(args) < 2 || !ok {
		return
	}
	verb, body := fmt.Sprint(args[0]), fmt.Sprint(args[1])
	script, _ := lua.ScriptOfFunction(body)
	if !(verb == "evalsha" && slices.Contains(scriptSHAs(h.name), body) || verb == "fcall" && script == h.name) {
		return
	}
	res, _ := c.Slice()
	for _, v := range res {
		if one, _ := v.([]any); len(one) == 1 && strings.HasPrefix(replyString(one[0]), string(claimGranted)+histSep) {
			h.once.Do(h.fn)
			return
		}
	}
}

// TestCancelJustAfterClaimActsAtOnce: a cancel that lands after Redis
// answered the read or finish that claimed a run, but before the runner
// registered the run for cancel messages, must stop the run at once, not
// at its first heartbeat (a third of the lease TTL: 10 s here).
func TestCancelJustAfterClaimActsAtOnce(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"read_next", "finish"} {
		for _, b := range redistest.Backends(t) {
			t.Run(path+"/"+b.Name, func(t *testing.T) {
				bg := context.Background()
				target := "u1"
				if path == "finish" {
					target = "u2" // claimed by u1's finish
				}
				stage := HandlerFunc(func(ctx context.Context, run *Run) error {
					if run.Subject() != target {
						return nil
					}
					<-ctx.Done()
					return context.Cause(ctx)
				})
				job := Job{Scope: "sync", Stages: []Stage{{Name: "pull", Handler: stage}}}
				admin := newEnv(t, b.Client, Config{Prefix: "cj", Partitions: 1, Jobs: []Job{job}})
				handled := make(chan string, 16)
				// The hook runs on the runner's goroutine: its answer comes
				// over a channel (Redis over TCP is no synchronization the
				// race detector sees).
				answers := make(chan CancelOutcome, 1)
				rc := redis.NewClient(b.Client.(*redis.Client).Options())
				t.Cleanup(func() { _ = rc.Close() })
				rc.AddHook(&afterGrant{name: path, fn: func() {
					answer, err := admin.reg.Cancel(bg, target, "sync")
					answers <- answer
					if err != nil {
						t.Error(err)
						return
					}
					// The runner has handled the message before it sees
					// the claim.
					for p := range handled {
						if strings.HasPrefix(p, target+"|sync ") {
							return
						}
					}
				}})
				e := newEnv(t, rc, Config{Prefix: "cj", Partitions: 1, Jobs: []Job{job}})
				clSubmit(t, e.reg, "u1", "sync", SourceManual, "")
				if path == "finish" {
					clSubmit(t, e.reg, "u2", "sync", SourceManual, "")
				}
				rn, err := NewRunner(e.reg, RunnerConfig{ID: "cj", Concurrency: 1, FetchBatch: 1, LeaseTTL: 30 * time.Second,
					FetchBlock: 50 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				rn.testHooks.cancelHandled = func(p string) { handled <- p }
				ctx, stop := context.WithCancel(bg)
				done := make(chan error, 1)
				go func() { done <- rn.Run(ctx) }()
				t.Cleanup(func() { stop(); <-done })
				v := e.waitStatus(target, "sync", 3*time.Second, StatusCancelled, StatusDone, StatusFailed)
				var answer CancelOutcome
				select {
				case answer = <-answers:
				default: // the hook never ran
				}
				if v.Status != StatusCancelled || answer != CancelCancelling {
					t.Errorf("%s|sync: %s, cancel answered %q; want cancelled at once after cancelling", target, v.Status, answer)
				}
			})
		}
	}
}

// TestUnmatchedCancelsAreBounded: the cancels remembered for runs not yet
// registered expire after the window and are capped in number.
func TestUnmatchedCancelsAreBounded(t *testing.T) {
	u := newUnmatchedCancels(time.Minute)
	u.max = 3
	t0 := time.Now()
	for i, id := range []string{"a", "b", "c", "d"} {
		u.add(id, t0.Add(time.Duration(i)*time.Second))
	}
	if u.has("a") || !u.has("b") || !u.has("d") || len(u.at) != 3 {
		t.Errorf("after 4 adds with a cap of 3: a %v b %v d %v, %d kept; want a forgotten, b and d kept, 3", u.has("a"), u.has("b"), u.has("d"), len(u.at))
	}
	u.add("e", t0.Add(2*time.Minute))
	if len(u.at) != 1 || len(u.order) != 1 {
		t.Errorf("%d kept (%d in order) after the window passed, want 1", len(u.at), len(u.order))
	}
	old := newUnmatchedCancels(time.Second)
	old.add("x", time.Now().Add(-2*time.Second))
	if old.has("x") {
		t.Error("a cancel older than the window still matches")
	}
}

// TestDrainLeavesALiveOlderRunnersEntry: an older runner of a rolling
// deploy holds a request of its stream with a 9 s lease, refreshing the
// entry every 3 s; the entry is idle past this runner's reclaim idle (1 s)
// but its holder is alive. The drain must leave it pending — stream and
// group kept, so the older runner's next heartbeat finds them — while it
// takes the entry of a runner that died (no lease left).
func TestDrainLeavesALiveOlderRunnersEntry(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			c := &counter{}
			e := newEnv(t, b.Client, Config{Prefix: "dl", Partitions: 1, Jobs: []Job{clJob("course_sync", Stage{Name: "pulling", Handler: c})}})
			clSubmit(t, e.reg, "live", "course_sync", SourceSchedule, "")
			clSubmit(t, e.reg, "dead", "course_sync", SourceSchedule, "")
			legacyQueue(t, b.Client, e.reg, 0)
			bulk := e.reg.ks.LegacyStream(0, keyspace.LaneBulk)
			read := func(consumer string) string {
				res, err := b.Client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: keyspace.LegacyGroup, Consumer: consumer,
					Streams: []string{bulk, ">"}, Count: 1}).Result()
				if err != nil || len(res) != 1 || len(res[0].Messages) != 1 {
					t.Fatalf("read by %s: %v %v", consumer, res, err)
				}
				return res[0].Messages[0].ID
			}
			liveID := read("old/live00")
			read("old/dead00")
			// The live holder's claim: the record running under its lease.
			k := taskkey.MustNew("live", "course_sync")
			if err := b.Client.HSet(ctx, e.reg.ks.Task(k), "status", "running", "owner", "old/live00", "token", "7", "attempt", "1").Err(); err != nil {
				t.Fatal(err)
			}
			if err := b.Client.Set(ctx, e.reg.ks.Lease(k), "7|old/live00", 9*time.Second).Err(); err != nil {
				t.Fatal(err)
			}
			b.Advance(1500 * time.Millisecond) // both entries idle past the new runner's reclaim idle, not the lease

			e.startRunner(RunnerConfig{ID: "dl-new", LeaseTTL: time.Second, ReclaimInterval: 20 * time.Millisecond})
			e.waitStatus("dead", "course_sync", 10*time.Second, StatusDone)
			pend, err := b.Client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: bulk, Group: keyspace.LegacyGroup,
				Start: "-", End: "+", Count: 10}).Result()
			if err != nil || len(pend) != 1 || pend[0].ID != liveID || pend[0].Consumer != "old/live00" {
				t.Fatalf("pending in the legacy stream: %v (%v); want only the live holder's entry %s, still its own", pend, err, liveID)
			}
			if n := c.get("live/pulling"); n != 0 {
				t.Errorf("the live holder's run ran %d times here, want 0", n)
			}
		})
	}
}
