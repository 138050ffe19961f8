package jobs

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/tasklease/tasklease/checkpoints"
	"github.com/tasklease/tasklease/leasing"
	"github.com/tasklease/tasklease/taskkey"
)

// Run is a stage's handle on the run it executes. Everything it writes is
// fenced by the lease; after the lease is lost every write fails with
// leasing.ErrNotHeld. A Run is only ever given its own task key, so a stage
// cannot touch another subject's record (an account switch is safe).
type Run struct {
	key      taskkey.Key
	runID    string
	attempt  int
	sources  []Source
	source   Source
	lease    leasing.Lease
	recovery checkpoints.Recovery
	stage    string
	stages   []string
	cursor   []byte
	// stopBy is how long a stage has, after its context is cancelled, to
	// stop before the lease could be granted to someone else.
	stopBy time.Duration
	store  *checkpoints.Store
	leases *leasing.Manager
	// starts paces process starts (RunnerConfig.ExecStarts); nil outside
	// a Runner: unpaced.
	starts chan struct{}
	// slots are the limiter slots the run holds (a limited job).
	slots []LimiterSlot
}

// LimiterSlots returns the limiter slots the run holds while it executes
// (jobs with limiters; nil otherwise). A downstream that must never see
// more than a limiter's concurrency of writers at once fences each write
// by (Limiter, Slot) with Token as it fences by key with FencingToken: a
// slot's token grows with every holder, so a paused holder whose slot
// expired and went to another run is refused.
func (r *Run) LimiterSlots() []LimiterSlot { return append([]LimiterSlot(nil), r.slots...) }

// limiterSlotsText formats slots as "name:slot:token,...", the
// TASKLEASE_LIMITER_SLOTS variable and Tasklease-Limiter-Slots header.
func limiterSlotsText(slots []LimiterSlot) string {
	b := make([]byte, 0, 32*len(slots))
	for i, s := range slots {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, s.Limiter...)
		b = append(b, ':')
		b = strconv.AppendInt(b, int64(s.Slot), 10)
		b = append(b, ':')
		b = strconv.AppendInt(b, s.Token, 10)
	}
	return string(b)
}

// acquireStart waits for a turn to start a stage's process and returns the
// function that ends it (idempotent, safe from any goroutine).
func (r *Run) acquireStart(ctx context.Context) (release func(), err error) {
	if r.starts == nil {
		return func() {}, nil
	}
	select {
	case r.starts <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	var once sync.Once
	return func() { once.Do(func() { <-r.starts }) }, nil
}

// Key returns the task key.
func (r *Run) Key() taskkey.Key { return r.key }

// Subject returns the key's subject (e.g. the user id).
func (r *Run) Subject() string { return r.key.Subject() }

// Scope returns the key's scope (the job).
func (r *Run) Scope() string { return r.key.Scope() }

// RunID returns the run's id.
func (r *Run) RunID() string { return r.runID }

// Attempt returns the attempt number, from 1; crashes count as attempts.
func (r *Run) Attempt() int { return r.attempt }

// Source returns the source of the request that started this attempt.
func (r *Run) Source() Source { return r.source }

// Sources returns the sources of every request merged into the run when
// this attempt started; requests that join it later are in the task's
// view (Registry.Get, TaskView.Sources).
func (r *Run) Sources() []Source { return append([]Source(nil), r.sources...) }

// FencingToken returns the lease's fencing token. Pass it to every
// downstream write so a stale holder's writes can be rejected.
func (r *Run) FencingToken() int64 { return r.lease.Token }

// Owner returns the lease owner (runner id and suffix).
func (r *Run) Owner() string { return r.lease.Owner }

// Stage returns the stage being executed.
func (r *Run) Stage() string { return r.stage }

// Stages returns the run's stages in order.
func (r *Run) Stages() []string { return append([]string(nil), r.stages...) }

// Resumed reports whether this attempt resumed a checkpoint (some stages, or
// part of this one, were done by an earlier attempt).
func (r *Run) Resumed() bool { return r.recovery.Mode == checkpoints.Resume }

// Recovery returns how this attempt continued the run.
func (r *Run) Recovery() checkpoints.Recovery { return r.recovery }

// Cursor returns the progress saved inside the current stage by an earlier
// attempt (or by SaveProgress in this one), nil if none.
func (r *Run) Cursor() []byte { return append([]byte(nil), r.cursor...) }

// SaveProgress stores cursor as progress inside the current stage, fenced:
// it fails with leasing.ErrNotHeld once the lease is lost.
func (r *Run) SaveProgress(ctx context.Context, cursor []byte) error {
	if err := r.store.SaveProgress(ctx, r.lease, r.runID, cursor); err != nil {
		return err
	}
	r.cursor = append(r.cursor[:0], cursor...)
	return nil
}

// CheckLease confirms with Redis that the lease is still held by this run,
// by renewing it; leasing.ErrNotHeld otherwise. Call it before a side effect
// that cannot carry the fencing token.
func (r *Run) CheckLease(ctx context.Context) error {
	return r.leases.Renew(ctx, r.lease)
}

// StopGrace is how long the stage may take to stop after its context is
// cancelled before the lease could pass to another runner. Stage kinds that
// run processes kill them within it.
func (r *Run) StopGrace() time.Duration { return r.stopBy }
