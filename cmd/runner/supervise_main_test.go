package main

import (
	"os"
	"syscall"
	"testing"

	"github.com/tasklease/tasklease/jobs"
)

// TestMain lets this test binary host the exec-stage supervisor as the
// runner binary does: `runner serve` run in-process by these tests builds
// exec stages whose supervisor is os.Executable() — the test binary —
// which must act as the supervisor, not run the tests again.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == jobs.SuperviseCommand {
		// syscall.Exit: under -race, os.Exit(0) sleeps a second first,
		// which every supervised stage would pay.
		syscall.Exit(jobs.SuperviseMain(os.Args[2:]))
	}
	os.Exit(m.Run())
}
