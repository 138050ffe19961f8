package jobs

// The operator console's reads (DESIGN §5): the runner registry, pages of
// the task table, per-scope figures and cancel-all-matching.

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/redistest"
)

func TestRunnerRegistryListsAliveAndGoneRunners(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			g := newGate()
			e := newEnv(t, b.Client, Config{Prefix: "rr", Partitions: 2, Jobs: []Job{
				clJob("held", Stage{Name: "only", Handler: g}), clJob("quick", Stage{Name: "only", Handler: &counter{}})}})
			a, stopA := e.startRunner(RunnerConfig{ID: "pod-a", Concurrency: 3, PresenceInterval: 20 * time.Millisecond, Version: "v9.9.9"})
			bRun, _ := e.startRunner(RunnerConfig{ID: "pod-b", Concurrency: 5, PresenceInterval: 20 * time.Millisecond})
			clSubmit(t, e.reg, "h1", "held", SourceManual, "")
			for i := range 4 {
				clSubmit(t, e.reg, fmt.Sprintf("q%d", i), "quick", SourceManual, "")
			}
			for i := range 4 {
				e.waitStatus(fmt.Sprintf("q%d", i), "quick", 10*time.Second, StatusDone)
			}
			e.waitStatus("h1", "held", 10*time.Second, StatusRunning)
			var infos []RunnerInfo
			waitFor(t, 10*time.Second, "both runners listed with the held run active and 4 finished", func() bool {
				var err error
				if infos, err = e.reg.Runners(ctx); err != nil {
					t.Fatal(err)
				}
				active, done := 0, 0
				for _, in := range infos {
					active += in.Active
					for _, c := range in.Finished {
						if c.Scope == "quick" {
							done += c.Done
						}
					}
				}
				return len(infos) == 2 && active == 1 && done == 4
			})
			byOwner := map[string]RunnerInfo{}
			for _, in := range infos {
				byOwner[in.Owner] = in
			}
			ia, ib := byOwner[a.Owner()], byOwner[bRun.Owner()]
			if ia.ID != "pod-a" || ia.Concurrency != 3 || ia.Version != "v9.9.9" || !ia.Alive || ia.StartedAt.IsZero() {
				t.Errorf("pod-a: %+v", ia)
			}
			if ib.ID != "pod-b" || ib.Concurrency != 5 || ib.Version == "" || !ib.Alive {
				t.Errorf("pod-b: %+v", ib)
			}
			g.open()
			e.waitStatus("h1", "held", 10*time.Second, StatusDone)
			stopA()
			infos, err := e.reg.Runners(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(infos) != 2 || infos[0].Owner != bRun.Owner() || !infos[0].Alive || infos[1].Alive || infos[1].StoppedAt == nil {
				t.Fatalf("after pod-a stopped: %+v, want pod-b alive first, pod-a gone", infos)
			}
		})
	}
}

// A runner that stops refreshing (crashed) is shown gone after three
// missed refreshes, by Redis time.
func TestRunnerRegistryShowsASilentRunnerGone(t *testing.T) {
	t.Parallel()
	mini := redistest.StartMini(t)
	rdb := mini.Client(t)
	ctx := context.Background()
	e := newEnv(t, rdb, Config{Prefix: "rs", Partitions: 1, Jobs: []Job{clJob("quick", Stage{Name: "only", Handler: &counter{}})}})
	rn, err := NewRunner(e.reg, RunnerConfig{ID: "pod-c", PresenceInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := rn.beat(ctx); err != nil {
		t.Fatal(err)
	}
	infos, err := e.reg.Runners(ctx)
	if err != nil || len(infos) != 1 || !infos[0].Alive {
		t.Fatalf("after a beat: %+v %v", infos, err)
	}
	mini.Advance(3*time.Second + 100*time.Millisecond)
	infos, _ = e.reg.Runners(ctx)
	if len(infos) != 1 || infos[0].Alive || infos[0].HeartbeatAgeSeconds < 3 {
		t.Fatalf("3.1 s after the last beat: %+v, want gone", infos)
	}
}

func TestListPageFiltersSortsAndCounts(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			e := newEnv(t, b.Client, Config{Prefix: "lp", Partitions: 4, Jobs: []Job{
				clJob("alpha", Stage{Name: "only", Handler: &counter{}}), clJob("beta", Stage{Name: "only", Handler: &counter{}})}})
			for i := range 25 {
				clSubmit(t, e.reg, fmt.Sprintf("user%02d", i), "alpha", SourceManual, "")
			}
			for i := range 5 {
				clSubmit(t, e.reg, fmt.Sprintf("team%d", i), "beta", SourceSchedule, "")
			}
			page, err := e.reg.ListPage(ctx, ListOptions{Limit: 10})
			if err != nil || page.Total != 30 || len(page.Tasks) != 10 {
				t.Fatalf("first page: total %d, %d tasks, %v", page.Total, len(page.Tasks), err)
			}
			// Pages cover every task once, newest first.
			var seen []string
			var last time.Time
			for off := 0; off < 30; off += 10 {
				p, err := e.reg.ListPage(ctx, ListOptions{Limit: 10, Offset: off})
				if err != nil {
					t.Fatal(err)
				}
				for _, v := range p.Tasks {
					if len(seen) > 0 && v.UpdatedAt.After(last) {
						t.Errorf("%s (updated %s) after a task updated %s: want newest first", v.Key, v.UpdatedAt, last)
					}
					seen, last = append(seen, v.Key), *v.UpdatedAt
				}
			}
			if len(seen) != 30 {
				t.Fatalf("pages: %d keys, want 30", len(seen))
			}
			uniq := slices.Compact(slices.Sorted(slices.Values(seen)))
			if len(uniq) != 30 {
				t.Fatalf("pages repeat tasks: %d distinct of 30", len(uniq))
			}
			p, _ := e.reg.ListPage(ctx, ListOptions{Scope: "alpha", SubjectPrefix: "user1"})
			if p.Total != 10 {
				t.Errorf("alpha with prefix user1: total %d, want 10", p.Total)
			}
			for _, v := range p.Tasks {
				if v.Scope != "alpha" || v.Subject[:5] != "user1" {
					t.Errorf("filtered page holds %s", v.Key)
				}
			}
			p, _ = e.reg.ListPage(ctx, ListOptions{Status: StatusDone})
			if p.Total != 0 {
				t.Errorf("done: total %d before any runner", p.Total)
			}
			e.startRunner(RunnerConfig{ID: "lp", Concurrency: 1})
			e.waitStatus("user00", "alpha", 10*time.Second, StatusDone)
			p, _ = e.reg.ListPage(ctx, ListOptions{Sort: ListSortStarted, Limit: 1})
			if len(p.Tasks) != 1 || p.Tasks[0].StartedAt == nil {
				t.Errorf("sorted by started: %+v, want a started run first", p.Tasks)
			}
			if _, err := e.reg.ListPage(ctx, ListOptions{Sort: "nope"}); err == nil {
				t.Error("sort nope accepted")
			}
			if _, err := e.reg.ListPage(ctx, ListOptions{SubjectPrefix: "bad prefix"}); err == nil {
				t.Error("a prefix with a space accepted")
			}
		})
	}
}

func TestOverviewAndCancelMatching(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			e := newEnv(t, b.Client, Config{Prefix: "ov", Partitions: 2, Jobs: []Job{
				clJob("alpha", Stage{Name: "only", Handler: &counter{}}), clJob("beta", Stage{Name: "only", Handler: &counter{}})}})
			e.startRunner(RunnerConfig{ID: "ov", PresenceInterval: 20 * time.Millisecond})
			for i := range 3 {
				clSubmit(t, e.reg, fmt.Sprintf("d%d", i), "alpha", SourceManual, "")
				e.waitStatus(fmt.Sprintf("d%d", i), "alpha", 10*time.Second, StatusDone)
			}
			if err := e.reg.Pause(ctx, "beta"); err != nil {
				t.Fatal(err)
			}
			for i := range 4 {
				clSubmit(t, e.reg, fmt.Sprintf("w%d", i), "beta", SourceManual, "")
			}
			var ov Overview
			waitFor(t, 10*time.Second, "the overview to count 3 done alpha runs in the last hour", func() bool {
				var err error
				if ov, err = e.reg.Overview(ctx); err != nil {
					t.Fatal(err)
				}
				return len(ov.Scopes) == 2 && ov.Scopes[0].LastHour.Done == 3
			})
			alpha, beta := ov.Scopes[0], ov.Scopes[1]
			if alpha.Scope != "alpha" || alpha.Counts[StatusDone] != 3 || alpha.Paused || len(alpha.Throughput) != ThroughputMinutes {
				t.Errorf("alpha: %+v", alpha)
			}
			if last := alpha.Throughput[ThroughputMinutes-1]; last.Done+alpha.Throughput[ThroughputMinutes-2].Done != 3 {
				t.Errorf("alpha throughput ends %+v, want the 3 runs in the last two minutes", alpha.Throughput[ThroughputMinutes-2:])
			}
			if beta.Scope != "beta" || !beta.Paused || beta.Counts[StatusQueued] != 4 || beta.Policy != PolicyJoin {
				t.Errorf("beta: %+v", beta)
			}

			sum, err := e.reg.CancelMatching(ctx, ListOptions{Scope: "beta", SubjectPrefix: "w"}, true)
			if err != nil || sum.Matched != 4 || sum.Cancelled != 0 {
				t.Fatalf("dry run: %+v %v", sum, err)
			}
			if v, _ := e.reg.Get(ctx, "w0", "beta"); v.Status != StatusQueued {
				t.Fatalf("dry run cancelled w0 (%s)", v.Status)
			}
			sum, err = e.reg.CancelMatching(ctx, ListOptions{Scope: "beta"}, false)
			if err != nil || sum.Matched != 4 || sum.Cancelled != 4 {
				t.Fatalf("cancel all beta: %+v %v", sum, err)
			}
			for i := range 4 {
				e.waitStatus(fmt.Sprintf("w%d", i), "beta", time.Second, StatusCancelled)
			}
			if sum, _ := e.reg.CancelMatching(ctx, ListOptions{Status: StatusDone}, false); sum.Matched != 0 {
				t.Errorf("cancel of done tasks matched %d", sum.Matched)
			}
		})
	}
}
