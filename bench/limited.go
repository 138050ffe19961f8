package main

import (
	"fmt"
	"sync/atomic"

	"github.com/tasklease/tasklease/jobs"
)

// e2eLimiter names the limiter of e2e_1stage_limited.
const e2eLimiter = "bench"

// e2eLimited: e2e_1stage (the same runs, submitters and runner) with the
// job holding a named limiter of concurrency 50, the runner's own, so the
// limit never binds: what a limited run costs when nothing waits. Each
// repetition also measures tasklease's plain e2e_1stage, alternately before
// and after it, and the goal is the ratio of the two within the
// repetition: measured minutes apart on a shared host, they would differ
// by the host. tasklease only: asynq has no limiter.
func (b *bench) e2eLimited(rep int) error {
	const name = "e2e_1stage_limited"
	var slotless, wrongLimiter atomic.Int64
	limited := tlVariant{
		stages: 1,
		config: func(cfg *jobs.Config) {
			cfg.Limiters = append(cfg.Limiters, jobs.Limiter{Name: e2eLimiter, Concurrency: concurrency})
			cfg.Jobs[0].Limiters = []string{e2eLimiter}
		},
		observe: func(run *jobs.Run) {
			slots := run.LimiterSlots()
			if len(slots) != 1 {
				slotless.Add(1)
				return
			}
			if slots[0].Limiter != e2eLimiter {
				wrongLimiter.Add(1)
			}
		},
	}
	plain := tlVariant{stages: 1}

	var base, lim e2eResult
	measure := func(which string, v tlVariant, into *e2eResult) (err error) {
		if *into, err = b.e2eTasklease(which, rep, v); err != nil {
			return fmt.Errorf("tasklease (%s): %w", which, err)
		}
		return nil
	}
	// alternate the order: whichever runs second finds a warmer process
	first, second := func() error { return measure("e2e_1stage", plain, &base) }, func() error { return measure(name, limited, &lim) }
	if rep%2 == 0 {
		first, second = second, first
	}
	if err := first(); err != nil {
		return err
	}
	if err := second(); err != nil {
		return err
	}
	n := b.sz.E2ERuns
	b.check(fmt.Sprintf("%s rep %d: runs without exactly one limiter slot", name, rep), slotless.Load(), 0)
	b.check(fmt.Sprintf("%s rep %d: runs holding another limiter's slot", name, rep), wrongLimiter.Load(), 0)

	b.rep.add(name+"_per_s", lim.rate)
	b.rep.add(name+"_baseline_per_s", base.rate)
	b.rep.add(name+"_ratio", lim.rate/base.rate)
	b.rep.add(name+"_redis_calls_per_run", lim.redisCalls)
	b.rep.add(name+"_baseline_redis_calls_per_run", base.redisCalls)
	b.rep.add("round_trips_per_1stage_limited_run", lim.roundTrips)
	b.rep.add(name+"_redis_cpu_us_per_run", lim.redisCPUus)
	b.rep.add(name+"_bench_cpu_us_per_run", lim.benchCPUus)
	if b.commands {
		b.progress("%s rep %d: tasklease per run: %s", name, rep, formatCommands(lim.commands, n))
		b.progress("%s rep %d: tasklease FCALLs per run: %s", name, rep, formatFcalls(lim.fcalls, n))
		b.progress("%s rep %d: (unlimited) tasklease per run: %s", name, rep, formatCommands(base.commands, n))
		b.progress("%s rep %d: (unlimited) tasklease FCALLs per run: %s", name, rep, formatFcalls(base.fcalls, n))
	}
	b.progress("%s rep %d: limited %.0f runs/s, unlimited %.0f runs/s: %.2f× (per run: redis %.1f µs vs %.1f, %.1f calls vs %.1f, %.2f round trips vs %.2f, bench CPU %.1f µs vs %.1f)",
		name, rep, lim.rate, base.rate, lim.rate/base.rate, lim.redisCPUus, base.redisCPUus, lim.redisCalls, base.redisCalls,
		lim.roundTrips, base.roundTrips, lim.benchCPUus, base.benchCPUus)
	return nil
}
