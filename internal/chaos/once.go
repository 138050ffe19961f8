//go:build linux

package chaos

import (
	"cmp"
	"fmt"
	"maps"
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
	// first and last time), so a subject's requests cannot always be told
	// apart by occurrence. A subject passes when some way of placing its
	// requests gives every checked bucket exactly one per occurrence: the
	// first and last request of an event are in the buckets of their known
	// times, the others anywhere in between, and requests outside the
	// checked buckets (before the epoch's first occurrence, after its
	// window, in a bucket not checked) count for nothing. Otherwise the
	// subject fails in the bucket that placing fell short in or overfilled.
	// (Earlier versions spread the middle requests by a fixed rule, and
	// twice blamed a subject whose requests had a valid placing: CI seeds
	// 1796228366033615002 and 1796243184187023141.)
	bucketOf := func(at int64) int {
		for i, b := range bs {
			if at >= b.start && at < b.end {
				return i
			}
		}
		return -1
	}
	type verdict struct {
		bucket    int
		got, want int64
	}
	wrong := map[verdict][]string{}
	for _, s := range h.bulk {
		d := ep.keys[taskkey.MustNew(s, bulkScope).String()]
		want := make([]int64, len(bs)) // -1: not checked for this subject
		for j, b := range bs {
			want[j] = -1
			if !slices.Contains(check, b) {
				continue
			}
			if d != nil && d.events >= historyCap && d.first > b.start {
				continue // trimmed: the history no longer covers the bucket
			}
			want[j] = int64(len(b.occs))
		}
		var spans []placedSpan
		var shown []string
		if d != nil {
			for _, r := range d.sched {
				shown = append(shown, fmt.Sprintf("%s..%s %s/%s ×%d", time.UnixMilli(r.at).Format("15:04:05.000"),
					time.UnixMilli(r.last).Format("15:04:05.000"), r.event, r.outcome, r.count))
				first, last := bucketOf(r.at), bucketOf(r.last)
				before := len(bs) > 0 && r.at < bs[0].start
				after := len(bs) > 0 && r.last >= bs[len(bs)-1].end
				if first < 0 && last < 0 && !(before && after) {
					continue // wholly outside the buckets
				}
				spans = append(spans, placedSpan{first: first, last: last, count: r.count, before: before, after: after})
			}
		}
		got := placeRequests(want, spans)
		for j, w := range want {
			if w >= 0 && got[j] != w {
				v := verdict{j, got[j], w}
				wrong[v] = append(wrong[v], fmt.Sprintf("%s %v", s, shown))
				break // one verdict per subject: the earliest bucket
			}
		}
	}
	vs := slices.SortedFunc(maps.Keys(wrong), func(a, b verdict) int { return cmp.Compare(a.bucket, b.bucket) })
	for _, v := range vs {
		subjects := wrong[v]
		h.viol.add(checkOnce, "epoch %d, %s: %d subject(s) got %d schedule request(s), want %d: %s",
			i+1, fmtOccs(bs[v.bucket]), len(subjects), v.got, v.want, strings.Join(subjects[:min(6, len(subjects))], "; "))
	}
	return fired, checked
}

// placedSpan is one coalesced schedule event of a subject over the
// buckets: its first request is in bucket first and its last in bucket
// last (-1: outside every bucket, before them when before is set, after
// them when after is), count requests in all.
type placedSpan struct {
	first, last   int
	count         int64
	before, after bool
}

// placeRequests places the spans' requests in the buckets so that every
// bucket j with want[j] >= 0 gets exactly want[j], if that is possible
// (buckets with want -1 take any number), and returns how many each
// bucket got. When no placing fits, the answer differs from want in a
// bucket that cannot be satisfied. It is a flow problem: spans supply
// their middle requests (those besides the first and last) to any bucket
// between, checked buckets demand what their ends did not already fill.
// First the checked buckets are filled as far as possible, then the rest
// is drained into unchecked buckets and outside; augmenting never takes a
// request back out of a bucket, so the checked ones stay filled.
func placeRequests(want []int64, spans []placedSpan) []int64 {
	m := len(want)
	got := make([]int64, m)
	// Nodes: 0 source, 1..k spans, k+1..k+m buckets, k+m+1 outside, k+m+2 sink.
	k := len(spans)
	src, out, sink := 0, k+m+1, k+m+2
	const inf = int64(1) << 40
	capa := make([][]int64, k+m+3)
	for i := range capa {
		capa[i] = make([]int64, k+m+3)
	}
	fixed := func(b int) {
		if b >= 0 {
			got[b]++
		}
	}
	for i, sp := range spans {
		left := sp.count
		if left > 0 { // the first request
			fixed(sp.first)
			left--
		}
		if left > 0 { // the last request
			fixed(sp.last)
			left--
		}
		capa[src][1+i] = left
		lo, hi := sp.first, sp.last
		if lo < 0 {
			lo = 0
		}
		if hi < 0 {
			hi = m - 1
		}
		for j := lo; j <= hi; j++ {
			capa[1+i][k+1+j] = inf
		}
		if sp.before || sp.after {
			capa[1+i][out] = inf
		}
	}
	for j, w := range want {
		if w >= 0 {
			capa[k+1+j][sink] = max(0, w-got[j])
		}
	}
	flow := func() {
		for {
			prev := make([]int, len(capa))
			for i := range prev {
				prev[i] = -1
			}
			prev[src] = src
			queue := []int{src}
			for len(queue) > 0 && prev[sink] < 0 {
				u := queue[0]
				queue = queue[1:]
				for v, c := range capa[u] {
					if c > 0 && prev[v] < 0 {
						prev[v] = u
						queue = append(queue, v)
					}
				}
			}
			if prev[sink] < 0 {
				return
			}
			push := inf
			for v := sink; v != src; v = prev[v] {
				push = min(push, capa[prev[v]][v])
			}
			for v := sink; v != src; v = prev[v] {
				capa[prev[v]][v] -= push
				capa[v][prev[v]] += push
				if u := prev[v]; u > k && u <= k+m && v == sink {
					got[u-k-1] += push
				}
			}
		}
	}
	flow() // fill the checked buckets
	for j, w := range want {
		if w < 0 {
			capa[k+1+j][sink] = inf
		}
	}
	capa[out][sink] = inf
	flow() // drain the rest
	for i := range spans {
		if rest := capa[src][1+i]; rest > 0 { // requests with nowhere to go: overfill the span's last checked bucket
			lo, hi := max(spans[i].first, 0), spans[i].last
			if hi < 0 {
				hi = m - 1
			}
			for j := hi; j >= lo; j-- {
				if want[j] >= 0 {
					got[j] += rest
					break
				}
			}
		}
	}
	return got
}
