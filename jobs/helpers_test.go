package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/lua"
)

// testEnv is a registry (and optional runners) on one Redis.
type testEnv struct {
	t   *testing.T
	rdb redis.UniversalClient
	reg *Registry
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("TASKLEASE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func newEnv(t *testing.T, rdb redis.UniversalClient, cfg Config) *testEnv {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	if cfg.Partitions == 0 {
		cfg.Partitions = 4
	}
	reg, err := NewRegistry(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if redistest.OnSharedCluster(rdb) {
		// The shared cluster (redistest.WithSharedCluster) outlives the
		// test: remove the test's keys when it ends (after the runners it
		// starts from here on have stopped), so a rerun (-count) finds
		// none.
		t.Cleanup(func() { deletePrefix(t, rdb.(*redis.ClusterClient), reg.ks.Prefix()) })
	}
	return &testEnv{t: t, rdb: rdb, reg: reg}
}

// deletePrefix deletes every key of a registry's prefix on every master:
// all of them live under the partitions' hash tags, "{<prefix>:p<N>}".
// Best effort: a failure is only logged.
func deletePrefix(t testing.TB, cc *redis.ClusterClient, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		iter := node.Scan(ctx, 0, "{"+prefix+":*", 1000).Iterator()
		for iter.Next(ctx) {
			if err := node.Unlink(ctx, iter.Val()).Err(); err != nil {
				return err
			}
		}
		return iter.Err()
	})
	if err != nil {
		t.Logf("cleanup: deleting the keys of prefix %s: %v", prefix, err)
	}
}

// startRunner runs a Runner until the test ends (or stop is called) and
// returns it with a stop func that waits for the graceful shutdown; setup
// runs on the Runner before it starts.
func (e *testEnv) startRunner(cfg RunnerConfig, setup ...func(*Runner)) (*Runner, func()) {
	e.t.Helper()
	if cfg.FetchBlock == 0 {
		cfg.FetchBlock = 100 * time.Millisecond
	}
	if cfg.RetryPoll == 0 {
		cfg.RetryPoll = 20 * time.Millisecond
	}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = 2 * time.Second
	}
	rn, err := NewRunner(e.reg, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, f := range setup {
		f(rn)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rn.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				e.t.Errorf("runner: %v", err)
			}
		})
	}
	e.t.Cleanup(stop)
	return rn, stop
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// waitStatus polls the task until its status is one of want.
func (e *testEnv) waitStatus(subject, scope string, d time.Duration, want ...Status) TaskView {
	e.t.Helper()
	var v TaskView
	waitFor(e.t, d, subject+"|"+scope+" status in "+joinStatus(want), func() bool {
		var err error
		v, err = e.reg.Get(context.Background(), subject, scope)
		if err != nil && !errors.Is(err, ErrNotFound) {
			e.t.Fatal(err)
		}
		for _, w := range want {
			if v.Status == w {
				return true
			}
		}
		return false
	})
	return v
}

func joinStatus(s []Status) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += ","
		}
		out += string(x)
	}
	return out
}

// gate is a stage handler that blocks until released, recording entries.
type gate struct {
	mu      sync.Mutex
	entered []*Run
	release chan struct{}
	err     error
}

func newGate() *gate { return &gate{release: make(chan struct{})} }

func (g *gate) RunStage(ctx context.Context, run *Run) error {
	g.mu.Lock()
	g.entered = append(g.entered, run)
	g.mu.Unlock()
	select {
	case <-g.release:
		return g.err
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (g *gate) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.entered)
}

func (g *gate) open() { close(g.release) }

// counter is a stage handler that counts executions per subject.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counter) RunStage(ctx context.Context, run *Run) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[run.Subject()+"/"+run.Stage()]++
	return nil
}

func (c *counter) get(k string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[k]
}

// runChildRunner runs a Runner in a child test process until the parent
// SIGKILLs it; bound only matters if the parent vanished without its
// Pdeathsig firing.
func runChildRunner(t *testing.T, reg *Registry, cfg RunnerConfig, bound time.Duration) {
	t.Helper()
	if cfg.FetchBlock == 0 {
		cfg.FetchBlock = 100 * time.Millisecond
	}
	if cfg.RetryPoll == 0 {
		cfg.RetryPoll = 20 * time.Millisecond
	}
	rn, err := NewRunner(reg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	if err := rn.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// takeScript takes entries off a partition's lanes (people first) into its
// taken set, reclaimable a minute later, as a read does before it claims
// (lib/queues.lua read_lanes). KEYS: the queue keys; ARGV[1] n.
var takeScript = redis.NewScript(`
local t = redis.call('TIME')
local due = t[1] * 1000 + 60000
local out = {}
for _, lane in ipairs({KEYS[2], KEYS[1]}) do
  local got = redis.call('LPOP', lane, tonumber(ARGV[1]) - #out)
  if got then
    for _, e in ipairs(got) do
      redis.call('ZADD', KEYS[4], due, e)
      out[#out + 1] = e
    end
  end
  if #out >= tonumber(ARGV[1]) then break end
end
return out`)

// takeEntries takes up to n entries of partition p off its lanes (people
// first) into the taken set without claiming them, and returns them: a
// runner that read them and then died or stalled before its claim.
func takeEntries(tb testing.TB, reg *Registry, p, n int) []entry {
	tb.Helper()
	res, err := takeScript.Run(context.Background(), reg.rdb, reg.ks.QueueKeys(p), n).Slice()
	if err != nil && !errors.Is(err, redis.Nil) {
		tb.Fatal(err)
	}
	out := make([]entry, 0, len(res))
	for _, v := range res {
		e, ok := entryFrom(p, replyString(v))
		if !ok {
			tb.Fatalf("entry %q is not tasklease's", v)
		}
		out = append(out, e)
	}
	return out
}

// queueState describes partition p's request queue for a failure message:
// the lanes' and the taken set's entries (with scores).
func queueState(ctx context.Context, rdb redis.UniversalClient, reg *Registry, p int) (lines []string, empty bool) {
	empty = true
	for _, l := range [...]string{reg.ks.Queue(p, 0), reg.ks.Queue(p, 1)} {
		if es, _ := rdb.LRange(ctx, l, 0, -1).Result(); len(es) > 0 {
			empty = false
			lines = append(lines, fmt.Sprintf("%s: %d entries %q", l, len(es), es))
		}
	}
	if zs, _ := rdb.ZRangeWithScores(ctx, reg.ks.Taken(p), 0, -1).Result(); len(zs) > 0 {
		empty = false
		lines = append(lines, fmt.Sprintf("%s: %d taken %v", reg.ks.Taken(p), len(zs), zs))
	}
	return lines, empty
}

// scriptSHAs are the EVALSHA hashes of script name in each variant a
// Registry runs (lua.LibraryOptions: with and without the due index).
func scriptSHAs(name string) []string {
	return []string{lua.MustScript(name).Hash(), lua.MustScriptWith(name, lua.LibraryOptions{DueIndex: true}).Hash()}
}
