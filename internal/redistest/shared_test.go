package redistest

import (
	"context"
	"errors"
	"os"
	"testing"
)

// TestSharedCluster: every caller gets the same cluster, which outlives the
// test that started it; StopShared stops its nodes and removes its
// directory.
func TestSharedCluster(t *testing.T) {
	t.Cleanup(StopShared) // whatever happens below
	var first *Cluster
	t.Run("starts", func(t *testing.T) { first = SharedCluster(t) })
	if first == nil {
		t.Fatal("the first caller got no cluster")
	}
	// The subtest that started it has ended and run its cleanups.
	c := SharedCluster(t)
	if c != first {
		t.Fatal("a second caller got another cluster")
	}
	ctx := context.Background()
	cc := c.Client(t)
	for _, k := range []string{"{a}x", "{b}x", "{c}x"} { // three slots
		if err := cc.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatalf("SET %s on the shared cluster: %v", k, err)
		}
	}
	if !OnSharedCluster(cc) {
		t.Error("OnSharedCluster(a client of the shared cluster) = false")
	}
	if OnSharedCluster(StartMini(t).Client(t)) {
		t.Error("OnSharedCluster(a miniredis client) = true")
	}
	addrs, dir := c.Addrs(), c.nodes[0].dir

	StopShared()
	if OnSharedCluster(cc) {
		t.Error("OnSharedCluster after StopShared = true")
	}
	for _, a := range addrs {
		if err := ping(a); err == nil {
			t.Errorf("node %s answers PING after StopShared", a)
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory %s still there after StopShared: %v", dir, err)
	}
	StopShared() // idempotent
}
