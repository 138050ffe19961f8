//go:build linux

// Check 6: every accepted request is reflected in a run (docs/concepts.md).

package chaos

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/taskkey"
)

// lossWindow is how far back before a Redis restart that keeps its data
// (AOF fsynced every second) or a failover (asynchronous replication)
// acknowledged writes may be lost.
const lossWindow = 2 * time.Second

// acceptedReq is a submit the load got a 200 answer for whose outcome
// names a run (started, joined, queued, replaced).
type acceptedReq struct {
	key      taskkey.Key
	runID    string       // the answer's Task.RunID
	outcome  jobs.Outcome // the answer's outcome
	status   jobs.Status  // the answer's Task.Status
	sent, at time.Time    // local: the request sent, its answer received
}

// followUp reports whether the request is answered by a follow-up run
// still to come rather than by the run its answer names. queued: the
// answer names the active run; at most one follow-up (coalescing every
// queue request) starts when it ends (lua/lib/runs.lua finish_terminal).
// replaced: a running run is flagged and answered with (its holder ends it
// as cancelled, which starts the fresh run); a queued or retrying one is
// ended in the submit itself and the answer names the fresh run (queued),
// which then answers the request like a started one.
func (r acceptedReq) followUp() bool {
	return r.outcome == jobs.OutcomeQueued || (r.outcome == jobs.OutcomeReplaced && r.status == jobs.StatusRunning)
}

func (r acceptedReq) String() string {
	return fmt.Sprintf("%s %s run %s (sent %s, answered %s)", r.key, r.outcome, r.runID,
		r.sent.Format("15:04:05.000"), r.at.Format("15:04:05.000"))
}

// acceptLog is what check 6 needs from the load: the accepted submits, and
// the cancels that cancelled or flagged a run (a cancel drops a queued
// follow-up, lua/cancel.lua).
type acceptLog struct {
	mu      sync.Mutex
	reqs    []acceptedReq
	cancels map[string][]time.Time // key → when such a cancel was answered
}

// submit records res, the 200 answer to a submit of key sent at sent, if
// its outcome names a run.
func (l *acceptLog) submit(key taskkey.Key, sent time.Time, res jobs.SubmitResult) {
	switch res.Outcome {
	case jobs.OutcomeStarted, jobs.OutcomeJoined, jobs.OutcomeQueued, jobs.OutcomeReplaced:
	default:
		return
	}
	r := acceptedReq{key: key, runID: res.Task.RunID, outcome: res.Outcome, status: res.Task.Status,
		sent: sent, at: time.Now()}
	l.mu.Lock()
	l.reqs = append(l.reqs, r)
	l.mu.Unlock()
}

// cancel records the answer to a cancel of key, if it cancelled or
// flagged a run.
func (l *acceptLog) cancel(key taskkey.Key, outcome jobs.CancelOutcome) {
	if outcome != jobs.CancelCancelled && outcome != jobs.CancelCancelling {
		return
	}
	at := time.Now()
	l.mu.Lock()
	if l.cancels == nil {
		l.cancels = map[string][]time.Time{}
	}
	l.cancels[key.String()] = append(l.cancels[key.String()], at)
	l.mu.Unlock()
}

// checkAccepted is check 6: every accepted request is reflected in a run
// that ended or is still active (docs/concepts.md). For each submit the load got
// a 200 answer for with an outcome naming a run:
//
//   - Its epoch is the one it was answered in (before which fault's down).
//     Not checked, as a Redis fault may legitimately have lost it or its
//     snapshot may not show it: a request in flight while Redis was down
//     (sent before a fault's up, answered after its down); one answered
//     within lossWindow before the down of a restart that kept its data or
//     a failover; one answered after its epoch's pre-fault snapshot began
//     (epoch.end); one whose key's history, in a snapshot it is checked
//     against, was trimmed past it (historyCap events, the oldest after
//     the request was sent).
//   - Presence: its run is in its epoch's snapshot (the pre-fault one, read
//     before the loss, or the final state): some history event names the
//     run, or the run record does.
//   - Reflection, in the snapshot before the first restart that lost the
//     data at or after its epoch (restartEmpty; the final state if none):
//     a request answered by its own run (started, joined, replaced
//     answered with the fresh run) needs that run ended there (a done,
//     failed or cancelled event) or still the key's active run (the record
//     names it, queued, running or retrying). A request answered by a
//     follow-up (queued, or replaced naming the running run; see
//     acceptedReq.followUp) needs the run it names to be the active run
//     with the follow-up still queued (the record's followUp flag), or the
//     first run after it in the history (the follow-up: the run it names
//     was active when the request arrived, so the next run began after
//     it) to have ended or be the active run, or, when no run followed, a
//     cancel of the key answered after the request was sent (a cancel
//     drops a queued follow-up).
//
// Whether an active run has a live holder is check 1's (the final state is
// read after the drain). It returns the requests checked.
func (h *harness) checkAccepted() int {
	h.acc.mu.Lock()
	reqs := slices.Clone(h.acc.reqs)
	cancels := maps.Clone(h.acc.cancels)
	h.acc.mu.Unlock()
	checked := 0
	skipped := map[string]int{}
	failed := 0
	for _, r := range reqs {
		skip, fail, final := h.judgeAccepted(r, cancels)
		switch {
		case skip != "":
			skipped[skip]++
		case fail != "":
			checked++
			failed++
			hist := ""
			if final && failed <= detailsPerCheck { // the final state is what Redis holds now
				hist = "\n" + historyLines(context.Background(), h.rdb, h.ks, r.key, 25)
			}
			h.viol.add(checkAccepted, "%s: %s%s", r.String(), fail, hist)
		default:
			checked++
		}
	}
	reasons := []string{}
	for why, n := range skipped {
		reasons = append(reasons, fmt.Sprintf("%d %s", n, why))
	}
	sort.Strings(reasons)
	if len(reasons) == 0 {
		reasons = append(reasons, "none")
	}
	h.note("check 6: %d accepted requests, %d checked, %d not reflected; not checked: %s",
		len(reqs), checked, failed, strings.Join(reasons, ", "))
	return checked
}

// judgeAccepted applies check 6 to r: why it is not checked, or what is
// wrong with it ("" and "": it is reflected); final says whether it was
// judged against the final state.
func (h *harness) judgeAccepted(r acceptedReq, cancels map[string][]time.Time) (skip, fail string, final bool) {
	if len(h.epochs) == 0 {
		return "without an epoch", "", false
	}
	last := len(h.epochs) - 1
	e := -1 // the epoch it was answered in: outage e ended it (or it is the last)
	for i, o := range h.outages {
		if !r.sent.After(o.up) && !r.at.Before(o.down) {
			return "in flight during a Redis fault", "", false
		}
		if e < 0 && r.at.Before(o.down) {
			e = i
		}
	}
	if e < 0 || e > last {
		e = last
	}
	if e < last && e < len(h.outages) {
		o := h.outages[e]
		if o.kind != FaultRedisRestartEmpty && !r.at.Before(o.down.Add(-lossWindow)) {
			return "answered within " + lossWindow.String() + " before a " + o.kind, "", false
		}
	}
	pe := h.epochs[e]
	if e < last && pe.end > 0 && r.at.UnixMilli() >= pe.end {
		return "answered after the pre-fault snapshot began", "", false
	}
	j := last // the snapshot it is reflected in: before the data is lost, or the final state
	for i := e; i < len(h.outages) && i < last; i++ {
		if h.outages[i].kind == FaultRedisRestartEmpty {
			j = i
			break
		}
	}
	name := func(i int) string {
		if i == last {
			return "the final state"
		}
		o := h.outages[i]
		return fmt.Sprintf("epoch %d's snapshot before the %s at %s", i+1, o.kind, o.down.Format("15:04:05.000"))
	}
	data := func(i int) *keyData {
		if d := h.epochs[i].keys[r.key.String()]; d != nil {
			return d
		}
		return &keyData{}
	}
	p, d := data(e), data(j)
	for _, x := range []*keyData{p, d} {
		if x.events >= historyCap && x.first > r.sent.UnixMilli() {
			return "in a trimmed history", "", false
		}
	}
	final = j == last
	if p.runs[r.runID] == nil && p.runID != r.runID {
		return "", fmt.Sprintf("run %s is not in the key's history in %s (%d events, %s)",
			r.runID, name(e), p.events, p.record()), final
	}
	reflected := func(id string) bool {
		rs := d.runs[id]
		return rs != nil && rs.ended != "" || d.current(id)
	}
	state := func() string {
		return fmt.Sprintf("%s: %d events, %s", name(j), d.events, d.record())
	}
	if !r.followUp() {
		if reflected(r.runID) {
			return "", "", final
		}
		return "", fmt.Sprintf("run %s neither ended nor is the key's active run in %s", r.runID, state()), final
	}
	if d.current(r.runID) && d.followUp {
		return "", "", final // the follow-up is still visibly queued
	}
	// A cancel answered after the request was sent drops a queued follow-up
	// (lua/cancel.lua): whatever run the history shows next is a fresh one,
	// not this request's to reflect. Checked before that next run, because
	// the snapshot reads a key's record before its history (readKeys): a
	// fresh run started in between is in the history but not the record.
	for _, c := range cancels[r.key.String()] {
		if c.After(r.sent) {
			return "", "", final
		}
	}
	if rs := d.runs[r.runID]; rs != nil {
		next, at := "", -1
		for id, o := range d.runs {
			if o.first > rs.first && (at < 0 || o.first < at) {
				next, at = id, o.first
			}
		}
		if next != "" {
			if reflected(next) {
				return "", "", final
			}
			return "", fmt.Sprintf("the follow-up run %s after run %s neither ended nor is the key's active run in %s",
				next, r.runID, state()), final
		}
	}
	ended := "not ended"
	if rs := d.runs[r.runID]; rs != nil && rs.ended != "" {
		ended = "ended " + rs.ended
	}
	return "", fmt.Sprintf("no follow-up run after run %s (%s), none visibly queued, and no cancel of the key since, in %s",
		r.runID, ended, state()), final
}

// record renders what the key's run record says, for a message.
func (d *keyData) record() string {
	if d.runID == "" {
		return "no run record"
	}
	return fmt.Sprintf("record: run %s %s, follow-up queued %v", d.runID, d.status, d.followUp)
}
