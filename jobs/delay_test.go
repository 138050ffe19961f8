package jobs

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/redistest"
)

// delayEnv is a registry with one one-stage job counting its executions,
// and a runner.
func delayEnv(t *testing.T, b redistest.Backend, prefix string) (*testEnv, *counter) {
	t.Helper()
	c := &counter{}
	e := newEnv(t, b.Client, Config{Prefix: prefix, Jobs: []Job{clJob("sync", Stage{Name: "pushing", Handler: c})}})
	e.startRunner(RunnerConfig{ID: "pod-dl", ReclaimInterval: 50 * time.Millisecond})
	return e, c
}

// firstEventAt returns the Redis time of the oldest event named name of
// run runID in evs (newest first).
func firstEventAt(evs []Event, runID, name string) time.Time {
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].RunID == runID && evs[i].Event == name {
			return evs[i].At
		}
	}
	return time.Time{}
}

// A delayed request creates a queued run that starts no sooner than its
// delay, by Redis time.
func TestDelayedRunStartsAfterItsDelay(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			e, c := delayEnv(t, b, "dl1")
			const delay = 3 * time.Second
			res, err := e.reg.Submit(context.Background(), "u1", "sync", SubmitOptions{Source: SourceSchedule, Delay: delay})
			if err != nil {
				t.Fatal(err)
			}
			v := res.Task
			if res.Outcome != OutcomeStarted || v.Status != StatusQueued || v.NotBefore == nil || v.RequestedAt == nil ||
				!v.NotBefore.Equal(v.RequestedAt.Add(delay)) {
				t.Fatalf("answer %s: %s, notBefore %v, requested %v; want a queued run not before requested + %s",
					res.Outcome, v.Status, v.NotBefore, v.RequestedAt, delay)
			}
			if got, err := e.reg.Get(context.Background(), "u1", "sync"); err != nil || got.NotBefore == nil ||
				!got.NotBefore.Equal(*v.NotBefore) || got.Waiting == "" {
				t.Fatalf("view: notBefore %v, waiting %q (%v); want the answer's notBefore and a reason", got.NotBefore, got.Waiting, err)
			}
			b.Advance(delay)
			done := e.waitStatus("u1", "sync", 20*time.Second, StatusDone, StatusFailed, StatusCancelled)
			if done.Status != StatusDone || c.get("u1/pushing") != 1 || done.NotBefore != nil || done.Waiting != "" {
				t.Fatalf("run %s after %d executions, notBefore %v, waiting %q; want done once, no longer delayed",
					done.Status, c.get("u1/pushing"), done.NotBefore, done.Waiting)
			}
			evs := clHistory(t, e.reg, "u1", "sync")
			asked, started := firstEventAt(evs, res.RunID, "requested"), firstEventAt(evs, res.RunID, "started")
			if started.Sub(asked) < delay {
				t.Errorf("started %s after the request (Redis time), want at least %s", started.Sub(asked), delay)
			}
		})
	}
}

// A request without a delay that joins a delayed run starts it at once:
// a person's "sync now" does not wait for the schedule's delay — also when
// its source already joined the run with a delay (a repeat, which
// submit_fast would otherwise answer without looking at the delay).
func TestJoinWithoutDelayStartsADelayedRun(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			for i, c := range []struct {
				name    string
				delayed []Source // requests with a delay, in order
				now     Source   // then one without
			}{
				{"manual after schedule", []Source{SourceSchedule}, SourceManual},
				{"repeat of a delayed join", []Source{SourceSchedule, SourceForeground, SourceForeground}, SourceForeground},
			} {
				t.Run(c.name, func(t *testing.T) {
					e, cnt := delayEnv(t, b, fmt.Sprintf("dl2%d", i))
					var first SubmitResult
					for i, src := range c.delayed {
						res, err := e.reg.Submit(context.Background(), "u1", "sync", SubmitOptions{Source: src, Delay: time.Hour})
						if err != nil {
							t.Fatal(err)
						}
						if i == 0 {
							first = res
						}
					}
					v, err := e.reg.Get(context.Background(), "u1", "sync")
					if err != nil || v.Status != StatusQueued || v.NotBefore == nil {
						t.Fatalf("before the request without a delay: %s, notBefore %v (%v)", v.Status, v.NotBefore, err)
					}
					res, err := e.reg.Submit(context.Background(), "u1", "sync", SubmitOptions{Source: c.now})
					if err != nil || res.Outcome != OutcomeJoined || res.RunID != first.RunID {
						t.Fatalf("request without a delay: %s for run %s (%v), want joined to %s", res.Outcome, res.RunID, err, first.RunID)
					}
					done := e.waitStatus("u1", "sync", 10*time.Second, StatusDone, StatusFailed, StatusCancelled)
					if done.Status != StatusDone || done.RunID != first.RunID || cnt.get("u1/pushing") != 1 {
						t.Fatalf("run %s %s after %d executions; want %s done once, an hour early",
							done.RunID, done.Status, cnt.get("u1/pushing"), first.RunID)
					}
				})
			}
		})
	}
}

// A delay is checked before anything is written.
func TestSubmitDelayValidated(t *testing.T) {
	t.Parallel()
	e := newEnv(t, redistest.StartMini(t).Client(t), Config{Prefix: "dv", Jobs: []Job{clJob("sync", Stage{Name: "a", Handler: &counter{}})}})
	for _, o := range []SubmitOptions{
		{Delay: -time.Second},
		{Delay: DelayMax + time.Second},
		{NotBefore: time.Now().Add(DelayMax + time.Hour)},
	} {
		if _, err := e.reg.Submit(context.Background(), "u1", "sync", o); !errors.Is(err, ErrInvalidDelay) {
			t.Errorf("submit with delay %s, not before %v: %v, want ErrInvalidDelay", o.Delay, o.NotBefore, err)
		}
	}
	if _, err := e.reg.Get(context.Background(), "u1", "sync"); !errors.Is(err, ErrNotFound) {
		t.Errorf("after refused submits the key exists: %v", err)
	}
}
