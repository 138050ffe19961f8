//go:build linux

package redistest

import "syscall"

// sysProcAttr puts redis-server in its own process group, so a terminal ^C
// aimed at `go test` is handled by our cleanup rather than racing it, and
// has the kernel SIGKILL it if the test binary dies without cleaning up.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
