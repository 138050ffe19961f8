package jobs

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/redistest"
)

// qhRequests lists the request events of run runID (requested, joined,
// skipped, throttled) as "event source outcome ×count", sorted.
func qhRequests(evs []Event, runID string) []string {
	var out []string
	for _, e := range evs {
		if e.RunID != runID {
			continue
		}
		switch e.Event {
		case "requested", "joined", "skipped", "throttled":
			out = append(out, fmt.Sprintf("%s %s %s ×%d", e.Event, e.Source, e.Outcome, e.Count))
		}
	}
	slices.Sort(out)
	return out
}

// TestQueuedRequestsCreditedToTheirRun: the audit is per run (DESIGN §3,
// §9): a queue request is logged under the follow-up that serves it, with
// its own source and coalesced count, not under the run it waited behind;
// the follow-up gets no made-up request of its own.
func TestQueuedRequestsCreditedToTheirRun(t *testing.T) {
	t.Parallel()
	const subject, scope = "u1", "course_sync"
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			h := newClHold(1)
			e := newEnv(t, b.Client, Config{Prefix: "qh", Jobs: []Job{polTwoStages(scope, h, &counter{})}})
			e.startRunner(RunnerConfig{ID: "pod-qh"})

			first := clSubmit(t, e.reg, subject, scope, SourceManual, "")
			clRecv(t, h.entered, 10*time.Second, "the first run to start")
			var queued []SubmitResult
			for _, src := range []Source{SourceForeground, SourceSchedule, SourceForeground, SourceManual} {
				r := clSubmit(t, e.reg, subject, scope, src, PolicyQueue)
				if r.Outcome != OutcomeQueued {
					t.Fatalf("queue request from %s: %s, want queued", src, r.Outcome)
				}
				queued = append(queued, r)
			}
			h.open()
			follow := polWaitRun(e, subject, scope, first.Task.RunID, 10*time.Second, StatusDone, StatusFailed, StatusCancelled)
			if follow.Status != StatusDone {
				t.Fatalf("follow-up %s ended %s, want done", follow.RunID, follow.Status)
			}
			evs := clHistory(t, e.reg, subject, scope)
			if got, want := qhRequests(evs, first.Task.RunID), []string{"requested manual started ×1"}; !slices.Equal(got, want) {
				t.Errorf("requests under the first run %s: %q, want %q", first.Task.RunID, got, want)
			}
			want := []string{"requested foreground queued ×2", "requested manual queued ×1", "requested schedule queued ×1"}
			if got := qhRequests(evs, follow.RunID); !slices.Equal(got, want) {
				t.Errorf("requests under the follow-up %s: %q, want %q (each queue request with its source and count)", follow.RunID, got, want)
			}
			for _, r := range queued {
				if r.RunID != follow.RunID {
					t.Errorf("queued reply names run %q as serving it, want the follow-up %s", r.RunID, follow.RunID)
				}
			}
			if t.Failed() {
				t.Logf("history (newest first):\n%s", qhDump(evs))
			}
		})
	}
}

// TestReplaceRequestCreditedToItsRun: a replace request is logged under
// the run that replaces (and serves it), with the queue requests that run
// also serves; the replaced run's own end says it was replaced.
func TestReplaceRequestCreditedToItsRun(t *testing.T) {
	t.Parallel()
	const subject, scope = "u1", "course_sync"
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			h := newClHold(1)
			e := newEnv(t, b.Client, Config{Prefix: "qr", Jobs: []Job{polTwoStages(scope, h, &counter{})}})
			clStartRunner(e, RunnerConfig{ID: "pod-qr"}, 1)

			first := clSubmit(t, e.reg, subject, scope, SourceSchedule, "")
			clRecv(t, h.entered, 10*time.Second, "the first run to start")
			q := clSubmit(t, e.reg, subject, scope, SourceForeground, PolicyQueue)
			r := clSubmit(t, e.reg, subject, scope, SourceManual, PolicyReplace)
			if q.Outcome != OutcomeQueued || r.Outcome != OutcomeReplaced {
				t.Fatalf("outcomes %s, %s; want queued, replaced", q.Outcome, r.Outcome)
			}
			next := polWaitRun(e, subject, scope, first.Task.RunID, 10*time.Second, StatusDone, StatusFailed, StatusCancelled)
			evs := clHistory(t, e.reg, subject, scope)
			if got, want := qhRequests(evs, first.Task.RunID), []string{"requested schedule started ×1"}; !slices.Equal(got, want) {
				t.Errorf("requests under the replaced run: %q, want %q", got, want)
			}
			want := []string{"requested foreground queued ×1", "requested manual replaced ×1"}
			if got := qhRequests(evs, next.RunID); !slices.Equal(got, want) {
				t.Errorf("requests under the replacing run %s: %q, want %q", next.RunID, got, want)
			}
			if !clSameSet(next.Sources, clSources(SourceForeground, SourceManual)) {
				t.Errorf("replacing run's sources %v, want [foreground manual]", next.Sources)
			}
			if q.RunID != next.RunID || r.RunID != next.RunID {
				t.Errorf("replies name runs %q (queued) and %q (replaced), want %s", q.RunID, r.RunID, next.RunID)
			}
			if t.Failed() {
				t.Logf("history (newest first):\n%s", qhDump(evs))
			}
		})
	}
}

// TestCancelledFollowUpKeepsItsRequests: a cancel drops the queued
// follow-up; the requests it would have served stay under its id, with
// their count, and a cancelled event of that id says what became of them.
// A follow-up queued after the cancel is a new run with its own requests.
func TestCancelledFollowUpKeepsItsRequests(t *testing.T) {
	t.Parallel()
	const subject, scope = "u1", "course_sync"
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			// The first run's stage ignores its cancel until released, so
			// the run is still stopping when the later request comes.
			h := &qhStubborn{entered: make(chan struct{}, 1), release: make(chan struct{})}
			e := newEnv(t, b.Client, Config{Prefix: "qc", Jobs: []Job{polTwoStages(scope, h, &counter{})}})
			clStartRunner(e, RunnerConfig{ID: "pod-qc"}, 1)

			first := clSubmit(t, e.reg, subject, scope, SourceManual, "")
			clRecv(t, h.entered, 10*time.Second, "the first run to start")
			dropped := clSubmit(t, e.reg, subject, scope, SourceSchedule, PolicyQueue)
			clSubmit(t, e.reg, subject, scope, SourceSchedule, PolicyQueue)
			if o, err := e.reg.Cancel(t.Context(), subject, scope); err != nil || o != CancelCancelling {
				t.Fatalf("Cancel: %s %v, want cancelling", o, err)
			}
			// queued while the cancelled run is still stopping: a new follow-up
			later := clSubmit(t, e.reg, subject, scope, SourceSchedule, PolicyQueue)
			close(h.release)
			if later.Outcome != OutcomeQueued || dropped.RunID == "" || later.RunID == "" || later.RunID == dropped.RunID {
				t.Fatalf("follow-ups %q (dropped) and %q (%s after the cancel): want two ids, the second queued", dropped.RunID, later.RunID, later.Outcome)
			}
			next := polWaitRun(e, subject, scope, first.Task.RunID, 10*time.Second, StatusDone, StatusFailed, StatusCancelled)
			if next.RunID != later.RunID {
				t.Errorf("run after the cancelled one is %s, want the follow-up queued after the cancel, %s", next.RunID, later.RunID)
			}
			evs := clHistory(t, e.reg, subject, scope)
			if got, want := qhRequests(evs, dropped.RunID), []string{"requested schedule queued ×2"}; !slices.Equal(got, want) {
				t.Errorf("requests under the dropped follow-up: %q, want %q", got, want)
			}
			if c, ok := qhFind(evs, dropped.RunID, "cancelled"); !ok || !strings.Contains(c.Error, "before it started") {
				t.Errorf("the dropped follow-up's cancelled event: %+v (found %v), want one saying it never started", c, ok)
			}
			if got, want := qhRequests(evs, later.RunID), []string{"requested schedule queued ×1"}; !slices.Equal(got, want) {
				t.Errorf("requests under the later follow-up: %q, want %q", got, want)
			}
			if t.Failed() {
				t.Logf("history (newest first):\n%s", qhDump(evs))
			}
		})
	}
}

func qhFind(evs []Event, runID, event string) (Event, bool) {
	for _, e := range evs {
		if e.RunID == runID && e.Event == event {
			return e, true
		}
	}
	return Event{}, false
}

func qhDump(evs []Event) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "  %s run %s source=%s stage=%s outcome=%s count=%d error=%s\n", e.Event, e.RunID, e.Source, e.Stage, e.Outcome, e.Count, e.Error)
	}
	return b.String()
}

// qhStubborn is a stage whose first execution returns only when release
// is closed, whatever its context says (a stage slow to stop); later ones
// return at once.
type qhStubborn struct {
	calls   atomic.Int32
	entered chan struct{}
	release chan struct{}
}

func (s *qhStubborn) RunStage(ctx context.Context, run *Run) error {
	if s.calls.Add(1) == 1 {
		s.entered <- struct{}{}
		<-s.release
	}
	return nil
}
