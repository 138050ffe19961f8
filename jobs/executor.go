package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/tasklease/tasklease/checkpoints"
	"github.com/tasklease/tasklease/internal/histories"
	"github.com/tasklease/tasklease/leasing"
)

// finish results (ARGV[4] of finish.lua).
const (
	resultDone      = "done"      // every stage completed
	resultFailed    = "failed"    // permanent failure, or attempts exhausted
	resultCancelled = "cancelled" // cancelled through the registry
	resultRetry     = "retry"     // attempt failed; retry after a backoff (or fail at maxAttempts)
	resultDefer     = "defer"     // the stage asked to run again later (RetryAfter); the attempt is not counted
	resultHandback  = "handback"  // shutdown: release, keep the checkpoint, re-queue
)

// localRun is an entry's run on this runner: its context, which a
// registry cancel cancels, and its registration for cancel messages (made
// before the reclaimer's claim; after the read or finish that claimed a
// run, where a message that came first is remembered: see track), so a
// cancel published while the claim is in flight is not missed.
type localRun struct {
	e       entry
	ctx     context.Context
	cancel  context.CancelCauseFunc
	untrack func()
}

func (r *Runner) newLocalRun(e entry) *localRun {
	ctx, cancel := context.WithCancelCause(r.workCtx)
	return &localRun{e: e, ctx: ctx, cancel: cancel, untrack: r.track(cancelID(e.key.String(), e.runID), cancel)}
}

func (lr *localRun) end() {
	lr.untrack()
	lr.cancel(nil)
}

// chainMax bounds the runs one slot executes back to back from the reads
// of its finishes; then the slot goes back, so the fetch loops of other
// partitions get their turn.
const chainMax = 8

// start executes a granted run in its own goroutine, which holds the
// caller's slot. When the run finishes, the finish script also reads the
// partition's next entry (see finish), which the same goroutine claims and
// runs with the same slot; it releases the slot when there is none.
func (r *Runner) start(lr *localRun, c claimResult) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for n := 1; lr != nil; n++ {
			next, carry := r.execute(lr, c, n < chainMax)
			lr.end()
			var limited []*admission
			lr, c, limited = r.claimNext(next)
			switch {
			case carry == nil:
			case lr == nil && len(limited) > 0:
				limited[0].carry = carry // handed over in its acquire call
			case lr == nil && r.taking(): // this goroutine's slot goes to the best waiting run, if any
				limited = r.giveBackCarried(carry, 1)
			default:
				r.giveBackCarried(carry, 0)
			}
			if len(limited) == 0 {
				continue
			}
			held := 0
			if lr == nil { // this goroutine's slot goes to the first
				held = 1
			}
			got := held + r.tryAcquire(len(limited)-held)
			r.abandon(limited[got:], 0)
			if got > 0 {
				if lr == nil {
					r.admitWork(r.fetchCtx, limited[:got])
					return
				}
				go r.admitWork(r.fetchCtx, limited[:got])
			}
		}
		r.release(1)
	}()
}

// nextEntry is an entry a finish took for the slot it frees, with the
// finish's own claim of it when the script claimed it (a run of the same
// job), else nil.
type nextEntry struct {
	e     entry
	claim *claimResult
}

// claimNext runs the first granted of the entries a finish took: claimed
// by the finish already, or claimed here; nil when none was granted. The
// entries of limited jobs are returned to be admitted (admitWork).
func (r *Runner) claimNext(next []nextEntry) (*localRun, claimResult, []*admission) {
	var limited []*admission
	for i, n := range next {
		if n.claim == nil && r.limitedJob(n.e.key.Scope()) {
			limited = append(limited, &admission{e: n.e})
			continue
		}
		lr := r.newLocalRun(n.e)
		c := n.claim
		if c == nil {
			// Not cancelled when the grace ends (granting): a run granted
			// then is handed back by execute, not left to its lease.
			cctx, cancel := granting(r.workCtx, r.cfg.LeaseTTL)
			claims, err := r.claim(cctx, n.e.p, []entry{n.e})
			cancel()
			if err != nil {
				r.log.Warn("claim failed; the entry will be reclaimed", slog.String("task_key", n.e.key.String()), slog.Any("error", err))
				lr.end()
				continue
			}
			c = &claims[0]
		}
		if c.kind == claimGranted {
			for _, rest := range next[i+1:] { // not claimed: reclaimed when due
				if r.limitedJob(rest.e.key.Scope()) {
					limited = append(limited, &admission{e: rest.e})
				}
			}
			return lr, *c, limited
		}
		r.notGranted(n.e, *c)
		lr.end()
	}
	return nil, claimResult{}, limited
}

// execute runs a granted attempt under lr.ctx (cancelled on a registry
// cancel) and finishes it; with readNext it returns the entries the finish
// took for this goroutine's slot, and for a limited run the slots it
// holds, to be given back by the caller (with the next run's acquire).
func (r *Runner) execute(lr *localRun, c claimResult, readNext bool) (next []nextEntry, carry *carried) {
	e, runCtx, cancelRun := lr.e, lr.ctx, lr.cancel
	k, p, runID, source := e.key, e.p, e.runID, Source(e.source)
	job := r.reg.jobs[k.Scope()]
	lease := leasing.Lease{Key: k, Owner: r.owner, Token: c.token, TTL: c.ttl, GrantedAt: c.sent}
	log := r.log.With(slog.String("task_key", k.String()), slog.String("run_id", runID),
		slog.String("source", string(source)), slog.Int("attempt", c.attempt), slog.Int64("fencing_token", lease.Token))
	runCtx, span := r.startRunSpan(runCtx, k, runID, c)
	result, stageErr := "", error(nil)
	defer func() { span.end(r, k, runID, result, stageErr) }()
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
	// A limited run's slots are renewed with its lease and last no longer:
	// the keeper keeps the shorter of their times.
	keeperTTL := lease.TTL
	for _, g := range c.slots {
		keeperTTL = min(keeperTTL, r.slotTTL(g.lim))
	}
	keeper, err := leasing.NewKeeper(runCtx, lease.GrantedAt, leasing.KeeperConfig{TTL: keeperTTL,
		Renew: func(ctx context.Context) error {
			hb := &scriptCall{script: r.reg.scripts.heartbeat, keys: []string{ks.Lease(k), ks.Task(k), ks.Taken(p)},
				args: []any{lease.Owner, lease.Token, runID, lease.TTL.Milliseconds(), r.reclaimIdle.Milliseconds(), e.id}}
			calls := append([]*scriptCall{hb}, r.renewCalls(c.slots, e.id)...)
			if err := evalGrouped(ctx, r.reg.gc, calls); err != nil {
				return err
			}
			res, err := hb.cmd.Slice()
			if err != nil {
				return err
			}
			if len(res) == 0 || res[0] != int64(1) {
				return leasing.ErrNotHeld
			}
			for _, rc := range calls[1:] {
				if n, err := rc.cmd.Int64(); err != nil || n != 1 {
					return fmt.Errorf("limiter slot: %w", leasing.ErrNotHeld)
				}
			}
			if len(res) > 1 && res[1] == "1" {
				cancelRun(ErrCancelled)
			}
			return nil
		}})
	if err != nil { // timing validated in NewRunner; unreachable in practice
		log.Error("keeper", slog.Any("error", err))
		return nil, nil
	}
	defer keeper.Stop()
	kctx := keeper.Context()

	run := &Run{key: k, runID: runID, attempt: c.attempt, sources: c.sources, source: source,
		lease: lease, recovery: rec, stages: c.stages, cursor: rec.Cursor,
		stopBy: keeperTTL / 3, store: r.reg.store, leases: r.reg.leases, starts: r.execStarts}
	for _, g := range c.slots {
		run.slots = append(run.slots, LimiterSlot{Limiter: g.lim.Name, Slot: g.slot, Token: g.token})
	}

	result = resultDone
	completed := ""
	for i := rec.StageIndex; i < len(c.stages); i++ {
		if i == rec.StageIndex && !r.taking() {
			// Claimed by a read that ended after the runner began to stop
			// (the read sent with an idle wait runs when the wait ends):
			// give it back at once instead of starting it.
			result = resultHandback
			break
		}
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
			sent := time.Now()
			var op histories.Op
			if r.testHooks.history != nil { // k.String() allocates
				op = histories.Op{Key: k.String(), Kind: histories.Advance, Runner: r.owner, RunID: runID, Token: lease.Token, Done: i + 1}
				if r.historySent != nil {
					r.historySent(op, sent)
				}
			}
			_, err = r.reg.store.Advance(kctx, lease, runID, name)
			r.recordWrite(op, err, sent)
			if err == nil {
				continue
			}
		}
		result, stageErr = r.classify(kctx, err)
		break
	}

	if result == "" { // lease lost: nothing may be written
		result = "lease-lost"
		m.leaseLosses.WithLabelValues(k.Scope()).Inc()
		log.Warn("lease lost; stopped without writing", slog.String("stage", run.stage), slog.Any("error", keeper.Err()))
		return nil, carriedOf(c.slots, e.id, result, nil)
	}
	slots := c.slots
	if ra, ok := retryAfterOf(stageErr); ok && result == resultDefer && holdsOnRetryAfter(slots) {
		// The hold lands before finish shows the run retrying: carried
		// to the next admission, it would land a round trip or two after,
		// and a run submitted in between could start (CI caught one in
		// TestLimiterHoldOnRetryAfter). The stage is over; its slots are
		// given back now.
		r.releaseGrants(context.Background(), slots, e.id, 0, startsRan, ra.Delay)
		slots = nil
	}
	next = r.finish(job, e, lease, result, completed, stageErr, c.attempt, readNext, log)
	return next, carriedOf(slots, e.id, result, stageErr)
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
	sctx, span := r.startStageSpan(sctx, st.Name)
	defer func() { endStageSpan(span, err) }()
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
	case isRetryAfter(err):
		return resultDefer, err
	case err == nil:
		return resultRetry, errors.New("stage returned without error after its context ended")
	default:
		return resultRetry, err
	}
}
