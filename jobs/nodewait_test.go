package jobs

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/taskkey"
)

// longWaitClient is a client of srv whose reads outlast a long node wait
// (a pipeline's reply is read within ReadTimeout).
func longWaitClient(t *testing.T, srv *redistest.Server) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: 30 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// blockedWaits counts the connections blocked in a BLPOP, by CLIENT LIST.
func blockedWaits(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	list, err := rdb.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, " cmd=blpop ") {
			n++
		}
	}
	return n
}

// pickUps submits n manual requests one after another, each after the
// previous one is done, and returns how long each took from the submit to
// done (polled every millisecond). A request whose wake-up was lost would
// wait for a node wait's timeout (FetchBlock, 10 s here): the deadline of
// 3 s fails it.
func pickUps(t *testing.T, e *testEnv, n int, subject func(i int) string) []time.Duration {
	t.Helper()
	out := make([]time.Duration, 0, n)
	for i := range n {
		s := subject(i)
		t0 := time.Now()
		clSubmit(t, e.reg, s, "sync", SourceManual, "")
		e.waitStatus(s, "sync", 3*time.Second, StatusDone)
		out = append(out, time.Since(t0))
	}
	return out
}

func logPickUps(t *testing.T, what string, d []time.Duration) {
	t.Helper()
	s := slices.Clone(d)
	slices.Sort(s)
	q := func(f float64) time.Duration { return s[int(f*float64(len(s)-1))] }
	t.Logf("%s: %d requests, submit to done p50 %s, p99 %s, max %s", what, len(s), q(0.5), q(0.99), s[len(s)-1])
}

// One runner, 64 partitions: one blocking wait covers them all (64 with a
// wait per partition), and every request is picked up at once by a ring,
// also the ones to a partition that parked while a wait was in flight
// (each request of a partition after its previous run: that partition's
// fetcher parks after the run, while the wait covers the others). With a
// 10 s FetchBlock a lost wake-up would cost seconds and fail the deadline.
func TestNodeWaitCoversManyPartitions(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	rdb := longWaitClient(t, srv)
	c := &counter{}
	e := newEnv(t, rdb, Config{Prefix: "nw1", Partitions: 64, Jobs: []Job{clJob("sync", Stage{Name: "only", Handler: c})}})
	e.startRunner(RunnerConfig{ID: "nw", Concurrency: 16, FetchBlock: 10 * time.Second, LeaseTTL: time.Minute})
	probe := srv.Client(t)
	waitFor(t, 5*time.Second, "the runner's wait", func() bool { return blockedWaits(t, probe) == 1 })
	// Same partition over and over, then a new partition each time.
	same := pickUps(t, e, 50, func(int) string { return "same" })
	spread := pickUps(t, e, 150, func(i int) string { return fmt.Sprintf("s%d", i) })
	logPickUps(t, "one subject", same)
	logPickUps(t, "150 subjects over 64 partitions", spread)
	waitFor(t, 5*time.Second, "the runner's one wait again", func() bool {
		n := blockedWaits(t, probe)
		if n > 1 {
			t.Fatalf("%d connections wait in BLPOP, want 1", n)
		}
		return n == 1
	})
}

// Eight runners, two partitions: each runner has one wait, a ring wakes
// one of them, and no request waits for a timeout.
func TestNodeWaitManyRunnersFewPartitions(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	c := &counter{}
	e := newEnv(t, srv.Client(t), Config{Prefix: "nw2", Partitions: 2, Jobs: []Job{clJob("sync", Stage{Name: "only", Handler: c})}})
	for i := range 8 {
		env := &testEnv{t: t, rdb: longWaitClient(t, srv), reg: nil}
		reg, err := NewRegistry(env.rdb, Config{Prefix: "nw2", Partitions: 2, Logger: testLogger(t), Jobs: []Job{clJob("sync", Stage{Name: "only", Handler: c})}})
		if err != nil {
			t.Fatal(err)
		}
		env.reg = reg
		env.startRunner(RunnerConfig{ID: fmt.Sprintf("nw-%d", i), Concurrency: 4, FetchBlock: 10 * time.Second, LeaseTTL: time.Minute})
	}
	probe := srv.Client(t)
	waitFor(t, 5*time.Second, "eight waits", func() bool { return blockedWaits(t, probe) == 8 })
	d := pickUps(t, e, 200, func(i int) string { return fmt.Sprintf("s%d", i) })
	logPickUps(t, "200 subjects, 8 runners, 2 partitions", d)
	for i := range 200 {
		if got := c.get(fmt.Sprintf("s%d/only", i)); got != 1 {
			t.Errorf("s%d ran %d times, want once", i, got)
		}
	}
}

// A full runner does not wait on the bells: Redis hands a ring to the
// client that has blocked longest, and a runner with no slot free would
// take it and keep the request until one of its runs ended while an idle
// runner slept. Runner A (concurrency 1) holds a run that never ends and
// is the first to wait after it; runner B starts later and is idle. A
// request then must run on B at once, not after A's run (never here) or
// B's wait's 30 s timeout.
func TestNodeWaitFullRunnerLeavesRingsToIdleOnes(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	held := newGate()
	t.Cleanup(held.open)
	c := &counter{}
	cfg := Config{Prefix: "nw3", Partitions: 2, Jobs: []Job{clJob("hold", Stage{Name: "only", Handler: held}), clJob("sync", Stage{Name: "only", Handler: c})}}
	runner := func(id string) (*testEnv, *Runner) {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: 30 * time.Second, ClientName: id})
		t.Cleanup(func() { _ = rdb.Close() })
		e := newEnv(t, rdb, cfg)
		r, _ := e.startRunner(RunnerConfig{ID: id, Concurrency: 1, FetchBlock: 30 * time.Second, LeaseTTL: time.Minute})
		return e, r
	}
	probe := srv.Client(t)
	waitsOf := func(name string) int {
		list, err := probe.ClientList(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, line := range strings.Split(list, "\n") {
			if strings.Contains(line, " name="+name+" ") && strings.Contains(line, " cmd=blpop ") {
				n++
			}
		}
		return n
	}
	a, ra := runner("nw3-a")
	clSubmit(t, a.reg, "held", "hold", SourceManual, "")
	waitFor(t, 5*time.Second, "A runs the held run", func() bool { return held.count() == 1 })
	// A wait A sent before a fetcher's read took its last slot is still
	// in flight, and takes one ring (a gap left open: passing such rings
	// on made a nearly full runner cycle between its wait and a ring); a
	// nudge ends it, and A, full, does not wait again.
	if err := a.rdb.RPush(context.Background(), a.reg.ks.Nudge(ra.owner), "1").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "A, full, not waiting", func() bool { return waitsOf("nw3-a") == 0 })
	b, _ := runner("nw3-b")
	waitFor(t, 5*time.Second, "B's wait", func() bool { return waitsOf("nw3-b") == 1 })
	// x goes to a partition A's wait would cover: any while A is full
	// and waits on nothing, else one of those it waits on.
	ra.nodeWait.mu.Lock()
	covered := slices.Clone(ra.nodeWait.inFlight)
	ra.nodeWait.mu.Unlock()
	t.Logf("A's waits on the bells while full: %d, over partitions %v", waitsOf("nw3-a"), covered)
	x := "x0"
	for i := 0; len(covered) > 0; i++ {
		if x = fmt.Sprintf("x%d", i); slices.Contains(covered, b.reg.ks.Partition(taskkey.MustNew(x, "sync"))) {
			break
		}
	}
	clSubmit(t, b.reg, x, "sync", SourceManual, "")
	b.waitStatus(x, "sync", 5*time.Second, StatusDone)
	if got := c.get(x + "/only"); got != 1 {
		t.Fatalf("%s ran %d times, want once", x, got)
	}
}

// TestWaitClientRacesNoConnectingClient: the wait's client is made from
// the options of a client that may be connecting at that moment (another
// runner of the registry starting). go-redis then writes the options'
// maintenance-notifications config (its Mode, under a lock of its own)
// when the server refuses them, so waitClient must not read that config.
// The goroutine below writes it as go-redis does; under -race (as CI runs
// it) the test fails if waitClient reads it, as it did before the fix.
func TestWaitClientRacesNoConnectingClient(t *testing.T) {
	mr := miniredis.RunT(t)
	opts := &redis.Options{Addr: mr.Addr(), MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeAuto}}
	done := make(chan struct{})
	go func() {
		opts.MaintNotificationsConfig.Mode = maintnotifications.ModeDisabled
		close(done)
	}()
	w := waitClient(opts, time.Second)
	defer w.Close()
	<-done
	if err := w.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
}
