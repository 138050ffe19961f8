package jobs

// Conflict policies (join, skip, queue, replace), minInterval throttling,
// Cancel, Subscribe and List (DESIGN §3, §5, §9).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/redistest"
)

// polTwoStages is a job whose first stage is h and second c.
func polTwoStages(scope string, first, second Handler) Job {
	return clJob(scope, Stage{Name: "pulling", Handler: first}, Stage{Name: "pushing", Handler: second})
}

func polQueueDepth(t testing.TB, reg *Registry) int64 {
	t.Helper()
	n, _, err := reg.QueueDepth(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// polWaitRun waits until the key's current run is not runID and has one of
// the statuses.
func polWaitRun(e *testEnv, subject, scope, notRunID string, d time.Duration, want ...Status) TaskView {
	e.t.Helper()
	var v TaskView
	waitFor(e.t, d, fmt.Sprintf("a run other than %s in %v", notRunID, want), func() bool {
		var err error
		v, err = e.reg.Get(context.Background(), subject, scope)
		if err != nil && !errors.Is(err, ErrNotFound) {
			e.t.Fatal(err)
		}
		return v.RunID != notRunID && slices.Contains(want, v.Status)
	})
	return v
}

func TestPolicyQueueCoalescesIntoOneFollowUp(t *testing.T) {
	t.Parallel()
	const subject, scope, n = "u1", "course_sync", 20
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			h := newClHold(1)
			c := &counter{}
			e := newEnv(t, b.Client, Config{Prefix: "pq", Jobs: []Job{polTwoStages(scope, h, c)}})
			e.startRunner(RunnerConfig{ID: "pod-q"})

			first := clSubmit(t, e.reg, subject, scope, SourceManual, "")
			clRecv(t, h.entered, 10*time.Second, "the first run to start")

			barrier := make(chan struct{})
			outs := make(chan SubmitResult, n)
			errs := make(chan error, n)
			var wg sync.WaitGroup
			for i := range n {
				src := []Source{SourceSchedule, SourceForeground}[i%2]
				wg.Go(func() {
					<-barrier
					r, err := e.reg.Submit(context.Background(), subject, scope, SubmitOptions{Source: src, Policy: PolicyQueue})
					if err != nil {
						errs <- err
						return
					}
					outs <- r
				})
			}
			close(barrier)
			wg.Wait()
			close(outs)
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			for r := range outs {
				if r.Outcome != OutcomeQueued || !r.Task.FollowUpQueued || r.Task.RunID != first.Task.RunID {
					t.Errorf("queue request: outcome %s followUpQueued %v run %s; want queued, true, %s",
						r.Outcome, r.Task.FollowUpQueued, r.Task.RunID, first.Task.RunID)
				}
			}
			v, err := e.reg.Get(context.Background(), subject, scope)
			if err != nil || v.Status != StatusRunning || !v.FollowUpQueued {
				t.Fatalf("while queued: %+v %v; want running with followUpQueued", v, err)
			}
			evs := clHistory(t, e.reg, subject, scope)
			if q := clRequests(evs, "requested"); q != n+1 {
				t.Errorf("requested events stand for %d requests, want %d (one per request)", q, n+1)
			}
			// Coalesced: the started request, and one event per source of the
			// queue requests.
			if q := clCount(evs, "requested"); q != 3 {
				t.Errorf("%d requested events for %d requests from 3 sources, want one per source", q, n+1)
			}

			h.open()
			final := polWaitRun(e, subject, scope, first.Task.RunID, 10*time.Second, StatusDone, StatusFailed, StatusCancelled)
			if final.Status != StatusDone || final.FollowUpQueued {
				t.Fatalf("follow-up: status %s followUpQueued %v, want done, false", final.Status, final.FollowUpQueued)
			}
			if !clSameSet(final.Sources, clSources(SourceSchedule, SourceForeground)) {
				t.Errorf("follow-up sources %v, want the queue requesters' [schedule foreground]", final.Sources)
			}
			if h.calls() != 2 || c.get(subject+"/pushing") != 2 {
				t.Errorf("pulling ran %d times, pushing %d; want 2 each (the run and ONE follow-up)", h.calls(), c.get(subject+"/pushing"))
			}
			h.mu.Lock()
			follow := h.runs[len(h.runs)-1]
			h.mu.Unlock()
			if follow.RunID() != final.RunID || !clSameSet(follow.Sources(), clSources(SourceSchedule, SourceForeground)) {
				t.Errorf("follow-up run handle: id %s sources %v; want %s with the requesters' sources", follow.RunID(), follow.Sources(), final.RunID)
			}
			if d := polQueueDepth(t, e.reg); d != 0 {
				t.Errorf("%d requests left queued after the follow-up, want 0", d)
			}
			evs = clHistory(t, e.reg, subject, scope)
			if clCount(evs, "done") != 2 || clCount(evs, "started") != 2 {
				t.Errorf("history %v: want two started and two done", clEventNames(evs))
			}
		})
	}
}

func TestPolicyReplaceRunning(t *testing.T) {
	t.Parallel()
	const subject, scope = "u1", "course_sync"
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			h := newClHold(1)
			c := &counter{}
			e := newEnv(t, b.Client, Config{Prefix: "prr", Jobs: []Job{polTwoStages(scope, h, c)}})
			clStartRunner(e, RunnerConfig{ID: "pod-r"}, 1)

			first := clSubmit(t, e.reg, subject, scope, SourceManual, "")
			clRecv(t, h.entered, 10*time.Second, "the first run to start")
			r := clSubmit(t, e.reg, subject, scope, SourceForeground, PolicyReplace)
			if r.Outcome != OutcomeReplaced {
				t.Fatalf("outcome %s, want replaced", r.Outcome)
			}
			final := polWaitRun(e, subject, scope, first.Task.RunID, 10*time.Second, StatusDone, StatusFailed, StatusCancelled)
			if final.Status != StatusDone {
				t.Fatalf("fresh run: status %s (%s), want done", final.Status, final.LastError)
			}
			if cause := h.cause(first.Task.RunID); !errors.Is(cause, ErrCancelled) {
				t.Errorf("old run's stage context cause %v, want ErrCancelled", cause)
			}
			if !slices.Equal(final.Sources, clSources(SourceForeground)) {
				t.Errorf("fresh run sources %v, want [foreground]", final.Sources)
			}
			if h.calls() != 2 || c.get(subject+"/pushing") != 1 {
				t.Errorf("pulling ran %d times, pushing %d; want 2 and 1", h.calls(), c.get(subject+"/pushing"))
			}
			evs := clHistory(t, e.reg, subject, scope)
			var cancelled, replaced bool
			for _, ev := range evs {
				if ev.Event == "cancelled" && ev.RunID == first.Task.RunID {
					cancelled = true
				}
				if ev.Event == "done" && ev.RunID == first.Task.RunID {
					t.Errorf("the replaced run was recorded done")
				}
				if ev.Outcome == "replaced" && ev.Source == "foreground" {
					replaced = true
				}
			}
			if !cancelled || !replaced {
				t.Errorf("history %v: want the old run cancelled and the replace request recorded", clEventNames(evs))
			}
		})
	}
}

func TestPolicyReplaceQueued(t *testing.T) {
	t.Parallel()
	const subject, scope = "u1", "course_sync"
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			c := &counter{}
			e := newEnv(t, b.Client, Config{Prefix: "prq", Jobs: []Job{polTwoStages(scope, c, c)}})
			first := clSubmit(t, e.reg, subject, scope, SourceManual, "")
			r := clSubmit(t, e.reg, subject, scope, SourceSchedule, PolicyReplace)
			if r.Outcome != OutcomeReplaced {
				t.Fatalf("outcome %s, want replaced", r.Outcome)
			}
			if r.Task.RunID == first.Task.RunID || r.Task.Status != StatusQueued || !slices.Equal(r.Task.Sources, clSources(SourceSchedule)) {
				t.Errorf("after replace: run %s status %s sources %v; want a new queued run from schedule",
					r.Task.RunID, r.Task.Status, r.Task.Sources)
			}
			evs := clHistory(t, e.reg, subject, scope)
			if ev, ok := clFind(evs, "cancelled"); !ok || ev.RunID != first.Task.RunID {
				t.Errorf("history %v: want the queued run %s cancelled at once", clEventNames(evs), first.Task.RunID)
			}
			// The old run's entry stays in its lane (removing it from the
			// middle of a list is O(n)) until a runner reads it: the claim
			// finds the run over and acknowledges it.
			if d := polQueueDepth(t, e.reg); d != 2 {
				t.Errorf("%d requests queued, want 2 (the old one until read, the new one)", d)
			}
			e.startRunner(RunnerConfig{ID: "pod-rq"})
			v := e.waitStatus(subject, scope, 10*time.Second, StatusDone, StatusFailed, StatusCancelled)
			if v.Status != StatusDone || v.RunID != r.Task.RunID {
				t.Errorf("final: status %s run %s, want done of %s", v.Status, v.RunID, r.Task.RunID)
			}
			waitFor(t, 10*time.Second, "an empty queue", func() bool { return polQueueDepth(t, e.reg) == 0 })
			if n := c.get(subject + "/pulling"); n != 1 {
				t.Errorf("pulling ran %d times, want 1 (the replaced run never executes)", n)
			}
		})
	}
}

func TestPolicySkip(t *testing.T) {
	t.Parallel()
	const subject, scope = "u1", "course_sync"
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			c := &counter{}
			e := newEnv(t, b.Client, Config{Prefix: "ps", Jobs: []Job{polTwoStages(scope, c, c)}})
			first := clSubmit(t, e.reg, subject, scope, SourceManual, "")
			before := clRaw(t, e.reg, subject, scope)
			depth := polQueueDepth(t, e.reg)
			r := clSubmit(t, e.reg, subject, scope, SourceForeground, PolicySkip)
			if r.Outcome != OutcomeSkipped || r.Task.RunID != first.Task.RunID || r.Task.Status != StatusQueued {
				t.Errorf("skip: outcome %s run %s status %s; want skipped and the active run's view", r.Outcome, r.Task.RunID, r.Task.Status)
			}
			if slices.Contains(r.Task.Sources, SourceForeground) {
				t.Errorf("a skipped request's source was merged: %v", r.Task.Sources)
			}
			// Only the coalescing counter of skipped requests is written.
			if after := clRaw(t, e.reg, subject, scope); !mapsEqual(before, withoutCoalesced(after)) {
				t.Errorf("skip changed the record:\nbefore %v\nafter  %v", before, after)
			}
			if d := polQueueDepth(t, e.reg); d != depth {
				t.Errorf("stream depth %d → %d after skip", depth, d)
			}
			evs := clHistory(t, e.reg, subject, scope)
			if len(evs) != 2 || evs[0].Event != "skipped" || evs[0].Source != "foreground" || evs[0].RunID != first.Task.RunID {
				t.Errorf("history %v: want [skipped(foreground) requested(manual)]", clEventNames(evs))
			}
		})
	}
}

func TestPolicyThrottledWithinMinInterval(t *testing.T) {
	t.Parallel()
	const subject, scope = "u1", "course_sync"
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			// Steps of Redis time: miniredis's clock jumps an hour at once;
			// real Redis time only passes by waiting, so there the interval
			// is seconds, with a margin either side of its end for a loaded
			// machine.
			interval, early, late := time.Hour, 59*time.Minute, 2*time.Minute
			if b.Real {
				interval, early, late = 2*time.Second, time.Second, 1200*time.Millisecond
			}
			c := &counter{}
			job := polTwoStages(scope, c, c)
			job.MinInterval = interval
			e := newEnv(t, b.Client, Config{Prefix: "pt", Jobs: []Job{job}})
			e.startRunner(RunnerConfig{ID: "pod-t"})

			first := clSubmit(t, e.reg, subject, scope, SourceSchedule, "")
			if first.Outcome != OutcomeStarted {
				t.Fatalf("first request: %s, want started (no success yet)", first.Outcome)
			}
			e.waitStatus(subject, scope, 10*time.Second, StatusDone)
			for _, src := range []Source{SourceSchedule, SourceForeground} {
				r := clSubmit(t, e.reg, subject, scope, src, "")
				if r.Outcome != OutcomeThrottled || r.Task.RunID != first.Task.RunID || r.Task.Status != StatusDone {
					t.Errorf("%s right after a success: outcome %s run %s status %s; want throttled, the done run", src, r.Outcome, r.Task.RunID, r.Task.Status)
				}
			}
			evs := clHistory(t, e.reg, subject, scope)
			if len(evs) < 2 || evs[0].Event != "throttled" || evs[0].Source != "foreground" ||
				evs[1].Event != "throttled" || evs[1].Source != "schedule" || evs[0].Outcome != "throttled" {
				t.Errorf("history %v: want throttled(foreground), throttled(schedule) on top", clEventNames(evs))
			}

			manual := clSubmit(t, e.reg, subject, scope, SourceManual, "")
			if manual.Outcome != OutcomeStarted {
				t.Fatalf("manual: outcome %s, want started (manual is never throttled)", manual.Outcome)
			}
			polWaitRun(e, subject, scope, first.Task.RunID, 10*time.Second, StatusDone)
			if n := c.get(subject + "/pulling"); n != 2 {
				t.Errorf("pulling ran %d times, want 2", n)
			}

			// The interval counts from the last success, in Redis time.
			b.Advance(early)
			if r := clSubmit(t, e.reg, subject, scope, SourceSchedule, ""); r.Outcome != OutcomeThrottled {
				t.Errorf("schedule %s after the manual success (interval %s): %s, want throttled", early, interval, r.Outcome)
			}
			b.Advance(late)
			r := clSubmit(t, e.reg, subject, scope, SourceForeground, "")
			if r.Outcome != OutcomeStarted {
				t.Fatalf("foreground %s after the last success (interval %s): %s, want started", early+late, interval, r.Outcome)
			}
			polWaitRun(e, subject, scope, manual.Task.RunID, 10*time.Second, StatusDone)
		})
	}
}

// TestPolicyThrottleCountsFromTheLastSuccess: a run that fails does not
// reset the minimum interval; it counts from the last run that succeeded.
// (A done run's time is its finishedAt; the next run's start moves it to
// lastSuccessAt, which a failed run leaves as it is.)
func TestPolicyThrottleCountsFromTheLastSuccess(t *testing.T) {
	t.Parallel()
	const subject, scope = "u1", "course_sync"
	m := redistest.StartMini(t)
	var fail atomic.Bool
	job := clJob(scope, Stage{Name: "sync", Handler: HandlerFunc(func(context.Context, *Run) error {
		if fail.Load() {
			return errors.New("upstream down")
		}
		return nil
	})})
	job.MinInterval = time.Hour
	job.Retry.MaxAttempts = 1
	e := newEnv(t, m.Client(t), Config{Prefix: "pl", Jobs: []Job{job}})
	e.startRunner(RunnerConfig{ID: "pod-l"})

	first := clSubmit(t, e.reg, subject, scope, SourceSchedule, "")
	e.waitStatus(subject, scope, 10*time.Second, StatusDone)
	m.Advance(30 * time.Minute)
	fail.Store(true)
	manual := clSubmit(t, e.reg, subject, scope, SourceManual, "")
	if manual.Outcome != OutcomeStarted {
		t.Fatalf("manual: %s, want started", manual.Outcome)
	}
	polWaitRun(e, subject, scope, first.Task.RunID, 10*time.Second, StatusFailed)
	if r := clSubmit(t, e.reg, subject, scope, SourceSchedule, ""); r.Outcome != OutcomeThrottled {
		t.Errorf("schedule 30m after the last success, a failed run since: %s, want throttled", r.Outcome)
	}
	m.Advance(31 * time.Minute)
	fail.Store(false)
	if r := clSubmit(t, e.reg, subject, scope, SourceSchedule, ""); r.Outcome != OutcomeStarted {
		t.Errorf("schedule 61m after the last success: %s, want started", r.Outcome)
	}
}

func TestPolicyDefaultsAndOverride(t *testing.T) {
	t.Parallel()
	c := &counter{}
	skipJob := polTwoStages("backup", c, c)
	skipJob.OnConflict = PolicySkip
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			e := newEnv(t, b.Client, Config{Prefix: "pd", Jobs: []Job{polTwoStages("course_sync", c, c), skipJob}})
			if j, ok := e.reg.Job("course_sync"); !ok || j.OnConflict != PolicyJoin {
				t.Errorf("job without OnConflict: %q, want join", j.OnConflict)
			}
			for _, scope := range []string{"course_sync", "backup"} {
				if r := clSubmit(t, e.reg, "u1", scope, SourceManual, ""); r.Outcome != OutcomeStarted {
					t.Fatalf("%s: %s, want started", scope, r.Outcome)
				}
			}
			cases := []struct {
				scope string
				pol   Policy
				want  Outcome
			}{
				{"course_sync", "", OutcomeJoined},          // the default default is join
				{"backup", "", OutcomeSkipped},              // the job's OnConflict
				{"backup", PolicyJoin, OutcomeJoined},       // explicit beats the job's
				{"course_sync", PolicySkip, OutcomeSkipped}, // explicit beats the default
				{"course_sync", PolicyQueue, OutcomeQueued},
				{"backup", PolicyQueue, OutcomeQueued},
			}
			for _, tc := range cases {
				if r := clSubmit(t, e.reg, "u1", tc.scope, SourceSchedule, tc.pol); r.Outcome != tc.want {
					t.Errorf("%s policy %q: %s, want %s", tc.scope, tc.pol, r.Outcome, tc.want)
				}
			}
		})
	}
}

func TestPolicyCancelQueued(t *testing.T) {
	t.Parallel()
	const subject, scope = "u1", "course_sync"
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			c := &counter{}
			e := newEnv(t, b.Client, Config{Prefix: "pcq", Jobs: []Job{polTwoStages(scope, c, c)}})
			first := clSubmit(t, e.reg, subject, scope, SourceManual, "")
			o, err := e.reg.Cancel(context.Background(), subject, scope)
			if err != nil || o != CancelCancelled {
				t.Fatalf("Cancel of a queued run: %s %v, want cancelled", o, err)
			}
			v, err := e.reg.Get(context.Background(), subject, scope)
			if err != nil || v.Status != StatusCancelled || v.CanCancel || v.FinishedAt == nil || v.RunID != first.Task.RunID {
				t.Errorf("after cancel: %+v %v; want cancelled, canCancel false, finishedAt set", v, err)
			}
			if evs := clHistory(t, e.reg, subject, scope); len(evs) == 0 || evs[0].Event != "cancelled" {
				t.Errorf("history %v: want cancelled on top", clEventNames(evs))
			}
			// The entry stays in its lane until a runner reads it (the claim
			// finds the run over and acknowledges it).
			if d := polQueueDepth(t, e.reg); d != 1 {
				t.Errorf("%d requests queued, want 1 (the cancelled run's, until read)", d)
			}
			if o, err := e.reg.Cancel(context.Background(), subject, scope); err != nil || o != CancelNotRunning {
				t.Errorf("second Cancel: %s %v, want not_running", o, err)
			}
			// The key is not blocked: a runner started now runs nothing
			// stale, and a new request runs.
			e.startRunner(RunnerConfig{ID: "pod-cq"})
			r := clSubmit(t, e.reg, subject, scope, SourceManual, "")
			if r.Outcome != OutcomeStarted {
				t.Fatalf("after cancel: %s, want started", r.Outcome)
			}
			polWaitRun(e, subject, scope, first.Task.RunID, 10*time.Second, StatusDone)
			if n := c.get(subject + "/pulling"); n != 1 {
				t.Errorf("pulling ran %d times, want 1 (the cancelled run never runs)", n)
			}
			waitFor(t, 10*time.Second, "an empty queue", func() bool { return polQueueDepth(t, e.reg) == 0 })
		})
	}
}

func TestPolicyCancelRunning(t *testing.T) {
	t.Parallel()
	const subject, scope = "u1", "course_sync"
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			h := newClHold(1)
			c := &counter{}
			e := newEnv(t, b.Client, Config{Prefix: "pcr", Jobs: []Job{polTwoStages(scope, h, c)}})
			rn := clStartRunner(e, RunnerConfig{ID: "pod-cr"}, 1)
			first := clSubmit(t, e.reg, subject, scope, SourceManual, "")
			clRecv(t, h.entered, 10*time.Second, "the run to start")

			o, err := e.reg.Cancel(context.Background(), subject, scope)
			if err != nil || o != CancelCancelling {
				t.Fatalf("Cancel of a running run: %s %v, want cancelling", o, err)
			}
			v := e.waitStatus(subject, scope, 10*time.Second, StatusCancelled, StatusDone, StatusFailed)
			if v.Status != StatusCancelled || v.RunID != first.Task.RunID || v.CanCancel {
				t.Errorf("after cancel: status %s run %s canCancel %v; want cancelled, %s, false", v.Status, v.RunID, v.CanCancel, first.Task.RunID)
			}
			if cause := h.cause(first.Task.RunID); !errors.Is(cause, ErrCancelled) {
				t.Errorf("stage context cause %v, want ErrCancelled", cause)
			}
			if n := c.get(subject + "/pushing"); n != 0 {
				t.Errorf("pushing ran %d times after cancel, want 0", n)
			}
			evs := clHistory(t, e.reg, subject, scope)
			if len(evs) == 0 || evs[0].Event != "cancelled" || evs[0].RunID != first.Task.RunID || evs[0].Owner != rn.Owner() || evs[0].FencingToken <= 0 {
				t.Errorf("history %v (top %+v): want cancelled by %s, with its token", clEventNames(evs), evs[0], rn.Owner())
			}
			if o, err := e.reg.Cancel(context.Background(), subject, scope); err != nil || o != CancelNotRunning {
				t.Errorf("Cancel after cancelled: %s %v, want not_running", o, err)
			}
		})
	}
}

func TestPolicyCancelNotRunning(t *testing.T) {
	t.Parallel()
	const scope = "course_sync"
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			c := &counter{}
			e := newEnv(t, b.Client, Config{Prefix: "pcn", Jobs: []Job{polTwoStages(scope, c, c)}})
			if o, err := e.reg.Cancel(context.Background(), "never", scope); err != nil || o != CancelNotRunning {
				t.Errorf("Cancel of a key that never ran: %s %v, want not_running", o, err)
			}
			if _, err := e.reg.Get(context.Background(), "never", scope); !errors.Is(err, ErrNotFound) {
				t.Errorf("Cancel created a record for an idle key: Get = %v, want ErrNotFound", err)
			}
			e.startRunner(RunnerConfig{ID: "pod-cn"})
			clSubmit(t, e.reg, "u1", scope, SourceManual, "")
			before := e.waitStatus("u1", scope, 10*time.Second, StatusDone)
			if o, err := e.reg.Cancel(context.Background(), "u1", scope); err != nil || o != CancelNotRunning {
				t.Errorf("Cancel of a done run: %s %v, want not_running", o, err)
			}
			if after := clRaw(t, e.reg, "u1", scope); after["status"] != string(StatusDone) || after["runId"] != before.RunID {
				t.Errorf("Cancel changed a done record: %v", after)
			}
		})
	}
}

func TestPolicyCancelDropsQueuedFollowUp(t *testing.T) {
	t.Parallel()
	const subject, scope = "u1", "course_sync"
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			h := newClHold(1)
			c := &counter{}
			e := newEnv(t, b.Client, Config{Prefix: "pcf", Jobs: []Job{polTwoStages(scope, h, c)}})
			clStartRunner(e, RunnerConfig{ID: "pod-cf"}, 1)
			first := clSubmit(t, e.reg, subject, scope, SourceManual, "")
			clRecv(t, h.entered, 10*time.Second, "the run to start")
			if r := clSubmit(t, e.reg, subject, scope, SourceSchedule, PolicyQueue); r.Outcome != OutcomeQueued || !r.Task.FollowUpQueued {
				t.Fatalf("queue: %s followUpQueued %v, want queued, true", r.Outcome, r.Task.FollowUpQueued)
			}
			if o, err := e.reg.Cancel(context.Background(), subject, scope); err != nil || o != CancelCancelling {
				t.Fatalf("Cancel: %s %v, want cancelling", o, err)
			}
			if v, _ := e.reg.Get(context.Background(), subject, scope); v.FollowUpQueued {
				t.Errorf("followUpQueued still set after Cancel")
			}
			v := e.waitStatus(subject, scope, 10*time.Second, StatusCancelled, StatusDone, StatusFailed, StatusQueued)
			if v.Status != StatusCancelled || v.RunID != first.Task.RunID || v.FollowUpQueued {
				t.Fatalf("after cancel: status %s run %s followUp %v; want cancelled %s and no follow-up", v.Status, v.RunID, v.FollowUpQueued, first.Task.RunID)
			}
			if h.calls() != 1 {
				t.Errorf("pulling ran %d times, want 1 (no follow-up)", h.calls())
			}
			if d := polQueueDepth(t, e.reg); d != 0 {
				t.Errorf("%d requests queued, want 0", d)
			}
		})
	}
}

func TestPolicySubscribeStatusSequence(t *testing.T) {
	t.Parallel()
	const subject, scope = "u1", "course_sync"
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			h := newClHold(1)
			c := &counter{}
			e := newEnv(t, b.Client, Config{Prefix: "psub", Jobs: []Job{polTwoStages(scope, h, c)}})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ch, err := e.reg.Subscribe(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// Another key's changes arrive on the same feed and must not confuse it.
			clSubmit(t, e.reg, "other", scope, SourceManual, "")
			first := clSubmit(t, e.reg, subject, scope, SourceManual, "")
			e.startRunner(RunnerConfig{ID: "pod-sub"})

			var seq []Status
			released := false
			deadline := time.After(10 * time.Second)
			for len(seq) == 0 || seq[len(seq)-1] != StatusDone {
				select {
				case v, ok := <-ch:
					if !ok {
						t.Fatalf("feed closed; statuses so far %v", seq)
					}
					if v.Key != subject+"|"+scope {
						continue
					}
					if v.RunID != first.Task.RunID {
						t.Errorf("view of run %s, want %s", v.RunID, first.Task.RunID)
					}
					seq = append(seq, v.Status)
					if v.Status == StatusRunning && v.Stage == "pulling" && !released {
						// The claim itself was published: release the stage.
						if v.Owner == "" || v.StartedAt == nil || v.FencingToken <= 0 {
							t.Errorf("running view: owner %q startedAt %v token %d", v.Owner, v.StartedAt, v.FencingToken)
						}
						released = true
						h.open()
					}
				case <-deadline:
					t.Fatalf("no done view within 10s; statuses %v", seq)
				}
			}
			want := []Status{StatusQueued, StatusRunning, StatusDone}
			i := 0
			for _, s := range seq {
				if i < len(want) && s == want[i] {
					i++
				}
			}
			if i != len(want) {
				t.Errorf("statuses %v do not contain %v in order", seq, want)
			}
			cancel()
			waitFor(t, 10*time.Second, "the feed to close after its context ends", func() bool {
				select {
				case _, ok := <-ch:
					return !ok
				default:
					return false
				}
			})
		})
	}
}

func TestPolicyListFiltersAndSubjects(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			c := &counter{}
			e := newEnv(t, b.Client, Config{Prefix: "pl", Jobs: []Job{polTwoStages("course_sync", c, c), polTwoStages("backup", c, c)}})
			ctx := context.Background()
			var course []string
			for i := range 6 {
				s := fmt.Sprintf("s%d", i)
				course = append(course, s)
				clSubmit(t, e.reg, s, "course_sync", SourceManual, "")
			}
			clSubmit(t, e.reg, "s0", "backup", SourceSchedule, "")
			clSubmit(t, e.reg, "s1", "backup", SourceSchedule, "")
			for _, s := range course[:3] {
				if o, err := e.reg.Cancel(ctx, s, "course_sync"); err != nil || o != CancelCancelled {
					t.Fatalf("cancel %s: %s %v", s, o, err)
				}
			}
			list := func(o ListOptions) []TaskView {
				t.Helper()
				vs, err := e.reg.List(ctx, o)
				if err != nil {
					t.Fatalf("List(%+v): %v", o, err)
				}
				for i := 1; i < len(vs); i++ {
					if vs[i].UpdatedAt.After(*vs[i-1].UpdatedAt) {
						t.Errorf("List(%+v) not newest first at %d", o, i)
					}
				}
				return vs
			}
			keys := func(vs []TaskView) []string {
				out := make([]string, len(vs))
				for i, v := range vs {
					out[i] = v.Key
				}
				slices.Sort(out)
				return out
			}
			check := func(o ListOptions, want ...string) {
				t.Helper()
				slices.Sort(want)
				if got := keys(list(o)); !slices.Equal(got, want) {
					t.Errorf("List(%+v) = %v, want %v", o, got, want)
				}
			}
			check(ListOptions{}, "s0|course_sync", "s1|course_sync", "s2|course_sync", "s3|course_sync",
				"s4|course_sync", "s5|course_sync", "s0|backup", "s1|backup")
			check(ListOptions{Status: StatusCancelled}, "s0|course_sync", "s1|course_sync", "s2|course_sync")
			check(ListOptions{Status: StatusQueued, Scope: "course_sync"}, "s3|course_sync", "s4|course_sync", "s5|course_sync")
			check(ListOptions{Scope: "backup"}, "s0|backup", "s1|backup")
			check(ListOptions{Subject: "s1"}, "s1|course_sync", "s1|backup")
			check(ListOptions{Subject: "s1", Scope: "backup"}, "s1|backup")
			check(ListOptions{Subject: "s1", Scope: "course_sync", Status: StatusQueued})
			check(ListOptions{Subject: "nobody"})
			check(ListOptions{Status: StatusDone})
			for _, lim := range []int{1, 3} {
				vs := list(ListOptions{Limit: lim})
				if len(vs) != lim {
					t.Errorf("List(limit %d) returned %d", lim, len(vs))
				}
			}
			if vs := list(ListOptions{Status: StatusQueued, Limit: 2}); len(vs) != 2 || vs[0].Status != StatusQueued || vs[1].Status != StatusQueued {
				t.Errorf("List(queued, limit 2) = %v", keys(vs))
			}

			subs, err := e.reg.Subjects(ctx, "course_sync")
			if err != nil || !slices.Equal(subs, course) {
				t.Errorf("Subjects(course_sync) = %v %v, want %v", subs, err, course)
			}
			// Requests from schedules do not make a subject part of "all":
			// a schedule would otherwise keep every subject alive forever.
			subs, err = e.reg.Subjects(ctx, "backup")
			if err != nil || len(subs) != 0 {
				t.Errorf("Subjects(backup) = %v %v, want none (only schedule requests)", subs, err)
			}
		})
	}
}

// polSlowPubSubDial delays the dial of pub/sub connections only (found by
// their caller, go-redis's PubSub), as a loaded machine or a slow network
// may: the runner's cancel subscription then lags behind its first runs.
// delayed counts the dials it delayed.
type polSlowPubSubDial struct {
	delay   time.Duration
	delayed *atomic.Int32
}

// polAddDialHook adds h to every connection rdb dials: a ClusterClient
// dials through a client per node, so there h goes on each node's client.
func polAddDialHook(rdb redis.UniversalClient, h redis.Hook) {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		cc.OnNewNode(func(node *redis.Client) { node.AddHook(h) })
		return
	}
	rdb.AddHook(h)
}

func (h polSlowPubSubDial) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		pcs := make([]uintptr, 64)
		frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
		for {
			f, more := frames.Next()
			if strings.Contains(f.Function, "(*PubSub)") {
				h.delayed.Add(1)
				time.Sleep(h.delay)
				break
			}
			if !more {
				break
			}
		}
		return next(ctx, network, addr)
	}
}

func (polSlowPubSubDial) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (polSlowPubSubDial) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestPolicyCancelRightAfterRunnerStart: a cancel must reach a run at once
// (pub/sub), not at the holder's next heartbeat (LeaseTTL/3, 5s by default),
// even when the run started right after its runner did.
func TestPolicyCancelRightAfterRunnerStart(t *testing.T) {
	t.Parallel()
	const subject, scope = "u1", "course_sync"
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			client := b.Client
			slow := polSlowPubSubDial{delay: 500 * time.Millisecond, delayed: &atomic.Int32{}}
			polAddDialHook(client, slow)
			h := newClHold(1)
			c := &counter{}
			e := newEnv(t, client, Config{Prefix: "pcs", Jobs: []Job{polTwoStages(scope, h, c)}})
			e.startRunner(RunnerConfig{ID: "pod-cs"}) // LeaseTTL 15s: heartbeat every 5s
			clSubmit(t, e.reg, subject, scope, SourceManual, "")
			clRecv(t, h.entered, 10*time.Second, "the run to start")
			start := time.Now()
			if o, err := e.reg.Cancel(context.Background(), subject, scope); err != nil || o != CancelCancelling {
				t.Fatalf("Cancel: %s %v, want cancelling", o, err)
			}
			e.waitStatus(subject, scope, 10*time.Second, StatusCancelled)
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("the run stopped %s after Cancel: the publish was missed and only the heartbeat delivered it", d.Round(time.Millisecond))
			}
			if slow.delayed.Load() == 0 {
				t.Errorf("no pub/sub dial was delayed: the hook missed this client's connections, so the lag was not tested")
			}
		})
	}
}
