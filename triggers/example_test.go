package triggers_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/triggers"
)

// newRegistry registers two foreground jobs and one that is not. No runner
// executes them here, so a run stays queued and later requests join it.
func newRegistry(rdb redis.UniversalClient) *jobs.Registry {
	noop := jobs.HandlerFunc(func(context.Context, *jobs.Run) error { return nil })
	stages := []jobs.Stage{{Name: "pulling", Handler: noop}, {Name: "pushing", Handler: noop}}
	reg, err := jobs.NewRegistry(rdb, jobs.Config{
		Logger: slog.New(slog.DiscardHandler),
		Jobs: []jobs.Job{
			{Scope: "course_sync", Stages: stages, Foreground: true},
			{Scope: "message_sync", Stages: stages, Foreground: true},
			{Scope: "backup", Stages: stages},
		},
	})
	if err != nil {
		panic(err)
	}
	return reg
}

// The app of user u42 came to the foreground: one request per foreground
// job. A second hook call while those runs are active joins them instead of
// starting more.
func ExampleForeground() {
	mr, _ := miniredis.Run() // any Redis: redis.NewUniversalClient(...) for a real one
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	reg := newRegistry(rdb)

	for range 2 {
		res, err := triggers.Foreground(ctx, reg, "u42", nil) // nil: every job with Foreground set
		if err != nil {
			panic(err)
		}
		for _, r := range res {
			fmt.Println(r.Scope, r.Outcome, r.Task.Status)
		}
	}
	// Output:
	// course_sync started queued
	// message_sync started queued
	// course_sync joined queued
	// message_sync joined queued
}

// Every runner runs a Scheduler with the same schedules; one leads and
// fans each occurrence out to the subjects, one request each.
func ExampleScheduler() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	reg := newRegistry(rdb)

	s, err := triggers.NewScheduler(rdb, reg, triggers.SchedulerConfig{
		ID:     "pod-a",
		Logger: slog.New(slog.DiscardHandler),
		Schedules: []triggers.Schedule{
			{Name: "courses", Cron: "@every 1s", Scope: "course_sync", Subjects: []string{"u1", "u2"}},
		},
	})
	if err != nil {
		panic(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- s.Run(rctx) }()

	for {
		st, err := s.Status(ctx)
		if err != nil {
			panic(err)
		}
		if last := st[0].LastOccurrence; last != nil && last.Done {
			fmt.Println(st[0].Name, st[0].Cron, st[0].Scope, "subjects", st[0].Subjects.Count)
			fmt.Println("leader is pod-a:", st[0].Leader == s.Owner(), "submitted", last.Submitted)
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	<-done

	for _, subject := range []string{"u1", "u2"} {
		v, _ := reg.Get(ctx, subject, "course_sync")
		fmt.Println(v.Key, v.Status, v.Sources)
	}
	// Output:
	// courses @every 1s course_sync subjects 2
	// leader is pod-a: true submitted 2
	// u1|course_sync queued [schedule]
	// u2|course_sync queued [schedule]
}
