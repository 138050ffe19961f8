package triggers

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/jobs"
)

const testPrefix = "tltest"

func testLogger() *slog.Logger {
	if os.Getenv("TASKLEASE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

var noop = jobs.HandlerFunc(func(context.Context, *jobs.Run) error { return nil })

// newRegistry registers course_sync and message_sync (foreground jobs) and
// backup (not a foreground job). No runner executes them, so a run stays
// queued and later requests join it: every request is one history event.
func newRegistry(t testing.TB, rdb redis.UniversalClient) *jobs.Registry {
	t.Helper()
	stages := []jobs.Stage{{Name: "pulling", Handler: noop}, {Name: "pushing", Handler: noop}}
	reg, err := jobs.NewRegistry(rdb, jobs.Config{
		Prefix: testPrefix, Partitions: 4, Logger: testLogger(),
		Jobs: []jobs.Job{
			{Scope: "course_sync", Stages: stages, Foreground: true},
			{Scope: "message_sync", Stages: stages, Foreground: true},
			{Scope: "backup", Stages: stages},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func newScheduler(t testing.TB, rdb redis.UniversalClient, reg *jobs.Registry, cfg SchedulerConfig) *Scheduler {
	t.Helper()
	if cfg.Prefix == "" {
		cfg.Prefix = testPrefix
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	s, err := NewScheduler(rdb, reg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// start runs s until the test ends or stop is called; stop cancels Run's
// context and waits for Run to return.
func start(t testing.TB, s *Scheduler) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("scheduler %s: %v", s.Owner(), err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// firedKeys returns schedule name's occurrences (unix seconds) with the
// owner that claimed each, from the fired keys in Redis.
func firedKeys(t testing.TB, rdb redis.UniversalClient, name string) map[int64]string {
	t.Helper()
	ctx := context.Background()
	pattern := "{" + testPrefix + ":cron:" + name + "}:fired:*"
	out := map[int64]string{}
	iter := rdb.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		ts, err := strconv.ParseInt(k[strings.LastIndexByte(k, ':')+1:], 10, 64)
		if err != nil {
			t.Fatalf("fired key %q: %v", k, err)
		}
		owner, err := rdb.Get(ctx, k).Result()
		if err != nil {
			t.Fatalf("fired key %q: %v", k, err)
		}
		out[ts] = owner
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// firedKeyName is occurrence ts's fired key of schedule name.
func firedKeyName(name string, ts int64) string {
	return "{" + testPrefix + ":cron:" + name + "}:fired:" + strconv.FormatInt(ts, 10)
}

// stateKeyName is schedule name's fan-out state key.
func stateKeyName(name string) string { return "{" + testPrefix + ":cron:" + name + "}:fanout" }

// scheduleRequests counts the requests with source schedule in the key's
// history (every request is recorded whatever its outcome; repeats of a
// run's (source, outcome) are coalesced into one event with a count).
func scheduleRequests(t testing.TB, reg *jobs.Registry, subject, scope string) int {
	t.Helper()
	evs, err := reg.History(context.Background(), subject, scope, 1000)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs {
		switch e.Event {
		case "requested", "joined", "skipped", "throttled":
			if e.Source == string(jobs.SourceSchedule) {
				n += e.Count
			}
		}
	}
	return n
}

// decisions collects the observe hook's reports.
type decisions struct {
	mu  sync.Mutex
	all []firing
}

func (d *decisions) add(f firing) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.all = append(d.all, f)
}

func (d *decisions) count(dec Decision) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, f := range d.all {
		if f.decision == dec {
			n++
		}
	}
	return n
}
