//go:build linux

package chaos

import (
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/redistest"
)

// topology is the Redis deployment under test, as the harness sees it: a
// client to read state with, what the runner processes are told, and the
// data-loss fault.
type topology interface {
	// name is the Options.Topology that chose it.
	name() string
	// client reads Redis for the checker (closed at cleanup). Reads are per
	// key, except for SCANs, which go through scanKeys.
	client() redis.UniversalClient
	// runnerEnv is the environment that points a runner process at this
	// Redis; the runners' config reads it (see runnerConfig).
	runnerEnv() []string
	// restartEmpty makes Redis lose its data: down for about down, then
	// serving again, empty, at the same address(es).
	restartEmpty(t redistest.T, down time.Duration)
}

// newTopology starts the Redis of the topology called name. Without
// redis-server it skips t, unless TASKLEASE_REQUIRE_REDIS=1.
func newTopology(t redistest.T, name string) (topology, error) {
	t.Helper()
	switch name {
	case "single":
		return startSingle(t), nil
	default:
		return nil, fmt.Errorf("topology %q is not implemented (want %q)", name, "single")
	}
}

// single is one redis-server.
type single struct {
	rs  *redistest.Server
	rdb *redis.Client
}

func startSingle(t redistest.T) *single {
	t.Helper()
	rs := redistest.StartServer(t)
	return &single{rs: rs, rdb: rs.Client(t)}
}

func (s *single) name() string                  { return "single" }
func (s *single) client() redis.UniversalClient { return s.rdb }

func (s *single) runnerEnv() []string {
	return []string{"TASKLEASE_REDIS_URL=redis://" + s.rs.Addr() + "/0"}
}

// restartEmpty kills the server (a crash: nothing is saved, and it is
// configured without persistence anyway) and starts it on the same port.
func (s *single) restartEmpty(t redistest.T, down time.Duration) {
	t.Helper()
	s.rs.Kill()
	time.Sleep(down)
	s.rs.Restart(t)
}
