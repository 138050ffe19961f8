//go:build linux

// Check 10: what the runners saw of each run, checked for linearizability.

package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/tasklease/tasklease/internal/histories"
)

// historyTimeout bounds porcupine's search; a history it cannot decide
// within it is reported, not counted as a violation.
const historyTimeout = 2 * time.Minute

// historyStats is what check 10 did.
type historyStats struct {
	ops, runs, unconfirmed int
	excludedRuns           int // runs whose operations come near a Redis fault
	verdict                porcupine.CheckResult
	html                   string
}

// historyPath is where runner incarnation p writes its history log
// (runner serve --history-log).
func (h *harness) historyPath(id string, inc int) string {
	return fmt.Sprintf("%s/history-%s-%d.jsonl", h.dir, id, inc)
}

// checkHistories is check 10: every runner's history log (its grants,
// with their tokens, its stage advances and finishes, including calls
// nobody heard back from) is read, and each run's operations — a key's run
// id, across the runners that held it — are checked with porcupine
// against the sequential specification of a run (internal/histories).
// A Redis fault may lose what a run wrote, which no specification of the
// run allows, so a run with an operation within 2 s of a fault, or on both
// sides of one, is left out. Runs rather than keys: a key's next run may
// begin at any point of an epoch, and its earlier runs' state at a fault
// is not known.
func (h *harness) checkHistories() historyStats {
	var st historyStats
	var entries []histories.Entry
	for _, p := range h.allRunners() {
		f, err := os.Open(h.historyPath(p.id, p.inc))
		if err != nil {
			h.viol.add(checkHistories, "%s#%d: no history log: %v", p.id, p.inc, err)
			continue
		}
		es, err := histories.ReadLog(f)
		f.Close()
		if err != nil {
			h.viol.add(checkHistories, "%s#%d: %v", p.id, p.inc, err)
			continue
		}
		entries = append(entries, es...)
	}
	byRun := map[string][]histories.Entry{}
	var order []string
	for _, e := range entries {
		id := e.Op.Key + " " + e.Op.RunID
		if _, ok := byRun[id]; !ok {
			order = append(order, id)
		}
		byRun[id] = append(byRun[id], e)
	}
	var checked []histories.Entry
	for _, id := range order {
		run := byRun[id]
		if h.nearFault(run) {
			st.excludedRuns++
			continue
		}
		st.runs++
		for _, e := range run {
			e.Op.Key = id // the model partitions by Key: one run each
			checked = append(checked, e)
		}
	}
	res, err := histories.Check(histories.Operations(checked), historyTimeout, filepath.Join(h.dir, "histories"))
	if err != nil {
		h.viol.add(checkHistories, "%v", err)
	}
	st.ops, st.unconfirmed, st.verdict, st.html = res.Ops, res.Unknown, res.Verdict, res.HTML
	switch res.Verdict {
	case porcupine.Illegal:
		h.viol.add(checkHistories, "the runs' histories are not linearizable (%d operations of %d runs): porcupine's view is histories/histories.html in the kept logs", res.Ops, st.runs)
	case porcupine.Unknown:
		h.note("check 10: porcupine could not decide within %v (%d operations)", historyTimeout, res.Ops)
	}
	return st
}

// nearFault: one of run's operations is within 2 s of a Redis fault, or
// the run has operations on both sides of one.
func (h *harness) nearFault(run []histories.Entry) bool {
	const margin = 2 * time.Second
	for _, o := range h.outages {
		from, to := o.down.Add(-margin).UnixNano(), o.up.Add(margin).UnixNano()
		before, after := false, false
		for _, e := range run {
			ret := e.Ret
			if e.Out == histories.Unknown {
				ret = e.Call // open to the end: judged by when it was sent
			}
			if e.Call < to && ret > from {
				return true
			}
			before = before || ret <= from
			after = after || e.Call >= to
		}
		if before && after {
			return true
		}
	}
	return false
}
