package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"
)

// How a run of a limited job starts (docs/flow-control.md): its request
// entry, taken from a partition like any other, first asks each of the
// job's limiters for a start (limiter_acquire.lua, in the limiter's own
// hash slot), and only a run admitted by all of them is claimed
// (claim.lua, in the partition's slot). A run not admitted stays queued —
// no lease, no attempt counted — and waits in the limiter, whose freed
// slots are reserved for the best waiting run by the runner that frees
// them (limiter_release.lua) or, after a crash or at a rate's next start,
// by a runner's pump. Two steps in two slots: a crash between them leaves
// a slot that expires with its TTL, and a slot taken before the claim
// expires no later than the lease granted after it, so the run's
// heartbeat, which renews both, keeps them together.

// slotGrant is a limiter start a run holds: the slot's number (-1 for a
// rate-only limiter) and its fencing token.
type slotGrant struct {
	lim   *limiterDef
	slot  int
	token int64
}

// LimiterSlot is a limiter slot a run holds (Run.LimiterSlots): a
// downstream that fences by (Limiter, Slot) with Token accepts at most
// Concurrency writers at once, even from a paused holder whose slot
// expired.
type LimiterSlot struct {
	Limiter string `json:"limiter"`
	Slot    int    `json:"slot"`
	Token   int64  `json:"token"`
}

// limiterRecheck: a waiting run's entry is re-examined by a reclaim this
// long after it began to wait, in case the limiter lost track of it (a
// flushed limiter, a reservation whose runner died): it only asks the
// limiter again, which keeps a waiting run's place.
const limiterRecheck = 5 * time.Minute

// admission is an entry on its way through its job's limiters: it holds
// one runner slot.
type admission struct {
	e      entry
	grants []slotGrant
	sent   time.Time // the earliest limiter call: its slots count from here
	group  string
	// carry: the slots of the run that finished in this admission's runner
	// slot, given back in its acquire call (one call for both).
	carry *carried
	// lr: the run registered for cancels before a call that may claim it
	// (an acquire that claims on a single server)
	lr *localRun
	// reserved: a waiting run a limiter reserved a slot for (its entry
	// is taken until limiterRecheck): when its claim or next limiter call
	// fails it waits again (waitAgain), not until the recheck.
	reserved bool
}

func (a *admission) endRun() {
	if a.lr != nil {
		a.lr.end()
		a.lr = nil
	}
}

// claimSpec asks the acquire of a's only limiter to claim a's run when
// admitted: on a single Redis server, where the script may reach the
// run's keys in another slot. "" when not: on Cluster, or for a job with
// several limiters (each admits it first).
func (r *Runner) claimSpec(a *admission) string {
	scope := a.e.key.Scope()
	if !r.reg.singleNode || len(r.reg.jobLimits[scope]) != 1 || len(a.grants) > 0 {
		return ""
	}
	return r.reg.ks.Tag(a.e.p) + histSep + r.reg.stagesCSV[scope] + histSep +
		strconv.Itoa(r.reg.jobs[scope].Retry.MaxAttempts) + histSep + strconv.FormatInt(r.leaseTTL(scope).Milliseconds(), 10)
}

// startClaimed starts a run its acquire admitted and claimed (reply one:
// 'c', slot, token, the claim's reply), sent at sent.
func (r *Runner) startClaimed(a *admission, d *limiterDef, one []any, sent time.Time) {
	g := slotGrant{lim: d, slot: int(toInt(one[1])), token: toInt(one[2])}
	c, err := r.decodeClaim(one[3], a.e, sent)
	if err != nil || c.kind != claimGranted || a.lr == nil {
		// unreadable: the lease expires unused, the entry is reclaimed
		r.log.Warn("limiter claim unreadable; the run will be reclaimed", slog.String("task_key", a.e.key.String()), slog.Any("error", err))
		a.endRun()
		r.releaseGrants(context.Background(), []slotGrant{g}, a.e.id, 0, startsRan, 0)
		r.release(1)
		return
	}
	c.slots = []slotGrant{g}
	if !a.sent.IsZero() && a.sent.Before(c.sent) {
		c.sent = a.sent
	}
	lr := a.lr
	a.lr = nil
	r.start(lr, c)
}

func (a *admission) holds(d *limiterDef) bool {
	for _, g := range a.grants {
		if g.lim == d {
			return true
		}
	}
	return false
}

// limitedJob reports whether entry e's job takes limiter slots here.
func (r *Runner) limitedJob(scope string) bool { return len(r.reg.jobLimits[scope]) > 0 }

// slotTTL is how long a slot of d lasts unless renewed: the shortest
// lease TTL of the jobs using it on this runner.
func (r *Runner) slotTTL(d *limiterDef) time.Duration {
	t := d.slotTTL
	if t == 0 || r.cfg.LeaseTTL < t {
		for scope, defs := range r.reg.jobLimits {
			for _, x := range defs {
				if x == d && r.reg.jobs[scope].LeaseTTL == 0 {
					t = min(cmp0(t, r.cfg.LeaseTTL), r.cfg.LeaseTTL)
				}
			}
		}
	}
	return cmp0(t, r.cfg.LeaseTTL)
}

// admitAndStart takes entries of limited jobs through their limiters,
// claims those admitted and starts them. The caller holds a runner slot
// per entry; each goes with a started run or to a waiting run reserved
// for this runner, or is released.
func (r *Runner) admitAndStart(ctx context.Context, es []entry) {
	work := make([]*admission, 0, len(es))
	for _, e := range es {
		work = append(work, &admission{e: e})
	}
	r.admitWork(ctx, work)
}

// admitWork reports whether a Redis call failed on the way: a pump backs
// off then, since the runs it reserves may meet the failure again.
func (r *Runner) admitWork(ctx context.Context, work []*admission) (failed bool) {
	for len(work) > 0 {
		if !r.taking() {
			r.abandon(work, len(work))
			return failed
		}
		r.readGroups(ctx, work)
		ready, f1 := r.acquireAll(ctx, work)
		var f2 bool
		work, f2 = r.claimAdmitted(ctx, ready)
		failed = failed || f1 || f2
	}
	return failed
}

// readGroups reads the request group of entries whose job groups its
// runs by request (one HGET each; other jobs need nothing).
func (r *Runner) readGroups(ctx context.Context, work []*admission) {
	for _, a := range work {
		job := r.reg.jobs[a.e.key.Scope()]
		switch {
		case job == nil || a.group != "":
		case job.Fairness.GroupBy == FairnessRequest:
			a.group, _ = r.reg.rdb.HGet(ctx, r.reg.ks.Task(a.e.key), "group").Result()
		default:
			a.group = job.groupOf(a.e.key.Subject())
		}
	}
}

// acquireAll asks each admission's missing limiters for a start, limiter
// by limiter in the job's order, until every admission holds them all
// (ready) or waits (its runner slot goes to a waiting run the limiter
// reserved for this runner, which joins the admissions, or is released).
func (r *Runner) acquireAll(ctx context.Context, work []*admission) (ready []*admission, failed bool) {
	defer r.releaseCarried(ctx, work)
	pending := work
	for len(pending) > 0 {
		byLim := map[*limiterDef][]*admission{}
		var order []*limiterDef
		for _, a := range pending {
			d := r.nextLimiter(a)
			if d == nil {
				ready = append(ready, a)
				continue
			}
			if byLim[d] == nil {
				order = append(order, d)
			}
			byLim[d] = append(byLim[d], a)
		}
		pending = nil
		if len(order) == 0 {
			break
		}
		calls := make([]*scriptCall, len(order))
		for i, d := range order {
			hold, rel := int64(0), []any(nil)
			for _, a := range byLim[d] {
				if a.carry == nil {
					continue
				}
				if g, ok := a.carry.take(d); ok {
					hold = max(hold, a.carry.holdFor(d))
					rel = append(rel, g.slot, g.token, a.carry.id)
				}
			}
			args := append([]any{d.conf, r.owner, r.slotTTL(d).Milliseconds(), hold, r.claimConf, r.grantFloor(), len(rel) / 3}, rel...)
			for _, a := range byLim[d] {
				spec := r.claimSpec(a)
				if spec != "" && a.lr == nil {
					a.lr = r.newLocalRun(a.e)
				}
				args = append(args, a.e.id, a.e.lane.Letter(), a.group, spec)
			}
			calls[i] = &scriptCall{script: r.reg.scripts.limiterAcquire, keys: []string{d.key}, args: args}
		}
		sent := time.Now()
		cctx, cancel := granting(ctx, r.cfg.LeaseTTL)
		err := evalGrouped(cctx, r.reg.gc, calls)
		cancel()
		for i, d := range order {
			as := byLim[d]
			res, rerr := calls[i].cmd.Slice()
			if err != nil || rerr != nil || len(res) != 4 {
				r.log.Warn("limiter acquire failed; the entries will be reclaimed", slog.String("limiter", d.Name), slog.Any("error", errors.Join(err, rerr)))
				r.giveBack(ctx, as)
				r.pumpAfterLostReply(d) // it may have reserved waiting runs for the slots of those that wait
				failed = true
				continue
			}
			results, _ := res[0].([]any)
			waited := 0
			for j, a := range as {
				one, _ := results[j].([]any)
				switch kind := replyString(one[0]); {
				case len(one) == 4 && kind == "c": // admitted and claimed (single server)
					r.startClaimed(a, d, one, sent)
					continue
				case len(one) == 2 && kind == "n": // admitted, not granted: the slot is back
					if c, err := r.decodeClaim(one[1], a.e, sent); err == nil {
						r.notGranted(a.e, c)
					}
					a.endRun()
					waited++ // its runner slot: free for a reserved run
					continue
				}
				if len(one) == 3 && replyString(one[0]) == "g" {
					a.grants = append(a.grants, slotGrant{lim: d, slot: int(toInt(one[1])), token: toInt(one[2])})
					if a.sent.IsZero() {
						a.sent = sent
					}
					pending = append(pending, a)
					continue
				}
				why, at := "", int64(0)
				if len(one) == 3 {
					why, at = replyString(one[1]), toInt(one[2])
				}
				a.endRun()
				r.wait(ctx, a, d, why, at)
				waited++
			}
			// the runs reserved here take the runner slots of those that wait
			reserved := r.decodeReserved(d, res[1], sent)
			pending = append(pending, reserved...)
			r.release(waited - len(reserved))
			if toInt(res[3]) > 0 {
				r.pokePump(d)
			}
		}
	}
	return ready, failed
}

// releaseCarried gives back what the admissions carried for limiters
// their acquire calls did not ask (they wait at an earlier one).
func (r *Runner) releaseCarried(ctx context.Context, work []*admission) {
	for _, a := range work {
		if a.carry != nil && len(a.carry.grants) > 0 {
			r.releaseGrants(ctx, a.carry.grants, a.carry.id, 0, startsRan, a.carry.hold)
			a.carry.grants = nil
		}
	}
}

// nextLimiter returns the first of a's job's limiters it does not hold.
func (r *Runner) nextLimiter(a *admission) *limiterDef {
	for _, d := range r.reg.jobLimits[a.e.key.Scope()] {
		if !a.holds(d) {
			return d
		}
	}
	return nil
}

// decodeReserved turns the waiting runs a limiter reserved for this runner
// into admissions holding that slot; each takes the runner slot of a run
// that began to wait.
func (r *Runner) decodeReserved(d *limiterDef, v any, sent time.Time) []*admission {
	list, _ := v.([]any)
	var out []*admission
	for _, x := range list {
		one, _ := x.([]any)
		if len(one) != 3 {
			continue
		}
		e, ok := entryFrom(0, replyString(one[0]))
		g := slotGrant{lim: d, slot: int(toInt(one[1])), token: toInt(one[2])}
		if !ok { // not an entry (never written so): free its slot
			r.releaseGrants(context.Background(), []slotGrant{g}, replyString(one[0]), 0, startsUnused, 0)
			continue
		}
		e.p = r.reg.ks.Partition(e.key)
		out = append(out, &admission{e: e, grants: []slotGrant{g}, sent: sent, reserved: true})
	}
	return out
}

// wait records that a's run waits for d: its record says why, its entry
// stays taken until limiterRecheck, and its other starts are given back.
func (r *Runner) wait(ctx context.Context, a *admission, d *limiterDef, why string, at int64) {
	r.reg.metrics.limiterDeferred.WithLabelValues(a.e.key.Scope()).Inc()
	text := r.waitingText(d, why, at)
	ks := r.reg.ks
	p := a.e.p
	if err := r.reg.scripts.limiterWait.Run(ctx, r.reg.gc, []string{ks.Task(a.e.key), ks.Taken(p), ks.Watch(p)},
		a.e.runID, a.e.id, text, limiterRecheck.Milliseconds(), ks.Events(p)).Err(); err != nil {
		r.log.Warn("limiter wait not recorded", slog.String("task_key", a.e.key.String()), slog.Any("error", err))
	}
	r.releaseGrants(ctx, a.grants, a.e.id, 0, startsUnused, 0)
	a.grants = nil
	r.pokePump(d)
}

// waitingText is the view's waiting for a run waiting for d.
func (r *Runner) waitingText(d *limiterDef, why string, at int64) string {
	name := "limiter " + d.Name + ": "
	switch why {
	case "full":
		return name + fmt.Sprintf("%d of %d in use", d.Concurrency, d.Concurrency)
	case "rate":
		return name + "rate " + d.Rate.String()
	case "held":
		return name + "held until " + time.UnixMilli(at).UTC().Format(time.RFC3339) + " (retry-after)"
	}
	return name + "waiting its turn"
}

// claimAdmitted claims the admitted entries, partition by partition, and
// starts the granted runs. An entry whose claim is not granted gives its
// starts back (refunding the rate); the runs the limiters reserve for
// this runner in return are returned to be admitted.
func (r *Runner) claimAdmitted(ctx context.Context, ready []*admission) (more []*admission, failed bool) {
	ready = r.refreshStale(ctx, ready)
	byP := map[int][]*admission{}
	var ps []int
	for _, a := range ready {
		if byP[a.e.p] == nil {
			ps = append(ps, a.e.p)
		}
		byP[a.e.p] = append(byP[a.e.p], a)
	}
	for _, p := range ps {
		as := byP[p]
		es := make([]entry, len(as))
		for i, a := range as {
			es[i] = a.e
		}
		runs := make([]*localRun, len(as))
		for i, e := range es {
			runs[i] = r.newLocalRun(e)
		}
		cctx, cancel := granting(ctx, r.cfg.LeaseTTL)
		claims, err := r.claim(cctx, p, es)
		cancel()
		var again []*admission
		for i, a := range as {
			if err == nil && claims[i].kind == claimGranted {
				c := claims[i]
				c.slots = a.grants
				if a.sent.Before(c.sent) {
					c.sent = a.sent
				}
				r.start(runs[i], c)
				continue
			}
			runs[i].end()
			if err != nil && a.reserved {
				again = append(again, a)
				continue
			}
			if err == nil {
				r.notGranted(a.e, claims[i])
			}
			got := r.releaseGrants(ctx, a.grants, a.e.id, 1, startsUnused, 0)
			if len(got) == 0 {
				r.release(1)
			}
			more = append(more, got...)
		}
		if err != nil {
			r.log.Warn("claim failed; the entries will be reclaimed, the waiting runs wait again", slog.Int("partition", p),
				slog.Int("waiting_runs", len(again)), slog.Any("error", err))
			failed = true
			r.waitAgain(ctx, again)
			r.release(len(again))
		}
	}
	return more, failed
}

// abandon gives back what admissions hold when they cannot go on (the
// runner stops taking work, or has no runner slot for them): their starts
// and their entries (reclaimable at once); it releases slots runner slots.
func (r *Runner) abandon(work []*admission, slots int) {
	if len(work) == 0 {
		r.release(slots)
		return
	}
	es := make([]entry, len(work))
	for i, a := range work {
		es[i] = a.e
		a.endRun()
		r.releaseGrants(context.Background(), a.grants, a.e.id, 0, startsUnused, 0)
		r.giveBackCarried(a.carry, 0)
	}
	r.handBackEntries(context.Background(), es)
	r.release(slots)
}

// giveBack releases admissions whose limiter call failed: their starts
// are given back, their entries are reclaimed when due; reserved runs
// wait again in the limiters that reserved them.
func (r *Runner) giveBack(ctx context.Context, as []*admission) {
	var again []*admission
	for _, a := range as {
		if a.reserved {
			again = append(again, a)
			continue
		}
		a.endRun()
		r.releaseGrants(context.Background(), a.grants, a.e.id, 0, startsUnused, 0)
	}
	r.waitAgain(ctx, again)
	r.release(len(as))
}
