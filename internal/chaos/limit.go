//go:build linux

// Check 9: never more than N accepted concurrent writers. The limited job
// holds a slot of the limiter "remote" (concurrency N = Options.Limit)
// while it runs; its two http stages write to the recorder's limited
// route, which fences each write by its key (fencing token) and by its
// slot ("remote#<slot>", slot token). At no instant may more than N of
// the job's executions have writes accepted there.

package chaos

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/taskkey"
)

// limitedExec is one execution of the limited job as its downstream saw
// it: the writes of one lease grant of a run (key and fencing token) that
// name the same slots.
type limitedExec struct {
	key       string
	token     int64
	slotsText string
	slots     []slotHeld
	runner    string
	writes    []recReq // by arrival
	accepted  int
	// from..to is the execution's interval at the downstream: from the
	// arrival of its first accepted write to the commit of its last
	// accepted write (zero without an accepted write).
	from, to time.Time
}

func (e *limitedExec) String() string {
	if e.accepted == 0 {
		return fmt.Sprintf("%s token %d slots %q runner %s: none of %d writes accepted, the first at %s",
			e.key, e.token, e.slotsText, e.runner, len(e.writes), e.writes[0].arrive.Format("15:04:05.000"))
	}
	return fmt.Sprintf("%s token %d slots %q runner %s: accepted %s..%s (%d of %d writes)",
		e.key, e.token, e.slotsText, e.runner, e.from.Format("15:04:05.000"), e.to.Format("15:04:05.000"),
		e.accepted, len(e.writes))
}

// limitedExecutions groups the limited job's requests into executions,
// ordered by their first request.
func limitedExecutions(reqs []recReq) []*limitedExec {
	by := map[string]*limitedExec{}
	var out []*limitedExec
	for _, r := range reqs {
		if !r.limited {
			continue
		}
		id := fmt.Sprintf("%s %d %s", r.key, r.token, r.slotsText)
		e := by[id]
		if e == nil {
			e = &limitedExec{key: r.key, token: r.token, slotsText: r.slotsText, slots: r.slots, runner: r.runner}
			by[id] = e
			out = append(out, e)
		}
		e.writes = append(e.writes, r)
	}
	for _, e := range out {
		slices.SortStableFunc(e.writes, func(a, b recReq) int { return a.arrive.Compare(b.arrive) })
		for _, w := range e.writes {
			if w.outcome != recAccepted {
				continue
			}
			if e.accepted == 0 || w.arrive.Before(e.from) {
				e.from = w.arrive
			}
			if w.end.After(e.to) {
				e.to = w.end
			}
			e.accepted++
		}
	}
	slices.SortStableFunc(out, func(a, b *limitedExec) int { return a.writes[0].arrive.Compare(b.writes[0].arrive) })
	return out
}

// limitStats is what check 9 measured.
type limitStats struct {
	writes, accepted  int     // the limited job's requests, and those accepted
	executions        int     // executions with an accepted write
	maxConcurrent     int     // most accepted executions overlapping at one instant
	atLimit           float64 // seconds with limit accepted executions overlapping
	refusedLate       int     // refused by the slot fence, a newer holder of the slot having written: late writes of a deposed holder
	refusedAfterStop  int     // of them, from a runner SIGSTOPped while the write was held or in the 5 s before it arrived
	refusedAfterPause int     // of them, near a CLIENT PAUSE of Redis past the lease TTL
	refusedByKey      int     // refused by the key's fencing token
	aborted           int     // given up by the runner
	// Behind a Redis fault: executions that began after one with a slot
	// token not above every token of the limiter seen before it, and
	// their writes refused by the slot fence (not counted as late).
	behindFaults, refusedBehind int
	behindExample               string // the first such execution
	// tokensTwice counts slot tokens ("limiter#slot token") that two
	// executions held.
	tokensTwice        int
	tokensTwiceExample string
}

// checkLimit is check 9: at no instant do more than h.limit executions of
// the limited job have accepted writes at the recorder.
//
// An execution's interval is from the arrival of its first accepted write
// to the commit of its last accepted one. That is the stretch in which the
// downstream had it as a writer: before its first accepted write it had
// done nothing there, and after its last accepted write nothing more of
// it was let in — a later write was refused, or it ended. The engine's
// own view (from the slot's grant to its release, or to the run's end)
// would count a holder paused past its TTL as a writer until it woke,
// though its slot had gone to another run and its late writes were
// refused: it is the fence, not the engine's bookkeeping, that keeps a
// remote at N writers, and this check asks the remote. The gap between a
// run's two writes counts: a remote sees a client between a pull and its
// push as in progress.
//
// Why N holds with a fencing downstream: the recorder admits a write of
// slot s only if its token is at least the highest it has seen for s, on
// arrival and at commit. Once a newer holder of s has sent a write, every
// write of an older holder still held is refused at commit and every later
// one on arrival, so the accepted intervals of one slot never overlap, and
// there are N slots. Two holders of one slot can both be accepted only if
// they carry the same token (the engine gave one token twice) or a write
// names no valid slot, and then this check counts N+1.
func (h *harness) checkLimit(reqs []recReq) limitStats {
	var st limitStats
	execs := limitedExecutions(reqs)
	h.mu.Lock()
	stops := slices.Clone(h.stopLog)
	h.mu.Unlock()
	behind := h.slotTokensBehind(execs)
	st.behindFaults = len(behind)
	held := map[string]*limitedExec{}
	for _, e := range execs {
		if why, ok := behind[e]; ok && st.behindExample == "" {
			st.behindExample = e.String() + ": " + why
		}
		for _, s := range e.slots {
			id := fmt.Sprintf("%s token %d", s.fenceKey(), s.token)
			if o := held[id]; o != nil {
				st.tokensTwice++
				if st.tokensTwiceExample == "" {
					st.tokensTwiceExample = id + " held by " + o.String() + " and by " + e.String()
				}
			}
			held[id] = e
		}
		for _, w := range e.writes {
			st.writes++
			switch {
			case w.outcome == recAccepted:
				st.accepted++
			case w.refused() && w.bySlot && behind[e] != "":
				st.refusedBehind++
			case w.refused() && w.bySlot:
				st.refusedLate++
				stopped, paused := false, false
				for _, s := range stops {
					if s.from.Before(w.end) && s.to.After(w.arrive.Add(-5*time.Second)) {
						stopped = stopped || (s.marker != "" && s.marker == w.runner)
						paused = paused || s.marker == ""
					}
				}
				if stopped {
					st.refusedAfterStop++
				}
				if paused {
					st.refusedAfterPause++
				}
			case w.refused():
				st.refusedByKey++
			case w.outcome == recAborted:
				st.aborted++
			}
		}
		if e.accepted == 0 {
			continue
		}
		st.executions++
		if len(e.slots) != 1 || e.slots[0].limiter != limiterName || e.slots[0].slot < 0 || e.slots[0].slot >= h.limit {
			h.viol.add(checkLimit, "%s: accepted, but its %s header %q does not name one slot of %s (0..%d); the downstream cannot fence it\n%s",
				e.String(), "Tasklease-Limiter-Slots", e.slotsText, limiterName, h.limit-1, execWrites(e))
		}
	}
	st.maxConcurrent, st.atLimit = h.overlaps(execs)
	return st
}

// overlaps sweeps the accepted executions' intervals: it reports a
// violation of check 9 each time more than h.limit overlap (once per
// stretch above the limit, naming the executions open then), and returns
// the most that overlapped and how long h.limit or more did.
func (h *harness) overlaps(execs []*limitedExec) (peak int, atLimit float64) {
	type edge struct {
		at   time.Time
		open bool
		e    *limitedExec
	}
	var edges []edge
	for _, e := range execs {
		if e.accepted > 0 {
			edges = append(edges, edge{e.from, true, e}, edge{e.to, false, e})
		}
	}
	// An interval ending when another begins does not overlap it: at equal
	// times the ends come first (the recorder times both under one lock,
	// so an older holder's last commit precedes a newer one's first
	// arrival).
	slices.SortStableFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		switch {
		case a.open == b.open:
			return 0
		case !a.open:
			return -1
		}
		return 1
	})
	open := map[*limitedExec]bool{}
	above := false
	var since time.Time
	var at time.Duration
	for _, ed := range edges {
		if len(open) >= h.limit {
			at += ed.at.Sub(since)
		}
		since = ed.at
		if !ed.open {
			delete(open, ed.e)
			if len(open) <= h.limit {
				above = false
			}
			continue
		}
		open[ed.e] = true
		peak = max(peak, len(open))
		if len(open) > h.limit && !above {
			above = true
			list := make([]*limitedExec, 0, len(open))
			for e := range open {
				list = append(list, e)
			}
			slices.SortFunc(list, func(a, b *limitedExec) int {
				return cmp.Or(strings.Compare(a.slotsText, b.slotsText), a.from.Compare(b.from))
			})
			var b strings.Builder
			for _, e := range list {
				b.WriteString("  " + e.String() + "\n" + execWrites(e))
			}
			h.viol.add(checkLimit, "at %s, %d executions of %s had accepted writes at once, more than the limit %d of %s:\n%s",
				ed.at.Format("15:04:05.000"), len(open), limitedScope, h.limit, limiterName, b.String())
		}
	}
	return peak, at.Seconds()
}

// slotTokensBehind finds the executions that began after a Redis fault
// with a slot token not above every token of the same limiter seen before
// the fault: the limiter's token counter went back with the data Redis
// lost. A fencing downstream refuses their writes (or, were a token given
// twice to holders of one slot, might accept both: check 9 counts them
// then). It says for each which fault and which earlier token.
func (h *harness) slotTokensBehind(execs []*limitedExec) map[*limitedExec]string {
	behind := map[*limitedExec]string{}
	for _, o := range slices.Backward(h.outages) { // the latest fault before an execution names it
		before := map[string]int64{}
		for _, e := range execs {
			for _, s := range e.slots {
				if e.writes[0].arrive.Before(o.down) {
					before[s.limiter] = max(before[s.limiter], s.token)
				}
			}
		}
		for _, e := range execs {
			if !e.writes[0].arrive.After(o.up) || behind[e] != "" {
				continue
			}
			for _, s := range e.slots {
				if s.token <= before[s.limiter] {
					behind[e] = fmt.Sprintf("slot token %d after the Redis fault %s at %s, though token %d of %s was seen before it",
						s.token, o.kind, o.down.Format("15:04:05.000"), before[s.limiter], s.limiter)
					break
				}
			}
		}
	}
	return behind
}

// execWrites renders an execution's writes for a violation.
func execWrites(e *limitedExec) string {
	var b strings.Builder
	for _, w := range e.writes {
		b.WriteString("    " + w.String() + "\n")
	}
	return b.String()
}

// limitedState describes, for a stuck key of the limited job, what Redis
// holds of it and of its limiter (read-only): the run record, where the
// record's run has entries (its partition's lanes and taken set, with the
// taken score relative to Redis time), and the limiter's slots, holders
// and waiting members — what a report of a run the limiter lost track of
// needs.
func (h *harness) limitedState(ctx context.Context, k taskkey.Key) string {
	var b strings.Builder
	now, err := redisNowMs(ctx, h.rdb)
	if err != nil {
		return "  (limiter state: " + err.Error() + ")\n"
	}
	rec, err := h.rdb.HGetAll(ctx, h.ks.Task(k)).Result()
	fmt.Fprintf(&b, "  record %s: %v %v\n", h.ks.Task(k), rec, err)
	p := h.ks.Partition(k)
	runID := rec["runId"]
	if runID != "" {
		for _, l := range []string{h.ks.Queue(p, 0), h.ks.Queue(p, 1)} {
			es, err := h.rdb.LRange(ctx, l, 0, -1).Result()
			for _, e := range es {
				if strings.Contains(e, runID) {
					fmt.Fprintf(&b, "  lane %s holds %q\n", l, e)
				}
			}
			if err != nil {
				fmt.Fprintf(&b, "  lane %s: %v\n", l, err)
			}
		}
		taken, err := h.rdb.ZRangeWithScores(ctx, h.ks.Taken(p), 0, -1).Result()
		found := false
		for _, z := range taken {
			if e, _ := z.Member.(string); strings.Contains(e, runID) {
				found = true
				fmt.Fprintf(&b, "  taken %s holds %q, reclaimable in %dms\n", h.ks.Taken(p), e, int64(z.Score)-now)
			}
		}
		if !found {
			fmt.Fprintf(&b, "  no entry of run %s in %s (%d entries) %v\n", runID, h.ks.Taken(p), len(taken), err)
		}
	}
	base := "{" + keyPrefix + ":limiter:" + limiterName + "}"
	pipe := h.rdb.Pipeline()
	hash := pipe.HGetAll(ctx, base)
	slots := pipe.ZRangeWithScores(ctx, base+":slots", 0, -1)
	holders := pipe.HGetAll(ctx, base+":holders")
	wmeta := pipe.HGetAll(ctx, base+":wmeta")
	wp := pipe.ZRangeWithScores(ctx, base+":wp", 0, -1)
	groups := pipe.LRange(ctx, base+":groups", 0, -1)
	wg := pipe.ZRangeWithScores(ctx, base+":wg:", 0, -1)
	_, err = pipe.Exec(ctx)
	if err != nil && err != redis.Nil {
		fmt.Fprintf(&b, "  limiter %s: %v\n", base, err)
	}
	fmt.Fprintf(&b, "  limiter %s at Redis time %d: %v\n", base, now, hash.Val())
	for _, z := range slots.Val() {
		fmt.Fprintf(&b, "    slot %v expires in %dms, holder %s\n", z.Member, int64(z.Score)-now, holders.Val()[fmt.Sprint(z.Member)])
	}
	fmt.Fprintf(&b, "    waiting members %d: %v; people %v; groups %v; group \"\" %v\n", len(wmeta.Val()), wmeta.Val(), wp.Val(), groups.Val(), wg.Val())
	return strings.ReplaceAll(b.String(), "\x1f", "|")
}
