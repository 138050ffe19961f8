package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tasklease/tasklease/jobs"
)

// The fair-share measurement's job: its own limiter of this concurrency,
// runs grouped by their subject's prefix, a stage of fairStage.
const (
	fairConcurrency = 10
	fairStage       = 5 * time.Millisecond
)

// limiterFairness: tenant A's backlog waits for a concurrency-10 limiter
// (the job's own, fair share by subject prefix, a stage of ~5 ms: the
// limiter drains A at ~2,000 runs/s); then tenant B's runs arrive one
// after another, 5–10 ms apart, each from the same source as A's
// (schedule: a person's request would go first whatever the groups), and
// each should start after at most one start of A's. Measured: B's Submit →
// handler start. tasklease only: asynq has no limiter.
func (b *bench) limiterFairness(rep int) error {
	const name = "limiter_fairness"
	n := b.sz.FairBacklog
	if err := b.reset(); err != nil {
		return err
	}
	var bulk atomic.Int64
	ch := make(chan started, b.sz.FairRequests+16)
	tl, err := b.newTasklease(stageHandlers(1, func(ctx context.Context, run *jobs.Run) {
		if strings.HasPrefix(run.Subject(), "b:") {
			ch <- started{run.Subject(), time.Now()}
		} else {
			bulk.Add(1)
		}
		t := time.NewTimer(fairStage) // the work: a call that takes ~5 ms
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}), func(cfg *jobs.Config) {
		cfg.Jobs[0].Concurrency = fairConcurrency
		cfg.Jobs[0].Fairness = jobs.Fairness{GroupBy: jobs.FairnessSubjectPrefix, Separator: ":"}
	})
	if err != nil {
		return err
	}
	defer tl.close()

	queued, err := tl.queueBacklog(b.ctx, "a:", n)
	if err != nil {
		return err
	}
	b.check(fmt.Sprintf("%s rep %d: tenant A's runs queued", name, rep), queued, int64(n))
	if err := tl.startRunner(b.ctx); err != nil {
		return err
	}
	t0 := time.Now()
	var waiting int
	var loaded time.Duration
	// The backlog is in the limiter when every run of it waits there or has
	// started: all but the at most fairConcurrency holding a slot on their
	// way to their handler.
	inLimiter := func() (bool, error) {
		ls, err := tl.obs.Limiters(b.ctx) // the admin client: not counted
		if err != nil {
			return false, err
		}
		i := slices.IndexFunc(ls, func(v jobs.LimiterView) bool { return slices.Contains(v.Jobs, scope) })
		if i < 0 {
			return false, fmt.Errorf("no limiter for job %s in %v", scope, ls)
		}
		waiting = ls[i].Waiting
		if int64(waiting)+bulk.Load() < int64(n-fairConcurrency) {
			return false, nil
		}
		loaded = time.Since(t0)
		return true, nil
	}
	res, err := b.requestsUnderBacklog(underBacklog{
		backlog: int64(n), requests: b.sz.FairRequests, prefix: "b:", bulk: &bulk,
		ready: inLimiter, readyEvery: 10 * time.Millisecond, readyWithin: 5 * time.Minute, // a read of Redis each
		readyWhat: "tenant A's backlog not in the limiter",
	}, ch, func(id string) error {
		_, err := tl.reg.Submit(b.ctx, id, scope, jobs.SubmitOptions{Source: jobs.SourceSchedule})
		return err
	})
	if err != nil {
		return fmt.Errorf("tasklease: %w", err)
	}
	if res.left <= 0 {
		b.fail("%s rep %d: tenant A's backlog was drained before tenant B's last request: not measured under backlog (make the backlog larger)", name, rep)
	}
	b.rep.add(name+"_p50_ms", ms(percentile(res.latencies, 50)))
	b.rep.add(name+"_p99_ms", ms(percentile(res.latencies, 99)))
	b.progress("%s rep %d (%d of tenant A's runs, concurrency %d, %s stages; in the limiter after %.1f s, %d waiting): tenant B's %d runs p50 %.2f ms p99 %.2f ms max %.2f ms (A: %d left, draining %.0f/s)",
		name, rep, n, fairConcurrency, fairStage, loaded.Seconds(), waiting, len(res.latencies),
		ms(percentile(res.latencies, 50)), ms(percentile(res.latencies, 99)), ms(percentile(res.latencies, 100)), res.left, res.drainRate)
	return nil
}
