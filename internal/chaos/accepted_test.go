//go:build linux

package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/taskkey"
)

// hev is one history event of a key, for keyData built by hand.
type hev struct {
	at    time.Duration // since acceptT0
	run   string
	event string
}

var acceptT0 = time.Unix(100_000, 0)

// acceptKeyData is a key's state with the history evs (chronological) and
// the record naming run with status (and its follow-up flag).
func acceptKeyData(run string, status jobs.Status, followUp bool, evs ...hev) *keyData {
	d := &keyData{events: len(evs), runID: run, status: status, followUp: followUp}
	for n, e := range evs {
		if n == 0 {
			d.first = acceptT0.Add(e.at).UnixMilli()
		}
		d.seeRun(e.run, n, e.event, 0)
	}
	return d
}

// Check 6: every accepted request is reflected in a run that ended or is
// still active, in the snapshot of its epoch (the final state, or the one
// read before a restart that lost the data); requests a Redis fault may
// have lost are not checked.
func TestCheckerAcceptedRequestsAreReflected(t *testing.T) {
	key := taskkey.MustNew("u1", bulkScope)
	at := func(d time.Duration) time.Time { return acceptT0.Add(d) }
	req := func(outcome jobs.Outcome, run string, status jobs.Status, answered time.Duration) acceptedReq {
		return acceptedReq{key: key, runID: run, outcome: outcome, status: status,
			sent: at(answered - 100*time.Millisecond), at: at(answered)}
	}
	started := func(run string, answered time.Duration) acceptedReq {
		return req(jobs.OutcomeStarted, run, jobs.StatusQueued, answered)
	}
	queued := func(run string, answered time.Duration) acceptedReq {
		return req(jobs.OutcomeQueued, run, jobs.StatusRunning, answered)
	}
	none := acceptKeyData("", "", false)
	// a run r1 requested at 1s, running, done at 3s
	r1done := []hev{{time.Second, "r1", "requested"}, {1100 * time.Millisecond, "r1", "started"}, {3 * time.Second, "r1", "done"}}
	r1running := acceptKeyData("r1", jobs.StatusRunning, false, r1done[:2]...)
	// outages at 10s..11s: the epoch before it ends (its snapshot begins) at 9.5s
	fault := func(kind string) []outage {
		return []outage{{kind: kind, down: at(10 * time.Second), up: at(11 * time.Second)}}
	}
	epochs := func(before, final *keyData) []*epoch {
		return []*epoch{
			{end: at(9500 * time.Millisecond).UnixMilli(), keys: map[string]*keyData{key.String(): before}},
			{keys: map[string]*keyData{key.String(): final}},
		}
	}
	final := func(d *keyData) []*epoch { return []*epoch{{keys: map[string]*keyData{key.String(): d}}} }
	for _, tc := range []struct {
		name     string
		epochs   []*epoch
		outages  []outage
		reqs     []acceptedReq
		cancels  []time.Duration // accepted cancels of the key, answered at
		want     int             // violations
		wantSeen int             // requests checked
	}{
		{"its run is in the history and done", final(acceptKeyData("r1", jobs.StatusDone, false, r1done...)),
			nil, []acceptedReq{started("r1", time.Second), req(jobs.OutcomeJoined, "r1", jobs.StatusRunning, 2*time.Second)}, nil, 0, 2},
		{"its run never appears", final(acceptKeyData("r1", jobs.StatusDone, false, r1done...)),
			nil, []acceptedReq{started("r9", time.Second)}, nil, 1, 1},
		{"no state at all", final(none), nil, []acceptedReq{started("r1", time.Second)}, nil, 1, 1},
		{"its run is still the active one", final(r1running), nil, []acceptedReq{started("r1", time.Second)}, nil, 0, 1},
		{"its run appears but neither ended nor is active", final(acceptKeyData("r2", jobs.StatusDone, false,
			append(r1done[:2:2], hev{4 * time.Second, "r2", "requested"}, hev{5 * time.Second, "r2", "done"})...)),
			nil, []acceptedReq{started("r1", time.Second)}, nil, 1, 1},

		// A restart that lost the data: the pre-fault snapshot, read before
		// the loss, must show it.
		{"lost to a restartEmpty, in the pre-fault snapshot", epochs(r1running, none), fault(FaultRedisRestartEmpty),
			[]acceptedReq{started("r1", time.Second)}, nil, 0, 1},
		{"lost to a restartEmpty, not in the pre-fault snapshot either", epochs(none, none), fault(FaultRedisRestartEmpty),
			[]acceptedReq{started("r1", time.Second)}, nil, 1, 1},
		{"answered after the pre-fault snapshot began, missing", epochs(none, none), fault(FaultRedisRestartEmpty),
			[]acceptedReq{started("r1", 9700*time.Millisecond)}, nil, 0, 0},
		{"a run after the restart, missing", epochs(none, none), fault(FaultRedisRestartEmpty),
			[]acceptedReq{started("r1", 12*time.Second)}, nil, 1, 1},

		// A failover (or a restart from the AOF) may lose the last writes:
		// within 2 s before it, a request is not checked.
		{"answered 1 s before a failover, missing", epochs(none, none), fault(FaultFailover),
			[]acceptedReq{started("r1", 9*time.Second)}, nil, 0, 0},
		{"answered 1.5 s before a restart keeping data, missing", epochs(none, none), fault(FaultRedisRestartKeepData),
			[]acceptedReq{started("r1", 8500*time.Millisecond)}, nil, 0, 0},
		{"answered while Redis failed over", epochs(none, none), fault(FaultFailover),
			[]acceptedReq{started("r1", 10500*time.Millisecond)}, nil, 0, 0},
		{"in flight across the failover", epochs(none, none), fault(FaultFailover),
			[]acceptedReq{{key: key, runID: "r1", outcome: jobs.OutcomeStarted, status: jobs.StatusQueued, sent: at(9 * time.Second), at: at(11500 * time.Millisecond)}},
			nil, 0, 0},
		{"answered after the failover, missing", epochs(none, none), fault(FaultFailover),
			[]acceptedReq{started("r1", 12*time.Second)}, nil, 1, 1},
		{"answered after the failover, done", epochs(none, acceptKeyData("r1", jobs.StatusDone, false,
			hev{12 * time.Second, "r1", "requested"}, hev{13 * time.Second, "r1", "done"})), fault(FaultFailover),
			[]acceptedReq{started("r1", 12*time.Second)}, nil, 0, 1},
		{"answered long before the failover, gone after it", epochs(r1running, none), fault(FaultFailover),
			[]acceptedReq{started("r1", time.Second)}, nil, 1, 1},
		{"answered long before the failover, ended after it", epochs(r1running, acceptKeyData("r1", jobs.StatusDone, false,
			append(r1done[:2:2], hev{12 * time.Second, "r1", "done"})...)), fault(FaultFailover),
			[]acceptedReq{started("r1", time.Second)}, nil, 0, 1},
		{"answered long before the failover, missing before it", epochs(none, acceptKeyData("r1", jobs.StatusDone, false, r1done...)),
			fault(FaultFailover), []acceptedReq{started("r1", time.Second)}, nil, 1, 1},

		{"a history trimmed past it", final(func() *keyData {
			d := acceptKeyData("r2", jobs.StatusDone, false, hev{5 * time.Second, "r2", "requested"}, hev{6 * time.Second, "r2", "done"})
			d.events = historyCap
			return d
		}()), nil, []acceptedReq{started("r1", time.Second)}, nil, 0, 0},

		// queued (and replaced answered with the running run): the follow-up
		// must run, be visibly queued, or have been dropped by a cancel.
		{"queued, the follow-up ran", final(acceptKeyData("r2", jobs.StatusDone, false,
			append(r1done[:3:3], hev{3 * time.Second, "r2", "requested"}, hev{4 * time.Second, "r2", "done"})...)),
			nil, []acceptedReq{queued("r1", 2*time.Second)}, nil, 0, 1},
		{"queued, no follow-up", final(acceptKeyData("r1", jobs.StatusDone, false, r1done...)),
			nil, []acceptedReq{queued("r1", 2*time.Second)}, nil, 1, 1},
		{"queued, the follow-up still queued", final(acceptKeyData("r1", jobs.StatusRunning, true, r1done[:2]...)),
			nil, []acceptedReq{queued("r1", 2*time.Second)}, nil, 0, 1},
		{"queued, the active run no longer has the follow-up", final(acceptKeyData("r1", jobs.StatusRunning, false, r1done[:2]...)),
			nil, []acceptedReq{queued("r1", 2*time.Second)}, nil, 1, 1},
		{"queued, the follow-up dropped by a later cancel", final(acceptKeyData("r1", jobs.StatusCancelled, false,
			append(r1done[:2:2], hev{3 * time.Second, "r1", "cancelled"})...)),
			nil, []acceptedReq{queued("r1", 2*time.Second)}, []time.Duration{2500 * time.Millisecond}, 0, 1},
		// CI seed 1796228366033615002: the record was read after the cancel
		// ended r1 and before a fresh request started r2, the history after.
		{"queued, the follow-up dropped by a later cancel, a fresh run only in the history", final(acceptKeyData("r1", jobs.StatusCancelled, false,
			append(r1done[:2:2], hev{3 * time.Second, "r1", "cancelled"}, hev{4 * time.Second, "r2", "requested"})...)),
			nil, []acceptedReq{queued("r1", 2*time.Second)}, []time.Duration{2500 * time.Millisecond}, 0, 1},
		{"queued, a cancel before it does not drop it", final(acceptKeyData("r1", jobs.StatusCancelled, false,
			append(r1done[:2:2], hev{3 * time.Second, "r1", "cancelled"})...)),
			nil, []acceptedReq{queued("r1", 2*time.Second)}, []time.Duration{1500 * time.Millisecond}, 1, 1},
		{"queued, the follow-up neither ended nor active", final(acceptKeyData("r3", jobs.StatusDone, false,
			append(r1done[:3:3], hev{3 * time.Second, "r2", "requested"}, hev{4 * time.Second, "r3", "requested"}, hev{5 * time.Second, "r3", "done"})...)),
			nil, []acceptedReq{queued("r1", 2*time.Second)}, nil, 1, 1},
		{"replaced a running run, the fresh one ran", final(acceptKeyData("r2", jobs.StatusDone, false,
			append(r1done[:2:2], hev{2 * time.Second, "r1", "cancelled"}, hev{2 * time.Second, "r2", "requested"}, hev{3 * time.Second, "r2", "done"})...)),
			nil, []acceptedReq{req(jobs.OutcomeReplaced, "r1", jobs.StatusRunning, 2*time.Second)}, nil, 0, 1},
		{"replaced a running run, no fresh one", final(acceptKeyData("r1", jobs.StatusCancelled, false,
			append(r1done[:2:2], hev{2 * time.Second, "r1", "cancelled"})...)),
			nil, []acceptedReq{req(jobs.OutcomeReplaced, "r1", jobs.StatusRunning, 2*time.Second)}, nil, 1, 1},
		// replacing a queued or retrying run answers with the fresh run
		{"replaced a queued run, answered with the fresh one, done", final(acceptKeyData("r2", jobs.StatusDone, false,
			hev{time.Second, "r1", "requested"}, hev{2 * time.Second, "r1", "cancelled"}, hev{2 * time.Second, "r2", "requested"}, hev{3 * time.Second, "r2", "done"})),
			nil, []acceptedReq{req(jobs.OutcomeReplaced, "r2", jobs.StatusQueued, 2*time.Second)}, nil, 0, 1},
		{"replaced a queued run, answered with a fresh one that never appears", final(acceptKeyData("r1", jobs.StatusCancelled, false,
			hev{time.Second, "r1", "requested"}, hev{2 * time.Second, "r1", "cancelled"})),
			nil, []acceptedReq{req(jobs.OutcomeReplaced, "r2", jobs.StatusQueued, 2*time.Second)}, nil, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := checkerHarness(t, "u1")
			h.epochs, h.outages = tc.epochs, tc.outages
			h.acc.reqs = tc.reqs
			for _, c := range tc.cancels {
				if h.acc.cancels == nil {
					h.acc.cancels = map[string][]time.Time{}
				}
				h.acc.cancels[key.String()] = append(h.acc.cancels[key.String()], at(c))
			}
			seen := h.checkAccepted()
			if got := h.viol.of(checkAccepted); len(got) != tc.want || seen != tc.wantSeen {
				t.Fatalf("%d violations, %d checked; want %d, %d: %v", len(got), seen, tc.want, tc.wantSeen, got)
			}
			for _, v := range h.viol.of(checkAccepted) {
				t.Log(v)
			}
		})
	}
}

// The load records only the submits whose outcome names a run, and only
// the cancels that cancelled or flagged one.
func TestAcceptLogRecordsWhatNamesARun(t *testing.T) {
	var l acceptLog
	k := taskkey.MustNew("u1", bulkScope)
	for _, o := range []jobs.Outcome{jobs.OutcomeStarted, jobs.OutcomeJoined, jobs.OutcomeQueued, jobs.OutcomeReplaced,
		jobs.OutcomeSkipped, jobs.OutcomeThrottled} {
		l.submit(k, time.Now(), jobs.SubmitResult{Outcome: o, Task: jobs.TaskView{RunID: "r1", Status: jobs.StatusRunning}})
	}
	for _, o := range []jobs.CancelOutcome{jobs.CancelCancelled, jobs.CancelCancelling, jobs.CancelNotRunning} {
		l.cancel(k, o)
	}
	if len(l.reqs) != 4 || len(l.cancels[k.String()]) != 2 {
		t.Fatalf("recorded %d submits, %d cancels; want 4, 2: %+v", len(l.reqs), len(l.cancels[k.String()]), l.reqs)
	}
	for _, r := range l.reqs {
		if r.runID != "r1" || r.key != k || r.at.Before(r.sent) {
			t.Fatalf("recorded %+v", r)
		}
	}
}

// readKeys keeps what check 6 reads: the runs the history names (with
// their terminal event), and the record's run, status and follow-up flag.
func TestReadKeysRunsAndRecord(t *testing.T) {
	h := checkerHarness(t, "u1")
	ctx := context.Background()
	reg, err := historyReader(h.rdb, h.ks, h.keys)
	if err != nil {
		t.Fatal(err)
	}
	res, err := reg.Submit(ctx, "u1", bulkScope, jobs.SubmitOptions{Source: jobs.SourceManual})
	if err != nil || res.Outcome != jobs.OutcomeStarted {
		t.Fatalf("submit: %+v, %v", res, err)
	}
	run := res.Task.RunID
	q, err := reg.Submit(ctx, "u1", bulkScope, jobs.SubmitOptions{Source: jobs.SourceManual, Policy: jobs.PolicyQueue})
	if err != nil || q.Outcome != jobs.OutcomeQueued || q.Task.RunID != run || q.RunID == "" || q.RunID == run {
		t.Fatalf("queue: %+v, %v", q, err)
	}
	follow := q.RunID // logged under the follow-up that serves it
	read := func() *keyData {
		t.Helper()
		keys, err := readKeys(ctx, h.rdb, h.ks, h.keys)
		if err != nil {
			t.Fatal(err)
		}
		return keys[h.keys[0].String()]
	}
	d := read()
	if d.runs[run] == nil || d.runs[run].ended != "" || !d.current(run) || !d.followUp || d.status != jobs.StatusQueued {
		t.Fatalf("after submit and queue: runs %v, record %q %s follow-up %v", d.runs, d.runID, d.status, d.followUp)
	}
	if o, err := reg.Cancel(ctx, "u1", bulkScope); err != nil || o != jobs.CancelCancelled {
		t.Fatalf("cancel: %v, %v", o, err)
	}
	d = read()
	// the dropped follow-up is in the history too: its request, and its end
	if d.runs[run] == nil || d.runs[run].ended != "cancelled" || d.current(run) || d.followUp || len(d.runs) != 2 ||
		d.runs[follow] == nil || d.runs[follow].ended != "cancelled" {
		t.Fatalf("after cancel: runs %v, record %q %s follow-up %v", d.runs, d.runID, d.status, d.followUp)
	}
}
