//go:build linux

package jobs

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// execManyEnv, in the helper process of TestExecSupervisedRunnerKilledMany,
// is the number of stages it runs at once.
const execManyEnv = "TASKLEASE_TEST_EXEC_MANY"

// execManySupervisorEnv, when set, is the binary hosting the helper's
// supervisors (TestExecStageCost: the runner's own).
const execManySupervisorEnv = "TASKLEASE_TEST_EXEC_MANY_SUPERVISOR"

// execManyStages is how many supervised stages die with their runner.
const execManyStages = 200

// TestExecSupervisedManyHelperProcess is not a test: it is the runner of
// TestExecSupervisedRunnerKilledMany, which SIGKILLs it while its stages
// run. Without TASKLEASE_TEST_EXEC_MANY it skips.
func TestExecSupervisedManyHelperProcess(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv(execManyEnv))
	if n == 0 {
		t.Skip("helper process for TestExecSupervisedRunnerKilledMany")
	}
	// Each stage: a child and a double-forked setsid daemon, both ignoring
	// SIGTERM, so only the parent-death path stops them.
	script := `trap '' TERM
		( setsid sh -c 'trap "" TERM; exec sleep 300' & )
		sleep 300 &
		wait`
	supervisor := testSupervisor(t)
	if bin := os.Getenv(execManySupervisorEnv); bin != "" {
		supervisor = []string{bin, SuperviseCommand}
	}
	var wg sync.WaitGroup
	for range n {
		run := testStageRun()
		run.stopBy = 0
		e := &ExecStage{Command: []string{"sh", "-c", script},
			Env: []string{execMarkEnv + "=" + os.Getenv(execHelperMarkEnv)}, KillGrace: time.Minute,
			Supervisor: supervisor}
		wg.Go(func() { _ = e.RunStage(context.Background(), run) })
	}
	wg.Wait()
	t.Fatal("every RunStage returned; the helper should have been killed")
}

// A runner SIGKILLed with 200 supervised stages (each a shell, a child and
// a setsid daemon, all ignoring SIGTERM): every process of every stage is
// dead within seconds. The cleanup time and the host CPU it took are
// logged; docs/stages.md quotes them.
func TestExecSupervisedRunnerKilledMany(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 800 processes")
	}
	took, busy := killRunnerWithStages(t, execManyStages, "")
	t.Logf("runner SIGKILL with %d stages to the last of their %d processes dead: %v, host CPU busy %v",
		execManyStages, 4*execManyStages, took.Round(time.Millisecond), busy)
}

// killRunnerWithStages starts a helper runner process with n supervised
// stages (supervisors hosted by supervisorBin, or this test binary), waits
// until all their processes run, SIGKILLs it, and returns how long until
// the last of them was dead and the host CPU spent meanwhile.
func killRunnerWithStages(t *testing.T, n int, supervisorBin string) (took, busy time.Duration) {
	t.Helper()
	mark := newExecMark(t)
	cmd, _, exited := startHelperRunner(t, "TestExecSupervisedManyHelperProcess",
		execManyEnv+"="+strconv.Itoa(n), execHelperMarkEnv+"="+mark, execManySupervisorEnv+"="+supervisorBin)

	// Supervisor, shell, sleep and daemon per stage. Starting them is not
	// what is tested, and under -race on a busy host it took over 90 s
	// (CI): the wait fails only when the starts stop making progress.
	want := 4 * n
	const stalled = 30 * time.Second
	grew, best := time.Now(), 0
	for got := 0; got < want; got = len(markedProcs(mark)) {
		select {
		case <-exited:
			t.Fatalf("helper exited with %d of %d processes started", got, want)
		default:
		}
		if got > best {
			best, grew = got, time.Now()
		}
		if time.Since(grew) > stalled {
			t.Fatalf("%d of %d stage processes started, none more for %v", got, want, stalled)
		}
		time.Sleep(20 * time.Millisecond)
	}

	busy0 := hostBusy(t)
	killed := time.Now()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for {
		left := markedProcs(mark)
		if len(left) == 0 {
			break
		}
		if time.Since(killed) > 10*time.Second {
			t.Fatalf("10s after the runner was SIGKILLed, %d of %d stage processes are alive", len(left), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(killed), hostBusy(t) - busy0
}

// hostBusy is the host's non-idle CPU time since boot (/proc/stat).
func hostBusy(t *testing.T) time.Duration {
	t.Helper()
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	var ticks int64
	for i, v := range strings.Fields(line)[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ = 100
}

// A supervised stage holds its start token (RunnerConfig.ExecStarts) from
// before its supervisor is started until the supervisor reports the
// command started, and no longer; a stage that cannot get one waits, and
// gives up when its context ends.
func TestExecStartsPaced(t *testing.T) {
	dir, mark := t.TempDir(), newExecMark(t)
	gate := dir + "/gate"
	// The supervisor is started through a wrapper that waits for the gate:
	// a supervisor slow to start.
	wrapper := append([]string{"sh", "-c", `while [ ! -e "$0" ]; do sleep 0.01; done; exec "$@"`, gate}, testSupervisor(t)...)
	run := testStageRun()
	run.starts = make(chan struct{}, 1)
	e := &ExecStage{Command: []string{"sleep", "30"}, Env: []string{execMarkEnv + "=" + mark},
		Supervisor: wrapper, KillGrace: time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	t.Setenv(execMarkEnv, mark) // the wrapper carries the mark too
	errc := runStageAsync(ctx, e, run)
	deadline := time.Now().Add(10 * time.Second)
	for len(markedProcs(mark)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the wrapper did not start")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if len(run.starts) != 1 {
		t.Fatalf("start tokens held while the supervisor starts: %d, want 1", len(run.starts))
	}
	// Another stage waits for the token, and gives up with its context.
	other := testStageRun()
	other.starts = run.starts
	octx, ocancel := context.WithCancel(context.Background())
	oerr := runStageAsync(octx, &ExecStage{Command: []string{"true"}, Supervisor: testSupervisor(t)}, other)
	ocancel()
	if err := recvStage(t, oerr, 10*time.Second); err == nil || !strings.Contains(err.Error(), "not started") {
		t.Fatalf("a stage without a start token: %v, want not started", err)
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for len(run.starts) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the start token was not released once the supervisor reported the start")
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-errc:
		t.Fatalf("the stage ended early: %v", err)
	default:
	}
	cancel()
	_ = recvStage(t, errc, 20*time.Second)
}
