package jobs

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/internal/redistest"
)

// legacyQueue moves partition p's queued entries back into the request
// streams of the versions before request lists, as such a version would
// have queued them (consumer group created by its runners): the state a
// rolling deploy to this version starts from.
func legacyQueue(t *testing.T, rdb redis.UniversalClient, reg *Registry, p int) {
	t.Helper()
	ctx := context.Background()
	for _, l := range keyspace.Lanes() {
		stream := reg.ks.LegacyStream(p, l)
		if err := rdb.XGroupCreateMkStream(ctx, stream, keyspace.LegacyGroup, "0").Err(); err != nil {
			t.Fatal(err)
		}
		es, err := rdb.LRange(ctx, reg.ks.Queue(p, l), 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range es {
			e, ok := entryFrom(p, id)
			if !ok {
				t.Fatalf("entry %q", id)
			}
			if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream,
				Values: []any{"key", e.key.String(), "runId", e.runID, "source", e.source}}).Err(); err != nil {
				t.Fatal(err)
			}
		}
		rdb.Del(ctx, reg.ks.Queue(p, l))
	}
}

// TestRollingDeployDrainsLegacyStreams: requests an older version queued
// in its request streams — unread, and read by an older runner that died
// before finishing — are served by runners of this version, once each,
// and the drained streams are deleted with their consumer group.
func TestRollingDeployDrainsLegacyStreams(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			c := &counter{}
			e := newEnv(t, b.Client, Config{Prefix: "lg", Partitions: 1, Jobs: []Job{clJob("course_sync", Stage{Name: "pulling", Handler: c})}})
			clSubmit(t, e.reg, "u0", "course_sync", SourceManual, "")
			for i := 1; i <= 4; i++ {
				clSubmit(t, e.reg, fmt.Sprintf("u%d", i), "course_sync", SourceSchedule, "")
			}
			legacyQueue(t, b.Client, e.reg, 0)
			// An older runner read two bulk requests and died.
			bulk := e.reg.ks.LegacyStream(0, keyspace.LaneBulk)
			if err := b.Client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: keyspace.LegacyGroup, Consumer: "old/000000",
				Streams: []string{bulk, ">"}, Count: 2}).Err(); err != nil {
				t.Fatal(err)
			}
			b.Advance(1500 * time.Millisecond) // its entries are idle past the lease TTL

			e.startRunner(RunnerConfig{ID: "lg-new", LeaseTTL: time.Second, ReclaimInterval: 20 * time.Millisecond})
			for i := range 5 {
				e.waitStatus(fmt.Sprintf("u%d", i), "course_sync", 10*time.Second, StatusDone)
			}
			for i := range 5 {
				if n := c.get(fmt.Sprintf("u%d/pulling", i)); n != 1 {
					t.Errorf("u%d ran %d times, want 1", i, n)
				}
			}
			waitFor(t, 10*time.Second, "the legacy streams deleted", func() bool {
				n, err := b.Client.Exists(ctx, bulk, e.reg.ks.LegacyStream(0, keyspace.LanePeople)).Result()
				return err == nil && n == 0
			})
			waitFor(t, 10*time.Second, "an empty queue", func() bool {
				_, empty := queueState(ctx, b.Client, e.reg, 0)
				return empty
			})
		})
	}
}

// TestLegacyDrainEveryTenthPass: the reclaimer drains the legacy streams on
// its first pass and then every legacyDrainEvery passes, not on each: the
// check costs two EXISTS per partition, on every idle runner.
func TestLegacyDrainEveryTenthPass(t *testing.T) {
	t.Parallel()
	mini := redistest.StartMini(t)
	rdb := mini.Client(t)
	ctx := context.Background()
	e := newEnv(t, rdb, Config{Prefix: "ld", Partitions: 1, Jobs: []Job{clJob("course_sync", Stage{Name: "pulling", Handler: &counter{}})}})
	rn, err := NewRunner(e.reg, RunnerConfig{ID: "ld-new"})
	if err != nil {
		t.Fatal(err)
	}
	people := e.reg.ks.LegacyStream(0, keyspace.LanePeople)
	streamed := func() bool {
		t.Helper()
		n, err := rdb.Exists(ctx, people).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	clSubmit(t, e.reg, "u0", "course_sync", SourceManual, "")
	legacyQueue(t, rdb, e.reg, 0)
	rn.reclaimAll(ctx)
	if streamed() {
		t.Fatal("the first pass left the legacy stream")
	}
	clSubmit(t, e.reg, "u1", "course_sync", SourceManual, "")
	legacyQueue(t, rdb, e.reg, 0)
	for pass := 2; pass <= legacyDrainEvery; pass++ {
		rn.reclaimAll(ctx)
		if !streamed() {
			t.Fatalf("pass %d drained the legacy stream, want only every %d passes", pass, legacyDrainEvery)
		}
	}
	rn.reclaimAll(ctx)
	if streamed() {
		t.Fatalf("pass %d left the legacy stream", legacyDrainEvery+1)
	}
}
