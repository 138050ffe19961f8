package jobs

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/taskkey"
)

// TestFinishIndexesItsRetry: on a single Redis server a retry scheduled by
// finish puts its partition in the retry index, scored at the retry's due
// time, so the mover's one read finds it (moveRetries).
func TestFinishIndexesItsRetry(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) { // real Redis: finish.lua as a Redis Function
		t.Run(b.Name, func(t *testing.T) {
			rdb := b.Client
			ctx := context.Background()
			fail := HandlerFunc(func(context.Context, *Run) error { return errors.New("remote down") })
			e := newEnv(t, rdb, Config{Prefix: "ri", Partitions: 4, Jobs: []Job{{Scope: "course_sync",
				Stages: []Stage{{Name: "pulling", Handler: fail}}, Retry: RetryPolicy{MaxAttempts: 3, Backoff: time.Hour, MaxBackoff: time.Hour}}}})
			e.startRunner(RunnerConfig{ID: "ri-a"})
			clSubmit(t, e.reg, "u1", "course_sync", SourceManual, "")
			v := e.waitStatus("u1", "course_sync", 10*time.Second, StatusRetrying)
			if v.NextAttemptAt == nil {
				t.Fatalf("retrying without nextAttemptAt: %+v", v)
			}
			p := e.reg.ks.Partition(taskkey.MustNew("u1", "course_sync"))
			score, err := rdb.ZScore(ctx, e.reg.ks.RetryDue(), e.reg.ks.Tag(p)).Result()
			if err != nil {
				t.Fatalf("retry index entry of partition %d: %v, want the retry's due time", p, err)
			}
			if got, want := int64(score), v.NextAttemptAt.UnixMilli(); got > want {
				t.Fatalf("retry index scores partition %d at %d, after its retry's due time %d", p, got, want)
			}
		})
	}
}

// TestRetryIndexNamesThePartitionsToMove: between sweeps the mover asks only
// the partitions the retry index says are due, keeps the index (the entry
// goes with the partition's last retry), and a sweep moves the retries an
// older version scheduled without an index entry.
func TestRetryIndexNamesThePartitionsToMove(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) { // real Redis: retry_move.lua as a Redis Function
		t.Run(b.Name, func(t *testing.T) { retryIndexNamesThePartitionsToMove(t, b.Client) })
	}
}

func retryIndexNamesThePartitionsToMove(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	e := newEnv(t, rdb, Config{Prefix: "rm", Partitions: 4, Jobs: []Job{clJob("course_sync", Stage{Name: "pulling", Handler: &counter{}})}})
	rn, err := NewRunner(e.reg, RunnerConfig{ID: "rm-a"})
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
	rn.retryPasses = 1 // between sweeps

	retry("run-1") // as an older version schedules it: no index entry
	rn.moveRetries(ctx)
	if n := queued(); n != 0 {
		t.Fatalf("a pass between sweeps moved %d retries of a partition the index does not name", n)
	}
	if err := rdb.ZAdd(ctx, ks.RetryDue(), redis.Z{Score: past, Member: ks.Tag(p)}).Err(); err != nil {
		t.Fatal(err)
	}
	rn.moveRetries(ctx)
	if n := queued(); n != 1 {
		t.Fatalf("%d retries moved from the partition the index names as due, want 1", n)
	}
	if n, _ := rdb.ZCard(ctx, ks.RetryDue()).Result(); n != 0 {
		t.Fatalf("the retry index keeps %d entries after the partition's last retry moved, want 0", n)
	}

	retry("run-2") // again without an index entry
	rn.retryPasses = retrySweepEvery
	rn.moveRetries(ctx)
	if n := queued(); n != 2 {
		t.Fatalf("the sweep left the retry scheduled without an index entry (%d queued, want 2)", n)
	}
}
