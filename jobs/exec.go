package jobs

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/tasklease/tasklease/internal/supervisor"
)

// ExecKillGraceDefault is how long ExecStage waits between SIGTERM and
// SIGKILL when KillGrace is zero.
const ExecKillGraceDefault = 5 * time.Second

// supervisorKillWait bounds the wait for a hurried supervisor: its own
// bound on SIGKILLed descendants dying (5 s, for one stuck in the kernel)
// and a margin. Only then is its process group SIGKILLed.
const supervisorKillWait = 6 * time.Second

const (
	// execStderrTail is how much of the end of stderr is kept for the error
	// message.
	execStderrTail = 4 << 10
	// execIODelay bounds how long to wait for output pipes after the process
	// exited: a grandchild that escaped the process group (setsid) may hold
	// them open forever.
	execIODelay = time.Second
)

// ExecStage runs a command per stage execution.
//
// The command sees the run in its environment: TASKLEASE_KEY,
// TASKLEASE_SUBJECT, TASKLEASE_SCOPE, TASKLEASE_STAGE, TASKLEASE_SOURCE,
// TASKLEASE_RUN_ID, TASKLEASE_ATTEMPT, TASKLEASE_FENCING_TOKEN,
// TASKLEASE_RESUMED ("1" or "0") and TASKLEASE_CURSOR (saved progress,
// standard base64, empty if none).
//
// # What is stopped, and when
//
// With a Supervisor, on Linux, the command runs under a supervisor process
// (see package internal/supervisor) that is a child subreaper: every
// process the command starts — children, grandchildren, daemons that
// double-fork and setsid out of the process group — stays its descendant.
//   - The command exits: what it left running gets SIGTERM, 200 ms, then
//     SIGKILL; RunStage returns once every descendant is dead and reaped.
//   - The stage context is done (cancel, timeout, lease loss, shutdown):
//     every descendant gets SIGTERM, and SIGKILL at 80% of the kill grace
//     (for a grace under 500 ms, up to 100 ms before its end). If the
//     supervisor has not finished when the whole grace is up, it gets its
//     DeathSignal (SIGKILL every descendant now) and up to 6 s more; only
//     then is its process group SIGKILLed. The supervisor itself is never
//     killed first: what left the group would outlive it.
//   - The runner dies (SIGKILL, OOM, crash): the supervisor gets SIGUSR1 as
//     its parent-death signal and SIGKILLs every descendant at once.
//
// Only processes started on the command's behalf by something else
// (systemd-run, a container engine, ssh to another host) are out of reach.
//
// Without a Supervisor (or on another OS) the command runs in its own
// process group. When the context is done the group gets SIGTERM, then
// SIGKILL after the kill grace; when the command exits, what is left in
// its group is SIGKILLed. On Linux the command itself — not its children —
// also gets SIGKILL if the runner dies. Descendants that leave the group
// (setsid, daemons) are not tracked: they may outlive the stage, and the
// runner, and race the next lease holder. To enable the supervisor, host
// it in your main before anything else and set Supervisor:
//
//	if len(os.Args) > 1 && os.Args[1] == jobs.SuperviseCommand { os.Exit(jobs.SuperviseMain(os.Args[2:])) }
//	stage.Supervisor = []string{"/proc/self/exe", jobs.SuperviseCommand} // this binary, even if replaced on disk
//
// `runner serve` does this for every exec stage of its configuration.
type ExecStage struct {
	// Command is the argv; Command[0] is looked up in PATH. Required.
	Command []string
	// Dir is the working directory; empty means the runner's.
	Dir string
	// Env holds extra "K=V" entries appended to os.Environ(). The
	// TASKLEASE_* variables are set after them and win.
	Env []string
	// KillGrace is the delay between SIGTERM and SIGKILL (default
	// ExecKillGraceDefault). It is capped at the run's StopGrace so the
	// process is dead before the lease can pass to another runner.
	KillGrace time.Duration
	// Stdout receives the command's standard output; nil discards it.
	Stdout io.Writer
	// Stderr receives the command's standard error; nil discards it. The
	// last 4 KiB are kept for the error message either way.
	Stderr io.Writer
	// Logger, when set, receives each line of output the command writes
	// (stdout at info, stderr at warn) with the run's task_key, run_id,
	// stage, attempt and fencing_token, besides Stdout and Stderr.
	Logger *slog.Logger
	// Supervisor is the command prefix that starts the exec supervisor,
	// normally {path of a binary whose main hosts SuperviseMain,
	// SuperviseCommand}; the supervisor's options and the command follow
	// it. A relative path is taken relative to the runner's working
	// directory. Empty, or on an OS other than Linux, the command runs
	// unsupervised (see the type's documentation).
	//
	// The binary must check for SuperviseCommand before it does anything
	// else: one that does not runs its usual main with these arguments (a
	// test binary, for one, runs all its tests), and the stage fails.
	Supervisor []string

	// supervisorGrace, when set (tests), replaces supervisorGrace: a
	// supervisor slower than the runner's kill grace, as on a loaded
	// machine.
	supervisorGrace func(time.Duration) time.Duration
	// ioDelay, when set (tests), replaces execIODelay: a test that checks
	// RunStage does not wait for it makes it long enough that no slow
	// machine blurs the difference.
	ioDelay time.Duration
}

// ioWait is how long RunStage waits for the output pipes (and a
// supervisor's status) after the process exited.
func (e *ExecStage) ioWait() time.Duration {
	if e.ioDelay > 0 {
		return e.ioDelay
	}
	return execIODelay
}

// SuperviseCommand is the first argument that makes a binary hosting the
// exec supervisor run it instead of its usual work; see
// ExecStage.Supervisor and SuperviseMain.
const SuperviseCommand = "__tasklease-supervise"

// SuperviseMain runs the exec supervisor with the arguments that follow
// SuperviseCommand and returns the process exit code. A binary hosts it by
// checking os.Args[1] first thing in main:
//
//	if len(os.Args) > 1 && os.Args[1] == jobs.SuperviseCommand {
//		os.Exit(jobs.SuperviseMain(os.Args[2:]))
//	}
//
// It handles SIGTERM, SIGINT and SIGUSR1 itself and must not run in a
// process that does anything else.
func SuperviseMain(args []string) int { return supervisor.Main(args) }

// Validate checks the configuration; errors wrap ErrConfig.
func (e *ExecStage) Validate() error {
	if len(e.Command) == 0 || e.Command[0] == "" {
		return fmt.Errorf("%w: exec stage: empty command", ErrConfig)
	}
	if e.KillGrace < 0 {
		return fmt.Errorf("%w: exec stage %s: negative kill grace", ErrConfig, e.Command[0])
	}
	for _, kv := range e.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return fmt.Errorf("%w: exec stage %s: env entry %q is not K=V", ErrConfig, e.Command[0], kv)
		}
	}
	return nil
}

// killGrace returns the SIGTERM→SIGKILL delay for run.
func (e *ExecStage) killGrace(run *Run) time.Duration {
	g := e.KillGrace
	if g == 0 {
		g = ExecKillGraceDefault
	}
	if sg := run.StopGrace(); sg > 0 && g > sg {
		g = sg
	}
	return g
}

// RunStage runs the command and waits for it. Exit status 0 completes the
// stage. When ctx is done the command and what it started are stopped and
// the error wraps context.Cause(ctx).
func (e *ExecStage) RunStage(ctx context.Context, run *Run) error {
	if err := e.Validate(); err != nil {
		return Permanent(err)
	}
	argv0 := e.Command[0]
	if ctx.Err() != nil {
		return fmt.Errorf("exec %s: not started: %w", argv0, context.Cause(ctx))
	}
	grace := e.killGrace(run)
	endStart, err := run.acquireStart(ctx)
	if err != nil {
		return fmt.Errorf("exec %s: not started: %w", argv0, err)
	}
	defer endStart()

	// Supervised, cmd is the supervisor and sv its side of the protocol.
	var cmd *exec.Cmd
	var sv *supervised
	if supervisorSupported && len(e.Supervisor) > 0 {
		var err error
		if cmd, sv, err = e.supervisedCmd(grace); err != nil {
			return startError(argv0, err)
		}
	} else {
		cmd = exec.Command(argv0, e.Command[1:]...)
	}
	tail := &tailBuffer{max: execStderrTail}
	if sv == nil {
		cmd.Dir = e.Dir // the supervisor gets --dir
	}
	cmd.Env = execEnv(ctx, e.Env, run)
	stdout, stderr := []io.Writer{}, []io.Writer{tail}
	if e.Stdout != nil {
		stdout = append(stdout, e.Stdout)
	}
	if e.Stderr != nil {
		stderr = append(stderr, e.Stderr)
	}
	if e.Logger != nil {
		log := e.Logger.With(slog.String("task_key", run.Key().String()), slog.String("run_id", run.RunID()),
			slog.String("stage", run.Stage()), slog.Int("attempt", run.Attempt()), slog.Int64("fencing_token", run.FencingToken()))
		outLog := &lineLogger{log: log, level: slog.LevelInfo, stream: "stdout"}
		errLog := &lineLogger{log: log, level: slog.LevelWarn, stream: "stderr"}
		defer outLog.flush() // after the process and its output copying ended
		defer errLog.flush()
		stdout, stderr = append(stdout, outLog), append(stderr, errLog)
	}
	if len(stdout) > 0 { // none: /dev/null
		cmd.Stdout = io.MultiWriter(stdout...)
	}
	cmd.Stderr = io.MultiWriter(stderr...)
	cmd.SysProcAttr = execSysProcAttr(sv != nil)
	cmd.WaitDelay = e.ioWait()

	p, err := startExec(cmd)
	if sv != nil {
		sv.started(err == nil, endStart)
	} else {
		endStart()
	}
	if err != nil {
		return startError(argv0, err)
	}

	var stopped error
	select {
	case <-p.exited:
	case <-ctx.Done():
		stopped = context.Cause(ctx)
		if sv != nil {
			// The supervisor stops the descendants within its shorter grace;
			// hurrying it, then the group SIGKILL, are the backstops.
			terminateProcess(cmd.Process)
		} else {
			terminateGroup(cmd.Process)
		}
		t := time.NewTimer(grace)
		select {
		case <-p.exited:
			t.Stop()
		case <-t.C:
			if sv == nil {
				killGroup(cmd.Process)
				<-p.exited
				break
			}
			// A supervisor still at work when the grace is up is told to
			// SIGKILL every descendant at once and given the time that
			// takes. SIGKILLing it instead would leave what left its
			// process group (setsid, a double fork) running with nobody
			// left to kill it; seen in cmd/chaos on a loaded machine.
			hurrySupervisor(cmd.Process)
			t.Reset(supervisorKillWait)
			select {
			case <-p.exited:
			case <-t.C:
				killGroup(cmd.Process)
				<-p.exited
			}
		}
	}
	// The leader is gone; kill what it left behind in its group (or what
	// ignored SIGTERM). On Linux the leader is not reaped yet, so its pid —
	// the group id — cannot have been reused. A supervisor has normally
	// emptied the group already.
	killGroup(cmd.Process)
	close(p.reap)
	err = <-p.done

	if stopped != nil {
		if sv != nil {
			sv.wait()
		}
		return fmt.Errorf("exec %s: stopped: %w", argv0, stopped)
	}
	if sv != nil {
		return sv.result(argv0, err, tail.String())
	}
	if err == nil || errors.Is(err, exec.ErrWaitDelay) {
		// ErrWaitDelay: exit 0, but an escaped grandchild held the output
		// pipes; the command itself succeeded.
		return nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if code := ee.ExitCode(); code >= 0 {
			return exitError(argv0, code, tail.String())
		}
		// Killed by a signal we did not send (ExitCode is -1).
		return execFailed(argv0, ee.String(), tail.String())
	}
	return fmt.Errorf("exec %s: %w", argv0, err)
}

// exitError is the error of a command that exited with a non-zero code:
// RetryAfterExitCode asks for a retry that does not count (RetryAfter).
func exitError(argv0 string, code int, stderrTail string) error {
	err := execFailed(argv0, "exit "+strconv.Itoa(code), stderrTail)
	if code == RetryAfterExitCode {
		return RetryAfter(parseExecRetryAfter(stderrTail), err)
	}
	return err
}

// execFailed is the error of a command that ran and failed: what happened
// ("exit 3", "signal: killed") and the tail of its stderr.
func execFailed(argv0, what, stderrTail string) error {
	if stderrTail == "" {
		return fmt.Errorf("exec %s: %s", argv0, what)
	}
	return fmt.Errorf("exec %s: %s: %s", argv0, what, stderrTail)
}

// startError wraps a failure to start the command, permanent if retrying
// cannot help.
func startError(argv0 string, err error) error {
	err = fmt.Errorf("exec %s: start: %w", argv0, err)
	if permanentStartError(err) {
		return Permanent(err)
	}
	return err
}

// permanentStartError reports whether a start failure will repeat on retry
// (missing binary or directory, no permission), as opposed to a transient
// resource shortage such as EAGAIN.
func permanentStartError(err error) bool {
	return errors.Is(err, exec.ErrNotFound) || errors.Is(err, exec.ErrDot) ||
		errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission)
}

// execEnv builds the command's environment.
func execEnv(ctx context.Context, extra []string, run *Run) []string {
	resumed := "0"
	if run.Resumed() {
		resumed = "1"
	}
	cursor := ""
	if c := run.Cursor(); len(c) > 0 {
		cursor = base64.StdEncoding.EncodeToString(c)
	}
	env := append(os.Environ(), extra...)
	if tp := traceparent(ctx); tp != "" { // the stage's span, when tracing is on
		env = append(env, "TRACEPARENT="+tp)
	}
	// Appended last: exec keeps the last value of a duplicate key, so the
	// run's identity cannot be overridden by Env or the runner's environment.
	if len(run.slots) > 0 {
		env = append(env, "TASKLEASE_LIMITER_SLOTS="+limiterSlotsText(run.slots))
	}
	return append(env,
		"TASKLEASE_KEY="+run.Key().String(),
		"TASKLEASE_SUBJECT="+run.Subject(),
		"TASKLEASE_SCOPE="+run.Scope(),
		"TASKLEASE_STAGE="+run.Stage(),
		"TASKLEASE_SOURCE="+string(run.Source()),
		"TASKLEASE_RUN_ID="+run.RunID(),
		"TASKLEASE_ATTEMPT="+strconv.Itoa(run.Attempt()),
		"TASKLEASE_FENCING_TOKEN="+strconv.FormatInt(run.FencingToken(), 10),
		"TASKLEASE_RESUMED="+resumed,
		"TASKLEASE_CURSOR="+cursor,
	)
}

// execProc tracks a started command.
type execProc struct {
	// exited is closed once the leader has exited. On Linux it is not reaped
	// yet, which keeps its pid (the group id) from being reused.
	exited chan struct{}
	// reap is closed by RunStage once the group is cleaned up.
	reap chan struct{}
	// done receives cmd.Wait's result.
	done chan error
}

// startExec starts cmd from a goroutine locked to its OS thread until the
// process is reaped: Linux's Pdeathsig fires when the forking thread exits,
// not the process, and the Go runtime may otherwise retire that thread.
func startExec(cmd *exec.Cmd) (*execProc, error) {
	p := &execProc{
		exited: make(chan struct{}),
		reap:   make(chan struct{}),
		done:   make(chan error, 1),
	}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		if waitExitedNoReap(cmd.Process.Pid) {
			close(p.exited)
			<-p.reap
			p.done <- cmd.Wait()
			return
		}
		// No way to wait without reaping here: reap, then let RunStage
		// clean up the group (best effort).
		err := cmd.Wait()
		close(p.exited)
		p.done <- err
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}
