package main

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/tasklease/tasklease/jobs"
)

// backlogBatch is the number of subjects of one SubmitMany when the
// tasklease backlog is enqueued.
const backlogBatch = 1000

// backlogResult is one system's manual requests under a backlog.
type backlogResult struct {
	latencies []time.Duration // manual submit → handler start
	left      int64           // backlog runs not yet started when the last manual request was sent
	drainRate float64         // backlog runs started per second during the manual window
}

// backlog: N queued bulk runs, then the consumer starts and, while the
// backlog drains, manual requests for other keys arrive one every 5–10 ms.
func (b *bench) backlog(rep int) error {
	tl, err := b.backlogTasklease(rep)
	if err != nil {
		return fmt.Errorf("tasklease: %w", err)
	}
	as, err := b.backlogAsynq(rep)
	if err != nil {
		return fmt.Errorf("asynq: %w", err)
	}
	for _, r := range []struct {
		name string
		res  backlogResult
	}{{"tasklease", tl}, {"asynq", as}} {
		if r.res.left <= 0 {
			b.fail("backlog rep %d %s: the backlog was drained before the last manual request: not measured under backlog (make the backlog larger)", rep, r.name)
		}
	}
	b.rep.add2("manual_under_backlog_p50_ms", ms(percentile(tl.latencies, 50)), ms(percentile(as.latencies, 50)))
	b.rep.add2("manual_under_backlog_p99_ms", ms(percentile(tl.latencies, 99)), ms(percentile(as.latencies, 99)))
	b.rep.add2("backlog_drain_per_s", tl.drainRate, as.drainRate)
	b.progress("backlog rep %d (%d queued, %d manual): tasklease manual p50 %.2f ms p99 %.2f ms (%d left, draining %.0f/s); asynq p50 %.2f ms p99 %.2f ms (%d left, draining %.0f/s)",
		rep, b.sz.Backlog, b.sz.BacklogManual,
		ms(percentile(tl.latencies, 50)), ms(percentile(tl.latencies, 99)), tl.left, tl.drainRate,
		ms(percentile(as.latencies, 50)), ms(percentile(as.latencies, 99)), as.left, as.drainRate)
	return nil
}

func (b *bench) backlogTasklease(rep int) (backlogResult, error) {
	n := b.sz.Backlog
	if err := b.reset(); err != nil {
		return backlogResult{}, err
	}
	var bulk atomic.Int64
	ch := make(chan started, b.sz.BacklogManual+16)
	tl, err := b.newTasklease(stageHandlers(1, func(_ context.Context, run *jobs.Run) {
		if strings.HasPrefix(run.Subject(), "m") {
			ch <- started{run.Subject(), time.Now()}
		} else {
			bulk.Add(1)
		}
	}))
	if err != nil {
		return backlogResult{}, err
	}
	defer tl.close()

	queued, err := tl.queueBacklog(b.ctx, "b", n)
	if err != nil {
		return backlogResult{}, err
	}
	b.check(fmt.Sprintf("backlog rep %d tasklease: backlog runs queued", rep), queued, int64(n))
	if err := tl.startRunner(b.ctx); err != nil {
		return backlogResult{}, err
	}
	return b.manualUnderBacklog(&bulk, ch, func(id string) error {
		_, err := tl.reg.Submit(b.ctx, id, scope, jobs.SubmitOptions{Source: jobs.SourceManual})
		return err
	})
}

func (b *bench) backlogAsynq(rep int) (backlogResult, error) {
	n := b.sz.Backlog
	if err := b.reset(); err != nil {
		return backlogResult{}, err
	}
	as := b.newAsynq()
	defer as.close()
	err := parallel(b.ctx, n, clients, func(i int) error {
		_, err := as.client.EnqueueContext(b.ctx, asynq.NewTask(taskType, []byte("b"+strconv.Itoa(i))))
		return err
	})
	if err != nil {
		return backlogResult{}, err
	}
	qi, err := as.insp.GetQueueInfo("default")
	if err != nil {
		return backlogResult{}, err
	}
	b.check(fmt.Sprintf("backlog rep %d asynq: backlog tasks pending", rep), int64(qi.Pending), int64(n))

	var bulk atomic.Int64
	ch := make(chan started, b.sz.BacklogManual+16)
	err = as.startServer(asynq.Config{Queues: map[string]int{"critical": 6, "default": 3}, StrictPriority: true},
		func(_ context.Context, t *asynq.Task) error {
			if id := string(t.Payload()); strings.HasPrefix(id, "m") {
				ch <- started{id, time.Now()}
			} else {
				bulk.Add(1)
			}
			return nil
		})
	if err != nil {
		return backlogResult{}, err
	}
	return b.manualUnderBacklog(&bulk, ch, func(id string) error {
		_, err := as.client.EnqueueContext(b.ctx, asynq.NewTask(taskType, []byte(id)), asynq.Queue("critical"))
		return err
	})
}

// manualUnderBacklog waits until the consumer is draining the backlog
// (bulk counts its handler calls), then submits the manual requests m0, m1,
// … 5–10 ms apart and returns their submit → handler-start latencies.
func (b *bench) manualUnderBacklog(bulk *atomic.Int64, ch <-chan started, submit func(id string) error) (backlogResult, error) {
	n := int64(b.sz.Backlog)
	return b.requestsUnderBacklog(underBacklog{
		backlog: n, requests: b.sz.BacklogManual, prefix: "m", bulk: bulk,
		ready: func() (bool, error) { return bulk.Load() >= min(n/20, 2000), nil }, readyWithin: time.Minute,
		readyWhat: "backlog not draining",
	}, ch, submit)
}

// underBacklog describes requests sent one after another while a backlog
// drains.
type underBacklog struct {
	backlog     int64         // runs in the backlog
	requests    int           // requests to send: prefix + "0", prefix + "1", …
	prefix      string        // of the requests' ids (their subjects)
	bulk        *atomic.Int64 // the backlog's handler calls so far
	ready       func() (bool, error)
	readyEvery  time.Duration // ready is asked this often (0: every millisecond)
	readyWithin time.Duration // the first request waits until ready, at most this long
	readyWhat   string        // the error when it is not ready in time
}

// requestsUnderBacklog waits until u.ready, then submits u's requests
// 5–10 ms apart and returns their submit → handler-start latencies (ch
// carries the starts of the requests, by id).
func (b *bench) requestsUnderBacklog(u underBacklog, ch <-chan started, submit func(id string) error) (backlogResult, error) {
	var res backlogResult
	n, manual, bulk := u.backlog, u.requests, u.bulk
	ctx, cancel := context.WithTimeout(b.ctx, u.readyWithin+5*time.Minute)
	defer cancel()
	if err := waitUntil(ctx, u.readyWithin, cmp.Or(u.readyEvery, time.Millisecond), u.ready); err != nil {
		return res, fmt.Errorf("%s (%d started): %w", u.readyWhat, bulk.Load(), err)
	}

	sent := make([]time.Time, manual)
	bulk0, t0 := bulk.Load(), time.Now()
	for i := range manual {
		sent[i] = time.Now()
		if err := submit(u.prefix + strconv.Itoa(i)); err != nil {
			return res, err
		}
		time.Sleep(time.Duration(5000+rand.IntN(5001)) * time.Microsecond)
	}
	res.left = n - bulk.Load()
	res.drainRate = float64(bulk.Load()-bulk0) / time.Since(t0).Seconds()

	at := make(map[string]time.Time, manual)
	timeout := time.After(time.Minute)
	for len(at) < manual {
		select {
		case s := <-ch:
			at[s.id] = s.at
		case <-timeout:
			return res, fmt.Errorf("%d of %d requests started within a minute", len(at), manual)
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}
	for i := range manual {
		start, ok := at[u.prefix+strconv.Itoa(i)]
		if !ok {
			return res, fmt.Errorf("request %s%d never started", u.prefix, i)
		}
		res.latencies = append(res.latencies, start.Sub(sent[i]))
	}
	return res, nil
}
