package jobs

// A limited run's slots after its admission: renewed with its lease,
// handed over to the next run on its runner or given back.

import (
	"context"
	"log/slog"
	"slices"
	"time"
)

// carried are the slots of a run that finished on this runner, not yet
// given back.
type carried struct {
	grants []slotGrant
	id     string        // the finished run's entry: the slots' member
	hold   time.Duration // a retry-after: the limiters that hold on one hold their starts
}

// take removes and returns the grant of d.
func (c *carried) take(d *limiterDef) (slotGrant, bool) {
	for i, g := range c.grants {
		if g.lim == d {
			c.grants = append(c.grants[:i], c.grants[i+1:]...)
			return g, true
		}
	}
	return slotGrant{}, false
}

// holdFor is the hold a release of d carries.
func (c *carried) holdFor(d *limiterDef) int64 {
	if d.hold {
		return c.hold.Milliseconds()
	}
	return 0
}

// startsBack says how the starts a run holds are given back
// (limiter_release.lua ARGV[6]).
type startsBack string

const (
	startsRan    startsBack = "0" // the run ran: the rate stays charged
	startsUnused startsBack = "1" // its claim was not granted: the rate is refunded
	// startsAgain: a reserved run whose claim's outcome is unknown (the
	// call failed): the rate is refunded and its request waits again,
	// first in line, instead of until its entry's limiterRecheck.
	startsAgain startsBack = "w"
)

// releaseGrants gives back grants of the run of entry id, pumping up to
// pop waiting runs reserved for this runner (which take the caller's
// runner slots); hold > 0 holds the limiters that hold on a retry-after.
func (r *Runner) releaseGrants(ctx context.Context, grants []slotGrant, id string, pop int, back startsBack, hold time.Duration) []*admission {
	if len(grants) == 0 {
		return nil
	}
	calls := r.releaseCalls(grants, id, pop, back, "", hold)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.LeaseTTL)
	defer cancel()
	sent := time.Now()
	if err := evalGrouped(ctx, r.reg.gc, calls); err != nil {
		r.log.Warn("limiter release failed; the slots expire with their TTL", slog.Any("error", err))
		if pop > 0 {
			r.pumpAfterLostReply(grants[0].lim)
		}
	}
	return r.released(grants, calls, sent)
}

// waitAgain gives back the starts of reserved runs whose claim or next
// limiter call failed, their requests first in line again in the
// limiters that reserved them (startsAgain). It reserves nothing in
// return and wakes no pump: the claim's partition may be down, and the
// next release or pump of the fleet hands the slots on. An entry whose
// limiters could not be told is handed back to be reclaimed now; and a
// reservation neither reached expires into lim_unreserve.
func (r *Runner) waitAgain(ctx context.Context, as []*admission) {
	var calls []*scriptCall
	var of []*admission
	for _, a := range as {
		a.endRun()
		cs := r.releaseCalls(a.grants, a.e.id, 0, startsAgain, a.group, 0)
		calls = append(calls, cs...)
		for range cs {
			of = append(of, a)
		}
		a.grants = nil
	}
	if len(calls) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.LeaseTTL)
	defer cancel()
	_ = evalGrouped(ctx, r.reg.gc, calls) // each call's error is in its cmd
	var back []entry
	seen := map[*admission]bool{}
	for i, c := range calls {
		if c.cmd != nil && c.cmd.Err() == nil || seen[of[i]] {
			continue
		}
		seen[of[i]] = true
		back = append(back, of[i].e)
	}
	if len(back) > 0 {
		r.log.Warn("limiter release failed; the waiting runs are handed back to be reclaimed", slog.Int("runs", len(back)))
		r.handBackEntries(ctx, back)
	}
}

// releaseCalls are the limiter_release.lua calls that give back grants
// (releaseGrants); the first pumps for pop runner slots. group is the
// members' fair-share group, for startsAgain.
func (r *Runner) releaseCalls(grants []slotGrant, id string, pop int, back startsBack, group string, hold time.Duration) []*scriptCall {
	calls := make([]*scriptCall, len(grants))
	for i, g := range grants {
		h := int64(0)
		if g.lim.hold {
			h = hold.Milliseconds()
		}
		n := 0
		if i == 0 { // one runner slot: the first limiter pumps for it
			n = pop
		}
		calls[i] = &scriptCall{script: r.reg.scripts.limiterRelease, keys: []string{g.lim.key},
			args: []any{g.lim.conf, r.owner, r.slotTTL(g.lim).Milliseconds(), n, h, string(back), group, r.grantFloor(), g.slot, g.token, id}}
	}
	return calls
}

// released decodes the replies of releaseCalls sent at sent: the waiting
// runs reserved for this runner.
func (r *Runner) released(grants []slotGrant, calls []*scriptCall, sent time.Time) []*admission {
	var more []*admission
	for i, c := range calls {
		if c.cmd == nil {
			continue
		}
		res, err := c.cmd.Slice()
		if err != nil || len(res) != 3 {
			continue
		}
		more = append(more, r.decodeReserved(grants[i].lim, res[0], sent)...)
		if toInt(res[2]) > 0 {
			r.pokePump(grants[i].lim)
		}
	}
	return more
}

// holdsOnRetryAfter: one of grants' limiters holds its starts when a run
// is told to retry after a while.
func holdsOnRetryAfter(grants []slotGrant) bool {
	return slices.ContainsFunc(grants, func(g slotGrant) bool { return g.lim.hold })
}

// carriedOf is what a finished run carries to the next admission in its
// runner slot: its slots, and the hold of a retry-after.
func carriedOf(grants []slotGrant, id, result string, stageErr error) *carried {
	if len(grants) == 0 {
		return nil
	}
	c := &carried{grants: slices.Clone(grants), id: id}
	if ra, ok := retryAfterOf(stageErr); ok && result == resultDefer {
		c.hold = ra.Delay
	}
	return c
}

// giveBackCarried releases what a finished run carried when no admission takes
// it over; with pop, the first slot freed is reserved for the best waiting
// run, which takes the caller's runner slot.
func (r *Runner) giveBackCarried(c *carried, pop int) []*admission {
	if c == nil {
		return nil
	}
	return r.releaseGrants(context.Background(), c.grants, c.id, pop, startsRan, c.hold)
}

// staleAfter: an admission whose first slot was taken longer ago than a
// sixth of its shortest slot TTL renews its slots before its claim, since
// its lease's keeper counts from then (a loaded runner, a reservation
// handed on through several limiters): otherwise the run could be given
// up as lost right after its claim.
func (r *Runner) stale(a *admission) bool {
	for _, g := range a.grants {
		if time.Since(a.sent) > r.slotTTL(g.lim)/6 {
			return true
		}
	}
	return false
}

// refreshStale renews the slots of stale admissions (one round trip) and
// counts them from then; an admission whose slot is no longer its own is
// given up (its entry is reclaimed).
func (r *Runner) refreshStale(ctx context.Context, ready []*admission) []*admission {
	var calls []*scriptCall
	var of []*admission
	for _, a := range ready {
		if !r.stale(a) {
			continue
		}
		cs := r.renewCalls(a.grants, a.e.id)
		calls = append(calls, cs...)
		for range cs {
			of = append(of, a)
		}
	}
	if len(calls) == 0 {
		return ready
	}
	sent := time.Now()
	cctx, cancel := granting(ctx, r.cfg.LeaseTTL)
	_ = evalGrouped(cctx, r.reg.gc, calls) // each call's error is in its cmd
	cancel()
	lost := map[*admission]bool{}
	for i, c := range calls {
		if n, err := c.cmd.Int64(); err != nil || n != 1 {
			lost[of[i]] = true
		}
	}
	out := ready[:0:0]
	for _, a := range ready {
		switch {
		case lost[a]:
			r.abandon([]*admission{a}, 1)
		case r.stale(a):
			a.sent = sent
			out = append(out, a)
		default:
			out = append(out, a)
		}
	}
	return out
}

// renewCalls are the limiter_renew.lua calls that renew a run's slots
// with its lease.
func (r *Runner) renewCalls(grants []slotGrant, id string) []*scriptCall {
	var calls []*scriptCall
	for _, g := range grants {
		if g.slot < 0 {
			continue
		}
		calls = append(calls, &scriptCall{script: r.reg.scripts.limiterRenew, keys: []string{g.lim.key},
			args: []any{r.slotTTL(g.lim).Milliseconds(), r.owner, g.slot, g.token, id}})
	}
	return calls
}
