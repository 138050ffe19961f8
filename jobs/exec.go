package jobs

import (
	"bytes"
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
	"sync"
	"time"
)

// ExecKillGraceDefault is how long ExecStage waits between SIGTERM and
// SIGKILL when KillGrace is zero.
const ExecKillGraceDefault = 5 * time.Second

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
// The command runs in its own process group. When the stage context is done
// (lease loss, cancel, timeout, shutdown) the group gets SIGTERM, then
// SIGKILL after the grace. Whatever the command leaves running in its group
// is killed when it exits, so no process of a stage outlives it and races
// the next lease holder. On Linux the command also gets SIGKILL if the
// runner dies.
//
// The command sees the run in its environment: TASKLEASE_KEY,
// TASKLEASE_SUBJECT, TASKLEASE_SCOPE, TASKLEASE_STAGE, TASKLEASE_SOURCE,
// TASKLEASE_RUN_ID, TASKLEASE_ATTEMPT, TASKLEASE_FENCING_TOKEN,
// TASKLEASE_RESUMED ("1" or "0") and TASKLEASE_CURSOR (saved progress,
// standard base64, empty if none).
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
}

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
// stage. When ctx is done the process group is stopped and the error wraps
// context.Cause(ctx).
func (e *ExecStage) RunStage(ctx context.Context, run *Run) error {
	if err := e.Validate(); err != nil {
		return Permanent(err)
	}
	argv0 := e.Command[0]
	if ctx.Err() != nil {
		return fmt.Errorf("exec %s: not started: %w", argv0, context.Cause(ctx))
	}

	tail := &tailBuffer{max: execStderrTail}
	cmd := exec.Command(argv0, e.Command[1:]...)
	cmd.Dir = e.Dir
	cmd.Env = execEnv(e.Env, run)
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
	cmd.SysProcAttr = execSysProcAttr()
	cmd.WaitDelay = execIODelay

	p, err := startExec(cmd)
	if err != nil {
		err = fmt.Errorf("exec %s: start: %w", argv0, err)
		if permanentStartError(err) {
			return Permanent(err)
		}
		return err
	}

	var stopped error
	select {
	case <-p.exited:
	case <-ctx.Done():
		stopped = context.Cause(ctx)
		terminateGroup(cmd.Process)
		t := time.NewTimer(e.killGrace(run))
		select {
		case <-p.exited:
			t.Stop()
		case <-t.C:
			killGroup(cmd.Process)
			<-p.exited
		}
	}
	// The leader is gone; kill what it left behind in its group (or what
	// ignored SIGTERM). On Linux the leader is not reaped yet, so its pid —
	// the group id — cannot have been reused.
	killGroup(cmd.Process)
	close(p.reap)
	err = <-p.done

	if stopped != nil {
		return fmt.Errorf("exec %s: stopped: %w", argv0, stopped)
	}
	if err == nil || errors.Is(err, exec.ErrWaitDelay) {
		// ErrWaitDelay: exit 0, but an escaped grandchild held the output
		// pipes; the command itself succeeded.
		return nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		msg := tail.String()
		if code := ee.ExitCode(); code >= 0 {
			if msg == "" {
				return fmt.Errorf("exec %s: exit %d", argv0, code)
			}
			return fmt.Errorf("exec %s: exit %d: %s", argv0, code, msg)
		}
		// Killed by a signal we did not send (ExitCode is -1).
		if msg == "" {
			return fmt.Errorf("exec %s: %v", argv0, ee)
		}
		return fmt.Errorf("exec %s: %v: %s", argv0, ee, msg)
	}
	return fmt.Errorf("exec %s: %w", argv0, err)
}

// permanentStartError reports whether a start failure will repeat on retry
// (missing binary or directory, no permission), as opposed to a transient
// resource shortage such as EAGAIN.
func permanentStartError(err error) bool {
	return errors.Is(err, exec.ErrNotFound) || errors.Is(err, exec.ErrDot) ||
		errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission)
}

// execEnv builds the command's environment.
func execEnv(extra []string, run *Run) []string {
	resumed := "0"
	if run.Resumed() {
		resumed = "1"
	}
	cursor := ""
	if c := run.Cursor(); len(c) > 0 {
		cursor = base64.StdEncoding.EncodeToString(c)
	}
	env := append(os.Environ(), extra...)
	// Appended last: exec keeps the last value of a duplicate key, so the
	// run's identity cannot be overridden by Env or the runner's environment.
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

// lineLogger logs each complete line written to it; a partial line waits
// for its end or for flush. Lines are capped so a command without newlines
// cannot grow it without bound.
type lineLogger struct {
	log    *slog.Logger
	level  slog.Level
	stream string
	buf    []byte
}

const lineLoggerMax = 4 << 10

func (l *lineLogger) Write(p []byte) (int, error) {
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		l.emit(l.buf[:i])
		l.buf = l.buf[i+1:]
	}
	if len(l.buf) > lineLoggerMax {
		l.emit(l.buf)
		l.buf = l.buf[:0]
	}
	return len(p), nil
}

func (l *lineLogger) flush() {
	if len(l.buf) > 0 {
		l.emit(l.buf)
		l.buf = nil
	}
}

func (l *lineLogger) emit(line []byte) {
	line = bytes.TrimRight(line, "\r")
	if len(line) > lineLoggerMax {
		line = line[:lineLoggerMax]
	}
	l.log.LogAttrs(context.Background(), l.level, "exec output", slog.String("stream", l.stream), slog.String("line", string(line)))
}

// tailBuffer is an io.Writer keeping the last max bytes written.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

// Write keeps the tail of p; it never fails, so the command is never cut
// off from its stderr.
func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if len(p) >= t.max {
		t.buf = append(t.buf[:0], p[len(p)-t.max:]...)
		return n, nil
	}
	if over := len(t.buf) + len(p) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

// String returns the kept tail, trimmed, as valid UTF-8 (the cut may split
// a character).
func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(strings.ToValidUTF8(string(t.buf), "\uFFFD"))
}
