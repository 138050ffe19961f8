//go:build linux

package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/redistest"
)

// topology is the Redis deployment under test, as the harness sees it: a
// client to read state with, what the runner processes are told, and the
// faults of Redis itself.
type topology interface {
	// name is the Options.Topology that chose it.
	name() string
	// client reads Redis for the checker (closed at cleanup). Reads are per
	// key, except for SCANs, which go through scanKeys.
	client() redis.UniversalClient
	// runnerEnv is the environment that points a runner process at this
	// Redis; the runners' config reads it (see runnerConfig).
	runnerEnv() []string
	// dataNodes are the addresses of every node that holds data (not the
	// Sentinels), as Redis announces them: the network faults put a proxy
	// in front of each. They stay the same across the topology's faults.
	dataNodes() []string
	// dataFaults are the Redis faults of a run, in order: each ends an
	// epoch (data may be lost).
	dataFaults() []string
	// dataFault makes one of them happen: Redis is serving again when it
	// returns; down is how long a restarted server stays down. With lag,
	// the node that serves after it has a clock lag behind the one it
	// replaces (a failover to a lagging replica). It returns how long
	// Redis took to serve again after the fault began.
	dataFault(t redistest.T, kind string, rng *rand.Rand, down, lag time.Duration) time.Duration
	// clockNodes are the data nodes that run on a clock of their own
	// (none without clock faults).
	clockNodes() []*redistest.Server
	// pause runs CLIENT PAUSE for d on the node that takes the writes (one
	// picked by rng on Cluster).
	pause(t redistest.T, ctx context.Context, rng *rand.Rand, d time.Duration) error
	// unplanned describes the Redis faults that happened without the
	// harness making them ("" if none): the checks assume every data loss
	// ends an epoch, so a run with one is not checkable past it.
	unplanned(ctx context.Context) (string, error)
}

// newTopology starts the Redis of the topology called name. Without
// redis-server it skips t, unless TASKLEASE_REQUIRE_REDIS=1.
func newTopology(t redistest.T, opts Options) (topology, error) {
	t.Helper()
	clocks := !opts.NoClockFaults
	switch name := opts.Topology; name {
	case TopologySingle:
		return startSingle(t, clocks), nil
	case TopologySentinel:
		return startSentinel(t, clocks), nil
	case TopologyCluster:
		return startCluster(t, clocks), nil
	default:
		return nil, fmt.Errorf("unknown topology %q (want %s, %s or %s)", name, TopologySingle, TopologySentinel, TopologyCluster)
	}
}

// single is one redis-server with AOF everysec.
type single struct {
	rs  *redistest.Server
	rdb *redis.Client
}

func startSingle(t redistest.T, clocks bool) *single {
	t.Helper()
	args := []string{"--appendonly", "yes", "--appendfsync", "everysec"}
	var rs *redistest.Server
	if clocks {
		rs = redistest.StartServerWithClock(t, redistest.NewClock(t), args...)
	} else {
		rs = redistest.StartServerWith(t, args...)
	}
	return &single{rs: rs, rdb: rs.Client(t)}
}

// lagBehind sets the clocks of the nodes that may serve next to lag behind
// the clock of from, the node they replace.
func lagBehind(from *redistest.Server, next []*redistest.Server, lag time.Duration) error {
	if lag == 0 || from.Clock() == nil {
		return nil
	}
	for _, n := range next {
		if err := n.Clock().Set(from.Clock().Offset() - lag); err != nil {
			return err
		}
	}
	return nil
}

func (s *single) name() string                  { return TopologySingle }
func (s *single) client() redis.UniversalClient { return s.rdb }

func (s *single) runnerEnv() []string {
	return []string{"TASKLEASE_REDIS_URL=redis://" + s.rs.Addr() + "/0"}
}

func (s *single) dataNodes() []string { return []string{s.rs.Addr()} }

func (s *single) clockNodes() []*redistest.Server { return clocked(s.rs) }

// clocked is those of ns that run on a clock of their own.
func clocked(ns ...*redistest.Server) []*redistest.Server {
	var out []*redistest.Server
	for _, n := range ns {
		if n.Clock() != nil {
			out = append(out, n)
		}
	}
	return out
}

func (s *single) dataFaults() []string {
	return []string{FaultRedisRestartKeepData, FaultRedisRestartEmpty}
}

// dataFault kills the server (a crash) and starts it on the same port,
// from its append-only file or, for FaultRedisRestartEmpty, with the
// files gone.
func (s *single) dataFault(t redistest.T, kind string, _ *rand.Rand, down, lag time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	s.rs.Kill()
	time.Sleep(down)
	if err := lagBehind(s.rs, []*redistest.Server{s.rs}, lag); err != nil {
		t.Fatalf("chaos: %v", err)
	}
	if kind == FaultRedisRestartEmpty {
		if err := s.rs.WipeData(); err != nil {
			t.Fatalf("chaos: %v", err)
		}
	}
	s.rs.Restart(t)
	return time.Since(start)
}

// unplanned: nothing but the harness restarts the single server.
func (s *single) unplanned(context.Context) (string, error) { return "", nil }

func (s *single) pause(_ redistest.T, ctx context.Context, _ *rand.Rand, d time.Duration) error {
	return pauseWrites(ctx, s.rdb, d)
}

// sentinel is a primary, two replicas and three Sentinels.
type sentinel struct {
	st        *redistest.Sentinels
	rdb       *redis.Client
	failovers int64 // the harness's, compared with the Sentinels' count
}

// sentinelDownAfter is the Sentinels' down-after-milliseconds in a chaos
// run. A CLIENT PAUSE WRITE of the primary under load blocks the
// Sentinels' hello PUBLISH, and their PINGs queue behind it: with the
// tests' 1 s, a 2 s pause made the Sentinels fail over on their own (seed
// 1796147927951728737). Writes blocked by the pause then ran on the old
// primary just before it was demoted and were lost, with nothing telling
// the checker a failover had happened. 3 s is above the longest pause
// (2 s) with a margin; a planned failover takes about 4 s.
const sentinelDownAfter = 3 * time.Second

func startSentinel(t redistest.T, clocks bool) *sentinel {
	t.Helper()
	st := redistest.StartSentinelWith(t, redistest.SentinelOptions{DownAfter: sentinelDownAfter, Clocks: clocks})
	return &sentinel{st: st, rdb: st.Client(t)}
}

func (s *sentinel) name() string                  { return TopologySentinel }
func (s *sentinel) client() redis.UniversalClient { return s.rdb }

func (s *sentinel) runnerEnv() []string {
	return []string{"TASKLEASE_REDIS_ADDRS=" + strings.Join(s.st.SentinelAddrs(), ","),
		"TASKLEASE_REDIS_MASTER=" + redistest.SentinelMaster}
}

func (s *sentinel) dataNodes() []string {
	out := []string{s.st.Primary.Addr()}
	for _, r := range s.st.Replicas {
		out = append(out, r.Addr())
	}
	return out
}

func (s *sentinel) clockNodes() []*redistest.Server {
	return clocked(append([]*redistest.Server{s.st.Primary}, s.st.Replicas...)...)
}

func (s *sentinel) dataFaults() []string { return []string{FaultFailover, FaultFailover} }

func (s *sentinel) dataFault(t redistest.T, _ string, _ *rand.Rand, _, lag time.Duration) time.Duration {
	t.Helper()
	// The Sentinels pick the replica to promote: each lags the primary.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	addr, err := s.st.MasterAddr(ctx)
	cancel()
	if err != nil {
		t.Fatalf("chaos: the primary before a failover: %v", err)
	}
	primary := s.st.Server(addr)
	var next []*redistest.Server
	for _, n := range append([]*redistest.Server{s.st.Primary}, s.st.Replicas...) {
		if n != primary {
			next = append(next, n)
		}
	}
	if err := lagBehind(primary, next, lag); err != nil {
		t.Fatalf("chaos: %v", err)
	}
	_, took := s.st.FailOver(t, time.Minute)
	s.failovers++
	return took
}

// unplanned compares the Sentinels' failover count with the harness's.
func (s *sentinel) unplanned(ctx context.Context) (string, error) {
	n, err := s.st.Failovers(ctx)
	if err != nil {
		return "", err
	}
	if n > s.failovers {
		return fmt.Sprintf("the Sentinels made %d failovers, the harness %d", n, s.failovers), nil
	}
	return "", nil
}

func (s *sentinel) pause(_ redistest.T, ctx context.Context, _ *rand.Rand, d time.Duration) error {
	return pauseWrites(ctx, s.rdb, d) // the failover client talks to the primary
}

// cluster is three masters with a replica each.
type cluster struct {
	c   *redistest.Cluster
	rdb *redis.ClusterClient
}

func startCluster(t redistest.T, clocks bool) *cluster {
	t.Helper()
	c := redistest.StartClusterWith(t, redistest.ClusterOptions{Replicas: 1, Clocks: clocks})
	return &cluster{c: c, rdb: c.Client(t)}
}

func (s *cluster) name() string                  { return TopologyCluster }
func (s *cluster) client() redis.UniversalClient { return s.rdb }

func (s *cluster) runnerEnv() []string {
	return []string{"TASKLEASE_REDIS_ADDRS=" + strings.Join(s.c.Addrs(), ",")}
}

func (s *cluster) dataNodes() []string { return s.c.Addrs() }

func (s *cluster) clockNodes() []*redistest.Server { return clocked(s.c.Nodes()...) }

func (s *cluster) dataFaults() []string { return []string{FaultFailover, FaultFailover} }

// partitionMaster is the master serving a partition picked by rng: a
// master without partitions would be a fault nobody notices.
func (s *cluster) partitionMaster(t redistest.T, rng *rand.Rand) *redistest.Server {
	return s.c.MasterOf(t, fmt.Sprintf("{%s:p%d}", keyPrefix, rng.IntN(partitions)))
}

func (s *cluster) dataFault(t redistest.T, _ string, rng *rand.Rand, _, lag time.Duration) time.Duration {
	t.Helper()
	m := s.partitionMaster(t, rng)
	if err := lagBehind(m, s.c.ReplicasOf(t, m), lag); err != nil {
		t.Fatalf("chaos: %v", err)
	}
	return s.c.FailOver(t, m, time.Minute)
}

// unplanned: a paused master still answers on the cluster bus, so no pause
// gets its replica promoted; the cluster epochs, bumped by other events
// too, would not count failovers reliably.
func (s *cluster) unplanned(context.Context) (string, error) { return "", nil }

func (s *cluster) pause(t redistest.T, ctx context.Context, rng *rand.Rand, d time.Duration) error {
	// go-redis routes CLIENT PAUSE to a random node; address the master.
	c := redis.NewClient(&redis.Options{Addr: s.partitionMaster(t, rng).Addr()})
	defer c.Close()
	return pauseWrites(ctx, c, d)
}

// pauseWrites is CLIENT PAUSE <d> WRITE: writes (and scripts) wait, key
// expiry stops, reads and the Sentinels' and replicas' traffic go on. A
// pause of every command past down-after-milliseconds would make the
// Sentinels fail the primary over, another fault.
func pauseWrites(ctx context.Context, c redis.UniversalClient, d time.Duration) error {
	return c.Do(ctx, "CLIENT", "PAUSE", d.Milliseconds(), "WRITE").Err()
}
