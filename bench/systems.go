package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/jobs"
)

// settle leaves a freshly started runner or server alone for a moment, so
// it is idle (groups created, blocking reads or polls under way) when the
// first request of a measurement arrives.
func settle() { time.Sleep(300 * time.Millisecond) }

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// stageHandlers returns n no-op stages; the last one calls last.
func stageHandlers(n int, last func(ctx context.Context, run *jobs.Run)) []jobs.Stage {
	names := []string{"pulling", "pushing", "third", "fourth"}
	out := make([]jobs.Stage, n)
	for i := range out {
		h := jobs.HandlerFunc(func(context.Context, *jobs.Run) error { return nil })
		if i == n-1 && last != nil {
			h = func(ctx context.Context, run *jobs.Run) error { last(ctx, run); return nil }
		}
		out[i] = jobs.Stage{Name: names[i], Handler: h}
	}
	return out
}

// tlSide is the tasklease side of a measurement: a Registry (and maybe a
// Runner) on a client whose round trips are counted.
type tlSide struct {
	rdb   *redis.Client
	trips *tripCounter
	reg   *jobs.Registry
	obs   *jobs.Registry // the same jobs on the uncounted admin client, for checks

	stopRunner context.CancelFunc
	runnerDone chan error
	closed     bool
}

// newTasklease returns a Registry with one job of scope sync with the given
// stages; each of opts may change the configuration first (the limiter
// measurements give the job limiters: cfg.Jobs[0] is the job).
func (b *bench) newTasklease(stages []jobs.Stage, opts ...func(cfg *jobs.Config)) (*tlSide, error) {
	t := &tlSide{trips: &tripCounter{}}
	if b.commands {
		t.trips.fns = &sync.Map{}
	}
	t.rdb = newClient(b.addr, t.trips)
	cfg := jobs.Config{Logger: discard, Jobs: []jobs.Job{{Scope: scope, Stages: stages}}}
	for _, o := range opts {
		o(&cfg)
	}
	var err error
	if t.reg, err = jobs.NewRegistry(t.rdb, cfg); err != nil {
		t.rdb.Close()
		return nil, err
	}
	if t.obs, err = jobs.NewRegistry(b.admin, cfg); err != nil {
		t.rdb.Close()
		return nil, err
	}
	return t, nil
}

// startRunner starts one Runner of concurrency 50.
func (t *tlSide) startRunner(ctx context.Context) error {
	rn, err := jobs.NewRunner(t.reg, jobs.RunnerConfig{ID: "bench", Concurrency: concurrency, ShutdownGrace: 5 * time.Second})
	if err != nil {
		return err
	}
	rctx, cancel := context.WithCancel(ctx)
	t.stopRunner, t.runnerDone = cancel, make(chan error, 1)
	go func() { t.runnerDone <- rn.Run(rctx) }()
	return nil
}

// close stops the runner (gracefully) and closes the client; again, it does
// nothing.
func (t *tlSide) close() error {
	if t.closed {
		return nil
	}
	t.closed = true
	var err error
	if t.stopRunner != nil {
		t.stopRunner()
		if e := <-t.runnerDone; e != nil {
			err = fmt.Errorf("runner: %w", e)
		}
		t.stopRunner = nil
	}
	t.rdb.Close()
	return err
}

// asSide is the asynq side: a Client, an Inspector and maybe a Server on
// one counted go-redis client.
type asSide struct {
	rdb    *redis.Client
	trips  *tripCounter
	client *asynq.Client
	insp   *asynq.Inspector
	srv    *asynq.Server
}

func (b *bench) newAsynq() *asSide {
	a := &asSide{trips: &tripCounter{}}
	a.rdb = newClient(b.addr, a.trips)
	a.client = asynq.NewClientFromRedisClient(a.rdb)
	a.insp = asynq.NewInspectorFromRedisClient(b.admin) // checks are not counted
	return a
}

// startServer starts an asynq Server of concurrency 50 with cfg's other
// settings.
func (a *asSide) startServer(cfg asynq.Config, h asynq.HandlerFunc) error {
	cfg.Concurrency = concurrency
	cfg.Logger = asynqDiscard{}
	cfg.LogLevel = asynq.FatalLevel
	a.srv = asynq.NewServerFromRedisClient(a.rdb, cfg)
	if err := a.srv.Start(h); err != nil {
		a.srv = nil
		return fmt.Errorf("asynq server: %w", err)
	}
	return nil
}

func (a *asSide) close() {
	if a.srv != nil {
		a.srv.Shutdown()
		a.srv = nil
	}
	_ = a.client.Close() // shared connection: only marks the client closed
	a.rdb.Close()
}

// asynqDiscard is an asynq.Logger that drops everything.
type asynqDiscard struct{}

func (asynqDiscard) Debug(...any) {}
func (asynqDiscard) Info(...any)  {}
func (asynqDiscard) Warn(...any)  {}
func (asynqDiscard) Error(...any) {}
func (asynqDiscard) Fatal(...any) {}

// queueBacklog submits n schedule requests for subjects prefix0 … prefix<n-1>
// (SubmitMany, backlogBatch at a time) and returns how many runs they
// started.
func (t *tlSide) queueBacklog(ctx context.Context, prefix string, n int) (int64, error) {
	var queued int64
	for i := 0; i < n; i += backlogBatch {
		subjects := make([]string, 0, backlogBatch)
		for j := i; j < min(i+backlogBatch, n); j++ {
			subjects = append(subjects, prefix+strconv.Itoa(j))
		}
		outs, err := t.reg.SubmitMany(ctx, scope, subjects, jobs.SubmitManyOptions{Source: jobs.SourceSchedule})
		if err != nil {
			return queued, err
		}
		for _, o := range outs {
			if o == jobs.OutcomeStarted {
				queued++
			}
		}
	}
	return queued, nil
}
