//go:build linux

package chaos

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tasklease/tasklease/taskkey"
)

// checkOnce is check 4 for one epoch: every occurrence's fan-out is
// claimed only after the previous one finished, so the requests of the
// occurrences claimed at c1 < c2 < … fall into [c1, c2), [c2, c3), …. In
// each such bucket inside the epoch's window every bulk subject must have
// exactly as many schedule requests as occurrences were claimed in it (an
// occurrence whose claim the poller missed shares its predecessor's
// bucket). It returns the occurrences fired and those checked.
func (h *harness) checkOnce(i int, ep *epoch) (fired, checked int) {
	type bucket struct {
		occs       []int64
		start, end int64
	}
	var bs []*bucket
	var cur *bucket
	for _, o := range ep.fired {
		if st, ok := ep.states[o]; ok && st.startedAt > 0 {
			cur = &bucket{occs: []int64{o}, start: st.startedAt}
			bs = append(bs, cur)
			if st.abandoned {
				h.viol.add(checkOnce, "epoch %d: occurrence %s was abandoned unfinished (%d submitted): its remaining subjects got no request",
					i+1, time.Unix(o, 0).Format("15:04:05"), st.submitted)
			}
		} else if cur != nil {
			cur.occs = append(cur.occs, o)
		}
	}
	// An occurrence the poller never saw finished (or that finished in the
	// millisecond the next was claimed: a resumed fan-out is followed at
	// once by the catch-up occurrence) has no sharp end: check it together
	// with the next one.
	merged := bs[:0]
	for _, b := range bs {
		if n := len(merged); n > 0 {
			prev := merged[n-1]
			if st, ok := ep.states[prev.occs[len(prev.occs)-1]]; !ok || !st.done || st.finishedAt >= b.start {
				prev.occs = append(prev.occs, b.occs...)
				continue
			}
		}
		merged = append(merged, b)
	}
	bs = merged
	for j, b := range bs {
		b.end = ep.end
		if j+1 < len(bs) {
			b.end = bs[j+1].start
		}
	}
	var check []*bucket
	for j, b := range bs {
		if b.start < ep.start || b.end > ep.end {
			continue
		}
		if j == len(bs)-1 { // the last one must be finished within the window
			st, ok := ep.states[b.occs[len(b.occs)-1]]
			if !ok || !st.done || st.finishedAt > ep.end {
				continue
			}
		}
		check = append(check, b)
		checked += len(b.occs)
	}
	fired = len(ep.fired)
	interrupted, interruptedChecked := 0, 0
	h.mu.Lock()
	for occ, e := range h.killed {
		if e != i {
			continue
		}
		interrupted++
		for _, b := range check {
			if slices.Contains(b.occs, occ) {
				interruptedChecked++
			}
		}
	}
	h.mu.Unlock()
	h.note("epoch %d: window %s..%s, %d occurrences fired, %d buckets, %d occurrences checked × %d subjects; %d fan-outs interrupted by a leader kill, %d of them checked",
		i+1, time.UnixMilli(ep.start).Format("15:04:05.000"), time.UnixMilli(ep.end).Format("15:04:05.000"),
		fired, len(bs), checked, len(h.bulk), interrupted, interruptedChecked)
	fmtOccs := func(b *bucket) string {
		var s []string
		for _, o := range b.occs {
			s = append(s, time.Unix(o, 0).Format("15:04:05"))
		}
		return fmt.Sprintf("occurrence(s) %v claimed in [%s, %s)", s,
			time.UnixMilli(b.start).Format("15:04:05.000"), time.UnixMilli(b.end).Format("15:04:05.000"))
	}
	// Repeats of a run's schedule joins are coalesced into one event (count,
	// first and last time): its requests are spread over the buckets they
	// span, one per occurrence, oldest first. (Within one coalesced span a
	// double request for one occurrence and none for the next cannot be told
	// apart; every other miscount can.)
	bucketOf := func(at int64) int {
		for i, b := range bs {
			if at >= b.start && at < b.end {
				return i
			}
		}
		return -1
	}
	counts := map[string][]int64{} // subject → requests per checked bucket
	spans := map[string][]string{}
	unknown := map[string]map[int]bool{} // subject → buckets its history cannot settle
	for _, s := range h.bulk {
		d := ep.keys[taskkey.MustNew(s, bulkScope).String()]
		c := make([]int64, len(bs))
		counts[s] = c
		if d == nil {
			continue
		}
		for _, r := range d.sched {
			first, last := bucketOf(r.at), bucketOf(r.last)
			spans[s] = append(spans[s], fmt.Sprintf("%s..%s %s/%s ×%d", time.UnixMilli(r.at).Format("15:04:05.000"),
				time.UnixMilli(r.last).Format("15:04:05.000"), r.event, r.outcome, r.count))
			// A span may start before the epoch's first bucket or go on after
			// its last: the requests outside the window are not this
			// epoch's to count.
			before, after := len(bs) > 0 && r.at < bs[0].start, len(bs) > 0 && r.last >= bs[len(bs)-1].end
			if first < 0 && last < 0 && !(before && after) {
				continue
			}
			if first < 0 {
				first = 0
			}
			if last < 0 {
				last = len(bs) - 1
			}
			// Fill the buckets the requests span, up to one request per
			// occurrence each: oldest first, or newest first when the span
			// began before the window. What is left over is dropped when
			// the span goes past the window on that side; otherwise it stays
			// in the edge bucket (and fails the check there).
			idx := make([]int, 0, last-first+1)
			for i := first; i <= last; i++ {
				idx = append(idx, i)
			}
			if before && !after {
				// Requests from before the window coalesced with some in
				// it: only the last is known to be at r.last. Its bucket
				// gets that one; how many of the others fell into the
				// window's buckets up to it is unknown, so those are not
				// checked for this subject. (Counting the others into
				// them, latest first, blamed a later bucket for requests
				// that were in fact older.)
				c[last]++
				if unknown[s] == nil {
					unknown[s] = map[int]bool{}
				}
				for _, i := range idx {
					unknown[s][i] = true
				}
				continue
			}
			drop := after
			left := r.count
			// The span's first and last requests are at known times (r.at,
			// r.last): their buckets get one each before the rest is
			// spread. (Spreading all of them oldest first put the last
			// one's into an earlier bucket holding two occurrences, and
			// blamed the last bucket: CI seed 1796228366033615002.)
			if !before && left > 0 {
				c[idx[0]]++
				left--
			}
			if !after && len(idx) > 1 && left > 0 {
				c[idx[len(idx)-1]]++
				left--
			}
			for n, i := range idx {
				take := min(left, int64(len(bs[i].occs))-c[i])
				if n == len(idx)-1 && !drop {
					take = left
				}
				if take > 0 {
					c[i] += take
					left -= take
				}
			}
		}
	}
	for _, b := range check {
		bi := slices.Index(bs, b)
		wrong := map[int64][]string{}
		for _, s := range h.bulk {
			d := ep.keys[taskkey.MustNew(s, bulkScope).String()]
			if d != nil && d.events >= historyCap && d.first > b.start {
				continue // trimmed: the history no longer covers the bucket
			}
			if unknown[s][bi] {
				continue
			}
			if n := counts[s][bi]; n != int64(len(b.occs)) {
				wrong[n] = append(wrong[n], fmt.Sprintf("%s %v", s, spans[s]))
			}
		}
		for n, subjects := range wrong {
			h.viol.add(checkOnce, "epoch %d, %s: %d subject(s) got %d schedule request(s), want %d: %s",
				i+1, fmtOccs(b), len(subjects), n, len(b.occs), strings.Join(subjects[:min(6, len(subjects))], "; "))
		}
	}
	return fired, checked
}
