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

// A debounced job: a burst of foreground requests 500 ms apart gives one
// run, started a debounce after the last of them; a longer burst is cut at
// the first request + debounceMax.
func TestDebounce(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			for i, c := range []struct {
				name          string
				max           time.Duration
				requests      int
				wantNotBefore time.Duration // after the first request
			}{
				{"burst", 10 * time.Second, 5, 2*time.Second + time.Second}, // the last at 2 s, + 1 s
				{"capped", 2 * time.Second, 7, 2 * time.Second},             // the last at 3 s: cut at 2 s
			} {
				t.Run(c.name, func(t *testing.T) {
					cnt := &counter{}
					job := clJob("sync", Stage{Name: "pushing", Handler: cnt})
					job.Debounce, job.DebounceMax = time.Second, c.max
					e := newEnv(t, b.Client, Config{Prefix: fmt.Sprintf("db%d", i), Jobs: []Job{job}})
					var first SubmitResult
					for n := range c.requests {
						if n > 0 {
							b.Advance(500 * time.Millisecond)
						}
						res, err := e.reg.Submit(context.Background(), "u1", "sync", SubmitOptions{Source: SourceForeground})
						if err != nil {
							t.Fatal(err)
						}
						if n == 0 {
							first = res
						} else if res.RunID != first.RunID || res.Task.Status != StatusQueued {
							t.Fatalf("request %d: %s %s (run %s), want the first request's run, still queued", n, res.Outcome, res.Task.Status, res.RunID)
						}
					}
					v, err := e.reg.Get(context.Background(), "u1", "sync")
					if err != nil || v.NotBefore == nil {
						t.Fatalf("after the burst: notBefore %v (%v)", v.NotBefore, err)
					}
					// By Redis time: the last request + debounce, at most the
					// first + debounceMax (on miniredis exactly c.wantNotBefore
					// after the first).
					var last time.Time
					for _, ev := range clHistory(t, e.reg, "u1", "sync") {
						if ev.RunID == first.RunID && (ev.Event == "requested" || ev.Event == "joined") {
							at := ev.At
							if ev.LastAt != nil {
								at = *ev.LastAt
							}
							if at.After(last) {
								last = at
							}
						}
					}
					want := last.Add(job.Debounce)
					if capAt := first.Task.RequestedAt.Add(c.max); capAt.Before(want) {
						want = capAt
					}
					if !v.NotBefore.Equal(want) {
						t.Errorf("not before %s, want %s (last request %s + %s, at most first %s + %s)",
							v.NotBefore, want, last, job.Debounce, first.Task.RequestedAt, c.max)
					}
					if b.Name == "miniredis" && v.NotBefore.Sub(*first.Task.RequestedAt) != c.wantNotBefore {
						t.Errorf("not before first request + %s, want + %s", v.NotBefore.Sub(*first.Task.RequestedAt), c.wantNotBefore)
					}
					e.startRunner(RunnerConfig{ID: "pod-db", ReclaimInterval: 50 * time.Millisecond})
					b.Advance(c.wantNotBefore)
					done := e.waitStatus("u1", "sync", 20*time.Second, StatusDone, StatusFailed, StatusCancelled)
					if done.Status != StatusDone || done.RunID != first.RunID || cnt.get("u1/pushing") != 1 {
						t.Fatalf("run %s %s after %d executions; want the one run done once", done.RunID, done.Status, cnt.get("u1/pushing"))
					}
					started := firstEventAt(clHistory(t, e.reg, "u1", "sync"), first.RunID, "started")
					if started.Before(*v.NotBefore) {
						t.Errorf("started at %s, before its notBefore %s", started, v.NotBefore)
					}
				})
			}
		})
	}
}

// A manual request is not debounced: it starts a debounced job's run at
// once, and starts a delayed one now.
func TestDebounceSkipsManual(t *testing.T) {
	t.Parallel()
	m := redistest.StartMini(t)
	cnt := &counter{}
	job := clJob("sync", Stage{Name: "pushing", Handler: cnt})
	job.Debounce = time.Hour
	e := newEnv(t, m.Client(t), Config{Prefix: "dbm", Jobs: []Job{job}})
	e.startRunner(RunnerConfig{ID: "pod-dbm", ReclaimInterval: 50 * time.Millisecond})
	if res := clSubmit(t, e.reg, "u1", "sync", SourceSchedule, ""); res.Task.NotBefore == nil {
		t.Fatalf("a schedule request of a debounced job: notBefore nil, want delayed")
	}
	clSubmit(t, e.reg, "u1", "sync", SourceManual, "")
	if v := e.waitStatus("u1", "sync", 10*time.Second, StatusDone, StatusFailed, StatusCancelled); v.Status != StatusDone {
		t.Fatalf("after the manual request: %s, want done at once", v.Status)
	}
	if res := clSubmit(t, e.reg, "u2", "sync", SourceManual, ""); res.Task.NotBefore != nil {
		t.Fatalf("a manual request of a debounced job was delayed to %v", res.Task.NotBefore)
	}
}

// A cancel ends a delayed run at once and leaves nothing in the taken set.
func TestCancelDelayedRun(t *testing.T) {
	t.Parallel()
	m := redistest.StartMini(t)
	e := newEnv(t, m.Client(t), Config{Prefix: "dc", Partitions: 1, Jobs: []Job{clJob("sync", Stage{Name: "a", Handler: &counter{}})}})
	if _, err := e.reg.Submit(context.Background(), "u1", "sync", SubmitOptions{Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if n, _ := e.rdb.ZCard(context.Background(), e.reg.ks.Taken(0)).Result(); n != 1 {
		t.Fatalf("taken set holds %d entries after a delayed submit, want its 1", n)
	}
	if o, err := e.reg.Cancel(context.Background(), "u1", "sync"); err != nil || o != CancelCancelled {
		t.Fatalf("cancel: %s, %v; want cancelled", o, err)
	}
	if v, _ := e.reg.Get(context.Background(), "u1", "sync"); v.Status != StatusCancelled || v.NotBefore != nil {
		t.Fatalf("after the cancel: %s, notBefore %v", v.Status, v.NotBefore)
	}
	if n, _ := e.rdb.ZCard(context.Background(), e.reg.ks.Taken(0)).Result(); n != 0 {
		t.Errorf("taken set holds %d entries after the cancel, want none", n)
	}
}

// A cron fan-out (SubmitMany) of a debounced job delays the runs it starts
// too; a manual bulk request does not.
func TestDebounceFanOut(t *testing.T) {
	t.Parallel()
	m := redistest.StartMini(t)
	job := clJob("sync", Stage{Name: "a", Handler: &counter{}})
	job.Debounce = 5 * time.Second
	e := newEnv(t, m.Client(t), Config{Prefix: "dbf", Jobs: []Job{job}})
	subjects := []string{"u1", "u2", "u3"}
	if _, err := e.reg.SubmitMany(context.Background(), "sync", subjects, SubmitManyOptions{Source: SourceSchedule}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.reg.SubmitMany(context.Background(), "sync", []string{"m1"}, SubmitManyOptions{Source: SourceManual}); err != nil {
		t.Fatal(err)
	}
	for _, s := range subjects {
		v, err := e.reg.Get(context.Background(), s, "sync")
		if err != nil || v.NotBefore == nil || v.RequestedAt == nil || !v.NotBefore.Equal(v.RequestedAt.Add(job.Debounce)) {
			t.Errorf("%s after a scheduled fan-out: notBefore %v, requested %v (%v); want requested + %s", s, v.NotBefore, v.RequestedAt, err, job.Debounce)
		}
	}
	if v, err := e.reg.Get(context.Background(), "m1", "sync"); err != nil || v.NotBefore != nil {
		t.Errorf("m1 after a manual bulk request: notBefore %v (%v), want none", v.NotBefore, err)
	}
}
