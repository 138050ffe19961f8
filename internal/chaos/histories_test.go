//go:build linux

package chaos

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/tasklease/tasklease/internal/histories"
)

// Check 10: the runners' history logs are checked per run; a double
// grant is Illegal (with porcupine's view written), a run near a Redis
// fault is left out, a clean takeover is fine.
func TestCheckerHistories(t *testing.T) {
	t0 := time.UnixMilli(1_000_000)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	g := func(runner, run string, tok int64, done int) histories.Op {
		return histories.Op{Key: "u1|bulk", Kind: histories.Grant, Runner: runner, RunID: run, Token: tok, Done: done}
	}
	adv := func(runner, run string, tok int64, done int) histories.Op {
		return histories.Op{Key: "u1|bulk", Kind: histories.Advance, Runner: runner, RunID: run, Token: tok, Done: done}
	}
	type line struct {
		runner    int // 0: chaos-a#1, 1: chaos-b#2
		op        histories.Op
		call, ret int // ms; ret < 0: sent, never answered
	}
	for _, tc := range []struct {
		name     string
		lines    []line
		outages  []outage
		verdict  porcupine.CheckResult
		runs     int
		excluded int
	}{
		{"takeover after a crash mid-advance", []line{
			{0, g("a", "r1", 10, 0), 0, 1}, {0, adv("a", "r1", 10, 1), 2, -1},
			{1, g("b", "r1", 11, 1), 50, 51}, {1, adv("b", "r1", 11, 2), 52, 53},
		}, nil, porcupine.Ok, 1, 0},
		{"one token granted twice", []line{
			{0, g("a", "r1", 10, 0), 0, 1}, {1, g("b", "r1", 10, 0), 5, 6},
		}, nil, porcupine.Illegal, 1, 0},
		{"a done stage granted as not done", []line{
			{0, g("a", "r1", 10, 0), 0, 1}, {0, adv("a", "r1", 10, 1), 2, 3}, {1, g("b", "r1", 11, 0), 50, 51},
		}, nil, porcupine.Illegal, 1, 0},
		{"the same, across a Redis fault", []line{
			{0, g("a", "r1", 10, 0), 0, 1}, {0, adv("a", "r1", 10, 1), 2, 3}, {1, g("b", "r1", 11, 0), 5000, 5001},
		}, []outage{{kind: FaultRedisRestartEmpty, down: at(2500), up: at(2600)}}, porcupine.Ok, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := checkerHarness(t)
			h.dir = t.TempDir()
			h.outages = tc.outages
			procs := []*runnerProc{{id: "chaos-a", inc: 1}, {id: "chaos-b", inc: 2}}
			h.all = procs
			logs := make([]*histories.Log, len(procs))
			for i, p := range procs {
				f, err := os.Create(h.historyPath(p.id, p.inc))
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				logs[i] = histories.NewLog(f)
			}
			for _, l := range tc.lines {
				if l.ret < 0 {
					logs[l.runner].Sent(l.op, at(l.call))
				} else {
					logs[l.runner].Returned(l.op, histories.OK, at(l.call), at(l.ret))
				}
			}
			st := h.checkHistories()
			if st.verdict != tc.verdict || st.runs != tc.runs || st.excludedRuns != tc.excluded {
				t.Fatalf("verdict %s, %d runs checked, %d left out; want %s, %d, %d (%v)",
					st.verdict, st.runs, st.excludedRuns, tc.verdict, tc.runs, tc.excluded, h.viol.of(checkHistories))
			}
			got := h.viol.of(checkHistories)
			if tc.verdict == porcupine.Illegal {
				if len(got) != 1 || !strings.Contains(got[0], "not linearizable") {
					t.Fatalf("violations %v, want one naming the history", got)
				}
				if _, err := os.Stat(st.html); err != nil {
					t.Errorf("porcupine's view: %v", err)
				}
			} else if len(got) != 0 {
				t.Fatalf("violations %v, want none", got)
			}
		})
	}
}
