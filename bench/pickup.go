package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/hibiken/asynq"

	"github.com/tasklease/tasklease/jobs"
)

// asynqFastCheck is the TaskCheckInterval of the second asynq variant: how
// often an idle asynq server polls its queues (default 1s).
const asynqFastCheck = 10 * time.Millisecond

// started is what a handler reports: which sample began, and when.
type started struct {
	id string
	at time.Time
}

// asynqDefaultCheck is asynq's default TaskCheckInterval.
const asynqDefaultCheck = time.Second

// pickup: sequential samples on an idle runner / server, from just before
// Submit (Enqueue) to the handler's start.
//
// A sample is submitted a random time after the previous one started, so
// it arrives at a random phase of the consumer's idle polling: asynq sleeps
// TaskCheckInterval/2 + rand(TaskCheckInterval) after finding its queues
// empty, so the gap is up to 1.5 TaskCheckInterval (tasklease blocks on
// XREADGROUP and has no phase: a few ms). With the default 1s that makes a
// sample cost about a second, so asynq's default variant takes a quarter
// of the samples (at least 3).
func (b *bench) pickup(rep int) error {
	n := b.sz.PickupSamples
	tl, err := b.pickupTasklease(n)
	if err != nil {
		return fmt.Errorf("tasklease: %w", err)
	}
	as, err := b.pickupAsynq(max(n/4, 3), asynqDefaultCheck)
	if err != nil {
		return fmt.Errorf("asynq: %w", err)
	}
	fast, err := b.pickupAsynq(n, asynqFastCheck)
	if err != nil {
		return fmt.Errorf("asynq (TaskCheckInterval %s): %w", asynqFastCheck, err)
	}
	b.rep.add2("pickup_p50_ms", ms(percentile(tl, 50)), ms(percentile(as, 50)))
	b.rep.add2("pickup_p99_ms", ms(percentile(tl, 99)), ms(percentile(as, 99)))
	b.rep.add("asynq_fast_pickup_p50_ms", ms(percentile(fast, 50)))
	b.rep.add("asynq_fast_pickup_p99_ms", ms(percentile(fast, 99)))
	b.progress("pickup rep %d: tasklease p50 %.2f ms p99 %.2f ms (%d samples); asynq p50 %.1f ms p99 %.1f ms (%d samples); asynq %s p50 %.2f ms p99 %.2f ms (%d samples)",
		rep, ms(percentile(tl, 50)), ms(percentile(tl, 99)), len(tl), ms(percentile(as, 50)), ms(percentile(as, 99)), len(as),
		asynqFastCheck, ms(percentile(fast, 50)), ms(percentile(fast, 99)), len(fast))
	return nil
}

func (b *bench) pickupTasklease(n int) ([]time.Duration, error) {
	if err := b.reset(); err != nil {
		return nil, err
	}
	ch := make(chan started, 16)
	tl, err := b.newTasklease(stageHandlers(1, func(_ context.Context, run *jobs.Run) {
		ch <- started{run.Subject(), time.Now()}
	}))
	if err != nil {
		return nil, err
	}
	defer tl.close()
	if err := tl.startRunner(b.ctx); err != nil {
		return nil, err
	}
	settle()
	return sampleLatencies(b.ctx, n, 3*time.Millisecond, ch, func(id string) error {
		_, err := tl.reg.Submit(b.ctx, id, scope, jobs.SubmitOptions{Source: jobs.SourceManual})
		return err
	})
}

// pickupAsynq samples an idle asynq server polling every check.
func (b *bench) pickupAsynq(n int, check time.Duration) ([]time.Duration, error) {
	if err := b.reset(); err != nil {
		return nil, err
	}
	ch := make(chan started, 16)
	as := b.newAsynq()
	defer as.close()
	err := as.startServer(asynq.Config{TaskCheckInterval: check}, func(_ context.Context, t *asynq.Task) error {
		ch <- started{string(t.Payload()), time.Now()}
		return nil
	})
	if err != nil {
		return nil, err
	}
	settle()
	return sampleLatencies(b.ctx, n, check*3/2, ch, func(id string) error {
		_, err := as.client.EnqueueContext(b.ctx, asynq.NewTask(taskType, []byte(id)))
		return err
	})
}

// sampleLatencies submits n requests one after another (ids p0, p1, …),
// each 2 ms + rand(maxGap) after the previous one's handler started, and
// returns submit → handler-start latencies.
func sampleLatencies(ctx context.Context, n int, maxGap time.Duration, ch <-chan started, submit func(id string) error) ([]time.Duration, error) {
	out := make([]time.Duration, 0, n)
	for i := range n {
		id := "p" + strconv.Itoa(i)
		t0 := time.Now()
		if err := submit(id); err != nil {
			return nil, err
		}
		timeout := time.After(10 * time.Second)
		for done := false; !done; {
			select {
			case s := <-ch:
				if s.id == id {
					out = append(out, s.at.Sub(t0))
					done = true
				}
			case <-timeout:
				return nil, fmt.Errorf("sample %s: handler did not start within 10s", id)
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		// Let the run finish and the consumer go idle again; arrive at a
		// random phase of whatever polling it does.
		time.Sleep(2*time.Millisecond + rand.N(maxGap))
	}
	return out, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
