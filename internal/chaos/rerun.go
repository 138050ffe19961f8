//go:build linux

package chaos

import (
	"time"
)

// checkRerun is check 7: once a run is done, none of its stages runs
// again — no exec stage of it starts, no http stage of it is accepted
// downstream. (The chaos jobs have one stage each, so "done" is the point
// after which the run's stage is complete.) A Redis fault that may have
// lost the done event (it fell within lossWindow before the fault's down,
// or during it) excuses a later execution: the record can have rolled back
// to running and the run been recovered. It returns how many executions
// it checked.
func (h *harness) checkRerun(reqs []recReq, lines []execLine) int {
	done := map[string]int64{} // key + " " + run id → when it ended done (Redis ms), earliest seen
	for _, ep := range h.epochs {
		for key, d := range ep.keys {
			for id, r := range d.runs {
				if r.ended != "done" {
					continue
				}
				k := key + " " + id
				if t, ok := done[k]; !ok || r.endedAt < t {
					done[k] = r.endedAt
				}
			}
		}
	}
	excused := func(endedAt int64) bool {
		for _, o := range h.outages {
			// endedAt is Redis time, up to the fault's clock lag behind the host's
			if endedAt >= o.down.Add(-lossWindow-o.lag).UnixMilli() && endedAt <= o.up.UnixMilli() {
				return true
			}
		}
		return false
	}
	checked := 0
	for _, l := range lines {
		if l.phase != "start" {
			continue
		}
		checked++
		if t, ok := done[l.key+" "+l.runID]; ok && l.at.UnixMilli() > t && !excused(t) {
			h.viol.add(checkRerun, "exec stage of %s run %s started at %s with token %d, after the run ended done at %s",
				l.key, l.runID, l.at.Format("15:04:05.000"), l.token, time.UnixMilli(t).Format("15:04:05.000"))
		}
	}
	for _, r := range reqs {
		if r.outcome != recAccepted {
			continue
		}
		checked++
		if t, ok := done[r.key+" "+r.runID]; ok && r.arrive.UnixMilli() > t && !excused(t) {
			h.viol.add(checkRerun, "%s: accepted downstream, arrived after the run ended done at %s\n%s",
				r.String(), time.UnixMilli(t).Format("15:04:05.000"), h.rec.lines(r.key, 8))
		}
	}
	return checked
}
