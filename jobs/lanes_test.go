package jobs

// People first (DESIGN §3): requests from people (manual, foreground) are
// claimed before bulk work (schedule, retry) of the same partition; a
// person's join on a queued bulk run promotes it; bulk work is never
// starved (one read in bulkFirstEvery takes the bulk lane first).

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/taskkey"
)

const lnScope = "lane_sync"

// lnOrder is a one-stage handler recording the order runs execute in.
type lnOrder struct {
	mu   sync.Mutex
	runs []string // subjects, in execution order
	each func(ctx context.Context, run *Run)
}

func (o *lnOrder) RunStage(ctx context.Context, run *Run) error {
	o.mu.Lock()
	o.runs = append(o.runs, run.Subject())
	o.mu.Unlock()
	if o.each != nil {
		o.each(ctx, run)
	}
	return nil
}

func (o *lnOrder) order() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.runs)
}

// lnEnv is a one-partition registry of lnScope on rdb.
func lnEnv(t *testing.T, rdb redis.UniversalClient, prefix string, h Handler) *testEnv {
	t.Helper()
	return newEnv(t, rdb, Config{Prefix: prefix, Partitions: 1, Jobs: []Job{clJob(lnScope, Stage{Name: "only", Handler: h})}})
}

// lnLens returns the lengths of partition 0's people and bulk lanes.
func lnLens(t testing.TB, e *testEnv) (people, bulk int64) {
	t.Helper()
	ctx := context.Background()
	pipe := e.rdb.Pipeline()
	p := pipe.LLen(ctx, e.reg.ks.Queue(0, keyspace.LanePeople))
	b := pipe.LLen(ctx, e.reg.ks.Queue(0, keyspace.LaneBulk))
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	return p.Val(), b.Val()
}

// lnWaitDrained waits until n runs executed, every listed subject's run is
// done and the queue is empty (every entry taken and acknowledged).
func lnWaitDrained(t *testing.T, e *testEnv, o *lnOrder, n int, subjects []string) {
	t.Helper()
	waitFor(t, 30*time.Second, fmt.Sprintf("%d runs executed", n), func() bool { return len(o.order()) >= n })
	for _, s := range subjects {
		if v := e.waitStatus(s, lnScope, 10*time.Second, StatusDone, StatusFailed, StatusCancelled); v.Status != StatusDone {
			t.Fatalf("%s: status %s, want done", s, v.Status)
		}
	}
	waitFor(t, 10*time.Second, "both lanes and the taken set empty", func() bool {
		_, empty := queueState(context.Background(), e.rdb, e.reg, 0)
		return empty
	})
}

func lnSchedule(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("s%02d", i)
	}
	return out
}

// A manual request submitted after a backlog of 30 schedule runs executes
// first (concurrency 1, one partition), not after the 30.
func TestLanesManualRunsBeforeScheduleBacklog(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			o := &lnOrder{}
			e := lnEnv(t, b.Client, "ln1", o)
			sched := lnSchedule(30)
			for _, s := range sched {
				if r := clSubmit(t, e.reg, s, lnScope, SourceSchedule, ""); r.Outcome != OutcomeStarted {
					t.Fatalf("%s: %s", s, r.Outcome)
				}
			}
			if r := clSubmit(t, e.reg, "person", lnScope, SourceManual, ""); r.Outcome != OutcomeStarted {
				t.Fatalf("manual: %s", r.Outcome)
			}
			if r := clSubmit(t, e.reg, "app", lnScope, SourceForeground, ""); r.Outcome != OutcomeStarted {
				t.Fatalf("foreground: %s", r.Outcome)
			}
			if p, bl := lnLens(t, e); p != 2 || bl != 30 {
				t.Fatalf("lanes: people %d bulk %d, want 2 and 30", p, bl)
			}
			if l := clRaw(t, e.reg, "person", lnScope)["lane"]; l != "p" {
				t.Errorf("manual run's lane %q, want p", l)
			}
			if l := clRaw(t, e.reg, "s00", lnScope)["lane"]; l != "" && l != "b" {
				t.Errorf("schedule run's lane %q, want the bulk lane (b, or absent)", l)
			}

			e.startRunner(RunnerConfig{ID: "ln1", Concurrency: 1})
			lnWaitDrained(t, e, o, 32, append([]string{"person", "app"}, sched...))
			got := o.order()
			if len(got) != 32 {
				t.Fatalf("%d executions, want 32: %v", len(got), got)
			}
			// Both people's runs come within the first three: at most one
			// bulk-first read can come before them.
			for _, who := range []string{"person", "app"} {
				if i := slices.Index(got, who); i < 0 || i > 2 {
					t.Errorf("%s ran as run #%d of %v; people's runs must come before the schedule backlog", who, i+1, got)
				}
			}
			// The bulk lane keeps its order (a stream is FIFO).
			var bulk []string
			for _, s := range got {
				if strings.HasPrefix(s, "s") {
					bulk = append(bulk, s)
				}
			}
			if !slices.Equal(bulk, sched) {
				t.Errorf("schedule runs ran in order %v, want %v", bulk, sched)
			}
		})
	}
}

// A manual join on a queued schedule run moves its entry to the people
// lane (the record's lane becomes p): the run executes early instead of
// after the backlog, the join is in the history, and no entry is left
// behind in either lane.
func TestLanesPersonJoinPromotesQueuedBulkRun(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			o := &lnOrder{}
			e := lnEnv(t, b.Client, "ln2", o)
			sched := lnSchedule(30)
			for _, s := range sched {
				clSubmit(t, e.reg, s, lnScope, SourceSchedule, "")
			}
			ctx := context.Background()
			target := sched[24]
			before := clRaw(t, e.reg, target, lnScope)

			// A schedule join does not promote.
			if r := clSubmit(t, e.reg, target, lnScope, SourceSchedule, ""); r.Outcome != OutcomeJoined {
				t.Fatalf("schedule join: %s", r.Outcome)
			}
			if p, bl := lnLens(t, e); p != 0 || bl != 30 {
				t.Fatalf("after a schedule join: people %d bulk %d, want 0 and 30", p, bl)
			}

			r := clSubmit(t, e.reg, target, lnScope, SourceManual, "")
			if r.Outcome != OutcomeJoined || r.Task.RunID != before["runId"] {
				t.Fatalf("manual join: %s run %s, want joined %s", r.Outcome, r.Task.RunID, before["runId"])
			}
			after := clRaw(t, e.reg, target, lnScope)
			if after["lane"] != "p" || after["entry"] == "" || after["entry"] == before["entry"] {
				t.Fatalf("after the manual join: lane %q entry %q (was %q); want lane p and a new entry",
					after["lane"], after["entry"], before["entry"])
			}
			// The bulk entry stays (the claim that reads it finds the run
			// started or over); the people lane gets one.
			if p, bl := lnLens(t, e); p != 1 || bl != 30 {
				t.Fatalf("after the manual join: people %d bulk %d, want 1 and 30", p, bl)
			}
			es, err := e.rdb.LRange(ctx, e.reg.ks.Queue(0, keyspace.LanePeople), 0, -1).Result()
			if err != nil || len(es) != 1 {
				t.Fatalf("people lane: %v, %v", es, err)
			}
			if en, ok := entryFrom(0, es[0]); !ok || es[0] != after["entry"] || en.runID != before["runId"] ||
				en.key != taskkey.MustNew(target, lnScope) || en.lane != keyspace.LanePeople || en.source != "manual" {
				t.Errorf("people entry %q (%+v), want %q for run %s", es[0], en, after["entry"], before["runId"])
			}

			// A second person's join (another person source) does not add a
			// second entry.
			if r := clSubmit(t, e.reg, target, lnScope, SourceForeground, ""); r.Outcome != OutcomeJoined {
				t.Fatalf("foreground join: %s", r.Outcome)
			}
			if p, bl := lnLens(t, e); p != 1 || bl != 30 {
				t.Fatalf("after a second person's join: people %d bulk %d, want 1 and 30", p, bl)
			}
			if l := clRaw(t, e.reg, target, lnScope)["entry"]; l != after["entry"] {
				t.Errorf("a second join moved the entry again: %s, was %s", l, after["entry"])
			}

			evs := clHistory(t, e.reg, target, lnScope)
			var joins []string
			for _, ev := range evs {
				if ev.Event == "joined" {
					joins = append(joins, string(ev.Source)+"/"+ev.Outcome)
					if ev.RunID != before["runId"] {
						t.Errorf("join event of run %s, want %s", ev.RunID, before["runId"])
					}
				}
			}
			slices.Sort(joins)
			if want := []string{"foreground/joined", "manual/joined", "schedule/joined"}; !slices.Equal(joins, want) {
				t.Errorf("join events %v, want %v (history %q)", joins, want, clEventNames(evs))
			}

			e.startRunner(RunnerConfig{ID: "ln2", Concurrency: 1})
			lnWaitDrained(t, e, o, 30, sched)
			got := o.order()
			if i := slices.Index(got, target); i < 0 || i > 1 {
				t.Errorf("promoted %s ran as run #%d of %v; want within the first two", target, i+1, got)
			}
			if n := len(got); n != 30 {
				t.Errorf("%d executions, want 30 (one per run): %v", n, got)
			}
			v, err := e.reg.Get(ctx, target, lnScope)
			if err != nil {
				t.Fatal(err)
			}
			if !clSameSet(v.Sources, clSources(SourceSchedule, SourceManual, SourceForeground)) {
				t.Errorf("promoted run's sources %v", v.Sources)
			}
		})
	}
}

// Bulk work is never starved: while people's requests keep arriving (at
// least 20 waiting in the people lane whenever a run executes), queued
// schedule runs still execute, one in about every bulkFirstEvery runs.
func TestLanesBulkNotStarvedByPeople(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			const (
				people   = 20 // kept waiting in the people lane
				bulkRuns = 4
				maxRuns  = 400 // runaway bound
			)
			var (
				e         *testEnv
				next      atomic.Int64 // people subjects submitted
				bulkDone  atomic.Int64
				mu        sync.Mutex
				waitingAt = map[string]int64{} // bulk subject → people waiting when it ran
			)
			o := &lnOrder{}
			o.each = func(ctx context.Context, run *Run) {
				if strings.HasPrefix(run.Subject(), "s") {
					p, _ := lnLens(t, e)
					mu.Lock()
					waitingAt[run.Subject()] = p
					mu.Unlock()
					bulkDone.Add(1)
					return
				}
				// A person's run: another person asks, so the lane never
				// drains while bulk work waits.
				if bulkDone.Load() < bulkRuns && next.Load() < maxRuns {
					s := fmt.Sprintf("p%03d", next.Add(1))
					if _, err := e.reg.Submit(ctx, s, lnScope, SubmitOptions{Source: SourceManual}); err != nil {
						t.Errorf("submit %s: %v", s, err)
					}
				}
			}
			e = lnEnv(t, b.Client, "ln3", o)
			sched := lnSchedule(bulkRuns)
			for _, s := range sched {
				clSubmit(t, e.reg, s, lnScope, SourceSchedule, "")
			}
			for range people {
				clSubmit(t, e.reg, fmt.Sprintf("p%03d", next.Add(1)), lnScope, SourceManual, "")
			}
			e.startRunner(RunnerConfig{ID: "ln3", Concurrency: 1})
			waitFor(t, 60*time.Second, "every schedule run executed", func() bool {
				return bulkDone.Load() == bulkRuns || len(o.order()) >= maxRuns
			})
			got := o.order()
			var at []int // positions of the schedule runs
			for i, s := range got {
				if strings.HasPrefix(s, "s") {
					at = append(at, i)
				}
			}
			if len(at) < bulkRuns {
				t.Fatalf("only %d of %d schedule runs in %d executions while people kept asking", len(at), bulkRuns, len(got))
			}
			// Each schedule run comes within a few runs of bulkFirstEvery
			// after the previous one (or the start).
			prev := -1
			for _, i := range at {
				if gap := i - prev; gap > bulkFirstEvery+3 {
					t.Errorf("a schedule run waited %d runs (positions %v); bulk must get one read in %d", gap, at, bulkFirstEvery)
				}
				prev = i
			}
			// And people were waiting each time: bulk ran despite them.
			mu.Lock()
			defer mu.Unlock()
			for s, n := range waitingAt {
				if n < people/2 {
					t.Errorf("when %s ran only %d people's requests were waiting; the test must keep the lane full", s, n)
				}
			}
			t.Logf("schedule runs at positions %v of %d; people waiting %v", at, len(got), waitingAt)
		})
	}
}

// lnSubjectsByPartition returns n subjects with prefix for each partition
// of e's keyspace.
func lnSubjectsByPartition(e *testEnv, prefix string, n int) [][]string {
	out := make([][]string, e.reg.ks.Partitions())
	for i := 0; ; i++ {
		s := fmt.Sprintf("%s%05d", prefix, i)
		p := e.reg.ks.Partition(taskkey.MustNew(s, lnScope))
		if len(out[p]) < n {
			out[p] = append(out[p], s)
		}
		full := true
		for _, ss := range out {
			full = full && len(ss) == n
		}
		if full {
			return out
		}
	}
}

// lnStarve runs a runner of the given concurrency over partitions, each
// with people's requests arriving steadily (people waiting per partition)
// and one schedule run waiting, and checks that every partition's
// schedule run executes within bound runs — not only the partitions that
// happen to get the bulk-first reads.
func lnStarve(t *testing.T, prefix string, partitions, concurrency, maxRuns, bound int) {
	const people = 8 // kept waiting per partition
	m := redistest.StartMini(t)
	var (
		e        *testEnv
		subjects [][]string
		mu       sync.Mutex
		used     []int // people subjects submitted, per partition
		bulkAt   = map[string]int{}
		runs     atomic.Int64
	)
	o := &lnOrder{}
	o.each = func(ctx context.Context, run *Run) {
		n := int(runs.Add(1))
		p := e.reg.ks.Partition(run.Key())
		mu.Lock()
		defer mu.Unlock()
		if strings.HasPrefix(run.Subject(), "s") {
			bulkAt[run.Subject()] = n
			return
		}
		if len(bulkAt) == partitions || n >= maxRuns || used[p] >= len(subjects[p]) {
			return
		}
		s := subjects[p][used[p]]
		used[p]++
		if _, err := e.reg.Submit(ctx, s, lnScope, SubmitOptions{Source: SourceManual}); err != nil {
			t.Errorf("submit %s: %v", s, err)
		}
	}
	e = newEnv(t, m.Client(t), Config{Prefix: prefix, Partitions: partitions,
		Jobs: []Job{clJob(lnScope, Stage{Name: "only", Handler: o})}})
	subjects = lnSubjectsByPartition(e, "p", maxRuns)
	used = make([]int, partitions)
	sched := lnSubjectsByPartition(e, "s", 1)
	for p := range partitions {
		clSubmit(t, e.reg, sched[p][0], lnScope, SourceSchedule, "")
		for range people {
			clSubmit(t, e.reg, subjects[p][used[p]], lnScope, SourceManual, "")
			used[p]++
		}
	}
	e.startRunner(RunnerConfig{ID: prefix, Concurrency: concurrency})
	waitFor(t, 60*time.Second, "every partition's schedule run, or the run bound", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(bulkAt) == partitions || runs.Load() >= int64(maxRuns)
	})
	mu.Lock()
	defer mu.Unlock()
	for p := range partitions {
		s := sched[p][0]
		if n, ok := bulkAt[s]; !ok || n > bound {
			t.Errorf("partition %d: schedule run %s ran as run #%d (0: never, in %d runs); want within %d runs while people keep asking",
				p, s, n, runs.Load(), bound)
		}
	}
	t.Logf("schedule runs at %v after %d runs", bulkAt, runs.Load())
}

// Bulk is not starved in any partition (4 partitions, concurrency 1):
// each partition's schedule run executes within partitions ×
// (bulkFirstEvery + 3) runs. (Before finishes read their own partition,
// the bulk-first reads landed on the same partition every time: with an
// even partition count the other partitions' bulk lanes were never read.)
func TestLanesBulkNotStarvedInAnyPartition(t *testing.T) {
	t.Parallel()
	lnStarve(t, "ln4", 4, 1, 600, 4*(bulkFirstEvery+3))
}

// The same with the default shape, 16 partitions and concurrency 16. (With
// one bulk-first counter per runner instead of per partition, bulk-first
// reads often went to partitions whose bulk lane was empty while another
// partition's bulk run waited behind its people's requests for thousands
// of runs.)
func TestLanesBulkNotStarvedInAnyPartitionDefaults(t *testing.T) {
	t.Parallel()
	lnStarve(t, "ln5", 16, 16, 1500, 2*16*(bulkFirstEvery+3))
}

// A read takes from the preferred lane first and the rest from the other
// lane (on Redis 7 one LMPOP, then an LPOP for the rest; elsewhere two
// LPOPs), claims what it takes, and takes nothing from empty lanes.
func TestLanesReadTakesTheRestFromTheOtherLane(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			e := lnEnv(t, b.Client, "ln6", &lnOrder{})
			clSubmit(t, e.reg, "person", lnScope, SourceManual, "")
			for _, s := range lnSchedule(4) {
				clSubmit(t, e.reg, s, lnScope, SourceSchedule, "")
			}
			rn, err := NewRunner(e.reg, RunnerConfig{ID: "ln6", Concurrency: 8})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			subjects := func(next []nextEntry) []string {
				var out []string
				for _, n := range next {
					if n.claim == nil || n.claim.kind != claimGranted {
						t.Fatalf("entry %s not claimed by the read: %+v", n.e.key, n.claim)
					}
					out = append(out, n.e.key.Subject())
				}
				return out
			}
			for _, step := range []struct {
				n            int
				want         []string
				people, bulk int64
			}{
				{3, []string{"person", "s00", "s01"}, 0, 2}, // people first, the rest from bulk
				{3, []string{"s02", "s03"}, 0, 0},           // people empty: bulk only
				{3, nil, 0, 0},                              // both empty
			} {
				next, err := rn.read(ctx, 0, step.n)
				if err != nil {
					t.Fatal(err)
				}
				if got := subjects(next); !slices.Equal(got, step.want) {
					t.Fatalf("read of %d took %v, want %v", step.n, got, step.want)
				}
				if p, bl := lnLens(t, e); p != step.people || bl != step.bulk {
					t.Fatalf("after taking %v: lanes people %d bulk %d, want %d and %d", step.want, p, bl, step.people, step.bulk)
				}
			}
			if n, _ := e.rdb.ZCard(ctx, e.reg.ks.Taken(0)).Result(); n != 5 {
				t.Fatalf("taken set holds %d entries, want the 5 read", n)
			}
		})
	}
}
