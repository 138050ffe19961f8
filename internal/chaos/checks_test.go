//go:build linux

package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/jobs"
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

// TestCheckerExactlyOnceSpanEndsAreExact: a coalesced span's first and
// last requests are at known times, so the bucket of each gets one even
// when an earlier bucket holds two occurrences (one never seen finished is
// checked with the next). Here occurrences 1 and 2 share a bucket and got
// one request between them, occurrence 3 got its own: the shared bucket is
// the one short, not occurrence 3's (CI seed 1796228366033615002 blamed
// the later bucket).
func TestCheckerExactlyOnceSpanEndsAreExact(t *testing.T) {
	states := map[int64]occState{
		1: {occ: 1, startedAt: 1000, finishedAt: 1600, done: true}, // finished after 2 was claimed: merged
		2: {occ: 2, startedAt: 1500, finishedAt: 1700, done: true},
		3: {occ: 3, startedAt: 2000, finishedAt: 2500, done: true},
	}
	h := checkerHarness(t, "u1")
	sched := []schedReq{{at: 1600, last: 2100, count: 2, event: "joined"}}
	ep := &epoch{start: 0, end: 3000, fired: []int64{1, 2, 3}, states: states,
		keys: map[string]*keyData{taskkey.MustNew("u1", bulkScope).String(): {sched: sched, events: len(sched), first: 1}}}
	h.checkOnce(0, ep)
	got := h.viol.of(checkOnce)
	if len(got) != 1 || !strings.Contains(got[0], "got 1 schedule request(s), want 2") {
		t.Fatalf("violations %q, want one: the bucket of occurrences 1 and 2 got 1 of 2", got)
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

// TestCheckerExactlyOnceNeverBlamesAValidHistory: whatever the buckets
// (some holding two occurrences) and however a subject's requests, one per
// occurrence, were coalesced into events, check 4 finds no violation; and
// with a lone request (an event of one) taken away, it finds one. Random cases from a
// fixed seed; the fixed spreading rule of earlier versions failed the
// first half.
func TestCheckerExactlyOnceNeverBlamesAValidHistory(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for n := range 300 {
		// Occurrences 1..occs claimed 1,000 ms apart from 1,000; some are
		// merged with the next (finished after it was claimed).
		occs := 3 + rng.IntN(6)
		states := map[int64]occState{}
		var fired []int64
		for o := 1; o <= occs; o++ {
			at := int64(o * 1000)
			fin := at + 100 + int64(rng.IntN(500))
			if o < occs && rng.IntN(4) == 0 {
				fin = at + 1000 + int64(rng.IntN(50))
			}
			states[int64(o)] = occState{occ: int64(o), startedAt: at, finishedAt: fin, done: true}
			fired = append(fired, int64(o))
		}
		// One request per occurrence, between its claim and the next one.
		var times []int64
		early := rng.IntN(2) == 0
		if early { // requests from before the first occurrence
			times = append(times, 200+int64(rng.IntN(300)), 600+int64(rng.IntN(300)))
		}
		for o := 1; o <= occs; o++ {
			times = append(times, int64(o*1000)+int64(rng.IntN(990)))
		}
		// Consecutive requests coalesced into events of random sizes.
		var sched []schedReq
		for i := 0; i < len(times); {
			size := 1 + rng.IntN(4)
			j := min(i+size, len(times))
			sched = append(sched, schedReq{at: times[i], last: times[j-1], count: int64(j - i), event: "joined"})
			i = j
		}
		run := func(sched []schedReq) []string {
			h := checkerHarness(t, "u1")
			ep := &epoch{start: 0, end: int64(occs+1) * 1000, fired: fired, states: states,
				keys: map[string]*keyData{taskkey.MustNew("u1", bulkScope).String(): {sched: sched, events: len(sched), first: 1}}}
			h.checkOnce(0, ep)
			return h.viol.of(checkOnce)
		}
		if got := run(sched); len(got) != 0 {
			t.Fatalf("case %d: a valid history %+v blamed: %v", n, sched, got)
		}
		// Take away a lone request. (Not when requests from before the
		// window exist: those may be counted for the missing one.)
		for i, r := range sched {
			if early {
				break
			}
			if r.count == 1 && r.at >= 1000 {
				broken := slices.Delete(slices.Clone(sched), i, i+1)
				if got := run(broken); len(got) != 1 {
					t.Fatalf("case %d: without the request at %d, %d violations: %v", n, r.at, len(got), got)
				}
				break
			}
		}
	}
}

// Check 1: drain asks a runner's API about every key until each run has
// ended (done, failed, cancelled, or 404: no record). A key whose run is
// still active when the timeout is up (queued with nobody claiming it,
// running under a holder that never ends it, retrying forever), or that
// the API cannot answer for, is stuck.
func TestCheckerNoStuckKey(t *testing.T) {
	type answer struct {
		code    int
		status  jobs.Status
		owner   string
		waiting string
	}
	ended := func(s jobs.Status) answer { return answer{code: http.StatusOK, status: s} }
	noRecord := answer{code: http.StatusNotFound}
	running := answer{code: http.StatusOK, status: jobs.StatusRunning, owner: "chaos-a/1f2e", waiting: ""}
	queued := answer{code: http.StatusOK, status: jobs.StatusQueued, waiting: "waiting for a runner that defines stage push"}
	retrying := answer{code: http.StatusOK, status: jobs.StatusRetrying}
	for _, tc := range []struct {
		name string
		// per subject, the API's successive answers (the last repeats)
		answers   map[string][]answer
		wantStuck []string // subjects
		wantFinal map[string]int
	}{
		{"every run ended", map[string][]answer{"u1": {ended(jobs.StatusDone)}, "u2": {ended(jobs.StatusFailed)},
			"u3": {ended(jobs.StatusCancelled)}, "u4": {noRecord}},
			nil, map[string]int{"done": 1, "failed": 1, "cancelled": 1, "idle": 1}},
		{"runs that end while draining", map[string][]answer{"u1": {running, running, ended(jobs.StatusDone)},
			"u2": {queued, noRecord}, "u3": {retrying, ended(jobs.StatusFailed)}},
			nil, map[string]int{"done": 1, "idle": 1, "failed": 1}},
		{"running under a holder that never ends it", map[string][]answer{"u1": {ended(jobs.StatusDone)}, "u2": {running}},
			[]string{"u2"}, map[string]int{"done": 1}},
		{"queued with nobody claiming it", map[string][]answer{"u1": {queued}, "u2": {noRecord}},
			[]string{"u1"}, map[string]int{"idle": 1}},
		{"retrying forever", map[string][]answer{"u1": {retrying}}, []string{"u1"}, map[string]int{}},
		{"the API cannot answer", map[string][]answer{"u1": {{code: http.StatusInternalServerError}}, "u2": {ended(jobs.StatusDone)}},
			[]string{"u1"}, map[string]int{"done": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // the stuck cases wait out the drain timeout
			var subjects []string
			for s := range tc.answers {
				subjects = append(subjects, s)
			}
			h := checkerHarness(t, subjects...)
			var mu sync.Mutex
			asked := map[string]int{}
			api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				subject, scope, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/v1/tasks/"), "/")
				mu.Lock()
				l := tc.answers[subject]
				n := asked[subject]
				asked[subject]++
				mu.Unlock()
				if len(l) == 0 || scope != bulkScope {
					http.NotFound(w, r)
					return
				}
				a := l[min(n, len(l)-1)]
				if a.code != http.StatusOK {
					http.Error(w, http.StatusText(a.code), a.code)
					return
				}
				_ = json.NewEncoder(w).Encode(jobs.TaskView{Key: subject + "|" + scope, Subject: subject, Scope: scope, RunID: "r1",
					Status: a.status, Stage: "push", Attempt: 1, MaxAttempts: 3, Owner: a.owner, FencingToken: 7, Waiting: a.waiting})
			}))
			t.Cleanup(api.Close)
			h.http = &http.Client{Timeout: time.Second}
			h.ids = []string{"chaos-a"}
			h.runners = map[string]*runnerProc{"chaos-a": {id: "chaos-a", url: api.URL}}

			_, final := h.drain(1500 * time.Millisecond)
			got := h.viol.of(checkStuck)
			if len(got) != len(tc.wantStuck) {
				t.Fatalf("%d violations, want %d (%v): %v", len(got), len(tc.wantStuck), tc.wantStuck, got)
			}
			for i, s := range tc.wantStuck {
				if k := taskkey.MustNew(s, bulkScope).String(); !strings.Contains(got[i], "key "+k+" still") {
					t.Errorf("violation does not name %s: %s", k, got[i])
				}
			}
			if fmt.Sprint(final) != fmt.Sprint(tc.wantFinal) {
				t.Errorf("final statuses %v, want %v", final, tc.wantFinal)
			}
		})
	}
}

// startMarked starts `sleep secs` as a runner's process would be: with
// CHAOS_RUNNER=marker and, unless key is "", TASKLEASE_KEY=key (what an
// exec stage's command and its descendants inherit). It is killed and
// reaped at cleanup; wait reports whether it has exited.
func startMarked(t *testing.T, marker, key, secs string) (wait func(time.Duration) bool) {
	t.Helper()
	bin, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary")
	}
	cmd := exec.Command(bin, secs)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CHAOS_RUNNER=") && !strings.HasPrefix(kv, "TASKLEASE_KEY=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "CHAOS_RUNNER="+marker)
	if key != "" {
		cmd.Env = append(cmd.Env, "TASKLEASE_KEY="+key)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	return func(d time.Duration) bool {
		select {
		case <-done:
			return true
		case <-time.After(d):
			return false
		}
	}
}

// Check 3, once every run has ended (noStageDescendants): a live process
// that carries a marker of this run and a key (started by an exec stage)
// is a violation, and is killed; a runner itself (a marker, no key), a
// helper that exits within the grace, and another run's processes are not.
// Real processes: the check scans /proc (the file builds on Linux only).
func TestCheckerNoSurvivingStageDescendant(t *testing.T) {
	for _, tc := range []struct {
		name   string
		marker string // "<nonce>" is this run's nonce
		key    string
		secs   string
		want   int
	}{
		{"nothing left", "", "", "", 0},
		{"a runner, no stage", "<nonce>/chaos-a/1", "", "30", 0},
		{"a helper that exits in time", "<nonce>/chaos-a/1", "s00|sync", "0.5", 0},
		{"another run's process", "chaosother/chaos-a/1", "s00|sync", "30", 0},
		{"a daemon of an ended stage", "<nonce>/chaos-a/1", "s00|sync", "30", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // a violation waits out the 3 s grace
			h := checkerHarness(t)
			h.nonce = fmt.Sprintf("chaostest%x", rand.Uint64())
			var wait func(time.Duration) bool
			if tc.marker != "" {
				wait = startMarked(t, strings.ReplaceAll(tc.marker, "<nonce>", h.nonce), tc.key, tc.secs)
			}
			h.noStageDescendants()
			got := h.viol.of(checkDescendant)
			if len(got) != tc.want {
				t.Fatalf("%d violations, want %d: %v", len(got), tc.want, got)
			}
			if tc.want > 0 {
				if !strings.Contains(got[0], fmt.Sprintf("key %q", tc.key)) {
					t.Errorf("violation does not name the process's key: %s", got[0])
				}
				if !wait(2 * time.Second) {
					t.Errorf("the surviving process was not killed")
				}
			}
		})
	}
}

// Check 3, when a runner dies (checkGone): a process that carries the
// dead incarnation's marker 5 s later is a violation, and is killed; one
// that exits in time is not, nor is another incarnation's.
func TestCheckerNoDescendantOutlivesItsRunner(t *testing.T) {
	for _, tc := range []struct {
		name     string
		suffix   string // marker: <nonce>/chaos-a/<suffix>
		key      string
		secs     string
		want     int
		wantSeen int64
	}{
		{"nothing left", "", "", "", 0, 0},
		{"a helper that exits in time", "1", "s00|sync", "0.5", 0, 1},
		{"another incarnation's process", "12", "s00|sync", "30", 0, 0},
		{"a daemon outlives its runner", "1", "s00|sync", "30", 1, 1},
		{"a supervisor without a key outlives its runner", "1", "", "30", 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // a violation waits out the 5 s grace
			h := checkerHarness(t)
			h.nonce = fmt.Sprintf("chaostest%x", rand.Uint64())
			p := &runnerProc{id: "chaos-a", inc: 1, marker: h.nonce + "/chaos-a/1"}
			var wait func(time.Duration) bool
			if tc.suffix != "" {
				wait = startMarked(t, h.nonce+"/chaos-a/"+tc.suffix, tc.key, tc.secs)
			}
			h.checkGone(p, "SIGKILL")
			got := h.viol.of(checkDescendant)
			if len(got) != tc.want {
				t.Fatalf("%d violations, want %d: %v", len(got), tc.want, got)
			}
			if seen := h.descSeen.Load(); seen != tc.wantSeen {
				t.Errorf("%d descendants seen, want %d", seen, tc.wantSeen)
			}
			if tc.want > 0 {
				if !strings.Contains(got[0], "chaos-a#1") {
					t.Errorf("violation does not name the runner: %s", got[0])
				}
				if !wait(2 * time.Second) {
					t.Errorf("the surviving process was not killed")
				}
			}
		})
	}
}

// Check 2 across Redis faults (checkTokensAcross): every token granted,
// sent to the recorder or handed to an exec stage after a fault began
// must be above every token seen for the key before it, whatever showed
// it (an epoch's snapshot, the recorder, the exec log); with two faults,
// the second is checked against the tokens seen before the second.
func TestCheckerTokensAcrossRedisFaults(t *testing.T) {
	t0 := time.UnixMilli(1_700_000_000_000)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	u1, s00 := taskkey.MustNew("u1", bulkScope).String(), taskkey.MustNew("s00", syncScope).String()
	g := func(s float64, tok int64) grant {
		return grant{at: at(s).UnixMilli(), token: tok, event: "started", runID: fmt.Sprintf("r%d", tok)}
	}
	req := func(s float64, tok int64, outcome string) recReq {
		return recReq{key: u1, runID: fmt.Sprintf("r%d", tok), token: tok, arrive: at(s), end: at(s + 0.5), outcome: outcome,
			keyHeader: true, headerMatches: true}
	}
	line := func(phase string, s float64, tok int64) execLine {
		return execLine{phase: phase, key: s00, runID: fmt.Sprintf("r%d", tok), marker: "m", token: tok, at: at(s)}
	}
	type keys = map[string][]grant
	// The first fault (a restart without the data) is at 10 s, the second
	// (a failover) at 20 s.
	outages := []outage{{kind: FaultRedisRestartEmpty, down: at(10), up: at(11)}, {kind: FaultFailover, down: at(20), up: at(21)}}
	for _, tc := range []struct {
		name   string
		faults int
		before []keys // each epoch's snapshot before its fault
		final  keys
		reqs   []recReq
		lines  []execLine
		want   int
		kind   string // the fault the violation names
	}{
		// grants
		{"grant above the tokens before", 1, []keys{{u1: {g(1, 10)}}}, keys{u1: {g(12, 11)}}, nil, nil, 0, ""},
		{"grant from before the fault, kept", 1, []keys{{u1: {g(1, 10)}}}, keys{u1: {g(1, 10), g(12, 11)}}, nil, nil, 0, ""},
		{"grant repeating a token from before", 1, []keys{{u1: {g(1, 10)}}}, keys{u1: {g(12, 10)}}, nil, nil, 1, FaultRedisRestartEmpty},
		{"grant below a token from before", 1, []keys{{u1: {g(1, 10)}}}, keys{u1: {g(12, 3)}}, nil, nil, 1, FaultRedisRestartEmpty},
		{"grant below a token only the recorder saw", 1, []keys{{}}, keys{u1: {g(12, 20)}},
			[]recReq{req(2, 30, recAccepted)}, nil, 1, FaultRedisRestartEmpty},
		{"grant below a token only the exec log saw", 1, []keys{{}}, keys{s00: {g(12, 20)}},
			nil, []execLine{line("start", 2, 30), line("end", 3, 30)}, 1, FaultRedisRestartEmpty},
		// recorder requests
		{"request with a token above", 1, []keys{{u1: {g(1, 10)}}}, keys{u1: {g(12, 11)}},
			[]recReq{req(1.5, 10, recAccepted), req(12, 11, recAccepted)}, nil, 0, ""},
		{"late request of the holder from before", 1, []keys{{u1: {g(1, 10)}}}, keys{u1: {g(12, 11)}},
			[]recReq{req(1.5, 10, recAccepted), req(10.5, 10, recAccepted), req(12, 11, recAccepted)}, nil, 0, ""},
		{"refused request with a lower token", 1, []keys{{u1: {g(1, 10)}}}, keys{},
			[]recReq{req(1.5, 10, recAccepted), req(12, 7, recRefusedArrival)}, nil, 0, ""},
		{"request with a lower token never granted", 1, []keys{{u1: {g(1, 10)}}}, keys{},
			[]recReq{req(1.5, 10, recAccepted), req(12, 7, recAccepted)}, nil, 1, FaultRedisRestartEmpty},
		// exec lines
		{"exec stage started with a token above", 1, []keys{{}}, keys{},
			nil, []execLine{line("start", 1, 10), line("end", 3, 10), line("start", 12, 11), line("end", 14, 11)}, 0, ""},
		{"exec stage of before the fault ending after it", 1, []keys{{}}, keys{},
			nil, []execLine{line("start", 9, 10), line("end", 12, 10)}, 0, ""},
		{"exec stage started with a lower token", 1, []keys{{}}, keys{},
			nil, []execLine{line("start", 1, 10), line("end", 3, 10), line("start", 12, 4), line("end", 14, 4)}, 1, FaultRedisRestartEmpty},
		// two faults: tokens seen before the second one count for it
		{"second fault: grant above every token before it", 2, []keys{{u1: {g(1, 10)}}, {u1: {g(12, 20)}}},
			keys{u1: {g(12, 20), g(22, 21)}}, nil, nil, 0, ""},
		{"second fault: grant above the first's tokens only", 2, []keys{{u1: {g(1, 10)}}, {u1: {g(12, 20)}}},
			keys{u1: {g(22, 15)}}, nil, nil, 1, FaultFailover},
		{"second fault: request above the first's tokens only", 2, []keys{{u1: {g(1, 10)}}, {}}, keys{},
			[]recReq{req(1.5, 10, recAccepted), req(12, 20, recAccepted), req(22, 15, recAccepted)}, nil, 1, FaultFailover},
		{"second fault: exec stage above the first's tokens only", 2, []keys{{}, {}}, keys{},
			nil, []execLine{line("start", 1, 10), line("end", 2, 10), line("start", 12, 20), line("end", 13, 20),
				line("start", 22, 15), line("end", 23, 15)}, 1, FaultFailover},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := checkerHarness(t, "u1")
			h.keys = append(h.keys, taskkey.MustNew("s00", syncScope))
			h.outages = outages[:tc.faults]
			for _, ks := range tc.before {
				ep := &epoch{keys: map[string]*keyData{}}
				for k, gs := range ks {
					ep.keys[k] = &keyData{grants: gs}
				}
				h.epochs = append(h.epochs, ep)
			}
			h.epochs = append(h.epochs, &epoch{}) // the last: the final state
			if len(h.epochs) != tc.faults+1 {
				t.Fatalf("%d epochs for %d faults", len(h.epochs), tc.faults)
			}
			final := map[string]*keyData{}
			for k, gs := range tc.final {
				final[k] = &keyData{grants: gs}
			}
			h.checkTokens(final, tc.reqs, tc.lines)
			got := h.viol.of(checkTokens)
			if len(got) != tc.want {
				t.Fatalf("%d violations, want %d: %v", len(got), tc.want, got)
			}
			for _, v := range got {
				if !strings.Contains(v, "Redis fault "+tc.kind+" ") {
					t.Errorf("violation does not name the fault %s: %s", tc.kind, v)
				}
			}
		})
	}
}

// Check 5 in the exec log (checkOverlaps): an exec stage still running
// when a newer token's stage of its key starts is a violation, unless the
// older one's runner was SIGSTOPped, Redis was paused (CLIENT PAUSE), or
// a Redis fault happened across it; the explained ones are counted.
func TestCheckerExecOverlapExplanations(t *testing.T) {
	t0 := time.Unix(2000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	const key = "s00|sync"
	older, newer := "chaosn/chaos-a/1", "chaosn/chaos-b/2"
	line := func(phase string, s float64, tok int64, marker string) execLine {
		return execLine{phase: phase, key: key, runID: fmt.Sprintf("r%d", tok), marker: marker, token: tok, at: at(s)}
	}
	// Token 1 on chaos-a#1 runs 0..3 s; token 2 on chaos-b#2 starts at 1 s.
	overlap := []execLine{line("start", 0, 1, older), line("start", 1, 2, newer), line("end", 3, 1, older), line("end", 4, 2, newer)}
	for _, tc := range []struct {
		name          string
		lines         []execLine
		stops         []stopSpan
		outages       []outage
		want, explain int
	}{
		{"one after the other", []execLine{line("start", 0, 1, older), line("end", 1, 1, older),
			line("start", 2, 2, newer), line("end", 3, 2, newer)}, nil, nil, 0, 0},
		{"unexplained overlap", overlap, nil, nil, 1, 0},
		{"older runner SIGSTOPped", overlap, []stopSpan{{marker: older, from: at(0.5), to: at(2.5)}}, nil, 0, 1},
		{"newer runner SIGSTOPped", overlap, []stopSpan{{marker: newer, from: at(0.5), to: at(2.5)}}, nil, 1, 0},
		{"older runner SIGSTOPped before it started", overlap, []stopSpan{{marker: older, from: at(-3), to: at(-1)}}, nil, 1, 0},
		{"CLIENT PAUSE", overlap, []stopSpan{{marker: "", from: at(0.5), to: at(2.5)}}, nil, 0, 1},
		{"CLIENT PAUSE after the newer one started", overlap, []stopSpan{{marker: "", from: at(1.5), to: at(3)}}, nil, 1, 0},
		{"Redis fault", overlap, nil, []outage{{kind: FaultFailover, down: at(0.5), up: at(0.9)}}, 0, 1},
		{"Redis fault long before", overlap, nil, []outage{{kind: FaultFailover, down: at(-5), up: at(-3)}}, 1, 0},
		{"Redis fault after the newer one started", overlap, nil, []outage{{kind: FaultFailover, down: at(2), up: at(2.5)}}, 1, 0},
		{"a stage started twice", []execLine{line("start", 0, 1, older), line("start", 0.5, 1, older), line("end", 1, 1, older)},
			nil, nil, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := checkerHarness(t)
			h.stopLog, h.outages = tc.stops, tc.outages
			explained := h.checkOverlaps(nil, tc.lines)
			got := h.viol.of(checkOverlap)
			if len(got) != tc.want {
				t.Fatalf("%d violations, want %d: %v", len(got), tc.want, got)
			}
			if explained != tc.explain {
				t.Errorf("%d overlaps explained, want %d", explained, tc.explain)
			}
			for _, v := range got {
				if !strings.Contains(v, key) {
					t.Errorf("violation does not name the key: %s", v)
				}
			}
		})
	}
}

// Check 7: once a run is done its stage never runs again, unless a Redis
// fault may have lost the done event.
func TestCheckerNoStageAfterItsRunIsDone(t *testing.T) {
	base := time.UnixMilli(10_000)
	key := taskkey.MustNew("s1", syncScope).String()
	for _, tc := range []struct {
		name    string
		startAt time.Time // an exec start of run r1
		outages []outage
		want    int
	}{
		{"before the done", base.Add(-time.Second), nil, 0},
		{"after the done", base.Add(time.Second), nil, 1},
		{"after the done, which a failover may have lost", base.Add(3 * time.Second),
			[]outage{{kind: FaultFailover, down: base.Add(time.Second), up: base.Add(2 * time.Second)}}, 0},
		{"after the done, a failover long after it", base.Add(time.Minute),
			[]outage{{kind: FaultFailover, down: base.Add(30 * time.Second), up: base.Add(32 * time.Second)}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := checkerHarness(t, "u1")
			d := &keyData{}
			d.seeRun("r1", 0, "started", base.Add(-2*time.Second).UnixMilli())
			d.seeRun("r1", 1, "done", base.UnixMilli())
			h.epochs = []*epoch{{keys: map[string]*keyData{key: d}}}
			h.outages = tc.outages
			lines := []execLine{{phase: "start", key: key, runID: "r1", token: 7, at: tc.startAt}}
			h.checkRerun(nil, lines)
			if got := h.viol.of(checkRerun); len(got) != tc.want {
				t.Fatalf("%d violations, want %d: %v", len(got), tc.want, got)
			}
		})
	}
}

// unplannedTopo is a topology whose Redis had faults the harness did not
// make (or could not tell).
type unplannedTopo struct {
	topology
	what string
	err  error
}

func (u unplannedTopo) unplanned(context.Context) (string, error) { return u.what, u.err }

func TestCheckerEveryRedisFaultIsTheHarnesss(t *testing.T) {
	for _, tc := range []struct {
		name string
		topo unplannedTopo
		want int
	}{
		{"only planned faults", unplannedTopo{}, 0},
		{"a failover of the Sentinels' own", unplannedTopo{what: "the Sentinels made 3 failovers, the harness 2"}, 1},
		{"cannot count", unplannedTopo{err: errors.New("no sentinel answers")}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := checkerHarness(t)
			h.topo = tc.topo
			h.checkRedisFaults(context.Background())
			if got := len(h.viol.of(checkFaults)); got != tc.want {
				t.Fatalf("violations = %d, want %d: %v", got, tc.want, h.viol.details())
			}
		})
	}
}

func TestCheckerNoGrantWhilePaused(t *testing.T) {
	wall := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	span := pauseSpan{from: 10_000, to: 12_000, fromWall: wall, toWall: wall.Add(2 * time.Second)}
	keys := func(at int64, key string) map[string]*keyData {
		return map[string]*keyData{key: {grants: []grant{{at: at, token: 7, event: "started", runID: "r1"}}}}
	}
	for _, tc := range []struct {
		name    string
		final   map[string]*keyData
		outages []outage
		checked int
		want    int
	}{
		{"granted before the pause", keys(9_999, "s01|sync"), nil, 1, 0},
		{"granted while paused", keys(11_000, "s01|sync"), nil, 1, 1},
		{"granted after the resume", keys(12_001, "s01|sync"), nil, 1, 0},
		{"another scope while paused", keys(11_000, "u001|bulk"), nil, 1, 0},
		{"a pause during a Redis fault is not checked", keys(11_000, "s01|sync"),
			[]outage{{kind: FaultRedisRestartEmpty, down: wall.Add(time.Second), up: wall.Add(1500 * time.Millisecond)}}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := checkerHarness(t)
			h.pauseSpans = []pauseSpan{span}
			h.outages = tc.outages
			if got := h.checkPause(tc.final); got != tc.checked {
				t.Errorf("checked %d pauses, want %d", got, tc.checked)
			}
			if got := len(h.viol.of(checkPause)); got != tc.want {
				t.Fatalf("violations = %d, want %d: %v", got, tc.want, h.viol.details())
			}
		})
	}
}
