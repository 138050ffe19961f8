//go:build linux

package jobs

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/redistest"
)

// Reclaim starvation (issue 4/8, defect 1): XAUTOCLAIM from 0-0 with a
// COUNT of a few free slots examines at most ten times that many pending
// entries, so a dead runner's entries behind hundreds of live, heartbeating
// ones were never reached. Here 300 live runs (more than the 160 entries
// the old scan could reach) share the only partition with 100 runs of a
// child runner that is SIGKILLed; a fresh runner must take all 100 over
// while the 300 stay with their live holder.

const (
	rcEnvChild = "TASKLEASE_RECLAIM_CHILD" // "1" in the child
	rcEnvAddr  = "TASKLEASE_RECLAIM_ADDR"
	rcPrefix   = "reclaim"
	rcScope    = "course_sync"
	rcLive     = 300
	rcDead     = 100
	rcLeaseTTL = 2 * time.Second // heartbeats of 300 runs must keep up under -race on 2 cores
)

// rcJobs: subjects "live…" block until their context ends; the others
// (the dead runner's, once taken over) finish at once. The child blocks in
// every run.
func rcJobs(blockAll bool) []Job {
	h := HandlerFunc(func(ctx context.Context, run *Run) error {
		if blockAll || strings.HasPrefix(run.Subject(), "live") {
			<-ctx.Done()
			return context.Cause(ctx)
		}
		return nil
	})
	return []Job{{Scope: rcScope, Stages: []Stage{{Name: "work", Handler: h}},
		Retry: RetryPolicy{MaxAttempts: 5, Backoff: 10 * time.Millisecond}}}
}

// TestHelperReclaimChild is not a test: it is the child runner of
// TestReclaimReachesDeadRunnerBehindLiveRuns.
func TestHelperReclaimChild(t *testing.T) {
	if os.Getenv(rcEnvChild) != "1" {
		t.Skip("helper process for TestReclaimReachesDeadRunnerBehindLiveRuns")
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(rcEnvAddr), PoolSize: 64})
	defer rdb.Close()
	reg, err := NewRegistry(rdb, Config{Prefix: rcPrefix, Partitions: 1, Jobs: rcJobs(true), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	runChildRunner(t, reg, RunnerConfig{ID: "rc-child", Concurrency: rcDead, LeaseTTL: rcLeaseTTL}, 3*time.Minute)
}

func TestReclaimReachesDeadRunnerBehindLiveRuns(t *testing.T) {
	s := redistest.StartServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), PoolSize: 256})
	t.Cleanup(func() { _ = rdb.Close() })
	e := newEnv(t, rdb, Config{Prefix: rcPrefix, Partitions: 1, Jobs: rcJobs(false)})
	ctx := context.Background()

	countRunning := func(prefix, owner string) int {
		vs, err := e.reg.List(ctx, ListOptions{Status: StatusRunning, Limit: ListLimitMax})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, v := range vs {
			if strings.HasPrefix(v.Subject, prefix) && strings.HasPrefix(v.Owner, owner) {
				n++
			}
		}
		return n
	}

	// The live runs first: their entries come first in the pending list.
	live, _ := e.startRunner(RunnerConfig{ID: "rc-live", Concurrency: rcLive, LeaseTTL: rcLeaseTTL})
	for i := range rcLive {
		recSubmit(t, e, fmt.Sprintf("live%03d", i), rcScope, OutcomeStarted)
	}
	waitFor(t, 90*time.Second, "the live runs", func() bool { return countRunning("live", live.Owner()) == rcLive })

	// Then the child takes its runs and is killed while holding them.
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperReclaimChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), rcEnvChild+"=1", rcEnvAddr+"="+s.Addr())
	out := &redistest.LogBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	kill := func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); <-exited }
	t.Cleanup(func() {
		kill()
		if t.Failed() {
			t.Logf("child output:\n%s", out.String())
		}
	})
	for i := range rcDead {
		recSubmit(t, e, fmt.Sprintf("dead%03d", i), rcScope, OutcomeStarted)
	}
	waitFor(t, 90*time.Second, "the child to hold its runs", func() bool {
		select {
		case <-exited:
			t.Fatalf("child exited early:\n%s", out.String())
		default:
		}
		return countRunning("dead", "rc-child/") == rcDead
	})
	kill()
	killedAt := time.Now()

	// A fresh runner with free slots must reach the dead runner's entries
	// behind the live ones.
	e.startRunner(RunnerConfig{ID: "rc-rescuer", Concurrency: 32, LeaseTTL: rcLeaseTTL, ReclaimInterval: 100 * time.Millisecond})
	waitFor(t, rcLeaseTTL+30*time.Second, "every run of the killed child to be taken over and done", func() bool {
		vs, err := e.reg.List(ctx, ListOptions{Status: StatusDone, Limit: ListLimitMax})
		if err != nil {
			t.Fatal(err)
		}
		return len(vs) == rcDead
	})
	t.Logf("%d runs of a SIGKILLed runner behind %d live ones taken over and done %s after the kill (lease TTL %s)",
		rcDead, rcLive, time.Since(killedAt).Round(time.Millisecond), rcLeaseTTL)
	if n := countRunning("live", live.Owner()); n != rcLive {
		t.Errorf("%d live runs still with their holder, want %d (a live lease was taken over)", n, rcLive)
	}
}

// TestReclaimNotStalledByForeignEntries: entries this runner cannot
// execute (a job it does not define) are left to other runners with a
// visible reason, and never hold the reclaim scan at the same place: the
// runnable entries behind them are reached.
func TestReclaimNotStalledByForeignEntries(t *testing.T) {
	mini := redistest.StartMini(t)
	rdb := mini.Client(t)
	ctx := context.Background()
	c := &counter{}
	both := newEnv(t, rdb, Config{Prefix: "rf", Partitions: 1, Jobs: []Job{
		{Scope: "alien", Stages: []Stage{{Name: "probe", Handler: c}}},
		{Scope: rcScope, Stages: []Stage{{Name: "work", Handler: c}}},
	}})
	for i := range 40 {
		recSubmit(t, both, fmt.Sprintf("a%02d", i), "alien", OutcomeStarted)
	}
	for i := range 5 {
		recSubmit(t, both, fmt.Sprintf("c%d", i), rcScope, OutcomeStarted)
	}
	// A runner that read every entry and died before claiming any.
	if es := takeEntries(t, both.reg, 0, 100); len(es) != 45 {
		t.Fatalf("took %d entries, want 45", len(es))
	}
	mini.Advance(2 * time.Minute) // the ghost's entries are due: idle past any lease TTL

	only := newEnv(t, rdb, Config{Prefix: "rf", Partitions: 1, Jobs: []Job{
		{Scope: rcScope, Stages: []Stage{{Name: "work", Handler: c}}},
	}})
	rn, _ := only.startRunner(RunnerConfig{ID: "rf-runner", Concurrency: 4, FetchBatch: 4, ReclaimInterval: 10 * time.Millisecond})
	for i := range 5 {
		only.waitStatus(fmt.Sprintf("c%d", i), rcScope, 20*time.Second, StatusDone)
	}
	// Entries due at the same time come in no particular order: some of
	// the aliens were examined on the way, and say why they wait.
	examined := 0
	for i := range 40 {
		v, err := both.reg.Get(ctx, fmt.Sprintf("a%02d", i), "alien")
		if err != nil {
			t.Fatal(err)
		}
		if v.Status != StatusQueued || c.get(v.Subject+"/probe") != 0 {
			t.Errorf("%s: status %s, probe ran %d times; want queued, never run", v.Key, v.Status, c.get(v.Subject+"/probe"))
		}
		if v.Waiting == "" {
			continue
		}
		examined++
		if want := "waiting for a runner that defines this job (" + rn.Owner() + " does not)"; v.Waiting != want {
			t.Errorf("%s: waiting %q, want %q", v.Key, v.Waiting, want)
		}
	}
	if examined < 4 {
		t.Errorf("%d alien runs say why they wait, want at least the first reclaim batch's 4", examined)
	}
}
