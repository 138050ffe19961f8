//go:build linux

package jobs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Exec stages under the supervisor, hosted by this test binary (TestMain).
// Every process of a stage is found by a marker in its environment, which
// all descendants inherit: execMarkEnv=<unique token>.

const execMarkEnv = "TASKLEASE_TEST_EXEC_MARK"

// testSupervisor is the Supervisor prefix with this test binary as host.
func testSupervisor(t testing.TB) []string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []string{exe, SuperviseCommand}
}

// newExecMark returns a unique marker; at the end of the test every live
// process carrying it is killed, so a failing test leaks nothing.
func newExecMark(t *testing.T) string {
	t.Helper()
	mark := fmt.Sprintf("%s-%d-%d", strings.ReplaceAll(t.Name(), "/", "."), os.Getpid(), time.Now().UnixNano())
	t.Cleanup(func() {
		for _, pid := range markedProcs(mark) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return mark
}

// markedProcs lists the live (not zombie) processes whose environment
// holds execMarkEnv=mark.
func markedProcs(mark string) []int {
	want := []byte(execMarkEnv + "=" + mark)
	dirs, _ := os.ReadDir("/proc")
	var out []int
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "environ"))
		if err != nil {
			continue
		}
		for _, kv := range bytes.Split(b, []byte{0}) {
			if bytes.Equal(kv, want) {
				if !processGone(pid) {
					out = append(out, pid)
				}
				break
			}
		}
	}
	return out
}

// describeProcs is ps for a failure message.
func describeProcs(pids []int) string {
	var b strings.Builder
	for _, pid := range pids {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		fmt.Fprintf(&b, "\n  %d sid %d: %s", pid, sessionOf(pid), bytes.ReplaceAll(bytes.TrimRight(cmdline, "\x00"), []byte{0}, []byte{' '}))
	}
	return b.String()
}

// sessionOf returns pid's session id, or -1.
func sessionOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 4 {
		return -1
	}
	sid, _ := strconv.Atoi(f[3]) // field 6
	return sid
}

// requireEscaped fails the test unless pid left the stage's session: it is
// what a process group kill cannot reach, so the test is not vacuous.
func requireEscaped(t *testing.T, what string, pid int) {
	t.Helper()
	if sid := sessionOf(pid); sid != pid {
		t.Fatalf("%s %d is in session %d, not its own: setsid did not happen", what, pid, sid)
	}
}

// requireNoneAlive fails the test if a process with mark is alive now.
func requireNoneAlive(t *testing.T, mark, when string) {
	t.Helper()
	if left := markedProcs(mark); len(left) > 0 {
		t.Fatalf("%s, %d processes of the stage are alive:%s", when, len(left), describeProcs(left))
	}
}

// runStageAsync runs e and returns its result channel.
func runStageAsync(ctx context.Context, e *ExecStage, run *Run) <-chan error {
	errc := make(chan error, 1)
	go func() { errc <- e.RunStage(ctx, run) }()
	return errc
}

// recvStage waits for RunStage's result.
func recvStage(t *testing.T, errc <-chan error, d time.Duration) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	case <-time.After(d):
		t.Fatalf("RunStage did not return within %v", d)
		return nil
	}
}

// Cancelled, a stage leaves nothing running: not its children, not what
// called setsid, not a double-forked daemon re-parented away from it, not
// what ignores SIGTERM — all dead by the time RunStage returns.
func TestExecSupervisedCancelKillsEscapedDescendants(t *testing.T) {
	const daemon = `setsid sh -c 'echo $$ > daemon.pid; exec sleep 300'`
	const stubborn = `setsid sh -c 'trap "" TERM; echo $$ > daemon.pid; while :; do sleep 1; done'`
	for _, c := range []struct{ name, script string }{
		{"setsid child", daemon + ` & sleep 300 & wait`},
		{"double fork", `( ` + daemon + ` & ) ; sleep 300`},
		{"ignores SIGTERM", `( ` + stubborn + ` & ) ; trap '' TERM; sleep 300`},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir, mark := t.TempDir(), newExecMark(t)
			const grace = 500 * time.Millisecond
			e := &ExecStage{Command: []string{"sh", "-c", c.script}, Dir: dir, Env: []string{execMarkEnv + "=" + mark},
				KillGrace: grace, Supervisor: testSupervisor(t), Stdout: &syncBuffer{}}
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			errc := runStageAsync(ctx, e, testStageRun())
			d := waitPIDFile(t, filepath.Join(dir, "daemon.pid"))
			requireEscaped(t, "daemon", d)
			start := time.Now()
			cancel(ErrCancelled)
			err := recvStage(t, errc, grace+5*time.Second)
			if !errors.Is(err, ErrCancelled) {
				t.Errorf("err = %v, want ErrCancelled", err)
			}
			requireNoneAlive(t, mark, fmt.Sprintf("RunStage returned after %v", time.Since(start).Round(time.Millisecond)))
		})
	}
}

// SIGTERM reaches every descendant, a setsid'd one too, so it can stop
// cleanly within the grace: not just the SIGKILL at the end.
func TestExecSupervisedCancelTermsEscapedDescendants(t *testing.T) {
	dir, mark := t.TempDir(), newExecMark(t)
	script := `( setsid sh -c 'trap "echo > termed; exit 0" TERM; echo $$ > daemon.pid; while :; do sleep 0.05; done' & ); sleep 300`
	e := &ExecStage{Command: []string{"sh", "-c", script}, Dir: dir, Env: []string{execMarkEnv + "=" + mark},
		KillGrace: 5 * time.Second, Supervisor: testSupervisor(t)}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	errc := runStageAsync(ctx, e, testStageRun())
	requireEscaped(t, "daemon", waitPIDFile(t, filepath.Join(dir, "daemon.pid")))
	start := time.Now()
	cancel(ErrShutdown)
	if err := recvStage(t, errc, 10*time.Second); !errors.Is(err, ErrShutdown) {
		t.Errorf("err = %v, want ErrShutdown", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %v: everything exits on SIGTERM, the grace should not run out", d)
	}
	if _, err := os.Stat(filepath.Join(dir, "termed")); err != nil {
		t.Error("the setsid'd descendant never got SIGTERM")
	}
	requireNoneAlive(t, mark, "after RunStage returned")
}

// The command succeeds after starting a daemon that holds its output
// pipes: RunStage returns nil at once (not after the 1s pipe WaitDelay),
// and the daemon is dead.
func TestExecSupervisedExitKillsDaemon(t *testing.T) {
	dir, mark := t.TempDir(), newExecMark(t)
	script := `setsid sh -c 'echo $$ > daemon.pid; echo daemon-up; exec sleep 300' & while [ ! -s daemon.pid ]; do sleep 0.01; done; echo done; exit 0`
	var stdout syncBuffer
	// Without the supervisor's kill the daemon holding the pipes would make
	// RunStage wait the whole ioDelay: a minute, which no slow machine
	// mistakes for returning at once.
	const ioDelay = time.Minute
	e := &ExecStage{Command: []string{"sh", "-c", script}, Dir: dir, Env: []string{execMarkEnv + "=" + mark},
		Supervisor: testSupervisor(t), Stdout: &stdout, ioDelay: ioDelay}
	start := time.Now()
	if err := e.RunStage(context.Background(), testStageRun()); err != nil {
		t.Fatalf("RunStage: %v", err)
	}
	d := time.Since(start)
	requireNoneAlive(t, mark, "after RunStage returned")
	if pid := waitPIDFile(t, filepath.Join(dir, "daemon.pid")); !processGone(pid) {
		t.Errorf("daemon %d alive", pid)
	}
	// 0.01s polls plus two process starts: far below the WaitDelay an
	// escaped daemon holding the pipe costs without the supervisor.
	if d > ioDelay/2 {
		t.Errorf("RunStage took %v", d)
	}
	if out := stdout.String(); !strings.Contains(out, "daemon-up") || !strings.Contains(out, "done") {
		t.Errorf("stdout %q", out)
	}
	t.Logf("RunStage returned in %v", d.Round(time.Millisecond))
}

// Environment of the helper process of TestExecSupervisedRunnerKilled.
const (
	execHelperEnv     = "TASKLEASE_TEST_EXEC_HELPER"      // "1" in the child
	execHelperMarkEnv = "TASKLEASE_TEST_EXEC_HELPER_MARK" // the stage's marker
	execHelperDirEnv  = "TASKLEASE_TEST_EXEC_HELPER_DIR"  // the stage's Dir
)

// TestExecSupervisedHelperProcess is not a test: it is the runner process
// of TestExecSupervisedRunnerKilled, which SIGKILLs it while its exec stage
// runs. Without TASKLEASE_TEST_EXEC_HELPER=1 it skips.
func TestExecSupervisedHelperProcess(t *testing.T) {
	if os.Getenv(execHelperEnv) != "1" {
		t.Skip("helper process for TestExecSupervisedRunnerKilled")
	}
	// A plain child, a double-forked setsid daemon and a setsid child, all
	// ignoring SIGTERM, under a long grace: only the parent-death path
	// (SIGKILL at once) stops them quickly.
	script := `trap '' TERM
		( setsid sh -c 'echo $$ > daemon.pid; exec sleep 300' & )
		setsid sh -c 'echo $$ > session.pid; exec sleep 300' &
		sleep 300 &
		while [ ! -s daemon.pid ] || [ ! -s session.pid ]; do sleep 0.01; done
		echo started
		wait`
	run := testStageRun()
	run.stopBy = 0
	e := &ExecStage{Command: []string{"sh", "-c", script}, Dir: os.Getenv(execHelperDirEnv),
		Env: []string{execMarkEnv + "=" + os.Getenv(execHelperMarkEnv)}, KillGrace: time.Minute,
		Supervisor: testSupervisor(t), Stdout: os.Stdout}
	err := e.RunStage(context.Background(), run)
	t.Fatalf("RunStage returned (%v); it should have been killed", err)
}

// The runner is SIGKILLed while an exec stage runs: every process of the
// stage — including the daemons that left its process group and session —
// dies within moments, before another runner could take the lease.
func TestExecSupervisedRunnerKilled(t *testing.T) {
	dir, mark := t.TempDir(), newExecMark(t)
	cmd, out, exited := startHelperRunner(t, "TestExecSupervisedHelperProcess",
		execHelperEnv+"=1", execHelperMarkEnv+"="+mark, execHelperDirEnv+"="+dir)

	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(out.String(), "started\n") {
		select {
		case <-exited:
			t.Fatalf("helper exited before its stage started")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the helper's stage did not start in time")
		}
		time.Sleep(5 * time.Millisecond)
	}
	requireEscaped(t, "double-forked daemon", waitPIDFile(t, filepath.Join(dir, "daemon.pid")))
	requireEscaped(t, "setsid child", waitPIDFile(t, filepath.Join(dir, "session.pid")))
	before := markedProcs(mark)
	if len(before) < 4 { // sh, sleep, two daemons (and the supervisor)
		t.Fatalf("only %d processes of the stage before the kill:%s", len(before), describeProcs(before))
	}

	killed := time.Now()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for {
		left := markedProcs(mark)
		if len(left) == 0 {
			break
		}
		if time.Since(killed) > 5*time.Second {
			t.Fatalf("5s after the runner was SIGKILLed, %d of %d processes of its stage are alive:%s",
				len(left), len(before), describeProcs(left))
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Logf("runner SIGKILL to the last of %d stage processes dead: %v", len(before), time.Since(killed).Round(time.Millisecond))
}

// startHelperRunner runs this test binary's test helper as a separate
// runner process with env added; it never outlives the test, and its output
// is logged when the test fails. exited is closed once it was reaped.
func startHelperRunner(t *testing.T, helper string, env ...string) (cmd *exec.Cmd, out *syncBuffer, exited chan struct{}) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command(exe, "-test.run=^"+helper+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	out = &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = time.Second // the stages' processes share the pipe
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited = make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("helper output:\n%s", out.String())
		}
	})
	return cmd, out, exited
}

// The command's environment is exactly what it is without the supervisor,
// and so are its directory and output.
func TestExecSupervisedEnvAndDir(t *testing.T) {
	dir := t.TempDir()
	envOf := func(supervisor []string, name string) (map[string]string, string) {
		out := filepath.Join(dir, name)
		var stdout syncBuffer
		e := &ExecStage{
			Command:    []string{"sh", "-c", `env > "$OUT"; pwd > "$OUT.pwd"; echo hello`},
			Dir:        dir,
			Env:        []string{"OUT=" + out, "EXTRA=yes", "TASKLEASE_STAGE=spoofed"},
			Stdout:     &stdout,
			Supervisor: supervisor,
		}
		if err := e.RunStage(context.Background(), testStageRun()); err != nil {
			t.Fatalf("RunStage: %v", err)
		}
		if stdout.String() != "hello\n" {
			t.Errorf("stdout = %q", stdout.String())
		}
		pwd, err := os.ReadFile(out + ".pwd")
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := filepath.EvalSymlinks(strings.TrimSpace(string(pwd))); got != mustEvalSymlinks(t, dir) {
			t.Errorf("pwd = %q, want %q", got, dir)
		}
		env := readEnvFile(t, out)
		delete(env, "OUT") // differs by design
		return env, out
	}
	plain, _ := envOf(nil, "plain.env")
	sup, _ := envOf(testSupervisor(t), "sup.env")
	if !maps.Equal(plain, sup) {
		for k, v := range sup {
			if pv, ok := plain[k]; !ok || pv != v {
				t.Errorf("supervised env %s=%q, unsupervised %q (set %v)", k, v, pv, ok)
			}
		}
		for k := range plain {
			if _, ok := sup[k]; !ok {
				t.Errorf("supervised env lacks %s", k)
			}
		}
	}
	if sup["TASKLEASE_STAGE"] != "pulling" || sup["TASKLEASE_FENCING_TOKEN"] != "7" || sup["EXTRA"] != "yes" {
		t.Errorf("supervised env: %v", sup)
	}
}

// Exit codes, signals, stderr tails and start failures read exactly as
// without the supervisor.
func TestExecSupervisedErrorsAsUnsupervised(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "noexec.sh"), []byte("#!/bin/sh\necho hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	long := `i=0; while [ $i -lt 200 ]; do printf '%0100d' 0 >&2; i=$((i+1)); done; echo END-MARK >&2; exit 1`
	for _, c := range []struct {
		name      string
		e         ExecStage
		want      string // in the error
		permanent bool
		is        error
	}{
		{name: "exit 3", e: ExecStage{Command: []string{"sh", "-c", "echo boom-detail >&2; exit 3"}}, want: "exit 3: boom-detail"},
		{name: "exit 137", e: ExecStage{Command: []string{"sh", "-c", "exit 137"}}, want: "exec sh: exit 137"},
		{name: "killed", e: ExecStage{Command: []string{"sh", "-c", "echo dying >&2; kill -9 $$"}}, want: "exec sh: signal: killed: dying"},
		{name: "terminated", e: ExecStage{Command: []string{"sh", "-c", "kill -TERM $$"}}, want: "exec sh: signal: terminated"},
		{name: "stderr tail", e: ExecStage{Command: []string{"sh", "-c", long}}, want: "END-MARK"},
		{name: "not in PATH", e: ExecStage{Command: []string{"tasklease-no-such-binary-9f3a"}}, permanent: true, is: exec.ErrNotFound},
		{name: "no such file", e: ExecStage{Command: []string{"./no-such-script"}, Dir: dir}, permanent: true, is: fs.ErrNotExist},
		{name: "not executable", e: ExecStage{Command: []string{"./noexec.sh"}, Dir: dir}, permanent: true, is: fs.ErrPermission},
		{name: "no such dir", e: ExecStage{Command: []string{"true"}, Dir: filepath.Join(dir, "missing")}, permanent: true, is: fs.ErrNotExist},
	} {
		t.Run(c.name, func(t *testing.T) {
			plainStage, supStage := c.e, c.e
			supStage.Supervisor = testSupervisor(t)
			var stderr syncBuffer
			supStage.Stderr = &stderr
			plain := plainStage.RunStage(context.Background(), testStageRun())
			sup := supStage.RunStage(context.Background(), testStageRun())
			if sup == nil || plain == nil {
				t.Fatalf("supervised %v, unsupervised %v: want errors", sup, plain)
			}
			if sup.Error() != plain.Error() {
				t.Errorf("supervised error\n  %q\nunsupervised\n  %q", sup, plain)
			}
			if !strings.Contains(sup.Error(), c.want) {
				t.Errorf("error %q lacks %q", sup, c.want)
			}
			if errors.Is(sup, ErrPermanent) != c.permanent {
				t.Errorf("ErrPermanent = %v, want %v: %v", !c.permanent, c.permanent, sup)
			}
			if c.is != nil && !errors.Is(sup, c.is) {
				t.Errorf("error %v is not %v", sup, c.is)
			}
			if len(sup.Error()) > execStderrTail+200 {
				t.Errorf("error is %d bytes", len(sup.Error()))
			}
			if c.name == "exit 3" && stderr.String() != "boom-detail\n" {
				t.Errorf("Stderr writer got %q", stderr.String())
			}
		})
	}
}

// The Logger gets the command's lines with the run's attributes.
func TestExecSupervisedLogsOutputLines(t *testing.T) {
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	st := &ExecStage{Command: []string{"sh", "-c", "echo one; echo oops >&2; printf tail; exit 3"}, Logger: log, Supervisor: testSupervisor(t)}
	err := st.RunStage(context.Background(), testStageRun())
	if err == nil || !strings.Contains(err.Error(), "exit 3: oops") {
		t.Fatalf("err = %v, want exit 3 with the stderr tail", err)
	}
	out := logs.String()
	for _, want := range []string{
		`level=INFO msg="exec output" task_key=u42|course_sync run_id=r1 stage=pulling attempt=2 fencing_token=7 stream=stdout line=one`,
		`level=WARN msg="exec output" task_key=u42|course_sync run_id=r1 stage=pulling attempt=2 fencing_token=7 stream=stderr line=oops`,
		`stream=stdout line=tail`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "supervisor") {
		t.Errorf("the supervisor wrote to the stage's output:\n%s", out)
	}
}

// Cancelled with everything ignoring SIGTERM: SIGKILL comes from the
// supervisor at its share of the grace, not before, and RunStage returns
// within the runner's grace with everything dead.
func TestExecSupervisedKillAfterGrace(t *testing.T) {
	dir, mark := t.TempDir(), newExecMark(t)
	script := `trap '' TERM; sleep 60 & echo $! > child.pid; echo $$ > shell.pid; wait`
	const grace = 500 * time.Millisecond
	e := &ExecStage{Command: []string{"sh", "-c", script}, Dir: dir, KillGrace: grace,
		Env: []string{execMarkEnv + "=" + mark}, Supervisor: testSupervisor(t)}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	errc := runStageAsync(ctx, e, testStageRun())
	shell := waitPIDFile(t, filepath.Join(dir, "shell.pid"))
	child := waitPIDFile(t, filepath.Join(dir, "child.pid"))
	start := time.Now()
	cancel(ErrCancelled)
	err := recvStage(t, errc, grace+3*time.Second)
	elapsed := time.Since(start)
	if !errors.Is(err, ErrCancelled) {
		t.Errorf("err = %v, want ErrCancelled", err)
	}
	if sg := supervisorGrace(grace); elapsed < sg*9/10 {
		t.Errorf("returned after %v: SIGKILL came before the supervisor's %v grace", elapsed, sg)
	}
	if elapsed > grace+time.Second {
		t.Errorf("returned after %v, want within the %v grace", elapsed, grace)
	}
	if !processGone(shell) || !processGone(child) {
		t.Errorf("shell or child alive after RunStage returned")
	}
	requireNoneAlive(t, mark, "after RunStage returned")
}

// What exits on SIGTERM ends the stage at once, whatever the grace.
func TestExecSupervisedTermWithinGrace(t *testing.T) {
	mark := newExecMark(t)
	e := &ExecStage{Command: []string{"sleep", "60"}, KillGrace: time.Minute,
		Env: []string{execMarkEnv + "=" + mark}, Supervisor: testSupervisor(t)}
	run := testStageRun()
	run.stopBy = 0 // no cap: the 1 minute grace applies
	ctx, cancel := context.WithCancelCause(context.Background())
	time.AfterFunc(100*time.Millisecond, func() { cancel(ErrShutdown) })
	start := time.Now()
	// Well within the minute: SIGTERM stops sleep at once.
	if err := recvStage(t, runStageAsync(ctx, e, run), 5*time.Second); !errors.Is(err, ErrShutdown) {
		t.Errorf("err = %v, want ErrShutdown", err)
	}
	t.Logf("returned %v after the start (cancelled at 100ms)", time.Since(start).Round(time.Millisecond))
}

// The kill grace stays capped at the run's StopGrace: everything is dead
// before the lease could pass on.
func TestExecSupervisedTimeoutCappedByStopGrace(t *testing.T) {
	dir, mark := t.TempDir(), newExecMark(t)
	e := &ExecStage{
		Command:    []string{"sh", "-c", `trap '' TERM; ( setsid sh -c 'trap "" TERM; while :; do sleep 1; done' & ); echo $$ > shell.pid; while :; do sleep 1; done`},
		Dir:        dir,
		Env:        []string{execMarkEnv + "=" + mark},
		KillGrace:  time.Minute,
		Supervisor: testSupervisor(t),
	}
	run := testStageRun()
	run.stopBy = 300 * time.Millisecond
	// The timeout fires once the shell runs: a fixed deadline from the start
	// could pass before a loaded machine has started it at all.
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	errc := runStageAsync(ctx, e, run)
	waitPIDFile(t, filepath.Join(dir, "shell.pid"))
	start := time.Now()
	cancel(context.DeadlineExceeded)
	err := recvStage(t, errc, 5*time.Second)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want context.DeadlineExceeded", err)
	}
	// At most the 300ms StopGrace (and slack for a loaded machine), not the
	// minute of KillGrace.
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %v; KillGrace should be capped by StopGrace (300ms)", d)
	}
	requireNoneAlive(t, mark, "after RunStage returned")
}

func TestExecSupervisedAlreadyCancelled(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(ErrCancelled)
	out := filepath.Join(t.TempDir(), "ran")
	e := &ExecStage{Command: []string{"sh", "-c", `touch "$OUT"`}, Env: []string{"OUT=" + out}, Supervisor: testSupervisor(t)}
	if err := e.RunStage(ctx, testStageRun()); !errors.Is(err, ErrCancelled) {
		t.Errorf("err = %v, want ErrCancelled", err)
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("command ran on a cancelled context")
	}
}

// A Supervisor prefix that does not start a supervisor fails the stage; it
// never passes for a command that succeeded.
func TestExecSupervisorMisconfigured(t *testing.T) {
	for _, sup := range [][]string{{"true"}, {"false"}, {"sh", "-c", "echo not a supervisor >&2"}} {
		out := filepath.Join(t.TempDir(), "ran")
		e := &ExecStage{Command: []string{"sh", "-c", `touch "$OUT"`}, Env: []string{"OUT=" + out}, Supervisor: sup}
		err := e.RunStage(context.Background(), testStageRun())
		if err == nil || !strings.Contains(err.Error(), "supervisor") {
			t.Errorf("Supervisor %q: err = %v, want a supervisor error", sup, err)
		}
		if errors.Is(err, ErrPermanent) {
			t.Errorf("Supervisor %q: %v must stay retryable", sup, err)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("Supervisor %q: the command ran", sup)
		}
	}
	e := &ExecStage{Command: []string{"true"}, Supervisor: []string{"/nonexistent/tasklease-host", SuperviseCommand}}
	if err := e.RunStage(context.Background(), testStageRun()); err == nil || !strings.Contains(err.Error(), "/nonexistent/tasklease-host") {
		t.Errorf("missing host: err = %v", err)
	}
}

func TestExecSupervisorGrace(t *testing.T) {
	for _, c := range []struct{ g, want time.Duration }{
		{5 * time.Second, 4 * time.Second},
		{time.Second, 800 * time.Millisecond},
		{300 * time.Millisecond, 200 * time.Millisecond},
		{100 * time.Millisecond, 50 * time.Millisecond},
		{0, 0},
	} {
		if got := supervisorGrace(c.g); got != c.want {
			t.Errorf("supervisorGrace(%v) = %v, want %v", c.g, got, c.want)
		}
	}
	// The supervisor is told its share: the runner's backstop comes later.
	if !slices.Contains(testSupervisor(t), SuperviseCommand) {
		t.Fatal("testSupervisor lacks SuperviseCommand")
	}
}

// A supervisor that has not finished when the kill grace is up is hurried
// (its DeathSignal), not SIGKILLed: killed, it could not kill what left
// its process group. Here the supervisor's own grace is made longer than
// the runner's, as on a loaded machine where it falls behind, and the
// stage's daemon escaped with setsid and ignores SIGTERM.
func TestExecSupervisedSlowSupervisorIsHurriedNotKilled(t *testing.T) {
	dir, mark := t.TempDir(), newExecMark(t)
	const stubborn = `setsid sh -c 'trap "" TERM; echo $$ > daemon.pid; while :; do sleep 1; done'`
	const grace = 300 * time.Millisecond
	e := &ExecStage{Command: []string{"sh", "-c", `( ` + stubborn + ` & ) ; sleep 300`}, Dir: dir,
		Env: []string{execMarkEnv + "=" + mark}, KillGrace: grace, Supervisor: testSupervisor(t), Stdout: &syncBuffer{},
		supervisorGrace: func(g time.Duration) time.Duration { return 10 * g }}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	errc := runStageAsync(ctx, e, testStageRun())
	d := waitPIDFile(t, filepath.Join(dir, "daemon.pid"))
	requireEscaped(t, "daemon", d)
	start := time.Now()
	cancel(ErrCancelled)
	if err := recvStage(t, errc, grace+10*time.Second); !errors.Is(err, ErrCancelled) {
		t.Errorf("err = %v, want ErrCancelled", err)
	}
	took := time.Since(start)
	requireNoneAlive(t, mark, fmt.Sprintf("RunStage returned after %v", took.Round(time.Millisecond)))
	if took > 10*grace {
		t.Errorf("RunStage returned after %v: the hurried supervisor should end it soon after the %v grace, not after its own %v", took, grace, 10*grace)
	}
}
