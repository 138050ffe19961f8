package jobs

import (
	"context"
	"time"
)

// pumpIdle and pumpBusy bound a pump's sleep while nothing waits (a
// denial here wakes it at once) and while runs wait (a release by their
// holders hands on the slots; the pump covers crashed holders and rates).
const (
	pumpIdle = time.Minute
	pumpBusy = 2 * time.Second
)

// pokePump wakes d's pump on this runner.
func (r *Runner) pokePump(d *limiterDef) {
	if ch := r.pumps[d]; ch != nil {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// pumpAfterLostReply wakes d's pump once the slots a call without a reply
// may have reserved for this runner have expired: lim_unreserve then puts
// their waiting runs back in line, and nothing else may look for a
// while (a pump sleeps pumpIdle while nothing waits).
func (r *Runner) pumpAfterLostReply(d *limiterDef) {
	time.AfterFunc(r.slotTTL(d)+pumpSlack, func() { r.pokePump(d) })
}

// pumpSlack: a pump woken for expired reservations looks this long after
// their TTL, by this runner's clock.
const pumpSlack = 100 * time.Millisecond

// pumpLoop reserves limiter d's freed slots for its waiting runs when no
// release hands them on: after a holder crashed (its slot expired), at a
// rate's next start, or when a hold ends. It sleeps while nothing waits
// (a denial on this runner wakes it) and otherwise until the limiter's
// next change, at most pumpBusy.
func (r *Runner) pumpLoop(ctx context.Context, d *limiterDef, poke <-chan struct{}) {
	sleep := time.Duration(0)
	for {
		if sleep > 0 {
			t := time.NewTimer(sleep)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-poke:
			case <-t.C:
			}
			t.Stop()
		}
		if !r.acquire(ctx) {
			return
		}
		call := &scriptCall{script: r.reg.scripts.limiterRelease, keys: []string{d.key},
			args: []any{d.conf, r.owner, r.slotTTL(d).Milliseconds(), 1, 0, string(startsRan), "", r.grantFloor()}}
		sent := time.Now()
		res, err := evalOne(ctx, r.reg.gc, call)
		if err != nil || len(res) != 3 {
			r.release(1)
			if ctx.Err() != nil {
				return
			}
			r.pumpAfterLostReply(d)
			sleep = pumpBusy
			continue
		}
		if more := r.decodeReserved(d, res[0], sent); len(more) > 0 {
			sleep = 0
			if r.admitWork(ctx, more) {
				sleep = pumpBusy // what failed may fail the next reservations too
			}
			continue
		}
		r.release(1)
		sleep = pumpIdle
		if toInt(res[2]) > 0 { // runs wait: look again when the limiter says, by its clock
			sleep = min(max(time.Duration(toInt(res[1]))*time.Millisecond, time.Millisecond), pumpBusy)
		}
	}
}

// startPumps starts a pump per limiter the runner's jobs use (newPumps).
func (r *Runner) startPumps(ctx context.Context, g interface{ Go(func()) }) {
	for d, ch := range r.pumps {
		g.Go(func() { r.pumpLoop(ctx, d, ch) })
	}
}

// newPumps makes the wake-up channel of each limiter the runner's jobs
// use (read without a lock from then on: made before Run), each with a
// wake-up pending: runs may wait from before the runner started.
func newPumps(reg *Registry) map[*limiterDef]chan struct{} {
	pumps := map[*limiterDef]chan struct{}{}
	for _, defs := range reg.jobLimits {
		for _, d := range defs {
			if pumps[d] == nil {
				pumps[d] = make(chan struct{}, 1)
				pumps[d] <- struct{}{}
			}
		}
	}
	return pumps
}
