package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tasklease/tasklease/jobs"
)

// The rate measurement's limiter: a rate a 2-core machine sustains with
// no-op stages, with a burst.
const (
	rateLimiter = "api"
	ratePerS    = 500
	rateBurst   = 10
)

// rateAccuracy: a limiter of rate 500/s, burst 10, saturated for D seconds
// by a backlog larger than the rate lets start (no-op stages, one runner
// of concurrency 50). Counted: the starts over D from the first, less the
// burst; accuracy = that ÷ (rate × D), 1 when the limiter gives exactly
// what it promises (GCRA: the burst at once, then one start every
// 1/rate).
//
// Both ends of the window are placed so that a handler's start, a
// moment after its admission, cannot move a start across them: the burst
// is told apart by its tokens (the limiter's admissions 1…burst), not by
// time — its runs start a few ms after their admission, behind the
// denied runs of the same read — and the window opens half an interval
// before the paced starts' schedule (the k-th admitted k-1 intervals
// after the first; its phase the median over 100 starts, not one start
// that may be late), so the start admitted D after the first paced one
// falls half an interval outside it. Also reported: the most starts
// within any second (rate_most_in_1s; handler times: the promise, rate +
// burst, is on admissions). tasklease only: asynq has no limiter.
func (b *bench) rateAccuracy(rep int) error {
	const name = "rate_accuracy"
	d := time.Duration(b.sz.RateSeconds) * time.Second
	interval := time.Second / ratePerS
	n := ratePerS*b.sz.RateSeconds*6/5 + rateBurst + 200 // saturated: more than the limiter lets start in D
	if err := b.reset(); err != nil {
		return err
	}
	type start struct {
		at    time.Time
		token int64 // the limiter's admission number
	}
	var count, slotless atomic.Int64
	starts := make([]start, n)
	tl, err := b.newTasklease(stageHandlers(1, func(_ context.Context, run *jobs.Run) {
		now := time.Now()
		slots := run.LimiterSlots()
		if len(slots) != 1 || slots[0].Limiter != rateLimiter {
			slotless.Add(1)
			return
		}
		if i := count.Add(1) - 1; i < int64(n) {
			starts[i] = start{now, slots[0].Token}
		}
	}), func(cfg *jobs.Config) {
		cfg.Limiters = append(cfg.Limiters, jobs.Limiter{Name: rateLimiter,
			Rate: jobs.Rate{Count: ratePerS, Per: time.Second, Burst: rateBurst}})
		cfg.Jobs[0].Limiters = []string{rateLimiter}
	})
	if err != nil {
		return err
	}
	defer tl.close()

	var queued int64
	for i := 0; i < n; i += backlogBatch {
		subjects := make([]string, 0, backlogBatch)
		for j := i; j < min(i+backlogBatch, n); j++ {
			subjects = append(subjects, "r"+strconv.Itoa(j))
		}
		outs, err := tl.reg.SubmitMany(b.ctx, scope, subjects, jobs.SubmitManyOptions{Source: jobs.SourceSchedule})
		if err != nil {
			return err
		}
		for _, o := range outs {
			if o == jobs.OutcomeStarted {
				queued++
			}
		}
	}
	b.check(fmt.Sprintf("%s rep %d: runs queued", name, rep), queued, int64(n))
	if err := tl.startRunner(b.ctx); err != nil {
		return err
	}
	if err := waitUntil(b.ctx, time.Minute, time.Millisecond, func() (bool, error) { return count.Load() > 0, nil }); err != nil {
		return fmt.Errorf("no run started: %w", err)
	}
	select { // the first start was at most a millisecond ago
	case <-time.After(d + 300*time.Millisecond):
	case <-b.ctx.Done():
		return b.ctx.Err()
	}
	startedBy := count.Load()
	if err := tl.close(); err != nil { // no handler runs after this
		return err
	}
	b.check(fmt.Sprintf("%s rep %d: runs without the limiter's slot", name, rep), slotless.Load(), 0)
	if startedBy >= int64(n) {
		b.fail("%s rep %d: all %d runs started within %s: the limiter was not saturated (make the backlog larger)", name, rep, n, d)
	}

	all := slices.Clone(starts[:min(count.Load(), int64(n))])
	slices.SortFunc(all, func(a, b start) int { return a.at.Compare(b.at) })
	// The paced starts' schedule: the k-th after the burst is admitted k-1
	// intervals after the first; its phase, the median over the first 100
	// of (start − its place in the schedule), is robust to one late start.
	var offs []float64
	for _, s := range all {
		if k := s.token - rateBurst; k > 0 && k <= 100 {
			offs = append(offs, float64(s.at.Sub(all[0].at)-time.Duration(k-1)*interval))
		}
	}
	if len(offs) == 0 {
		return fmt.Errorf("no start after the burst (%d starts)", len(all))
	}
	phase := time.Duration(median(offs))
	from := all[0].at.Add(phase - interval/2)
	paced, most := 0, 0
	for i, s := range all {
		if s.token > rateBurst && !s.at.Before(from) && s.at.Sub(from) < d {
			paced++
		}
		j, _ := slices.BinarySearchFunc(all[i:], s.at.Add(time.Second), func(a start, t time.Time) int { return a.at.Compare(t) })
		most = max(most, j) // starts in [s.at, s.at+1s)
	}
	want := float64(ratePerS) * d.Seconds()
	accuracy := float64(paced) / want
	b.rep.add(name, accuracy)
	b.rep.add("rate_most_in_1s", float64(most))
	b.progress("%s rep %d (%d/s, burst %d, %s saturated by %d runs): %d starts after the burst in %s from the first (exact: %.0f): accuracy %.4f; the paced starts' schedule begins %.1f ms after the first start (admitted %.1f ms after the burst); at most %d handler starts in any second (rate + burst: %d); %d runs left",
		name, rep, ratePerS, rateBurst, d, n, paced, d, want, accuracy,
		ms(phase), ms(interval), most, ratePerS+rateBurst, int64(n)-startedBy)
	return nil
}
