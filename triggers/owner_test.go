package triggers

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/jobs"
)

// TestSchedulerTakesTheRunnersOwner: a Scheduler given its process's
// jobs.Runner owner leads under that owner, so the schedule status and the
// runner registry name the process alike; a malformed owner is refused.
func TestSchedulerTakesTheRunnersOwner(t *testing.T) {
	t.Parallel()
	rdb := redistest.StartMini(t).Client(t)
	reg := newRegistry(t, rdb)
	runner, err := jobs.NewRunner(reg, jobs.RunnerConfig{ID: "pod-a"})
	if err != nil {
		t.Fatal(err)
	}
	schedules := []Schedule{{Name: "hourly", Cron: "@hourly", Scope: "course_sync", Subjects: []string{"u1"}}}
	s := newScheduler(t, rdb, reg, SchedulerConfig{ID: runner.ID(), Owner: runner.Owner(), Schedules: schedules,
		LeaderTTL: time.Second})
	if s.Owner() != runner.Owner() {
		t.Fatalf("scheduler owner %q, runner owner %q", s.Owner(), runner.Owner())
	}
	start(t, s)
	waitFor(t, 5*time.Second, "leadership", s.IsLeader)
	st, err := s.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 1 || st[0].Leader != runner.Owner() {
		t.Fatalf("status leader %+v, want %q", st, runner.Owner())
	}

	_, err = NewScheduler(rdb, reg, SchedulerConfig{Owner: "pod a/1", Schedules: schedules, Prefix: testPrefix})
	if !errors.Is(err, jobs.ErrConfig) {
		t.Errorf("owner with a space: %v, want ErrConfig", err)
	}
}
