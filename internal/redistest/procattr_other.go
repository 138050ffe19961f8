//go:build !linux

package redistest

import "syscall"

// sysProcAttr is a no-op outside Linux: Pdeathsig is Linux-only, so there a
// crashed test binary may leave redis-server running until it is killed.
func sysProcAttr() *syscall.SysProcAttr {
	return nil
}
