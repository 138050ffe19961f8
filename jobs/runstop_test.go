package jobs

import (
	"context"
	"testing"

	"github.com/tasklease/tasklease/internal/redistest"
)

// TestRunStoppedWhileStartingReturnsNil: a runner whose context ends
// before it has subscribed to cancels (a pod stopped as it starts; CI
// caught it on Cluster, where the subscription takes a round trip per
// master) shuts down like one stopped later — Run returns nil.
func TestRunStoppedWhileStartingReturnsNil(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			e := newEnv(t, b.Client, Config{Prefix: "rs", Partitions: 2, Jobs: []Job{clJob("course_sync", Stage{Name: "pulling", Handler: &counter{}})}})
			rn, err := NewRunner(e.reg, RunnerConfig{})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if err := rn.Run(ctx); err != nil {
				t.Fatalf("Run with its context ended: %v, want nil", err)
			}
		})
	}
}
