//go:build linux

package jobs

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestExecStageCost measures what an exec stage costs the host, with the
// runner binary itself hosting the supervisors as `runner serve` does: the
// processes, memory and CPU per stage at start, while it runs and at
// cleanup, and the cleanup after a runner that dies with them. It is a
// measurement, not a check: it runs only with TASKLEASE_EXEC_COST=<stages>,
// and docs/stages.md quotes its output:
//
//	TASKLEASE_EXEC_COST=150 go test ./jobs -run TestExecStageCost -v -count=1
func TestExecStageCost(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("TASKLEASE_EXEC_COST"))
	if n <= 0 {
		t.Skip("a measurement: set TASKLEASE_EXEC_COST=<stages>")
	}
	bin := filepath.Join(t.TempDir(), "runner")
	build := exec.Command("go", "build", "-o", bin, "../cmd/runner")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	mark := newExecMark(t)

	// Start: n stages through the runner's pacing.
	starts := make(chan struct{}, ExecStartsPerCPU*runtime.GOMAXPROCS(0))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errcs := make([]<-chan error, n)
	busy0, began := hostBusy(t), time.Now()
	for i := range errcs {
		run := testStageRun()
		run.starts = starts
		e := &ExecStage{Command: []string{"sleep", "300"}, Env: []string{execMarkEnv + "=" + mark},
			Supervisor: []string{bin, SuperviseCommand}, KillGrace: 2 * time.Second}
		errcs[i] = runStageAsync(ctx, e, run)
	}
	deadline := time.Now().Add(60 * time.Second)
	var procs []int
	for procs = markedProcs(mark); len(procs) < 2*n; procs = markedProcs(mark) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d processes started", len(procs), 2*n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	startWall, startHost := time.Since(began), hostBusy(t)-busy0
	startCPU := procCPU(procs)

	// Running: memory, and CPU over a fixed window.
	var rss, pss int64
	for _, pid := range procs {
		rss += statusKB(pid, "VmRSS:")
		pss += rollupKB(pid, "Pss:")
	}
	const window = 5 * time.Second
	cpu0 := procCPU(procs)
	time.Sleep(window) // a measurement window, not a wait for state
	runCPU := procCPU(procs) - cpu0

	// Cleanup: every stage cancelled at once (SIGTERM, then the runner's
	// wait for the supervisors' reports).
	busy0, began = hostBusy(t), time.Now()
	cancel()
	for _, errc := range errcs {
		_ = recvStage(t, errc, 30*time.Second)
	}
	cancelWall, cancelHost := time.Since(began), hostBusy(t)-busy0
	requireNoneAlive(t, mark, "after every stage was cancelled")

	// A runner that dies with them: each stage a shell, a child and a
	// setsid daemon, as in TestExecSupervisedRunnerKilledMany.
	deathWall, deathHost := killRunnerWithStages(t, n, bin)

	per := func(d time.Duration) string {
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)/float64(n))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d exec stages (`sleep 300`), supervisors hosted by the runner binary, %d CPUs:\n", n, runtime.NumCPU())
	fmt.Fprintf(&b, "  processes per stage:        %.1f (supervisor + command)\n", float64(len(procs))/float64(n))
	fmt.Fprintf(&b, "  start, all of them:         %v wall; CPU per stage %s in its processes, %s host-wide\n",
		startWall.Round(time.Millisecond), per(startCPU), per(startHost))
	fmt.Fprintf(&b, "  running, memory per stage:  RSS %d KiB, PSS %d KiB\n", rss/int64(n), pss/int64(n))
	fmt.Fprintf(&b, "  running, CPU per stage:     %s over %v\n", per(runCPU), window)
	fmt.Fprintf(&b, "  cancel, all at once:        %v wall; host CPU per stage %s\n", cancelWall.Round(time.Millisecond), per(cancelHost))
	fmt.Fprintf(&b, "  runner SIGKILLed with them: %v to the last of %d processes dead; host CPU per stage %s\n",
		deathWall.Round(time.Millisecond), 4*n, per(deathHost))
	t.Log("\n" + b.String())
}

// procCPU sums the time on CPU of every thread of the processes
// (/proc/<pid>/task/<tid>/schedstat, in nanoseconds: the clock-tick
// counters of stat round a 10 ms start to nothing).
func procCPU(pids []int) time.Duration {
	var ns int64
	for _, pid := range pids {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
		for _, f := range tasks {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			if first, _, ok := strings.Cut(string(b), " "); ok {
				n, _ := strconv.ParseInt(first, 10, 64)
				ns += n
			}
		}
	}
	return time.Duration(ns)
}

// statusKB reads a "Name: N kB" line of /proc/<pid>/status.
func statusKB(pid int, name string) int64 { return kbLine(fmt.Sprintf("/proc/%d/status", pid), name) }

// rollupKB reads a line of /proc/<pid>/smaps_rollup (Pss: shared pages
// divided among their sharers).
func rollupKB(pid int, name string) int64 {
	return kbLine(fmt.Sprintf("/proc/%d/smaps_rollup", pid), name)
}

func kbLine(path, name string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, name); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}
