package jobs

import (
	"os"
	"syscall"
	"testing"

	"github.com/tasklease/tasklease/internal/redistest"
)

// TestMain lets this test binary host the exec supervisor exactly as
// cmd/runner's main does: re-executed as `jobs.test __tasklease-supervise
// ...` it is the supervisor, so tests set ExecStage.Supervisor to
// testSupervisor() and need no marker in the stage's environment.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == SuperviseCommand {
		// syscall.Exit: under -race os.Exit(0) runs the race runtime's
		// finaliser, which sleeps a second (GORACE atexit_sleep_ms) — in
		// every successful supervised command.
		syscall.Exit(SuperviseMain(os.Args[2:]))
	}
	code := m.Run()
	redistest.StopShared() // the package's shared cluster (redistest.WithSharedCluster)
	os.Exit(code)
}
