package redistest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// clusterMasters is the smallest cluster redis-cli --cluster create
	// accepts without replicas.
	clusterMasters = 3

	// clusterReadyTimeout bounds cluster creation plus gossip convergence.
	clusterReadyTimeout = 20 * time.Second

	// busPortOffset is the fixed offset Redis uses for the cluster bus port.
	busPortOffset = 10000
)

// Cluster is a real 3-master Redis Cluster on loopback ports.
type Cluster struct {
	nodes []*Server
}

// StartCluster starts three cluster-enabled redis-server processes, joins them
// with `redis-cli --cluster create` (no replicas) and waits until every node
// reports cluster_state:ok with all 16384 slots assigned. It skips the test
// when redis-server or redis-cli is not on PATH, unless
// TASKLEASE_REQUIRE_REDIS=1. All nodes are stopped when the test ends.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	bin := requireBinary(t, "redis-server")
	cli := requireBinary(t, "redis-cli")
	dir := t.TempDir()

	c := &Cluster{}
	for range clusterMasters {
		s := newServer(t, bin, dir, func(port int) []string {
			return []string{
				"--cluster-enabled", "yes",
				"--cluster-config-file", filepath.Join(dir, fmt.Sprintf("nodes-%d.conf", port)),
				// Short enough for failure tests, long enough not to flap
				// on a loaded CI machine.
				"--cluster-node-timeout", "2000",
			}
		})
		s.startOnFreePort(t, freeClusterPort)
		c.nodes = append(c.nodes, s)
	}

	ctx, cancel := context.WithTimeout(context.Background(), clusterReadyTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli %s: %v\n%s%s", strings.Join(args, " "), err, out, c.logs())
	}
	if err := c.waitReady(ctx); err != nil {
		t.Fatalf("redistest: cluster %v not ready: %v%s", c.Addrs(), err, c.logs())
	}
	return c
}

// freeClusterPort returns a free port whose bus port (port+10000) is free
// too and still a valid port, since redis-server needs both.
func freeClusterPort(t testing.TB) int {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("redistest: find free port: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		ok := false
		if port+busPortOffset <= 65535 {
			if bus, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+busPortOffset))); err == nil {
				_ = bus.Close()
				ok = true
			}
		}
		_ = l.Close()
		if ok {
			return port
		}
	}
	t.Fatalf("redistest: no free port with a free cluster bus port (+%d)", busPortOffset)
	return 0
}

// waitReady polls every node until it sees a healthy, fully covered cluster
// of all nodes, or ctx expires.
func (c *Cluster) waitReady(ctx context.Context) error {
	want := map[string]string{
		"cluster_state":          "ok",
		"cluster_slots_assigned": "16384",
		"cluster_slots_ok":       "16384",
		"cluster_known_nodes":    strconv.Itoa(len(c.nodes)),
	}
	for {
		err := c.checkReady(ctx, want)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *Cluster) checkReady(ctx context.Context, want map[string]string) error {
	for _, addr := range c.Addrs() {
		info, err := clusterInfo(ctx, addr)
		if err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
		for k, v := range want {
			if info[k] != v {
				return fmt.Errorf("%s: %s=%q, want %q", addr, k, info[k], v)
			}
		}
	}
	return nil
}

// clusterInfo returns CLUSTER INFO of addr as key/value pairs.
func clusterInfo(ctx context.Context, addr string) (map[string]string, error) {
	// No retries and short timeouts: the caller polls anyway.
	c := redis.NewClient(&redis.Options{
		Addr:        addr,
		MaxRetries:  -1,
		DialTimeout: time.Second,
		ReadTimeout: time.Second,
	})
	defer c.Close()
	raw, err := c.ClusterInfo(ctx).Result()
	if err != nil {
		return nil, err
	}
	info := make(map[string]string)
	for _, line := range strings.Split(raw, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			info[k] = v
		}
	}
	return info, nil
}

// logs renders every node's log for a failure message.
func (c *Cluster) logs() string {
	var b strings.Builder
	for _, s := range c.nodes {
		fmt.Fprintf(&b, "\n--- log of %s ---\n%s", s.Addr(), s.log.String())
	}
	return b.String()
}

// Addrs returns the "127.0.0.1:PORT" addresses of the masters.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		addrs[i] = s.Addr()
	}
	return addrs
}

// Client returns a new go-redis cluster client seeded with all masters,
// closed when the test ends.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}
