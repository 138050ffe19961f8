//go:build linux

package jobs

import (
	"os"
	"syscall"
	"unsafe"

	"github.com/tasklease/tasklease/internal/supervisor"
)

// supervisorSupported: ExecStage.Supervisor is used here.
const supervisorSupported = true

// execSysProcAttr puts the command (or its supervisor) in its own process
// group, so it can be signalled as a whole, and has the kernel signal it if
// the runner dies: an orphan must never race the next lease holder. An
// unsupervised command gets SIGKILL; a supervisor gets its DeathSignal, on
// which it SIGKILLs every descendant before it exits.
//
// The signal fires when the thread that forked the process exits, which is
// why startExec forks from a locked thread.
func execSysProcAttr(supervised bool) *syscall.SysProcAttr {
	sig := syscall.SIGKILL
	if supervised {
		sig = supervisor.DeathSignal
	}
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: sig}
}

// terminateProcess sends SIGTERM to p alone (a supervisor forwards it).
func terminateProcess(p *os.Process) { _ = syscall.Kill(p.Pid, syscall.SIGTERM) }

// terminateGroup sends SIGTERM to the process group led by p.
func terminateGroup(p *os.Process) { _ = syscall.Kill(-p.Pid, syscall.SIGTERM) }

// killGroup sends SIGKILL to the process group led by p. ESRCH (the group is
// already empty) is expected and ignored.
func killGroup(p *os.Process) { _ = syscall.Kill(-p.Pid, syscall.SIGKILL) }

// hurrySupervisor sends a supervisor its DeathSignal: SIGKILL every
// descendant now, then exit.
func hurrySupervisor(p *os.Process) { _ = syscall.Kill(p.Pid, supervisor.DeathSignal) }

// pPID is waitid's P_PID id type.
const pPID = 1

// waitExitedNoReap blocks until the child pid has exited, leaving it a
// zombie (WNOWAIT) so its pid, and so the group id, stays reserved until
// cmd.Wait reaps it. It reports false if waitid failed.
func waitExitedNoReap(pid int) bool {
	var info [128]byte // siginfo_t; contents unused
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid),
			uintptr(unsafe.Pointer(&info)), syscall.WEXITED|syscall.WNOWAIT, 0, 0)
		if errno == syscall.EINTR {
			continue
		}
		return errno == 0
	}
}
