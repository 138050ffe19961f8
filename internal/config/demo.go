package config

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/tasklease/tasklease/jobs"
)

// demoFailPrefix: demo runs of subjects starting with it fail.
const demoFailPrefix = "fail"

// demoHalfway is the progress cursor a demo stage saves halfway through.
const demoHalfway = "halfway"

// DemoJobs returns the seed's three demo jobs, course_sync, message_sync and
// backup (sorted by scope), each pulling → pushing with Go stages that take
// 1–2 s, honour ctx and save progress once halfway, so a resumed stage
// visibly skips its first half. course_sync and message_sync are
// foreground jobs; all use the join policy, no minInterval and 3 attempts.
// `runner serve` registers them when no jobs are configured, so a fresh
// machine shows the whole system. A subject starting with "fail" fails at
// pushing, permanently (no retries), so failures and Retry can be shown too.
func DemoJobs() []jobs.Job {
	mk := func(scope string, foreground bool) jobs.Job {
		return jobs.Job{
			Scope: scope,
			Stages: []jobs.Stage{
				{Name: "pulling", Handler: jobs.HandlerFunc(demoStage)},
				{Name: "pushing", Handler: jobs.HandlerFunc(demoStage)},
			},
			OnConflict:  jobs.PolicyJoin,
			MinInterval: 0,
			Retry: jobs.RetryPolicy{
				MaxAttempts: 3,
				Backoff:     jobs.BackoffDefault,
				MaxBackoff:  jobs.MaxBackoffDefault,
			},
			Foreground: foreground,
		}
	}
	return []jobs.Job{
		mk("backup", false),
		mk("course_sync", true),
		mk("message_sync", true),
	}
}

// demoStage sleeps 1–2 s in two halves with a fenced SaveProgress between
// them; after a takeover at the halfway cursor only the second half runs.
func demoStage(ctx context.Context, run *jobs.Run) error {
	if run.Stage() == "pushing" && strings.HasPrefix(run.Subject(), demoFailPrefix) {
		if err := sleepCtx(ctx, 300*time.Millisecond); err != nil {
			return err
		}
		return jobs.Permanent(fmt.Errorf("demo: subjects starting with %q fail at pushing", demoFailPrefix))
	}
	total := time.Second + rand.N(time.Second)
	half := total / 2
	if string(run.Cursor()) != demoHalfway {
		if err := sleepCtx(ctx, half); err != nil {
			return err
		}
		if err := run.SaveProgress(ctx, []byte(demoHalfway)); err != nil {
			return fmt.Errorf("demo %s: save progress: %w", run.Stage(), err)
		}
	}
	return sleepCtx(ctx, total-half)
}

// sleepCtx waits d or until ctx is done, returning its cause.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
