//go:build linux

package supervisor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DeathSignal is the parent-death signal the runner arms for the
// supervisor: it means the runner is gone and the lease will pass to
// another runner, so every descendant is SIGKILLed at once. It is not
// SIGTERM (which asks for a graceful stop) and not SIGKILL (which the
// supervisor could not catch to clean up). SIGHUP was not chosen because
// nohup leaves it ignored and terminals send it on hangup. It may arrive
// more than once (the kernel sends it again each time the orphan is
// re-parented while the dying parent's threads exit); handling it is
// idempotent.
const DeathSignal = syscall.SIGUSR1

const (
	// supervisorNice is a supervisor's niceness once it has sent its
	// SIGKILLs: the lowest (see lowerPriority).
	supervisorNice = 19
	// leftoverGrace is the SIGTERM→SIGKILL delay for what the command left
	// behind when it exited by itself (capped by --grace).
	leftoverGrace = 200 * time.Millisecond
	// killTimeout bounds the wait for SIGKILLed descendants to die. Only a
	// process stuck in the kernel (D state) takes longer; it then runs no
	// more user code, and the supervisor exits rather than block the stage.
	killTimeout = 5 * time.Second
	// rewalkEvery is the re-walk interval while killing. Each reaped child
	// triggers a walk at once (its orphans are now the supervisor's), so
	// the timer is only the backstop for a fork that raced the kill. It
	// started at 5 ms and doubled; on a host where hundreds of supervisors
	// wait for the CPU, those walks were most of their cost.
	rewalkEvery = 100 * time.Millisecond
)

// Main runs the supervisor with the arguments after the host's supervise
// subcommand (see the package documentation) and returns the exit code.
func Main(args []string) int {
	o, err := ParseArgs(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "tasklease supervisor: %v\nusage: ... [--grace=DURATION] [--ppid=PID] [--status-fd=FD] [--path=FILE] [--dir=DIR] -- COMMAND [ARG...]\n", err)
		return 2
	}
	s := &supervisor{
		opts:      o,
		self:      os.Getpid(),
		procRoot:  "/proc",
		cmdExited: make(chan struct{}),
		allGone:   make(chan struct{}),
		reaped:    make(chan struct{}, 1),
	}
	return s.run()
}

type supervisor struct {
	opts     Options
	self     int
	procRoot string
	status   *os.File
	sigs     chan os.Signal
	cmdPID   int

	// cmdExited is closed by the reaper once the command is reaped, with
	// its status in cmdStatus.
	cmdExited chan struct{}
	cmdStatus syscall.WaitStatus
	// allGone is closed by the reaper once wait4 reports no child: as a
	// subreaper, that means no descendant is left at all.
	allGone chan struct{}
	// reaped gets a token (dropped if one is pending) each time a child is
	// reaped: what it left running is now the supervisor's child.
	reaped chan struct{}

	// walk lists the live descendants: along the kernel's children lists
	// where it has them, else by scanning /proc.
	walk   func() ([]proc, error)
	noProc bool // /proc could not be listed (warned once)
}

func (s *supervisor) run() int {
	// The command's parent-death signal fires when the thread that forked
	// it exits; this one is never released.
	runtime.LockOSThread()
	if fd := s.opts.StatusFD; fd >= 0 {
		syscall.CloseOnExec(fd) // inherited without it: keep it from the command
		s.status = os.NewFile(uintptr(fd), "status")
	}
	// Before anything is started: a signal from now on is queued, not lost.
	s.sigs = make(chan os.Signal, 8)
	signal.Notify(s.sigs, syscall.SIGTERM, syscall.SIGINT, DeathSignal)
	if p := s.opts.ParentPID; p > 0 && os.Getppid() != p {
		// The runner died before the parent-death signal could be caught
		// (the Go runtime drops an unrequested SIGUSR1).
		fmt.Fprintf(os.Stderr, "tasklease supervisor: parent %d is gone; not starting %s\n", p, s.opts.Argv[0])
		return 1
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "tasklease supervisor: cannot become a child subreaper (%v): daemonised descendants may escape\n", err)
	}
	if hasChildrenLists(s.procRoot, s.self) {
		s.walk = func() ([]proc, error) { return treeDescendants(s.procRoot, s.self) }
	} else {
		s.walk = func() ([]proc, error) { return descendants(s.procRoot, s.self) }
	}

	pid, err := s.start()
	if err != nil {
		errno := startErrno(err)
		s.report("start-error %d", int(errno))
		fmt.Fprintf(os.Stderr, "tasklease supervisor: start %s: %v\n", s.opts.Argv[0], err)
		if errno == syscall.ENOENT {
			return 127
		}
		return 126
	}
	s.cmdPID = pid
	s.report("started %d", pid)
	go s.reap()

	select {
	case <-s.cmdExited:
		// Whatever it left behind gets a short grace.
		s.stop(min(leftoverGrace, s.opts.Grace))
	case sig := <-s.sigs:
		if sig == DeathSignal {
			s.stop(0)
		} else {
			s.stop(s.opts.Grace)
		}
	}
	ws := syscall.WaitStatus(syscall.SIGKILL) // "killed by SIGKILL", if stuck
	select {
	case <-s.cmdExited: // always, unless killAll gave up on it
		ws = s.cmdStatus
	default:
	}
	if ws.Signaled() {
		s.report("signal %d", int(ws.Signal()))
		return 128 + int(ws.Signal())
	}
	s.report("exit %d", ws.ExitStatus())
	return ws.ExitStatus()
}

// start starts the command: same process group as the supervisor (so the
// runner's backstop SIGKILL to the group reaches it), stdin /dev/null,
// stdout and stderr inherited, and SIGKILL if the supervisor dies.
func (s *supervisor) start() (int, error) {
	path := s.opts.Path
	if path == "" {
		var err error
		if path, err = exec.LookPath(s.opts.Argv[0]); err != nil {
			return 0, err
		}
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return 0, err
	}
	defer devnull.Close()
	return syscall.ForkExec(path, s.opts.Argv, &syscall.ProcAttr{
		Dir:   s.opts.Dir,
		Env:   os.Environ(),
		Files: []uintptr{devnull.Fd(), 1, 2},
		Sys:   &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
	})
}

// lowerPriority sets every thread of the supervisor to niceness
// supervisorNice once its first SIGKILLs are sent. A pod that dies with
// hundreds of stages wakes hundreds of supervisors at once; at the
// runner's niceness they would share the CPU one to one with the
// surviving runners and their Redis, and starve the lease renewals that
// keep the survivors' runs (issue 1/6). The kills themselves go out first
// at full priority, so the stage's processes are gone at once; what
// remains — reaping, walking again for a fork that raced the kill, exiting
// — can wait. Linux keeps a niceness per thread; a thread the Go runtime
// starts later inherits its creator's. The processes being killed keep
// theirs, so they die at once. Measured on a 2-core VM: lowered before
// the first walk instead, a starved supervisor could leave a stage's
// processes alive 5 s after its runner died; never lowered, the
// survivors lost 250–360 leases.
func (s *supervisor) lowerPriority() {
	d, err := os.Open(filepath.Join(s.procRoot, strconv.Itoa(s.self), "task"))
	if err != nil {
		return
	}
	tids, _ := d.Readdirnames(-1)
	d.Close()
	for _, t := range tids {
		if tid, err := strconv.Atoi(t); err == nil {
			_ = unix.Setpriority(unix.PRIO_PROCESS, tid, supervisorNice)
		}
	}
}

// startErrno maps a start failure to the errno reported to the runner.
func startErrno(err error) syscall.Errno {
	var errno syscall.Errno
	switch {
	case errors.As(err, &errno):
		return errno
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, exec.ErrDot), errors.Is(err, fs.ErrNotExist):
		return syscall.ENOENT
	case errors.Is(err, fs.ErrPermission):
		return syscall.EACCES
	}
	return syscall.EINVAL
}

// report writes one status line; a runner that is gone cannot read it, and
// that is fine.
func (s *supervisor) report(format string, args ...any) {
	if s.status != nil {
		_, _ = fmt.Fprintf(s.status, format+"\n", args...)
	}
}

// reap reaps every child — the command, and each orphan re-parented to
// the supervisor — until there is none. It is the only caller of wait.
func (s *supervisor) reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil { // ECHILD
			close(s.allGone)
			return
		}
		if pid == s.cmdPID {
			s.cmdStatus = ws
			close(s.cmdExited)
		}
		select {
		case s.reaped <- struct{}{}:
		default:
		}
	}
}

// stop ends every descendant: SIGTERM (and SIGCONT, for stopped ones),
// up to grace to exit, then SIGKILL. DeathSignal cuts the grace short; a
// repeated SIGTERM changes nothing. With grace 0 it SIGKILLs at once.
func (s *supervisor) stop(grace time.Duration) {
	if grace > 0 {
		s.signalAll(syscall.SIGTERM, syscall.SIGCONT)
		t := time.NewTimer(grace)
		defer t.Stop()
	wait:
		for {
			select {
			case <-s.allGone:
				return
			case <-t.C:
				break wait
			case sig := <-s.sigs:
				if sig == DeathSignal {
					break wait
				}
			}
		}
	}
	s.killAll()
}

// killAll SIGKILLs every descendant, walking /proc again until none is
// left: a process may fork between a walk and its kill, and its children
// are re-parented to the supervisor when it dies.
func (s *supervisor) killAll() {
	deadline := time.NewTimer(killTimeout)
	defer deadline.Stop()
	for first := true; ; first = false {
		listed := s.signalAll(syscall.SIGKILL)
		if first {
			s.lowerPriority()
		}
		if !listed {
			// No /proc: the command is all this process can name. Once it
			// is reaped the supervisor exits and the runner SIGKILLs the
			// process group, which is today's guarantee without a
			// supervisor.
			select {
			case <-s.cmdExited:
				return
			default:
			}
		}
		t := time.NewTimer(rewalkEvery)
		select {
		case <-s.allGone:
			t.Stop()
			return
		case <-s.reaped:
		case <-deadline.C:
			t.Stop()
			ps, _ := s.walk()
			fmt.Fprintf(os.Stderr, "tasklease supervisor: %d descendants still alive %v after SIGKILL; giving up\n", len(ps), killTimeout)
			return
		case <-t.C:
		}
		t.Stop()
	}
}

// signalAll sends each signal to every live descendant. It reports false
// if /proc could not be listed; it then signals the command alone (and, for
// a catchable signal, the process group).
func (s *supervisor) signalAll(sigs ...syscall.Signal) bool {
	ps, err := s.walk()
	if err != nil {
		if !s.noProc {
			s.noProc = true
			fmt.Fprintf(os.Stderr, "tasklease supervisor: cannot list processes (%v): only the command and its process group are signalled\n", err)
		}
		select {
		case <-s.cmdExited: // reaped: its pid may be reused
		default:
			for _, sig := range sigs {
				_ = syscall.Kill(s.cmdPID, sig)
			}
		}
		for _, sig := range sigs {
			if sig != syscall.SIGKILL { // the supervisor catches or ignores these
				_ = syscall.Kill(0, sig)
			}
		}
		return false
	}
	for _, sig := range sigs {
		for _, p := range ps {
			signalProc(s.procRoot, p, sig)
		}
	}
	return true
}
