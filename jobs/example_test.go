package jobs_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/jobs"
)

// Every entry point submits through the Registry; a Runner executes. Here a
// manual "sync now" and a schedule arrive together: one run, both sources.
// (The runner starts after both requests so the output is the same every
// time: an idle runner starts a run within a millisecond, and a request
// that joins a running run is in the task's view, not in the Sources the
// attempt started with.)
func Example() {
	m, _ := miniredis.Run() // any Redis: redis.NewUniversalClient(...) for a real one
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	reg, err := jobs.NewRegistry(rdb, jobs.Config{Jobs: []jobs.Job{{
		Scope: "course_sync",
		Stages: []jobs.Stage{
			{Name: "pulling", Handler: jobs.HandlerFunc(func(ctx context.Context, run *jobs.Run) error {
				return nil // fetch what the sync needs
			})},
			{Name: "pushing", Handler: jobs.HandlerFunc(func(ctx context.Context, run *jobs.Run) error {
				// Hand the fencing token to every downstream write.
				fmt.Println("pushing for", run.Subject(), "fenced:", run.FencingToken() > 0, "sources", run.Sources())
				return nil
			})},
		},
	}}})
	if err != nil {
		panic(err)
	}
	first, _ := reg.Submit(ctx, "u42", "course_sync", jobs.SubmitOptions{Source: jobs.SourceManual})
	second, _ := reg.Submit(ctx, "u42", "course_sync", jobs.SubmitOptions{Source: jobs.SourceSchedule})
	fmt.Println(first.Outcome, second.Outcome)

	runner, _ := jobs.NewRunner(reg, jobs.RunnerConfig{ID: "pod-a"})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- runner.Run(rctx) }()

	for {
		v, _ := reg.Get(ctx, "u42", "course_sync")
		if v.Status == jobs.StatusDone {
			fmt.Println(v.Key, v.Status, v.CompletedStages)
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	<-done
	// Output:
	// started joined
	// pushing for u42 fenced: true sources [manual schedule]
	// u42|course_sync done [pulling pushing]
}
