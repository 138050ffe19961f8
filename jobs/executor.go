package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/checkpoints"
	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/leasing"
	"github.com/tasklease/tasklease/taskkey"
)

// finish results (ARGV[4] of finish.lua).
const (
	resultDone      = "done"      // every stage completed
	resultFailed    = "failed"    // permanent failure, or attempts exhausted
	resultCancelled = "cancelled" // cancelled through the registry
	resultRetry     = "retry"     // attempt failed; retry after a backoff (or fail at maxAttempts)
	resultHandback  = "handback"  // shutdown: release, keep the checkpoint, re-queue
)

// process handles one stream entry end to end.
func (r *Runner) process(p int, m redis.XMessage) {
	ctx := r.workCtx
	str := func(f string) string { s, _ := m.Values[f].(string); return s }
	k, err := taskkey.Parse(str("key"))
	if err != nil {
		// Not written by tasklease: drop it so it is not reclaimed forever.
		r.reg.rdb.XAck(ctx, r.reg.ks.Requests(p), keyspace.Group, m.ID)
		r.reg.rdb.XDel(ctx, r.reg.ks.Requests(p), m.ID)
		return
	}
	runID, source := str("runId"), str("source")
	// A job this runner does not define (job == nil) still goes through
	// claim, which leaves the entry to a runner that defines it and says so
	// in the task view (rolling deploys).
	job := r.reg.jobs[k.Scope()]
	runCtx, cancelRun := context.WithCancelCause(r.workCtx)
	defer cancelRun(nil)
	defer r.track(cancelID(k.String(), runID), cancelRun)()
	ttl := r.cfg.LeaseTTL
	if job != nil {
		ttl = cmp0(job.LeaseTTL, ttl)
	}
	sent := time.Now()
	c, err := r.claim(ctx, k, p, m, job, runID, source, ttl)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("claim failed; the entry will be reclaimed", slog.String("task_key", k.String()), slog.Any("error", err))
		}
		return
	}
	switch c.kind {
	case claimGranted:
	case claimForeign:
		r.log.Debug("run needs a stage or job this runner does not define; left to another runner",
			slog.String("task_key", k.String()), slog.String("run_id", runID), slog.String("stage", c.missing))
		return
	default:
		return
	}
	lease := leasing.Lease{Key: k, Owner: r.owner, Token: c.token, TTL: ttl, GrantedAt: sent}
	r.execute(runCtx, cancelRun, job, p, m.ID, runID, Source(source), lease, c)
}

// execute runs a granted attempt under runCtx (cancelled by cancelRun on a
// registry cancel).
func (r *Runner) execute(runCtx context.Context, cancelRun context.CancelCauseFunc, job *Job, p int, entryID, runID string, source Source, lease leasing.Lease, c claimResult) {
	k := lease.Key
	log := r.log.With(slog.String("task_key", k.String()), slog.String("run_id", runID),
		slog.String("source", string(source)), slog.Int("attempt", c.attempt), slog.Int64("fencing_token", lease.Token))
	m := r.reg.metrics
	m.leaseGrants.WithLabelValues(k.Scope()).Inc()
	m.active.Inc()
	defer m.active.Dec()

	cp := &checkpoints.Checkpoint{RunID: runID, Stages: c.stages, Completed: c.done, Cursor: c.cursor, Attempt: c.attempt}
	rec := checkpoints.Decide(cp)
	if c.prevStatus == StatusRunning {
		m.takeovers.WithLabelValues(k.Scope(), string(rec.Mode)).Inc()
		log.Info("recovered run", slog.String("outcome", string(rec.Mode)))
	}

	ks := r.reg.ks
	keeper, err := leasing.NewKeeper(runCtx, lease.GrantedAt, leasing.KeeperConfig{TTL: lease.TTL,
		Renew: func(ctx context.Context) error {
			res, err := r.reg.scripts.heartbeat.Run(ctx, r.reg.rdb,
				[]string{ks.Lease(k), ks.Task(k), ks.Requests(p)},
				lease.Owner, lease.Token, runID, lease.TTL.Milliseconds(), keyspace.Group, entryID).Slice()
			if err != nil {
				return err
			}
			if len(res) == 0 || res[0] != int64(1) {
				return leasing.ErrNotHeld
			}
			if len(res) > 1 && res[1] == "1" {
				cancelRun(ErrCancelled)
			}
			return nil
		}})
	if err != nil { // timing validated in NewRunner; unreachable in practice
		log.Error("keeper", slog.Any("error", err))
		return
	}
	defer keeper.Stop()
	kctx := keeper.Context()

	run := &Run{key: k, runID: runID, attempt: c.attempt, sources: c.sources, source: source,
		lease: lease, recovery: rec, stages: c.stages, cursor: rec.Cursor,
		stopBy: lease.TTL / 3, store: r.reg.store, leases: r.reg.leases}

	result, completed, stageErr := resultDone, "", error(nil)
	for i := rec.StageIndex; i < len(c.stages); i++ {
		if kctx.Err() != nil { // cancelled, shut down or lease lost since the last stage
			result, stageErr = r.classify(kctx, context.Cause(kctx))
			break
		}
		name := c.stages[i]
		st := job.stage(name)
		if st == nil { // claim checks every remaining stage is defined here; never fail a run for it
			result = resultHandback
			break
		}
		run.stage = name
		if i > rec.StageIndex {
			run.cursor = nil
		}
		err := r.runStage(kctx, st, run, log)
		last := i == len(c.stages)-1
		if err == nil && kctx.Err() != nil {
			// The stage returned nil after its context was cancelled
			// (shutdown grace over, or a cancel): it is done, and must not
			// run again. finish records it, fenced, before the hand-back or
			// the cancel; a lost lease writes nothing.
			result, stageErr = r.classify(kctx, context.Cause(kctx))
			if result == resultHandback || result == resultCancelled {
				completed = name
				if last { // nothing is left to hand back or to stop
					result, stageErr = resultDone, nil
				}
			}
			break
		}
		if err == nil {
			if last {
				completed = name // finish marks the last stage done, saving a round trip
				break
			}
			if _, err = r.reg.store.Advance(kctx, lease, runID, name); err == nil {
				continue
			}
		}
		result, stageErr = r.classify(kctx, err)
		break
	}

	if result == "" { // lease lost: nothing may be written
		m.leaseLosses.WithLabelValues(k.Scope()).Inc()
		log.Warn("lease lost; stopped without writing", slog.String("stage", run.stage), slog.Any("error", keeper.Err()))
		return
	}
	r.finish(job, p, lease, runID, result, completed, stageErr, c.attempt, log)
}

func (j *Job) stage(name string) *Stage {
	for i := range j.Stages {
		if j.Stages[i].Name == name {
			return &j.Stages[i]
		}
	}
	return nil
}

func (r *Runner) runStage(kctx context.Context, st *Stage, run *Run, log *slog.Logger) (err error) {
	sctx, cancel := kctx, context.CancelFunc(func() {})
	if st.Timeout > 0 {
		sctx, cancel = context.WithTimeoutCause(kctx, st.Timeout, fmt.Errorf("stage %s timed out after %s", st.Name, st.Timeout))
	}
	defer cancel()
	start := time.Now()
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("stage %s panicked: %v", st.Name, p)
		}
		res := "done"
		if err != nil {
			res = "error"
		}
		r.reg.metrics.stageDuration.WithLabelValues(run.Scope(), st.Name, res).Observe(time.Since(start).Seconds())
		log.Debug("stage", slog.String("stage", st.Name), slog.String("outcome", res), slog.Any("error", err))
	}()
	err = st.Handler.RunStage(sctx, run)
	if err == nil && sctx.Err() != nil && kctx.Err() == nil {
		err = context.Cause(sctx) // a timed-out stage that returned nil did not finish in time
	}
	return err
}

// classify decides how an attempt that did not complete ends. "" means the
// lease is lost and nothing may be written.
func (r *Runner) classify(kctx context.Context, err error) (string, error) {
	cause := context.Cause(kctx)
	switch {
	case errors.Is(err, leasing.ErrNotHeld) || errors.Is(cause, leasing.ErrLost):
		return "", err
	case errors.Is(cause, ErrCancelled):
		return resultCancelled, ErrCancelled
	case errors.Is(cause, ErrShutdown):
		return resultHandback, nil
	case errors.Is(err, ErrStaleToken) || errors.Is(err, ErrPermanent):
		return resultFailed, err
	case err == nil:
		return resultRetry, errors.New("stage returned without error after its context ended")
	default:
		return resultRetry, err
	}
}
