//go:build linux

package main

import "syscall"

// runnerProcAttr has the kernel SIGKILL a runner process if the test binary
// dies without cleaning up, so no runner outlives the test.
func runnerProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
