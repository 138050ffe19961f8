package jobs

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/leasing"
)

// TestTokensMonotonicWhenRedisRestartsEmpty (issue 4/8, defect 2): Redis
// restarts without persistence while a run holds token T. The holder loses
// its lease (its heartbeat is refused) and stops; the next run of the key
// gets a token above T — a downstream that rejects lower tokens keeps
// accepting new runs, and no two holders ever share a token.
func TestTokensMonotonicWhenRedisRestartsEmpty(t *testing.T) {
	s := redistest.StartServer(t)
	rdb := s.Client(t)
	ctx := context.Background()
	type entry struct {
		ctx context.Context
		run *Run
	}
	entered := make(chan entry, 2)
	h := HandlerFunc(func(ctx context.Context, run *Run) error {
		entered <- entry{ctx, run}
		<-ctx.Done()
		return context.Cause(ctx)
	})
	e := newEnv(t, rdb, Config{Prefix: "dl", Jobs: []Job{clJob("course_sync", Stage{Name: "pulling", Handler: h})}})
	e.startRunner(RunnerConfig{ID: "dl", LeaseTTL: time.Second})
	clSubmit(t, e.reg, "u1", "course_sync", SourceManual, "")
	first := clRecv(t, entered, 10*time.Second, "the first run to start")

	s.Kill()
	s.Restart(t)
	// The old holder learns it lost the lease and stops.
	clRecv(t, first.ctx.Done(), 10*time.Second, "the old holder to stop")
	cause := context.Cause(first.ctx)
	if !errors.Is(cause, leasing.ErrLost) {
		t.Errorf("old holder stopped by %v, want leasing.ErrLost", cause)
	}
	waitFor(t, 10*time.Second, "Redis to answer after the restart", func() bool { return rdb.Ping(ctx).Err() == nil })
	clSubmit(t, e.reg, "u1", "course_sync", SourceManual, "")
	second := clRecv(t, entered, 20*time.Second, "the second run to start")
	if second.run.FencingToken() <= first.run.FencingToken() {
		t.Fatalf("token after Redis lost its data %d, want above the earlier %d", second.run.FencingToken(), first.run.FencingToken())
	}
	if second.run.FencingToken() >= 1<<53 {
		t.Fatalf("token %d is not JSON-safe", second.run.FencingToken())
	}
}
