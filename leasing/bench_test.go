package leasing_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tasklease/tasklease/checkpoints"
	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/leasing"
	"github.com/tasklease/tasklease/taskkey"
)

// Benchmarks run against a real redis-server over loopback, so they measure
// round trips and script execution as deployed (skipped without the binary).

const benchKeys = 1024

func benchSetup(b *testing.B) (*leasing.Manager, *checkpoints.Store, []taskkey.Key) {
	b.Helper()
	srv := redistest.StartServer(b)
	rdb := srv.Client(b)
	m := newManager(b, rdb)
	store, err := checkpoints.NewStore(rdb, checkpoints.Config{})
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]taskkey.Key, benchKeys)
	for i := range keys {
		keys[i] = taskkey.MustNew(fmt.Sprintf("bench-u%d", i), "course_sync")
	}
	return m, store, keys
}

// BenchmarkAcquireRelease: one op is an Acquire plus its Release, on
// rotating keys.
func BenchmarkAcquireRelease(b *testing.B) {
	m, _, keys := benchSetup(b)
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		lease, err := m.Acquire(ctx, keys[i%benchKeys], "pod-a", 10*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		if err := m.Release(ctx, lease); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkAcquireReleaseParallel: as BenchmarkAcquireRelease from
// GOMAXPROCS goroutines (RunParallel), each on its own keys, so no attempt
// is refused.
func BenchmarkAcquireReleaseParallel(b *testing.B) {
	m, _, _ := benchSetup(b)
	ctx := context.Background()
	var worker atomic.Int32
	b.ReportAllocs()
	b.ResetTimer() // RunParallel does not use b.Loop; exclude the server start
	b.RunParallel(func(pb *testing.PB) {
		w := worker.Add(1)
		keys := make([]taskkey.Key, 64)
		for i := range keys {
			keys[i] = taskkey.MustNew(fmt.Sprintf("bench-w%d-u%d", w, i), "course_sync")
		}
		owner := fmt.Sprintf("pod-%d", w)
		i := 0
		for pb.Next() {
			lease, err := m.Acquire(ctx, keys[i%len(keys)], owner, 10*time.Second)
			if err != nil {
				b.Error(err)
				return
			}
			if err := m.Release(ctx, lease); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}

// BenchmarkRenew: one fenced renewal of a held lease.
func BenchmarkRenew(b *testing.B) {
	m, _, keys := benchSetup(b)
	ctx := context.Background()
	lease, err := m.Acquire(ctx, keys[0], "pod-a", 10*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := m.Renew(ctx, lease); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckpointWrite: one fenced checkpoint write (SaveProgress with
// a 64-byte cursor: lease check, record update, history entry, publish).
func BenchmarkCheckpointWrite(b *testing.B) {
	m, store, keys := benchSetup(b)
	ctx := context.Background()
	lease, err := m.Acquire(ctx, keys[0], "pod-a", time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := store.Begin(ctx, lease, "run-1", []string{"pulling", "pushing"}); err != nil {
		b.Fatal(err)
	}
	cursor := make([]byte, 64)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		cursor[0] = byte(i)
		if err := store.SaveProgress(ctx, lease, "run-1", cursor); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
