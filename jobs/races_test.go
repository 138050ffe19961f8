package jobs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/lua"
	"github.com/tasklease/tasklease/taskkey"
)

// Tests of issue 4/8 defects 5–8: cancel or replace racing a failing
// attempt, follow-ups and rolling deploys, a stage finishing just after the
// shutdown grace, and cancel messages matched by run.

// beforeFinish is a go-redis hook that calls fn once, just before the
// first finish.lua call is sent: the moment a cancel or replace can land
// after the runner decided how the attempt ends but before it is recorded.
type beforeFinish struct {
	shas []string
	once sync.Once
	fn   func()
}

func (h *beforeFinish) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessPipelineHook: finish.lua is sent pipelined with the read of the
// slot's next entry.
func (h *beforeFinish) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.check(cmd)
		}
		return next(ctx, cmds)
	}
}
func (h *beforeFinish) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.check(cmd)
		return next(ctx, cmd)
	}
}
func (h *beforeFinish) check(cmd redis.Cmder) {
	args := cmd.Args()
	if len(args) < 2 {
		return
	}
	script, _ := lua.ScriptOfFunction(fmt.Sprint(args[1]))
	if fmt.Sprint(args[0]) == "evalsha" && slices.Contains(h.shas, fmt.Sprint(args[1])) || fmt.Sprint(args[0]) == "fcall" && script == "finish" {
		h.once.Do(h.fn)
	}
}

// TestCancelDuringFailingAttemptEndsAtOnce (defect 5): a cancel that lands
// while finish(retry) is in flight must end the run at once, not after the
// retry backoff (up to maxBackoff), with Cancel answering "cancelling" all
// that time.
func TestCancelDuringFailingAttemptEndsAtOnce(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			job := Job{Scope: "course_sync", Retry: RetryPolicy{MaxAttempts: 5, Backoff: time.Hour, MaxBackoff: time.Hour},
				Stages: []Stage{{Name: "pulling", Handler: HandlerFunc(func(context.Context, *Run) error {
					return errors.New("remote said 500")
				})}}}
			admin := newEnv(t, b.Client, Config{Prefix: "cr", Jobs: []Job{job}})
			var answer CancelOutcome
			hook := &beforeFinish{shas: scriptSHAs("finish"), fn: func() {
				var err error
				if answer, err = admin.reg.Cancel(ctx, "u1", "course_sync"); err != nil {
					t.Error(err)
				}
			}}
			rc := redis.NewClient(b.Client.(*redis.Client).Options())
			t.Cleanup(func() { _ = rc.Close() })
			rc.AddHook(hook)
			e := newEnv(t, rc, Config{Prefix: "cr", Jobs: []Job{job}})
			e.startRunner(RunnerConfig{ID: "cr"})
			clSubmit(t, e.reg, "u1", "course_sync", SourceManual, "")
			v := e.waitStatus("u1", "course_sync", 10*time.Second, StatusCancelled, StatusFailed, StatusDone, StatusRetrying)
			if v.Status != StatusCancelled {
				t.Fatalf("status %s, want cancelled at once (next attempt at %v)", v.Status, v.NextAttemptAt)
			}
			if answer != CancelCancelling {
				t.Errorf("cancel during the attempt answered %q, want cancelling", answer)
			}
			if o, err := e.reg.Cancel(ctx, "u1", "course_sync"); err != nil || o != CancelNotRunning {
				t.Errorf("cancel after = %s %v, want not_running", o, err)
			}
			if n, _ := e.rdb.ZCard(ctx, e.reg.ks.Retry(e.reg.ks.Partition(taskkey.MustNew("u1", "course_sync")))).Result(); n != 0 {
				t.Errorf("retry queue holds %d entries, want none", n)
			}
		})
	}
}

// TestReplaceDuringFailingAttemptStartsAtOnce (defect 5): the same race
// with policy replace: the fresh run starts without waiting the backoff.
func TestReplaceDuringFailingAttemptStartsAtOnce(t *testing.T) {
	mini := redistest.StartMini(t)
	ctx := context.Background()
	var calls atomic.Int32
	job := Job{Scope: "course_sync", Retry: RetryPolicy{MaxAttempts: 5, Backoff: time.Hour, MaxBackoff: time.Hour},
		Stages: []Stage{{Name: "pulling", Handler: HandlerFunc(func(context.Context, *Run) error {
			if calls.Add(1) == 1 {
				return errors.New("remote said 500")
			}
			return nil
		})}}}
	admin := newEnv(t, mini.Client(t), Config{Prefix: "rr", Jobs: []Job{job}})
	rc := mini.Client(t)
	rc.AddHook(&beforeFinish{shas: scriptSHAs("finish"), fn: func() {
		if r, err := admin.reg.Submit(ctx, "u1", "course_sync", SubmitOptions{Policy: PolicyReplace}); err != nil || r.Outcome != OutcomeReplaced {
			t.Errorf("replace = %v %v", r.Outcome, err)
		}
	}})
	e := newEnv(t, rc, Config{Prefix: "rr", Jobs: []Job{job}})
	first := clSubmit(t, e.reg, "u1", "course_sync", SourceManual, "")
	e.startRunner(RunnerConfig{ID: "rr"})
	polWaitRun(e, "u1", "course_sync", first.Task.RunID, 10*time.Second, StatusDone)
	if calls.Load() != 2 {
		t.Errorf("stage ran %d times, want 2 (the failed attempt, then the replacing run)", calls.Load())
	}
	evs := clHistory(t, e.reg, "u1", "course_sync")
	if ev, ok := clFind(evs, "cancelled"); !ok || ev.RunID != first.Task.RunID {
		t.Errorf("history %v: want the first run cancelled", clEventNames(evs))
	}
	if clCount(evs, "retry-scheduled") != 0 {
		t.Errorf("history %v: a retry was scheduled for a replaced run", clEventNames(evs))
	}
}

// TestFollowUpTakesCurrentDefinition (defect 6): a queued follow-up is a
// new run with the job's current stages and maxAttempts, not a copy of the
// run it follows.
func TestFollowUpTakesCurrentDefinition(t *testing.T) {
	mini := redistest.StartMini(t)
	rdb := mini.Client(t)
	c := &counter{}
	g := newGate()
	old := newEnv(t, rdb, Config{Prefix: "fu", Jobs: []Job{{Scope: "course_sync",
		Retry:  RetryPolicy{MaxAttempts: 2},
		Stages: []Stage{{Name: "pulling", Handler: c}, {Name: "pushing", Handler: c}}}}})
	first := clSubmit(t, old.reg, "u1", "course_sync", SourceManual, "")
	// The new deploy renamed pushing to uploading and allows more attempts.
	cur := newEnv(t, rdb, Config{Prefix: "fu", Jobs: []Job{{Scope: "course_sync",
		Retry: RetryPolicy{MaxAttempts: 4},
		Stages: []Stage{{Name: "pulling", Handler: g}, {Name: "pushing", Handler: c},
			{Name: "uploading", Handler: c}}}}})
	cur.startRunner(RunnerConfig{ID: "fu"})
	waitFor(t, 10*time.Second, "the first run in pulling", func() bool { return g.count() == 1 })
	if r := clSubmit(t, old.reg, "u1", "course_sync", SourceSchedule, PolicyQueue); r.Outcome != OutcomeQueued {
		t.Fatalf("queue outcome %s", r.Outcome)
	}
	g.open()
	v := polWaitRun(cur, "u1", "course_sync", first.Task.RunID, 10*time.Second, StatusDone, StatusFailed)
	if v.Status != StatusDone {
		t.Fatalf("follow-up status %s (%s), want done", v.Status, v.LastError)
	}
	if want := []string{"pulling", "pushing", "uploading"}; !slices.Equal(v.Stages, want) || v.MaxAttempts != 4 {
		t.Errorf("follow-up stages %v maxAttempts %d, want %v and 4 (the job's current definition)", v.Stages, v.MaxAttempts, want)
	}
	if n := c.get("u1/uploading"); n != 1 {
		t.Errorf("uploading ran %d times, want 1", n)
	}
}

// TestRollingDeployLeavesRunToRunnerThatDefinesIt (defect 6): a runner
// that meets a run with a stage it does not define leaves it — visibly —
// to a runner that does, and never fails it.
func TestRollingDeployLeavesRunToRunnerThatDefinesIt(t *testing.T) {
	mini := redistest.StartMini(t)
	rdb := mini.Client(t)
	c := &counter{}
	old := newEnv(t, rdb, Config{Prefix: "rd", Jobs: []Job{{Scope: "course_sync",
		Stages: []Stage{{Name: "pulling", Handler: c}, {Name: "pushing", Handler: c}}}}})
	clSubmit(t, old.reg, "u1", "course_sync", SourceManual, "")

	renamed := newEnv(t, rdb, Config{Prefix: "rd", Jobs: []Job{{Scope: "course_sync",
		Stages: []Stage{{Name: "pulling", Handler: c}, {Name: "uploading", Handler: c}}}}})
	newer, stopNewer := renamed.startRunner(RunnerConfig{ID: "rd-new", ReclaimInterval: 10 * time.Millisecond})
	var v TaskView
	waitFor(t, 10*time.Second, "the new runner to say what the run waits for", func() bool {
		var err error
		v, err = renamed.reg.Get(context.Background(), "u1", "course_sync")
		return err == nil && v.Waiting != ""
	})
	if v.Status != StatusQueued || v.FencingToken != 0 || c.get("u1/pulling") != 0 {
		t.Fatalf("run %s token %d pulling ran %d times: the new runner must not start it", v.Status, v.FencingToken, c.get("u1/pulling"))
	}
	want := "waiting for a runner that defines stage pushing (" + newer.Owner() + " does not)"
	if v.Waiting != want {
		t.Errorf("waiting %q, want %q", v.Waiting, want)
	}
	stopNewer()
	// The stopped runner's last reclaim pass may have taken the entry (due
	// again a reclaim idle time later) without getting to claim it: let
	// that time pass on miniredis's frozen clock.
	mini.Advance(time.Minute)
	old.startRunner(RunnerConfig{ID: "rd-old", ReclaimInterval: 10 * time.Millisecond})
	v = old.waitStatus("u1", "course_sync", 10*time.Second, StatusDone, StatusFailed, StatusCancelled)
	if v.Status != StatusDone || v.Waiting != "" {
		t.Fatalf("status %s waiting %q (%s), want done with nothing to wait for", v.Status, v.Waiting, v.LastError)
	}
	if c.get("u1/pulling") != 1 || c.get("u1/pushing") != 1 {
		t.Errorf("pulling %d pushing %d, want 1 and 1", c.get("u1/pulling"), c.get("u1/pushing"))
	}
}

// TestShutdownRecordsStageThatReturnedNil (defect 7): a stage that returns
// nil just after the shutdown grace cancelled it is done: it is recorded
// before the hand-back, and the next runner resumes after it.
func TestShutdownRecordsStageThatReturnedNil(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			c := &counter{}
			entered := make(chan struct{}, 1)
			slowToNotice := HandlerFunc(func(ctx context.Context, run *Run) error {
				c.RunStage(ctx, run)
				entered <- struct{}{}
				<-ctx.Done() // the grace is over…
				return nil   // …but the work had finished: the stage is done
			})
			e := newEnv(t, b.Client, Config{Prefix: "sd", Jobs: []Job{clJob("course_sync",
				Stage{Name: "pulling", Handler: slowToNotice}, Stage{Name: "pushing", Handler: c})}})
			_, stop := e.startRunner(RunnerConfig{ID: "sd-a", ShutdownGrace: 20 * time.Millisecond})
			clSubmit(t, e.reg, "u1", "course_sync", SourceManual, "")
			clRecv(t, entered, 10*time.Second, "pulling to start")
			stop()
			v, err := e.reg.Get(context.Background(), "u1", "course_sync")
			if err != nil {
				t.Fatal(err)
			}
			if v.Status != StatusQueued || !slices.Equal(v.CompletedStages, []string{"pulling"}) {
				t.Fatalf("after shutdown: status %s completed %v, want queued with pulling done", v.Status, v.CompletedStages)
			}
			e.startRunner(RunnerConfig{ID: "sd-b"})
			v = e.waitStatus("u1", "course_sync", 10*time.Second, StatusDone, StatusFailed)
			if v.Status != StatusDone {
				t.Fatalf("status %s (%s)", v.Status, v.LastError)
			}
			if n := c.get("u1/pulling"); n != 1 {
				t.Errorf("pulling ran %d times, want 1 (a done stage ran again)", n)
			}
			if n := c.get("u1/pushing"); n != 1 {
				t.Errorf("pushing ran %d times, want 1", n)
			}
		})
	}
}

// TestShutdownLastStageReturnedNilIsDone (defect 7): when that stage was
// the last one, the run is done rather than handed back.
func TestShutdownLastStageReturnedNilIsDone(t *testing.T) {
	mini := redistest.StartMini(t)
	entered := make(chan struct{}, 1)
	h := HandlerFunc(func(ctx context.Context, run *Run) error {
		entered <- struct{}{}
		<-ctx.Done()
		return nil
	})
	e := newEnv(t, mini.Client(t), Config{Prefix: "sl", Jobs: []Job{clJob("course_sync", Stage{Name: "pulling", Handler: h})}})
	_, stop := e.startRunner(RunnerConfig{ID: "sl", ShutdownGrace: 20 * time.Millisecond})
	clSubmit(t, e.reg, "u1", "course_sync", SourceManual, "")
	clRecv(t, entered, 10*time.Second, "pulling to start")
	stop()
	if v, _ := e.reg.Get(context.Background(), "u1", "course_sync"); v.Status != StatusDone {
		t.Fatalf("status %s, want done", v.Status)
	}
}

// TestCancelMessageNamesTheRun (defect 8): the cancel message carries the
// run id, and a late message for an earlier run of the key does not stop
// the run executing now.
func TestCancelMessageNamesTheRun(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			g := newGate()
			e := newEnv(t, b.Client, Config{Prefix: "cm", Jobs: []Job{clJob("course_sync", Stage{Name: "pulling", Handler: g})}})
			k := taskkey.MustNew("u1", "course_sync")
			channel := e.reg.ks.Cancels(e.reg.ks.Partition(k))
			sub := b.Client.Subscribe(ctx, channel)
			t.Cleanup(func() { _ = sub.Close() })
			if _, err := sub.Receive(ctx); err != nil {
				t.Fatal(err)
			}
			handled := make(chan string, 16)
			rn, err := NewRunner(e.reg, RunnerConfig{ID: "cm", FetchBlock: 100 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			rn.testHooks.cancelHandled = func(payload string) { handled <- payload }
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- rn.Run(runCtx) }()
			t.Cleanup(func() { stop(); <-done })

			first := clSubmit(t, e.reg, "u1", "course_sync", SourceManual, "")
			waitFor(t, 10*time.Second, "the first run to start", func() bool { return g.count() == 1 })
			if o, err := e.reg.Cancel(ctx, "u1", "course_sync"); err != nil || o != CancelCancelling {
				t.Fatalf("cancel = %s %v", o, err)
			}
			msg := clRecv(t, sub.Channel(), 5*time.Second, "the cancel message")
			if want := "u1|course_sync " + first.Task.RunID; msg.Payload != want {
				t.Fatalf("cancel message %q, want %q (key and run)", msg.Payload, want)
			}
			clRecv(t, handled, 5*time.Second, "the runner to handle the cancel")
			e.waitStatus("u1", "course_sync", 10*time.Second, StatusCancelled)

			clSubmit(t, e.reg, "u1", "course_sync", SourceManual, "")
			waitFor(t, 10*time.Second, "the second run to start", func() bool { return g.count() == 2 })
			// The first run's message again, late: handled, and ignored.
			if err := b.Client.Publish(ctx, channel, msg.Payload).Err(); err != nil {
				t.Fatal(err)
			}
			if got := clRecv(t, handled, 5*time.Second, "the runner to handle the late message"); got != msg.Payload {
				t.Fatalf("handled %q, want the late message", got)
			}
			g.mu.Lock()
			second := g.entered[1]
			g.mu.Unlock()
			g.open()
			v := e.waitStatus("u1", "course_sync", 10*time.Second, StatusDone, StatusCancelled, StatusFailed)
			if v.Status != StatusDone || v.RunID != second.RunID() {
				t.Errorf("second run %s ended %s (%s), want done: a late cancel of the first run stopped it", v.RunID, v.Status, v.LastError)
			}
		})
	}
}

// TestStoppingRunnerHandsBackUnclaimedEntries: entries a runner read but
// did not claim because it was stopping are reclaimable by another runner
// at once, not a lease TTL later (a rolling deploy would otherwise leave
// such a request waiting for it).
func TestStoppingRunnerHandsBackUnclaimedEntries(t *testing.T) {
	mini := redistest.StartMini(t)
	rdb := mini.Client(t)
	e := newEnv(t, rdb, Config{Prefix: "hb", Jobs: []Job{clJob("course_sync", Stage{Name: "pulling", Handler: &counter{}})}})
	rn, err := NewRunner(e.reg, RunnerConfig{ID: "hb-a", LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	clSubmit(t, e.reg, "u1", "course_sync", SourceManual, "")
	clSubmit(t, e.reg, "u2", "course_sync", SourceSchedule, "")
	var es []entry
	for p := range e.reg.ks.Partitions() {
		es = append(es, takeEntries(t, e.reg, p, 10)...)
	}
	if len(es) != 2 {
		t.Fatalf("read %d entries, want 2", len(es))
	}
	stopped, cancel := context.WithCancel(ctx)
	cancel()
	rn.handBackEntries(stopped, es)
	for _, en := range es {
		due, err := rdb.ZRangeByScore(ctx, e.reg.ks.Taken(en.p), &redis.ZRangeBy{Min: "-inf", Max: "0"}).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(due) != 1 || due[0] != en.id {
			t.Errorf("%s: reclaimable now %v, want entry %s", en.key, due, en.id)
		}
	}
}
