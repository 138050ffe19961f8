//go:build linux

package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/taskkey"
)

// limitedReq is a write of the limited job at the recorder: key lN, its
// fencing token, slot slot of the limiter with token slotTok, from..to
// (seconds after t0).
func limitedReq(t0 time.Time, n int, slot int, slotTok int64, from, to float64, outcome string) recReq {
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	text := fmt.Sprintf("%s:%d:%d", limiterName, slot, slotTok)
	slots, _ := parseSlots(text)
	return recReq{key: fmt.Sprintf("l%02d|%s", n, limitedScope), runID: fmt.Sprintf("r%d", n), token: int64(100 + n),
		arrive: at(from), end: at(to), outcome: outcome, keyHeader: true, headerMatches: true,
		limited: true, stage: "pull", slotsText: text, slots: slots, runner: "chaosn/chaos-a/1"}
}

// Check 9 counts the executions of the limited job whose accepted writes
// overlap: N at once is the limit reached, N+1 a violation.
func TestCheckerNeverMoreThanNAcceptedWriters(t *testing.T) {
	t0 := time.Unix(3000, 0)
	const n = 3
	// each execution i of count writes over 0..2 s, on its own slot
	overlapping := func(count int) []recReq {
		var out []recReq
		for i := range count {
			out = append(out, limitedReq(t0, i, i%n, int64(10+i), 0.1*float64(i), 2, recAccepted))
		}
		return out
	}
	refused := func(r recReq, bySlot bool) recReq { r.outcome, r.bySlot = recRefusedCommit, bySlot; return r }
	noSlot := limitedReq(t0, 9, 0, 1, 0, 1, recAccepted)
	noSlot.slotsText, noSlot.slots = "", nil
	for _, tc := range []struct {
		name      string
		reqs      []recReq
		want      int // violations
		peak      int
		refusedBy int // refused by the slot fence
	}{
		{"N overlapping", overlapping(n), 0, n, 0},
		{"N+1 overlapping", overlapping(n + 1), 1, n + 1, 0},
		{"N+1, the extra one's write refused", append(overlapping(n), refused(limitedReq(t0, n, 0, 9, 0.5, 1.5, ""), true)), 0, n, 1},
		{"N+1, the extra one's write aborted", append(overlapping(n), func() recReq {
			r := limitedReq(t0, n, 0, 20, 0.5, 1.5, recAborted)
			return r
		}()), 0, n, 0},
		{"N+1 back to back: an end at a start does not overlap", append(overlapping(n),
			limitedReq(t0, n, 0, 20, 2, 3, recAccepted)), 0, n, 0},
		{"twice above the limit: two violations", append(overlapping(n+1),
			limitedReq(t0, 5, 1, 30, 3, 4, recAccepted), limitedReq(t0, 6, 1, 31, 3, 4, recAccepted),
			limitedReq(t0, 7, 2, 32, 3, 4, recAccepted), limitedReq(t0, 8, 0, 33, 3, 4, recAccepted)), 2, n + 1, 0},
		// An execution is a writer from its first accepted write to its
		// last, the gap between its stages included: l00 writes at 0..1
		// and 3..4, so at 2.5 s it is one of 4 writers with l01, l02 and
		// l03 (counted by its writes alone, 3).
		{"the gap between two writes counts", []recReq{
			limitedReq(t0, 0, 0, 10, 0, 1, recAccepted), limitedReq(t0, 0, 0, 10, 3, 4, recAccepted),
			limitedReq(t0, 1, 1, 11, 1.5, 3.5, recAccepted), limitedReq(t0, 2, 2, 12, 2, 3.2, recAccepted),
			limitedReq(t0, 3, 1, 13, 2.5, 2.8, recAccepted),
		}, 1, n + 1, 0},
		{"a write without slots accepted", []recReq{noSlot}, 1, 1, 0},
		{"a slot out of range", []recReq{limitedReq(t0, 0, n, 10, 0, 1, recAccepted)}, 1, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := checkerHarness(t)
			h.limit = n
			st := h.checkLimit(tc.reqs)
			got := h.viol.of(checkLimit)
			if len(got) != tc.want {
				t.Fatalf("%d violations, want %d: %v", len(got), tc.want, got)
			}
			if st.maxConcurrent != tc.peak {
				t.Errorf("max accepted concurrency %d, want %d", st.maxConcurrent, tc.peak)
			}
			if st.refusedLate != tc.refusedBy {
				t.Errorf("refused by the slot fence %d, want %d", st.refusedLate, tc.refusedBy)
			}
			for _, v := range got {
				if !strings.Contains(v, limitedScope) {
					t.Errorf("violation does not name the executions: %s", v)
				}
			}
		})
	}
}

// The time at the limit, and refused late writes of a SIGSTOPped runner.
func TestCheckerLimitFigures(t *testing.T) {
	t0 := time.Unix(3000, 0)
	h := checkerHarness(t)
	h.limit = 2
	late := limitedReq(t0, 2, 0, 5, 3, 3.5, recRefusedArrival)
	late.bySlot = true
	h.stopLog = []stopSpan{{marker: late.runner, from: t0.Add(time.Second), to: t0.Add(2500 * time.Millisecond)}}
	st := h.checkLimit([]recReq{
		limitedReq(t0, 0, 0, 10, 0, 2, recAccepted),
		limitedReq(t0, 1, 1, 11, 1, 3, recAccepted), // two at once over 1..2 s
		late,
	})
	if st.atLimit != 1 || st.maxConcurrent != 2 || st.executions != 2 {
		t.Errorf("at the limit %.3fs, peak %d, executions %d; want 1s, 2, 2", st.atLimit, st.maxConcurrent, st.executions)
	}
	if st.refusedLate != 1 || st.refusedAfterStop != 1 || st.writes != 3 || st.accepted != 2 {
		t.Errorf("%+v: want 3 writes, 2 accepted, 1 refused late after a SIGSTOP", st)
	}
	h.outages = []outage{{kind: FaultRedisRestartEmpty, down: t0.Add(4 * time.Second), up: t0.Add(5 * time.Second)}}
	behind := limitedReq(t0, 1, 0, 3, 6, 7, recRefusedArrival)
	behind.bySlot = true
	st = h.checkLimit([]recReq{limitedReq(t0, 0, 0, 10, 0, 2, recAccepted), behind, limitedReq(t0, 2, 1, 11, 6, 7, recAccepted)})
	if st.behindFaults != 1 || st.refusedBehind != 1 || st.refusedLate != 0 || !strings.Contains(st.behindExample, "l01|limited") {
		t.Errorf("%+v: want l01's execution behind the Redis fault, its write refused as behind, not late", st)
	}
	// the same slot token held twice (a counter that went back, then
	// caught up): counted, with the two executions
	st = h.checkLimit([]recReq{limitedReq(t0, 0, 0, 10, 0, 2, recAccepted), limitedReq(t0, 1, 0, 10, 6, 7, recAccepted)})
	if st.tokensTwice != 1 || !strings.Contains(st.tokensTwiceExample, "l00|limited") || !strings.Contains(st.tokensTwiceExample, "l01|limited") {
		t.Errorf("%+v: want remote#0 token 10 held twice, by l00 and l01", st)
	}
}

// The recorder fences the limited job's writes by slot: a holder whose
// slot has a newer holder that wrote is refused, whether its write was
// held when the newer one arrived (at commit) or came after (on arrival),
// and a write with a token of its slot at least the highest is accepted.
func TestRecorderFencesLimiterSlots(t *testing.T) {
	h := checkerHarness(t)
	post := func(key string, token int64, slots string) int {
		body, _ := json.Marshal(map[string]any{"key": key, "runId": "r", "stage": "pull", "attempt": 1, "fencingToken": token})
		req, _ := http.NewRequest(http.MethodPost, h.rec.url+limitedPath, bytes.NewReader(body))
		req.Header.Set("Tasklease-Key", key)
		req.Header.Set("Tasklease-Fencing-Token", fmt.Sprint(token))
		req.Header.Set(jobs.HTTPLimiterSlotsHeader, slots)
		req.Header.Set(limitedRunnerHeader, "m")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// The old holder of remote#0 (token 7) is being held when the new one
	// (token 8) arrives: refused at commit. Then it writes again: refused
	// on arrival. A holder of another slot with a lower token is not
	// concerned; nor is the new holder's second write.
	var wg sync.WaitGroup
	codes := make([]int, 2)
	wg.Go(func() { codes[0] = post("l01|limited", 50, "remote:0:7") })
	time.Sleep(50 * time.Millisecond)
	wg.Go(func() { codes[1] = post("l02|limited", 60, "remote:0:8") })
	wg.Wait()
	if codes[0] != http.StatusConflict || codes[1] != http.StatusOK {
		t.Fatalf("old holder %d, new holder %d: want 409, 200", codes[0], codes[1])
	}
	if c := post("l01|limited", 50, "remote:0:7"); c != http.StatusConflict {
		t.Errorf("old holder's late write: %d, want 409", c)
	}
	if c := post("l03|limited", 70, "remote:1:3"); c != http.StatusOK {
		t.Errorf("another slot's holder: %d, want 200", c)
	}
	if c := post("l02|limited", 60, "remote:0:8"); c != http.StatusOK {
		t.Errorf("new holder's second write: %d, want 200", c)
	}
	var outcomes []string
	for _, r := range h.rec.snapshot() {
		outcomes = append(outcomes, fmt.Sprintf("%s %s %v", r.key, r.outcome, r.bySlot))
	}
	want := []string{"l01|limited refused-commit true", "l02|limited accepted false", "l01|limited refused-arrival true",
		"l03|limited accepted false", "l02|limited accepted false"}
	if strings.Join(outcomes, "; ") != strings.Join(want, "; ") {
		t.Errorf("recorder outcomes:\n  %s\nwant\n  %s", strings.Join(outcomes, "\n  "), strings.Join(want, "\n  "))
	}
}

func TestParseSlots(t *testing.T) {
	got, err := parseSlots("remote:3:17,job.x:-1:4")
	if err != nil || len(got) != 2 || got[0] != (slotHeld{"remote", 3, 17}) || got[1] != (slotHeld{"job.x", -1, 4}) {
		t.Errorf("parseSlots = %v, %v", got, err)
	}
	for _, bad := range []string{"", "remote", "remote:1", "remote:x:1", ":1:2", "remote:1:2,"} {
		if _, err := parseSlots(bad); err == nil {
			t.Errorf("parseSlots(%q) accepted", bad)
		}
	}
}

// A stuck limited key's report shows its record, its entries and the
// limiter's state.
func TestLimitedStateDescribesRecordEntriesAndLimiter(t *testing.T) {
	h := checkerHarness(t)
	ctx := context.Background()
	k := taskkey.MustNew("l01", limitedScope)
	p := h.ks.Partition(k)
	entry := "bR1\x1fl01|limited\x1fmanual"
	base := "{" + keyPrefix + ":limiter:" + limiterName + "}"
	for _, err := range []error{
		h.rdb.HSet(ctx, h.ks.Task(k), "runId", "R1", "status", "running").Err(),
		h.rdb.ZAdd(ctx, h.ks.Taken(p), redis.Z{Score: 1, Member: entry}).Err(),
		h.rdb.ZAdd(ctx, base+":slots", redis.Z{Score: 0, Member: "0"}).Err(),
		h.rdb.HSet(ctx, base+":holders", "0", "o\x1f7\x1fh\x1fb\x1f\x1f"+entry).Err(),
		h.rdb.HSet(ctx, base, "token", "7", "n", "1").Err(),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	got := h.limitedState(ctx, k)
	for _, want := range []string{"status:running", "taken " + h.ks.Taken(p) + " holds", "slot 0 expires in", "o|7|h|b||bR1|l01|limited|manual", "token:7"} {
		if !strings.Contains(got, want) {
			t.Errorf("limitedState lacks %q:\n%s", want, got)
		}
	}
}
