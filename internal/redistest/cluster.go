package redistest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
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

	// replicaSyncTimeout bounds the replicas' first full sync and the
	// gossip that tells every node about the roles.
	replicaSyncTimeout = 20 * time.Second

	// clusterPollStep is the interval between cluster state probes: short,
	// since failover tests time the cluster with it.
	clusterPollStep = 20 * time.Millisecond
)

// Cluster is a real Redis Cluster of 3 masters (and, from
// StartClusterWithReplicas, one replica each) on loopback ports.
type Cluster struct {
	nodes []*Server
	// replicaOf maps each replica's address to its master's as created;
	// empty without replicas.
	replicaOf map[string]string
}

// StartCluster starts three cluster-enabled redis-server processes, joins them
// with `redis-cli --cluster create` (no replicas) and waits until every node
// reports cluster_state:ok with all 16384 slots assigned. It skips the test
// when redis-server or redis-cli is not on PATH, unless
// TASKLEASE_REQUIRE_REDIS=1. All nodes are stopped when the test ends.
func StartCluster(t T) *Cluster {
	t.Helper()
	return StartClusterWith(t, ClusterOptions{})
}

// ClusterOptions tune StartClusterWith.
type ClusterOptions struct {
	// Replicas per master: 0 or 1 (StartClusterWithReplicas).
	Replicas int
	// Clocks runs each node on a Clock of its own (Server.Clock), offset
	// 0 at start.
	Clocks bool
}

// StartClusterWithReplicas is StartCluster with one replica per master
// (`--cluster-replicas 1`, six nodes), for failover tests: it also waits
// until every replica has synced with its master and every node agrees on
// the roles, so a killed master's replica can be promoted (see MasterOf,
// Server.Kill and WaitFailover).
func StartClusterWithReplicas(t T) *Cluster {
	t.Helper()
	return StartClusterWith(t, ClusterOptions{Replicas: 1})
}

// StartClusterWith is StartCluster with opts.
func StartClusterWith(t T, opts ClusterOptions) *Cluster {
	t.Helper()
	replicas := opts.Replicas
	bin := requireBinary(t, "redis-server")
	cli := requireBinary(t, "redis-cli")
	dir := t.TempDir()

	c := &Cluster{replicaOf: map[string]string{}}
	var cs clocks
	for range clusterMasters * (1 + replicas) {
		s := newServer(t, bin, dir, func(port int) []string {
			args := []string{
				"--cluster-enabled", "yes",
				"--cluster-config-file", filepath.Join(dir, fmt.Sprintf("nodes-%d.conf", port)),
				// Short enough for failure tests, long enough not to flap
				// on a loaded CI machine.
				"--cluster-node-timeout", "2000",
			}
			if replicas > 0 {
				// A master waits 5 s by default before the first sync,
				// for more replicas to join it; there is only one.
				args = append(args, "--repl-diskless-sync-delay", "0")
			}
			return args
		})
		if opts.Clocks {
			cs.give(t, s)
		}
		s.startOnFreePort(t, freeClusterPort)
		c.nodes = append(c.nodes, s)
	}

	ctx, cancel := context.WithTimeout(context.Background(), clusterReadyTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli %s: %v\n%s%s", strings.Join(args, " "), err, out, c.logs())
	}
	if err := c.waitReady(ctx); err != nil {
		t.Fatalf("redistest: cluster %v not ready: %v%s", c.Addrs(), err, c.logs())
	}
	if replicas > 0 {
		// A replica that has not synced yet cannot be promoted, and
		// replicas start syncing only after create returns.
		sctx, cancel := context.WithTimeout(context.Background(), replicaSyncTimeout)
		defer cancel()
		if err := c.waitReplicas(sctx); err != nil {
			t.Fatalf("redistest: cluster %v replicas not ready: %v%s", c.Addrs(), err, c.logs())
		}
	}
	return c
}

// freeClusterPort returns a free port whose bus port (port+10000) is free
// too and still a valid port, since redis-server needs both.
func freeClusterPort(t T) int {
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
	return infoFields(raw), nil
}

// logs renders every node's log for a failure message.
func (c *Cluster) logs() string {
	var b strings.Builder
	for _, s := range c.nodes {
		fmt.Fprintf(&b, "\n--- log of %s ---\n%s", s.Addr(), s.log.String())
	}
	return b.String()
}

// Addrs returns the "127.0.0.1:PORT" addresses of the nodes as started
// (all masters, unless started with replicas).
func (c *Cluster) Addrs() []string { return addrsOf(c.nodes) }

// addrsOf returns the servers' addresses.
func addrsOf(servers []*Server) []string {
	addrs := make([]string, len(servers))
	for i, s := range servers {
		addrs[i] = s.Addr()
	}
	return addrs
}

// infoFields parses an INFO or CLUSTER INFO reply into its "key:value"
// fields.
func infoFields(raw string) map[string]string {
	info := make(map[string]string)
	for _, line := range strings.Split(raw, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			info[k] = v
		}
	}
	return info
}

// Client returns a new go-redis cluster client seeded with all nodes,
// closed when the test ends.
func (c *Cluster) Client(t T) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// nodeLine is one line of CLUSTER NODES.
type nodeLine struct {
	id, addr, master string // master: the master's id for a replica, "-" otherwise
	flags            map[string]bool
	slots            bool
}

// clusterNodes returns CLUSTER NODES as seen by addr.
func clusterNodes(ctx context.Context, addr string) ([]nodeLine, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
	defer c.Close()
	raw, err := c.ClusterNodes(ctx).Result()
	if err != nil {
		return nil, err
	}
	var out []nodeLine
	for _, line := range strings.Split(strings.TrimSpace(raw), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, fmt.Errorf("CLUSTER NODES line %q", line)
		}
		n := nodeLine{id: f[0], master: f[3], flags: map[string]bool{}, slots: len(f) > 8}
		n.addr, _, _ = strings.Cut(f[1], "@") // ip:port@cport[,hostname]
		for _, fl := range strings.Split(f[2], ",") {
			n.flags[fl] = true
		}
		out = append(out, n)
	}
	return out, nil
}

// waitReplicas polls until every node sees clusterMasters masters with
// slots and a replica for each, none of them failing, and every replica's
// link to its master is up; then it records who replicates whom.
func (c *Cluster) waitReplicas(ctx context.Context) error {
	for {
		err := c.checkReplicas(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(clusterPollStep):
		}
	}
}

func (c *Cluster) checkReplicas(ctx context.Context) error {
	var view []nodeLine
	for _, addr := range c.Addrs() {
		nodes, err := clusterNodes(ctx, addr)
		if err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
		masters, replicas := 0, 0
		for _, n := range nodes {
			for _, bad := range []string{"fail", "fail?", "handshake", "noaddr"} {
				if n.flags[bad] {
					return fmt.Errorf("%s sees %s as %s", addr, n.addr, bad)
				}
			}
			switch {
			case n.flags["master"] && n.slots:
				masters++
			case n.flags["slave"] && n.master != "-":
				replicas++
			}
		}
		if masters != clusterMasters || replicas != len(c.nodes)-clusterMasters {
			return fmt.Errorf("%s sees %d masters and %d replicas, want %d and %d",
				addr, masters, replicas, clusterMasters, len(c.nodes)-clusterMasters)
		}
		view = nodes
	}
	byID := map[string]string{}
	for _, n := range view {
		byID[n.id] = n.addr
	}
	replicaOf := map[string]string{}
	for _, n := range view {
		if !n.flags["slave"] {
			continue
		}
		info, err := replicationInfo(ctx, n.addr)
		if err != nil {
			return fmt.Errorf("%s: %w", n.addr, err)
		}
		if info["master_link_status"] != "up" || info["master_sync_in_progress"] != "0" {
			return fmt.Errorf("replica %s: master_link_status=%q master_sync_in_progress=%q",
				n.addr, info["master_link_status"], info["master_sync_in_progress"])
		}
		replicaOf[n.addr] = byID[n.master]
	}
	c.replicaOf = replicaOf
	return nil
}

// replicationInfo returns INFO replication of addr as key/value pairs.
func replicationInfo(ctx context.Context, addr string) (map[string]string, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
	defer c.Close()
	raw, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return nil, err
	}
	return infoFields(raw), nil
}

// running reports whether the server's process is alive.
func (s *Server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runningLocked()
}

// node returns the node listening on addr, nil if none.
func (c *Cluster) node(addr string) *Server {
	for _, s := range c.nodes {
		if s.Addr() == addr {
			return s
		}
	}
	return nil
}

// live returns the nodes whose process is running.
func (c *Cluster) live() []*Server {
	var out []*Server
	for _, s := range c.nodes {
		if s.running() {
			out = append(out, s)
		}
	}
	return out
}

// slotOwner returns the master that addr's CLUSTER SLOTS names for slot.
func slotOwner(ctx context.Context, addr string, slot int64) (string, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
	defer c.Close()
	slots, err := c.ClusterSlots(ctx).Result()
	if err != nil {
		return "", err
	}
	for _, r := range slots {
		if int64(r.Start) <= slot && slot <= int64(r.End) && len(r.Nodes) > 0 {
			return r.Nodes[0].Addr, nil
		}
	}
	return "", fmt.Errorf("slot %d not served", slot)
}

// MasterOf returns the node that masters key's slot now, as the first live
// node's CLUSTER SLOTS says.
func (c *Cluster) MasterOf(t T, key string) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	live := c.live()
	if len(live) == 0 {
		t.Fatal("redistest: MasterOf: no node is running")
	}
	addr := live[0].Addr()
	cc := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer cc.Close()
	slot, err := cc.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatalf("redistest: CLUSTER KEYSLOT %s on %s: %v", key, addr, err)
	}
	owner, err := slotOwner(ctx, addr, slot)
	if err != nil {
		t.Fatalf("redistest: owner of slot %d on %s: %v", slot, addr, err)
	}
	s := c.node(owner)
	if s == nil {
		t.Fatalf("redistest: slot %d is served by %s, not a node of this cluster", slot, owner)
	}
	return s
}

// ReplicaOf returns the replica of master as the cluster was created, nil
// when it has none.
func (c *Cluster) ReplicaOf(master *Server) *Server {
	for replica, m := range c.replicaOf {
		if m == master.Addr() {
			return c.node(replica)
		}
	}
	return nil
}

// WaitFailover waits, after dead (a master) was killed or paused, until
// the cluster has promoted dead's replica: every other running node reports
// cluster_state:ok, serves no slot from dead and names the replica the
// master of dead's slots. It returns the promoted node, or fails the test after timeout.
// The cluster is probed every clusterPollStep, so the return time is when
// the cluster recovered, to within a probe.
func (c *Cluster) WaitFailover(t T, dead *Server, timeout time.Duration) *Server {
	t.Helper()
	replica := c.ReplicaOf(dead)
	if replica == nil {
		t.Fatalf("redistest: WaitFailover: %s has no replica (start the cluster with StartClusterWithReplicas)", dead.Addr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		err := c.checkFailover(ctx, dead.Addr(), replica.Addr())
		if err == nil {
			return replica
		}
		select {
		case <-ctx.Done():
			t.Fatalf("redistest: %s not failed over to %s within %s: %v%s", dead.Addr(), replica.Addr(), timeout, err, c.logs())
		case <-time.After(clusterPollStep):
		}
	}
}

func (c *Cluster) checkFailover(ctx context.Context, dead, replica string) error {
	for _, s := range c.live() {
		addr := s.Addr()
		if addr == dead { // paused rather than killed: it answers nothing
			continue
		}
		info, err := clusterInfo(ctx, addr)
		if err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
		if info["cluster_state"] != "ok" {
			return fmt.Errorf("%s: cluster_state=%q", addr, info["cluster_state"])
		}
		nodes, err := clusterNodes(ctx, addr)
		if err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
		promoted := false
		for _, n := range nodes {
			if n.addr == dead && n.slots {
				return fmt.Errorf("%s still sees slots on %s", addr, dead)
			}
			if n.addr == replica && n.flags["master"] && n.slots {
				promoted = true
			}
		}
		if !promoted {
			return fmt.Errorf("%s does not see %s as a master with slots yet", addr, replica)
		}
	}
	return nil
}

// ReplicasOf returns the running replicas of master now, as the master's
// CLUSTER NODES says: the nodes a failover of master may promote.
func (c *Cluster) ReplicasOf(t T, master *Server) []*Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nodes, err := clusterNodes(ctx, master.Addr())
	if err != nil {
		t.Fatalf("redistest: CLUSTER NODES on %s: %v", master.Addr(), err)
	}
	id := ""
	for _, n := range nodes {
		if n.flags["myself"] {
			id = n.id
		}
	}
	var out []*Server
	for _, n := range nodes {
		if n.master == id && id != "" && !n.flags["fail"] {
			if s := c.node(n.addr); s != nil && s.running() {
				out = append(out, s)
			}
		}
	}
	return out
}

// Nodes returns every node, running or not.
func (c *Cluster) Nodes() []*Server { return slices.Clone(c.nodes) }
