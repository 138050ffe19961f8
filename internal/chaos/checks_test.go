//go:build linux

package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/taskkey"
)

// Each rule of the chaos checker, fed a history that breaks it, reports a
// violation, and fed the same history without the fault reports none: the
// checks of a chaos run can fail.

// checkerHarness is a harness with just what the checks read.
func checkerHarness(t *testing.T, subjects ...string) *harness {
	t.Helper()
	ks, err := keyspace.New(keyPrefix, partitions)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, logfn: t.Logf, ks: ks, rdb: redistest.StartMini(t).Client(t), bulk: subjects, killed: map[int64]int{}}
	h.rec = newRecorder(t, 1, ks)
	for _, s := range subjects {
		h.keys = append(h.keys, taskkey.MustNew(s, bulkScope))
	}
	return h
}

func TestCheckerTokensGoingBackwards(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tokens []int64
		want   int
	}{
		{"increasing", []int64{10, 11, 20}, 0},
		{"backwards", []int64{10, 20, 15}, 1},
		{"repeated", []int64{10, 10}, 1},
		{"not JSON-safe", []int64{1 << 53}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := checkerHarness(t, "u1")
			d := &keyData{}
			for i, tok := range tc.tokens {
				d.grants = append(d.grants, grant{at: int64(1000 + i), token: tok, event: "started", runID: "r"})
			}
			h.epochs = []*epoch{{start: 0, end: 5000}}
			h.checkTokens(map[string]*keyData{taskkey.MustNew("u1", bulkScope).String(): d}, nil, nil)
			if got := h.viol.of(checkTokens); len(got) != tc.want {
				t.Fatalf("%d violations, want %d: %v", len(got), tc.want, got)
			}
		})
	}
}

func TestCheckerOverlappingAcceptedExecutions(t *testing.T) {
	t0 := time.Unix(1000, 0)
	req := func(token int64, from, to time.Duration, outcome string) recReq {
		return recReq{key: "u1|bulk", runID: "r", token: token, arrive: t0.Add(from), end: t0.Add(to), outcome: outcome,
			keyHeader: true, headerMatches: true}
	}
	for _, tc := range []struct {
		name string
		reqs []recReq
		want int
	}{
		{"one after the other", []recReq{req(1, 0, time.Second, recAccepted), req(2, 2*time.Second, 3*time.Second, recAccepted)}, 0},
		{"older one refused", []recReq{req(1, 0, 2*time.Second, recRefusedCommit), req(2, time.Second, 3*time.Second, recAccepted)}, 0},
		{"older one accepted", []recReq{req(1, 0, 2*time.Second, recAccepted), req(2, time.Second, 3*time.Second, recAccepted)}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := checkerHarness(t, "u1")
			h.checkOverlaps(tc.reqs, nil)
			if got := h.viol.of(checkOverlap); len(got) != tc.want {
				t.Fatalf("%d violations, want %d: %v", len(got), tc.want, got)
			}
		})
	}
}

func TestCheckerExactlyOncePerOccurrence(t *testing.T) {
	// Two occurrences, claimed at 1,000 and 2,000 ms (Redis time) and
	// finished 500 ms later, in a window 0 .. 3,000 ms.
	states := map[int64]occState{
		1: {occ: 1, startedAt: 1000, finishedAt: 1500, done: true},
		2: {occ: 2, startedAt: 2000, finishedAt: 2500, done: true},
	}
	for _, tc := range []struct {
		name  string
		sched []schedReq
		want  int
	}{
		{"one request each", []schedReq{{at: 1100, last: 1100, count: 1, event: "requested"}, {at: 2100, last: 2100, count: 1, event: "joined"}}, 0},
		{"one coalesced event spanning both", []schedReq{{at: 1100, last: 2100, count: 2, event: "joined"}}, 0},
		{"the second missing", []schedReq{{at: 1100, last: 1100, count: 1, event: "requested"}}, 1},
		{"the first twice", []schedReq{{at: 1100, last: 1200, count: 2, event: "joined"}, {at: 2100, last: 2100, count: 1, event: "joined"}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := checkerHarness(t, "u1")
			ep := &epoch{start: 0, end: 3000, fired: []int64{1, 2}, states: states,
				keys: map[string]*keyData{taskkey.MustNew("u1", bulkScope).String(): {sched: tc.sched, events: len(tc.sched), first: 1}}}
			_, checked := h.checkOnce(0, ep)
			if checked != 2 {
				t.Fatalf("%d occurrences checked, want 2", checked)
			}
			got := h.viol.of(checkOnce)
			if len(got) != tc.want {
				t.Fatalf("%d violations, want %d: %v", len(got), tc.want, got)
			}
			for _, v := range got {
				if !strings.Contains(v, "u1") {
					t.Errorf("violation does not name the subject: %s", v)
				}
			}
		})
	}
}

// A run that was active before the window coalesces its older requests
// with the first one inside it. The checker must not count the older ones
// into the window's buckets: that pushed the next occurrence's requests
// into a later bucket, which then looked doubled (seen on Sentinel after a
// failover, when a CLIENT PAUSE bunched occurrences together).
func TestCheckerExactlyOnceWithRequestsFromBeforeTheWindow(t *testing.T) {
	// Occurrences 1 and 2 share a bucket (1 finished after 2 was claimed),
	// occurrence 3 has its own.
	states := map[int64]occState{
		1: {occ: 1, startedAt: 1000, finishedAt: 2100, done: true},
		2: {occ: 2, startedAt: 2000, finishedAt: 2500, done: true},
		3: {occ: 3, startedAt: 3000, finishedAt: 3500, done: true},
	}
	for _, tc := range []struct {
		name  string
		sched []schedReq
		want  int
	}{
		// 500 and 800 are before the window; 1100 is occurrence 1's; 2900
		// and 3100 are occurrence 2's and 3's, coalesced.
		{"older requests coalesced into the first", []schedReq{{at: 500, last: 1100, count: 3, event: "joined"},
			{at: 2900, last: 3100, count: 2, event: "joined"}}, 0},
		{"occurrence 3 twice", []schedReq{{at: 500, last: 1100, count: 3, event: "joined"},
			{at: 2900, last: 3100, count: 3, event: "joined"}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := checkerHarness(t, "u1")
			ep := &epoch{start: 0, end: 5000, fired: []int64{1, 2, 3}, states: states,
				keys: map[string]*keyData{taskkey.MustNew("u1", bulkScope).String(): {sched: tc.sched, events: len(tc.sched), first: 1}}}
			h.checkOnce(0, ep)
			if got := h.viol.of(checkOnce); len(got) != tc.want {
				t.Fatalf("%d violations, want %d: %v", len(got), tc.want, got)
			}
		})
	}
}
