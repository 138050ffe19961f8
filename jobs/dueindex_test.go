package jobs

import (
	"context"
	"errors"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/lua"
	"github.com/tasklease/tasklease/taskkey"
)

// TestDueHorizonMatches: the scripts announce only what is due within
// DUE_HORIZON_MS, so the timer must read the index at least that often.
func TestDueHorizonMatches(t *testing.T) {
	src, err := lua.SourceWith("read_next", lua.LibraryOptions{DueIndex: true})
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`local DUE_HORIZON_MS = (\d+)`).FindStringSubmatch(src)
	if m == nil {
		t.Fatal("read_next.lua does not define DUE_HORIZON_MS")
	}
	if ms, _ := strconv.Atoi(m[1]); time.Duration(ms)*time.Millisecond != dueHorizon {
		t.Fatalf("DUE_HORIZON_MS = %s, dueHorizon = %s", m[1], dueHorizon)
	}
}

// TestDueIndexKeptByTheScripts: on a single Redis server a claimed run's
// taken entry and a scheduled retry put their partition in the due index,
// scored no later than they come due; a run that ended leaves nothing
// there once its partition was asked.
func TestDueIndexKeptByTheScripts(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) { // real Redis: the scripts as Redis Functions
		t.Run(b.Name, func(t *testing.T) {
			rdb := b.Client
			ctx := context.Background()
			release := make(chan struct{})
			hold := HandlerFunc(func(ctx context.Context, _ *Run) error {
				select {
				case <-release:
				case <-ctx.Done():
				}
				return nil
			})
			fail := HandlerFunc(func(context.Context, *Run) error { return errors.New("remote down") })
			e := newEnv(t, rdb, Config{Prefix: "di", Partitions: 4, Jobs: []Job{
				clJob("course_sync", Stage{Name: "pulling", Handler: hold}),
				{Scope: "push", Stages: []Stage{{Name: "pushing", Handler: fail}},
					Retry: RetryPolicy{MaxAttempts: 3, Backoff: time.Hour, MaxBackoff: time.Hour}}}})
			rn, _ := e.startRunner(RunnerConfig{ID: "di-a"})
			ks := e.reg.ks
			score := func(member string) (float64, bool) {
				s, err := rdb.ZScore(ctx, ks.Due(), member).Result()
				if errors.Is(err, redis.Nil) {
					return 0, false
				}
				if err != nil {
					t.Fatal(err)
				}
				return s, true
			}

			clSubmit(t, e.reg, "u1", "course_sync", SourceManual, "")
			e.waitStatus("u1", "course_sync", 10*time.Second, StatusRunning)
			p := ks.Partition(taskkey.MustNew("u1", "course_sync"))
			taken, err := rdb.ZRangeWithScores(ctx, ks.Taken(p), 0, 0).Result()
			if err != nil || len(taken) != 1 {
				t.Fatalf("taken set of partition %d: %v %v, want the running run's entry", p, taken, err)
			}
			if s, ok := score("t" + ks.Tag(p)); !ok || s > taken[0].Score {
				t.Fatalf("due index: partition %d's taken set at %v (%v), want at most its entry's %v", p, s, ok, taken[0].Score)
			}

			clSubmit(t, e.reg, "u2", "push", SourceManual, "")
			v := e.waitStatus("u2", "push", 10*time.Second, StatusRetrying)
			q := ks.Partition(taskkey.MustNew("u2", "push"))
			if s, ok := score("r" + ks.Tag(q)); !ok || int64(s) > v.NextAttemptAt.UnixMilli() {
				t.Fatalf("due index: partition %d's retries at %v (%v), want at most the retry's %v", q, s, ok, v.NextAttemptAt.UnixMilli())
			}

			close(release)
			e.waitStatus("u1", "course_sync", 10*time.Second, StatusDone)
			rn.reclaimPartition(ctx, p, false) // as the timer does when it comes due
			if s, ok := score("t" + ks.Tag(p)); ok {
				t.Fatalf("due index keeps partition %d's taken set at %v after its last entry went", p, s)
			}
		})
	}
}

// TestTimerAsksOnlyDuePartitions: the timer moves the retries of the
// partitions the due index names, and removes their entry with the last
// retry; one an older version scheduled without an entry waits for a sweep,
// which moves it.
func TestTimerAsksOnlyDuePartitions(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) { // real Redis: retry_move.lua as a Redis Function
		t.Run(b.Name, func(t *testing.T) { timerAsksOnlyDuePartitions(t, b.Client) })
	}
}

func timerAsksOnlyDuePartitions(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	e := newEnv(t, rdb, Config{Prefix: "tm", Partitions: 4, Jobs: []Job{clJob("course_sync", Stage{Name: "pulling", Handler: &counter{}})}})
	rn, err := NewRunner(e.reg, RunnerConfig{ID: "tm-a"})
	if err != nil {
		t.Fatal(err)
	}
	ks := e.reg.ks
	key := taskkey.MustNew("u1", "course_sync")
	p := ks.Partition(key)
	const past = 1 // long due, by any clock
	retry := func(runID string) {
		t.Helper()
		if err := rdb.ZAdd(ctx, ks.Retry(p), redis.Z{Score: past, Member: runID + " " + key.String()}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	queued := func() int64 {
		t.Helper()
		n, err := rdb.LLen(ctx, ks.Queue(p, keyspace.LaneBulk)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	asked := map[string]time.Time{}

	retry("run-1") // as an older version schedules it: no index entry
	if _, err := rn.timerPass(ctx, asked); err != nil {
		t.Fatal(err)
	}
	if n := queued(); n != 0 {
		t.Fatalf("the timer moved %d retries of a partition the index does not name", n)
	}
	if err := rdb.ZAdd(ctx, ks.Due(), redis.Z{Score: past, Member: "r" + ks.Tag(p)}).Err(); err != nil {
		t.Fatal(err)
	}
	d, err := rn.timerPass(ctx, asked)
	if err != nil {
		t.Fatal(err)
	}
	if n := queued(); n != 1 {
		t.Fatalf("%d retries moved from the partition the index names as due, want 1", n)
	}
	if d != 0 {
		t.Fatalf("after moving retries the timer sleeps %s, want a new read at once", d)
	}
	if n, _ := rdb.ZCard(ctx, ks.Due()).Result(); n != 0 {
		t.Fatalf("the due index keeps %d entries after the partition's last retry moved, want 0", n)
	}
	if d, err := rn.timerPass(ctx, asked); err != nil || d < dueHorizon-time.Millisecond || d > dueHorizon {
		t.Fatalf("with nothing due the timer sleeps %s (%v), want the horizon %s", d, err, dueHorizon)
	}

	retry("run-2") // again without an index entry
	rn.sweepAll(ctx)
	if n := queued(); n != 2 {
		t.Fatalf("the sweep left the retry scheduled without an index entry (%d queued, want 2)", n)
	}
}

// TestTimerWokenForWhatIsDueSoon: a retry due sooner than the horizon is
// announced on the due index's channel, so an idle runner moves it when it
// is due, not at its timer's next read.
func TestTimerWokenForWhatIsDueSoon(t *testing.T) {
	t.Parallel()
	// Real Redis only: the backends' miniredis keeps its clock still, so
	// nothing comes due there unless a test moves it.
	rdb := redistest.StartServer(t).Client(t)
	var calls atomic.Int32
	flaky := HandlerFunc(func(context.Context, *Run) error {
		if calls.Add(1) == 1 {
			return errors.New("remote down")
		}
		return nil
	})
	e := newEnv(t, rdb, Config{Prefix: "tw", Partitions: 4, Jobs: []Job{{Scope: "course_sync",
		Stages: []Stage{{Name: "pulling", Handler: flaky}},
		Retry:  RetryPolicy{MaxAttempts: 3, Backoff: 300 * time.Millisecond, MaxBackoff: 300 * time.Millisecond}}}})
	rn, err := NewRunner(e.reg, RunnerConfig{ID: "tw-a", FetchBlock: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	asleep := make(chan struct{})
	var once sync.Once
	rn.testHooks.timerSleeps = func(d time.Duration) {
		if d == dueHorizon {
			once.Do(func() { close(asleep) })
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rn.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	select { // idle: nothing due, the timer sleeps its horizon
	case <-asleep:
	case <-time.After(10 * time.Second):
		t.Fatal("the timer never slept its horizon")
	}
	start := time.Now()
	clSubmit(t, e.reg, "u1", "course_sync", SourceManual, "")
	e.waitStatus("u1", "course_sync", dueHorizon-time.Second, StatusDone)
	t.Logf("failed once, retried and done after %s (retry backoff up to 300ms, horizon %s)", time.Since(start), dueHorizon)
}
