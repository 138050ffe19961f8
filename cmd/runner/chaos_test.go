//go:build linux

package main

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/chaos"
	"github.com/tasklease/tasklease/internal/redistest"
)

// TestChaosE2E is the chaos soak of the product as deployed (package
// internal/chaos): three `runner serve` binaries on one real redis-server,
// an http job (bulk) whose downstream checks fencing tokens, an exec job
// (sync) whose stage daemonises helpers, and a cron schedule on bulk for
// every subject. It submits and cancels at random through the runners'
// APIs while it SIGKILLs runners (the cron leader mid-fan-out among them),
// SIGSTOPs them past their lease TTL, and restarts Redis empty once. Then
// it checks: no key is stuck; tokens never go backwards (also across the
// data loss); no descendant of an exec stage survives its stage or its
// runner; every subject gets exactly one request per cron occurrence; no
// two executions of a key overlap unless the older one was refused.
//
// TASKLEASE_CHAOS_E2E=10m runs it longer; TASKLEASE_CHAOS_SEED replays
// the random choices of a run; the runners' logs of a failed run are kept
// in $TMPDIR/tasklease-chaos-e2e-<seed> (TASKLEASE_CHAOS_LOGS=DIR keeps
// them for any run). `go run ./cmd/chaos` runs the same soak.
func TestChaosE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs a chaos soak of runner processes")
	}
	dur := chaos.DurationDefault
	if v := os.Getenv("TASKLEASE_CHAOS_E2E"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < chaos.DurationMin {
			t.Fatalf("TASKLEASE_CHAOS_E2E=%q: want a duration of at least %v", v, chaos.DurationMin)
		}
		dur = d
	}
	seed := time.Now().UnixNano()
	if v := os.Getenv("TASKLEASE_CHAOS_SEED"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("TASKLEASE_CHAOS_SEED=%q: %v", v, err)
		}
		seed = n
	}
	replay := fmt.Sprintf("TASKLEASE_CHAOS_SEED=%d", seed)
	t.Logf("chaos-e2e: seed %d (%s replays the choices), chaos for %v", seed, replay, dur)

	// Skip before the build when chaos.Run would (redistest decides the
	// same way: TASKLEASE_REQUIRE_REDIS=1 makes it fail there instead).
	if _, err := exec.LookPath("redis-server"); err != nil && !redistest.RequireRedis() {
		t.Skip("redis-server not found on PATH (set TASKLEASE_REQUIRE_REDIS=1 to make this fatal)")
	}
	// The clock faults need gcc for redistest's clock shim; without it the
	// soak runs without them (CI has gcc, and the chaos command's short
	// passes make them).
	_, gccErr := exec.LookPath("gcc")
	bin := buildRunner(t, t.TempDir())
	rep, err := chaos.Run(t, chaos.Options{
		NoClockFaults: gccErr != nil && !redistest.RequireRedis(),
		Duration:      dur,
		Runners:       3,
		Keys:          chaos.KeysDefault, // ~200 live runs per partition
		Seed:          seed,
		RunnerBin:     bin,
		Topology:      "single",
		Logf:          func(format string, args ...any) { t.Logf("chaos-e2e: "+format, args...) },
		KeepLogs:      os.Getenv("TASKLEASE_CHAOS_LOGS"),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range rep.Summary() {
		t.Logf("chaos-e2e: %s", l)
	}
	for _, d := range rep.Details {
		t.Errorf("chaos-e2e: %s\n(replay: %s)", d, replay)
	}
}
