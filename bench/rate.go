package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
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
// of concurrency 50). Counted: the handler starts within D from the
// first, less the burst; accuracy = that ÷ (rate × D), 1 when the limiter
// gives exactly what it promises (GCRA: over any window W at most rate·W
// + burst starts).
//
// An exact limiter measures a few starts more than rate × D + burst (one
// start is 0.001 at --quick sizes, 0.0002 at full): the starts are the
// handlers', a moment after their admission in Redis, and the burst's
// runs start a few ms late (behind the denied runs of the same read), so
// the window, which opens at the first start, takes in those ms of paced
// starts too; and GCRA lets a limiter whose takers lagged (the runner's
// startup) catch up by up to the burst again. The goal is compared to 2
// decimals (report.go). The progress line says how late the burst was:
// its runs are told apart by their tokens, the limiter's admissions
// 1…burst. Also reported: the most starts within any second
// (rate_most_in_1s; for the same reasons a few more than rate + burst).
// tasklease only: asynq has no limiter.
func (b *bench) rateAccuracy(rep int) error {
	const name = "rate_accuracy"
	d := time.Duration(b.sz.RateSeconds) * time.Second
	interval := time.Second / ratePerS
	n := ratePerS*b.sz.RateSeconds*6/5 + rateBurst + 200 // saturated: more than the limiter lets start in D
	if err := b.reset(); err != nil {
		return err
	}
	type start struct {
		at    time.Time // the handler's start
		token int64     // the limiter's admission: at least Redis time in µs
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

	queued, err := tl.queueBacklog(b.ctx, "r", n)
	if err != nil {
		return err
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

	// Admissions are timed by their tokens, which the limiter takes as
	// Redis time in µs (one more than the last when two fall in one µs):
	// the limiter's own clock, free of the moment between an admission and
	// its handler's start.
	all := slices.Clone(starts[:min(count.Load(), int64(n))])
	slices.SortFunc(all, func(a, b start) int { return cmp.Compare(a.token, b.token) })
	at := func(s start) time.Time { return time.UnixMicro(s.token) }
	inD, most := 0, 0
	firstPaced, lastBurst := time.Duration(-1), time.Duration(0)
	for i, s := range all {
		since := at(s).Sub(at(all[0]))
		if since < d {
			inD++
		}
		if i < rateBurst {
			lastBurst = max(lastBurst, since)
		} else if firstPaced < 0 {
			firstPaced = since
		}
		j, _ := slices.BinarySearchFunc(all[i:], at(s).Add(time.Second), func(a start, t time.Time) int { return at(a).Compare(t) })
		most = max(most, j) // admissions in [s, s+1s)
	}
	want := float64(ratePerS) * d.Seconds()
	accuracy := (float64(inD) - rateBurst) / want
	b.rep.add(name, accuracy)
	b.rep.add("rate_most_in_1s", float64(most))
	b.progress("%s rep %d (%d/s, burst %d, %s saturated by %d runs): %d starts in %s from the first (exact: %.0f + %d): accuracy %.4f; the burst's last start %.1f ms, the first paced start %.1f ms after the first start (admitted %.1f ms after the burst); at most %d admissions in any second (rate + burst: %d); %d runs left",
		name, rep, ratePerS, rateBurst, d, n, inD, d, want, rateBurst, accuracy,
		ms(lastBurst), ms(firstPaced), ms(interval), most, ratePerS+rateBurst, int64(n)-startedBy)
	return nil
}
