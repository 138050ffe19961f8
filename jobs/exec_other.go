//go:build !linux

package jobs

import (
	"os"
	"reflect"
	"runtime"
	"syscall"
)

// supervisorSupported: the exec supervisor needs Linux (a child subreaper
// and /proc), so ExecStage.Supervisor is ignored here. Stages run in their
// own process group only; descendants that leave it are not tracked.
const supervisorSupported = false

// execSysProcAttr puts the command in its own process group where the OS
// has them. Setpgid is set by name because syscall.SysProcAttr has no such
// field on Windows and this file must build there too. There is no
// Pdeathsig outside Linux: a runner that dies leaves the command running.
// There is never a supervisor here.
func execSysProcAttr(bool) *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{}
	if f := reflect.ValueOf(attr).Elem().FieldByName("Setpgid"); f.IsValid() && f.Kind() == reflect.Bool {
		f.SetBool(true)
	}
	return attr
}

// terminateGroup sends SIGTERM to the process group led by p. Windows has
// no SIGTERM; the grace then just runs out before killGroup.
func terminateGroup(p *os.Process) { signalGroup(p, syscall.SIGTERM) }

// terminateProcess is for a supervisor, which never runs here.
func terminateProcess(p *os.Process) { signalGroup(p, syscall.SIGTERM) }

// killGroup sends SIGKILL to the process group led by p.
func killGroup(p *os.Process) { signalGroup(p, syscall.SIGKILL) }

// hurrySupervisor: there is no supervisor here; the group is killed.
func hurrySupervisor(p *os.Process) { killGroup(p) }

// signalGroup signals the group on Unix (a negative pid makes kill(2)
// target the group) and only the leader on Windows.
func signalGroup(p *os.Process, sig syscall.Signal) {
	if runtime.GOOS == "windows" {
		if sig == syscall.SIGKILL {
			_ = p.Kill()
		}
		return
	}
	if g, err := os.FindProcess(-p.Pid); err == nil {
		_ = g.Signal(sig)
	}
}

// waitExitedNoReap is unsupported here: the caller reaps first and cleans
// up the group afterwards, best effort.
func waitExitedNoReap(int) bool { return false }
