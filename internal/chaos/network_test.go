//go:build linux

package chaos

import (
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// TestNetworkFaultsBite: through a runner's proxy, each fault does what it
// says while it lasts, and the connection works again after it.
func TestNetworkFaultsBite(t *testing.T) {
	mr := miniredis.RunT(t)
	n := newNetwork([]string{mr.Addr()})
	defer n.close()
	env, err := n.env("r1")
	if err != nil {
		t.Fatal(err)
	}
	// The runner's config gets `"node": "proxy"` pairs.
	if !strings.HasPrefix(env, addressMapEnv+"=") || !strings.Contains(env, `"`+mr.Addr()+`": "127.0.0.1:`) {
		t.Fatalf("env %q", env)
	}
	proxy := n.proxies["r1"][0].Listen
	rdb := redis.NewClient(&redis.Options{Addr: proxy, ReadTimeout: 300 * time.Millisecond, MaxRetries: -1})
	defer rdb.Close()
	ping := func() error { return rdb.Ping(context.Background()).Err() }
	if err := ping(); err != nil {
		t.Fatalf("PING through the proxy: %v", err)
	}
	// Each fails a PING whose reply must come within 300 ms (the latency
	// is at least 350 ms), and PING works once it is taken away.
	for _, kind := range []string{FaultNetCommandsLost, FaultNetRepliesLost, FaultNetPartition, FaultNetLatency, FaultNetResetPeer} {
		f := pickNetFault(kind, rand.New(rand.NewPCG(1, 2)))
		if err := n.inject("r1", f); err != nil {
			t.Fatal(err)
		}
		if err := ping(); err == nil {
			t.Errorf("%s: PING answered during the fault", kind)
		}
		if err := n.heal("r1", f); err != nil {
			t.Fatal(err)
		}
		if err := ping(); err != nil {
			t.Errorf("%s: PING after the fault: %v", kind, err)
		}
	}
	if !slices.Equal(NetFaultKinds(), FaultKinds()[len(FaultKinds())-6:]) {
		t.Errorf("NetFaultKinds = %v", NetFaultKinds())
	}
}
