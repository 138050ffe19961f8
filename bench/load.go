package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/tasklease/tasklease/jobs"
)

// loadFractions are the shares of a system's saturation throughput the
// load measurement offers it.
var loadFractions = []int{50, 90}

// loadSubmitters carry the open-loop arrivals: enough that a submit's
// round trip never holds the next arrival back at these rates.
const loadSubmitters = 128

// load: pick-up latency under load. Each system's saturation throughput is
// measured first (E2ERuns no-op runs from 50 closed-loop submitters, as
// e2e_1stage: one Runner of concurrency 50; asynq polling every 10 ms);
// then for 5 s (--quick 1 s) runs arrive open loop, as a Poisson process
// at 50 % and at 90 % of that rate, and each run's latency is counted from
// its scheduled arrival (not from when a submitter got to it, so a backlog
// of arrivals counts against the system) to its handler's start.
func (b *bench) load(rep int) error {
	window := 5 * time.Second
	if b.rep.quick {
		window = time.Second
	}
	tlSat, err := b.e2eTasklease("load", rep, tlVariant{stages: 1})
	if err != nil {
		return fmt.Errorf("tasklease saturation: %w", err)
	}
	asSat, err := b.e2eAsynq("load", rep, asynqFastCheck, false)
	if err != nil {
		return fmt.Errorf("asynq saturation: %w", err)
	}
	b.rep.add2("load_saturation_per_s", tlSat.rate, asSat.rate)
	for _, pct := range loadFractions {
		tl, err := b.loadTasklease(tlSat.rate*float64(pct)/100, window)
		if err != nil {
			return fmt.Errorf("tasklease at %d %%: %w", pct, err)
		}
		as, err := b.loadAsynq(asSat.rate*float64(pct)/100, window)
		if err != nil {
			return fmt.Errorf("asynq at %d %%: %w", pct, err)
		}
		sfx := "_at_" + strconv.Itoa(pct) + "pct"
		b.rep.add2("pickup_p50_ms"+sfx, ms(percentile(tl, 50)), ms(percentile(as, 50)))
		b.rep.add2("pickup_p99_ms"+sfx, ms(percentile(tl, 99)), ms(percentile(as, 99)))
		b.progress("load rep %d at %d %%: tasklease %.0f runs/s offered, p50 %.2f ms p99 %.2f ms; asynq %.0f offered, p50 %.2f ms p99 %.2f ms",
			rep, pct, tlSat.rate*float64(pct)/100, ms(percentile(tl, 50)), ms(percentile(tl, 99)),
			asSat.rate*float64(pct)/100, ms(percentile(as, 50)), ms(percentile(as, 99)))
	}
	return nil
}

// arrivals are the scheduled times of a Poisson process of rate per
// second over window, as offsets from its start.
func arrivals(rate float64, window time.Duration) []time.Duration {
	var out []time.Duration
	for t := time.Duration(0); ; {
		t += time.Duration(rand.ExpFloat64() / rate * float64(time.Second))
		if t >= window {
			return out
		}
		out = append(out, t)
	}
}

// openLoop offers the arrivals to submit (i: the arrival's index) from
// loadSubmitters goroutines and returns each arrival's latency from its
// scheduled time to startedAt[i] (set by the handler, Unix ns), once every
// handler started.
func (b *bench) openLoop(at []time.Duration, startedAt []atomic.Int64, submit func(ctx context.Context, i int) error) ([]time.Duration, error) {
	ctx, cancel := context.WithTimeout(b.ctx, e2eTimeout)
	defer cancel()
	next := make(chan int, len(at))
	errs := make(chan error, loadSubmitters)
	sentAt := make([]int64, len(at))
	for range loadSubmitters {
		go func() {
			for i := range next {
				sentAt[i] = time.Now().UnixNano()
				if err := submit(ctx, i); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	t0 := time.Now()
	for i, d := range at {
		if wait := time.Until(t0.Add(d)); wait > 0 {
			time.Sleep(wait) // late arrivals go at once: they count from their schedule
		}
		next <- i
	}
	close(next)
	for range loadSubmitters {
		if err := <-errs; err != nil {
			return nil, err
		}
	}
	if err := waitUntil(ctx, e2eTimeout, time.Millisecond, func() (bool, error) {
		for i := range startedAt {
			if startedAt[i].Load() == 0 {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		return nil, fmt.Errorf("handlers started: %w", err)
	}
	out := make([]time.Duration, len(at))
	lag := make([]time.Duration, len(at))
	for i, d := range at {
		out[i] = time.Unix(0, startedAt[i].Load()).Sub(t0.Add(d))
		lag[i] = time.Unix(0, sentAt[i]).Sub(t0.Add(d))
	}
	b.progress("load: the harness sent arrivals late by p50 %.2f ms, p99 %.2f ms (counted in the pick-up)", ms(percentile(lag, 50)), ms(percentile(lag, 99)))
	return out, nil
}

func (b *bench) loadTasklease(rate float64, window time.Duration) ([]time.Duration, error) {
	if err := b.reset(); err != nil {
		return nil, err
	}
	at := arrivals(rate, window)
	startedAt := make([]atomic.Int64, len(at))
	tl, err := b.newTasklease(stageHandlers(1, func(_ context.Context, run *jobs.Run) {
		if i, err := strconv.Atoi(run.Subject()[1:]); err == nil && i < len(startedAt) {
			startedAt[i].CompareAndSwap(0, time.Now().UnixNano())
		}
	}))
	if err != nil {
		return nil, err
	}
	defer tl.close()
	if err := tl.startRunner(b.ctx); err != nil {
		return nil, err
	}
	settle()
	return b.openLoop(at, startedAt, func(ctx context.Context, i int) error {
		_, err := tl.reg.Submit(ctx, "l"+strconv.Itoa(i), scope, jobs.SubmitOptions{Source: jobs.SourceManual})
		return err
	})
}

func (b *bench) loadAsynq(rate float64, window time.Duration) ([]time.Duration, error) {
	if err := b.reset(); err != nil {
		return nil, err
	}
	at := arrivals(rate, window)
	startedAt := make([]atomic.Int64, len(at))
	as := b.newAsynq()
	defer as.close()
	err := as.startServer(asynq.Config{TaskCheckInterval: asynqFastCheck}, func(_ context.Context, t *asynq.Task) error {
		if i, err := strconv.Atoi(string(t.Payload()[1:])); err == nil && i < len(startedAt) {
			startedAt[i].CompareAndSwap(0, time.Now().UnixNano())
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	settle()
	return b.openLoop(at, startedAt, func(ctx context.Context, i int) error {
		_, err := as.client.EnqueueContext(ctx, asynq.NewTask(taskType, []byte("l"+strconv.Itoa(i))),
			asynq.Unique(24*time.Hour), asynq.Retention(7*24*time.Hour))
		return err
	})
}
