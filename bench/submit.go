package main

import (
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/tasklease/tasklease/jobs"
)

// hotSources is the source mix of submit requests: mostly bulk and app
// triggers, some people. A key's requests cycle through it.
var hotSources = []jobs.Source{
	jobs.SourceSchedule, jobs.SourceSchedule, jobs.SourceSchedule, jobs.SourceSchedule,
	jobs.SourceForeground, jobs.SourceForeground, jobs.SourceForeground,
	jobs.SourceManual, jobs.SourceManual, jobs.SourceManual,
}

// submitHot: requests for a small set of keys with nothing consuming, so
// every key has one queued run and the rest of its requests join it
// (tasklease) or are refused as duplicates (asynq Unique).
func (b *bench) submitHot(rep int) error {
	keys, n := b.sz.HotKeys, b.sz.HotRequests
	subject := func(i int) string { return "u" + strconv.Itoa(i%keys) }
	source := func(i int) jobs.Source { return hotSources[(i/keys)%len(hotSources)] }
	tl, err := b.submitTasklease(n, subject, source)
	if err != nil {
		return fmt.Errorf("tasklease: %w", err)
	}
	b.check(fmt.Sprintf("submit_hot rep %d tasklease: runs started", rep), tl.started, int64(keys))
	b.check(fmt.Sprintf("submit_hot rep %d tasklease: requests joined", rep), tl.joined, int64(n-keys))
	b.check(fmt.Sprintf("submit_hot rep %d tasklease: runs queued in Redis", rep), tl.queued, int64(keys))

	as, err := b.submitAsynq(n, subject)
	if err != nil {
		return fmt.Errorf("asynq: %w", err)
	}
	b.check(fmt.Sprintf("submit_hot rep %d asynq: tasks enqueued", rep), as.enqueued, int64(keys))
	b.check(fmt.Sprintf("submit_hot rep %d asynq: duplicates refused", rep), as.duplicates, int64(n-keys))
	b.check(fmt.Sprintf("submit_hot rep %d asynq: tasks pending in Redis", rep), as.pending, int64(keys))

	b.rep.add2("submit_hot_per_s", tl.rate, as.rate)
	b.addPerRequest("submit_hot", tl.e2eResult, as.e2eResult)
	b.progress("submit_hot rep %d: tasklease %.0f req/s (Redis CPU %.1f µs/req), asynq %.0f req/s (%.1f µs/req) (%d requests, %d keys)",
		rep, tl.rate, tl.redisCPUus, as.rate, as.redisCPUus, n, keys)
	return nil
}

// submitNew: every request is for a new key; both sides deduplicate.
func (b *bench) submitNew(rep int) error {
	n := b.sz.NewRequests
	subject := func(i int) string { return "n" + strconv.Itoa(i) }
	source := func(i int) jobs.Source { return hotSources[i%len(hotSources)] }
	tl, err := b.submitTasklease(n, subject, source)
	if err != nil {
		return fmt.Errorf("tasklease: %w", err)
	}
	b.check(fmt.Sprintf("submit_new rep %d tasklease: runs started", rep), tl.started, int64(n))
	b.check(fmt.Sprintf("submit_new rep %d tasklease: runs queued in Redis", rep), tl.queued, int64(n))

	as, err := b.submitAsynq(n, subject)
	if err != nil {
		return fmt.Errorf("asynq: %w", err)
	}
	b.check(fmt.Sprintf("submit_new rep %d asynq: tasks enqueued", rep), as.enqueued, int64(n))
	b.check(fmt.Sprintf("submit_new rep %d asynq: tasks pending in Redis", rep), as.pending, int64(n))

	b.rep.add2("submit_new_per_s", tl.rate, as.rate)
	b.addPerRequest("submit_new", tl.e2eResult, as.e2eResult)
	b.progress("submit_new rep %d: tasklease %.0f req/s (Redis CPU %.1f µs/req), asynq %.0f req/s (%.1f µs/req) (%d requests)",
		rep, tl.rate, tl.redisCPUus, as.rate, as.redisCPUus, n)
	return nil
}

// listedMax is the most tasks the console counts without truncating.
const listedMax = 5000

type tlSubmitResult struct {
	e2eResult                     // rate and per-request Redis CPU, commands, round trips, bench CPU
	started, joined, queued int64 // queued: runs queued afterwards, as the console counts them in Redis
}

// submitTasklease sends n requests (subject(i), policy join) from 50
// goroutines to a fresh Registry with no Runner.
func (b *bench) submitTasklease(n int, subject func(int) string, source func(int) jobs.Source) (tlSubmitResult, error) {
	var res tlSubmitResult
	if err := b.reset(); err != nil {
		return res, err
	}
	tl, err := b.newTasklease(stageHandlers(1, nil))
	if err != nil {
		return res, err
	}
	defer tl.close()
	var started, joined atomic.Int64
	m, err := b.startMeter(tl.trips)
	if err != nil {
		return res, err
	}
	err = parallel(b.ctx, n, clients, func(i int) error {
		r, err := tl.reg.Submit(b.ctx, subject(i), scope, jobs.SubmitOptions{Source: source(i), Policy: jobs.PolicyJoin})
		switch {
		case err != nil:
			return err
		case r.Outcome == jobs.OutcomeStarted:
			started.Add(1)
		case r.Outcome == jobs.OutcomeJoined:
			joined.Add(1)
		default:
			return fmt.Errorf("submit %s: outcome %s, want started or joined", subject(i), r.Outcome)
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	if res.e2eResult, err = m.stop(n); err != nil {
		return res, err
	}
	res.started, res.joined = started.Load(), joined.Load()
	if res.started > listedMax {
		// Every request for a new key: one entry per run.
		res.queued, _, err = tl.obs.QueueDepth(b.ctx)
		return res, err
	}
	// Runs, not entries: a person's join on a queued bulk run adds a
	// people-lane entry and leaves the bulk one until a runner reads it.
	ov, err := tl.obs.Overview(b.ctx)
	if err != nil {
		return res, err
	}
	if ov.CountsTruncated {
		return res, fmt.Errorf("console counts truncated: cannot check the queued runs")
	}
	for _, s := range ov.Scopes {
		res.queued += int64(s.Counts[jobs.StatusQueued])
	}
	return res, nil
}

type asSubmitResult struct {
	e2eResult
	enqueued, duplicates, pending int64
}

// submitAsynq enqueues n tasks (payload subject(i), Unique(24h)) from 50
// goroutines with no Server; ErrDuplicateTask counts as a served request.
func (b *bench) submitAsynq(n int, subject func(int) string) (asSubmitResult, error) {
	var res asSubmitResult
	if err := b.reset(); err != nil {
		return res, err
	}
	as := b.newAsynq()
	defer as.close()
	var enqueued, dups atomic.Int64
	m, err := b.startMeter(as.trips)
	if err != nil {
		return res, err
	}
	err = parallel(b.ctx, n, clients, func(i int) error {
		_, err := as.client.EnqueueContext(b.ctx, asynq.NewTask(taskType, []byte(subject(i))), asynq.Unique(24*time.Hour))
		switch {
		case err == nil:
			enqueued.Add(1)
		case errors.Is(err, asynq.ErrDuplicateTask):
			dups.Add(1)
		default:
			return err
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	if res.e2eResult, err = m.stop(n); err != nil {
		return res, err
	}
	res.enqueued, res.duplicates = enqueued.Load(), dups.Load()
	qi, err := as.insp.GetQueueInfo("default")
	if err != nil {
		return res, err
	}
	res.pending = int64(qi.Pending)
	return res, nil
}

// addPerRequest records a submit row's per-request costs: Redis CPU,
// Redis commands and bench-process CPU.
func (b *bench) addPerRequest(name string, tl, as e2eResult) {
	b.rep.add2(name+"_redis_cpu_us_per_req", tl.redisCPUus, as.redisCPUus)
	b.rep.add2(name+"_redis_calls_per_req", tl.redisCalls, as.redisCalls)
	b.rep.add2(name+"_bench_cpu_us_per_req", tl.benchCPUus, as.benchCPUus)
	b.addInstr(name+"_redis_instructions_per_req", tl, as)
}
