package jobs

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"slices"
	"time"

	"github.com/tasklease/tasklease/internal/supervisor"
)

// supervisorGrace is the SIGTERM→SIGKILL delay handed to the supervisor:
// short enough of the runner's grace g that it normally finishes its own
// cleanup before the runner's backstop fires — 80% of g, but at least
// min(g/2, 100ms) before the end.
func supervisorGrace(g time.Duration) time.Duration {
	return g - max(g/5, min(g/2, 100*time.Millisecond))
}

// supervised is the runner's side of one supervisor: the read end of its
// status pipe, and what it reported there.
type supervised struct {
	path    string        // the command's executable, as resolved here
	status  *os.File      // read end of the status pipe
	write   *os.File      // its write end, until the supervisor started
	done    chan struct{} // closed once the status was read to EOF
	st      supervisor.Status
	readErr error
	ioWait  time.Duration // ExecStage.ioWait
}

// supervisedCmd builds the supervisor command for e. The stage command is
// looked up here, in the runner's PATH, exactly as an unsupervised stage
// would be, so a missing binary fails the same way before anything starts.
func (e *ExecStage) supervisedCmd(grace time.Duration) (*exec.Cmd, *supervised, error) {
	target := exec.Command(e.Command[0], e.Command[1:]...)
	if target.Err != nil {
		return nil, nil, target.Err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	sg := supervisorGrace
	if e.supervisorGrace != nil {
		sg = e.supervisorGrace
	}
	opts := supervisor.Options{
		Grace:     sg(grace),
		ParentPID: os.Getpid(),
		StatusFD:  3, // ExtraFiles[0]
		Path:      target.Path,
		Dir:       e.Dir, // chdir failures then read as unsupervised
		Argv:      e.Command,
	}
	args := append(slices.Clone(e.Supervisor[1:]), opts.Args()...)
	cmd := exec.Command(e.Supervisor[0], args...)
	cmd.ExtraFiles = []*os.File{w}
	return cmd, &supervised{path: target.Path, status: r, write: w, done: make(chan struct{}), ioWait: e.ioWait()}, nil
}

// started closes this process's copy of the status pipe's write end, so
// that the supervisor's exit ends the status, and starts reading it.
// startDone is called when the supervisor has reported its start (or
// ended without one).
func (s *supervised) started(ok bool, startDone func()) {
	s.write.Close()
	if !ok {
		s.status.Close()
		close(s.done)
		startDone()
		return
	}
	go func() {
		s.st, s.readErr = supervisor.ReadStatus(s.status, startDone)
		close(s.done)
	}()
}

// wait waits for the end of the status, which comes when the supervisor
// exited (it keeps the pipe from the command). Whatever else holds it open
// — a Supervisor that is not a supervisor, and its children — gets
// s.ioWait (execIODelay).
func (s *supervised) wait() {
	t := time.NewTimer(s.ioWait)
	defer t.Stop()
	select {
	case <-s.done:
	case <-t.C:
		s.status.Close() // unblocks the read
		<-s.done
	}
	s.status.Close()
}

// result maps what the supervisor reported to RunStage's error. waitErr is
// cmd.Wait's result for the supervisor itself.
func (s *supervised) result(argv0 string, waitErr error, stderrTail string) error {
	s.wait()
	st := s.st
	switch {
	case st.StartErr != 0:
		return startError(argv0, &fs.PathError{Op: "fork/exec", Path: s.path, Err: st.StartErr})
	case st.Ended && st.Signal != 0:
		return execFailed(argv0, "signal: "+st.Signal.String(), stderrTail)
	case st.Ended && st.Code != 0:
		return exitError(argv0, st.Code, stderrTail)
	case st.Ended:
		return nil
	}
	// The supervisor ended without reporting the command's end: killed,
	// or the Supervisor prefix does not start one.
	what := "exited without reporting"
	switch {
	case s.readErr != nil:
		what = s.readErr.Error()
	case waitErr != nil:
		what = waitErr.Error()
	}
	if st.Started {
		what = fmt.Sprintf("supervisor %s (command pid %d)", what, st.PID)
	} else {
		what = fmt.Sprintf("supervisor %s before starting the command", what)
	}
	return execFailed(argv0, what, stderrTail)
}
