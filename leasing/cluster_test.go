package leasing_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/checkpoints"
	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/leasing"
	"github.com/tasklease/tasklease/taskkey"
)

// TestCluster runs every lease and checkpoint script over 300 task keys on a
// 3-master Redis Cluster: no CROSSSLOT or any other error, and the keys
// spread over every master.
func TestCluster(t *testing.T) {
	t.Parallel() // see TestContention
	const nKeys = 300
	stages := []string{"pulling", "pushing"}
	cl := redistest.StartCluster(t)
	rdb := cl.Client(t)
	ctx := context.Background()
	m := newManager(t, rdb)
	store, err := checkpoints.NewStore(rdb, checkpoints.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ks := defaultSpace(t)

	keys := make([]taskkey.Key, nKeys)
	for i := range keys {
		keys[i] = taskkey.MustNew(fmt.Sprintf("cluster-u%d", i), "course_sync")
	}

	// lifecycle runs every script on key and checks each answer.
	var lastToken sync.Map // key → token of the previous round
	lifecycle := func(key taskkey.Key, round int) error {
		runID := fmt.Sprintf("run-%d", round)
		lease, err := m.Acquire(ctx, key, "pod-a", 10*time.Second)
		if err != nil {
			return fmt.Errorf("Acquire: %w", err)
		}
		if prev, ok := lastToken.Load(key); ok && lease.Token <= prev.(int64) {
			return fmt.Errorf("token %d after %d: not increasing", lease.Token, prev)
		}
		lastToken.Store(key, lease.Token)
		var held *leasing.HeldError
		if _, err := m.Acquire(ctx, key, "pod-b", time.Second); !errors.As(err, &held) || held.Owner != "pod-a" {
			return fmt.Errorf("contended Acquire: %v, want HeldError by pod-a", err)
		}
		if err := m.Renew(ctx, lease); err != nil {
			return fmt.Errorf("Renew: %w", err)
		}
		cp, err := store.Begin(ctx, lease, runID, stages)
		if err != nil {
			return fmt.Errorf("Begin: %w", err)
		}
		if cp.RunID != runID || cp.Completed != 0 || cp.Stage != "pulling" {
			return fmt.Errorf("Begin checkpoint %+v", cp)
		}
		cursor := []byte(fmt.Sprintf("%s\x00\xff", key))
		if err := store.SaveProgress(ctx, lease, runID, cursor); err != nil {
			return fmt.Errorf("SaveProgress: %w", err)
		}
		if _, err := store.Advance(ctx, lease, runID, "pushing"); !errors.Is(err, checkpoints.ErrStageMismatch) {
			return fmt.Errorf("Advance of the wrong stage: %v, want ErrStageMismatch", err)
		}
		cp, err = store.Load(ctx, key)
		if err != nil {
			return fmt.Errorf("Load: %w", err)
		}
		if string(cp.Cursor) != string(cursor) {
			return fmt.Errorf("Load cursor %q, want %q", cp.Cursor, cursor)
		}
		if next, err := store.Advance(ctx, lease, runID, "pulling"); err != nil || next != "pushing" {
			return fmt.Errorf("Advance pulling = %q, %v", next, err)
		}
		if next, err := store.Advance(ctx, lease, runID, "pushing"); err != nil || next != "" {
			return fmt.Errorf("Advance pushing = %q, %v", next, err)
		}
		cp, err = store.Load(ctx, key)
		if err != nil {
			return fmt.Errorf("Load: %w", err)
		}
		if d := checkpoints.Decide(cp); d.Mode != checkpoints.Skip {
			return fmt.Errorf("Decide after all stages = %+v, want skip", d)
		}
		if err := m.Release(ctx, lease); err != nil {
			return fmt.Errorf("Release: %w", err)
		}
		if err := m.Renew(ctx, lease); !errors.Is(err, leasing.ErrNotHeld) {
			return fmt.Errorf("Renew after Release: %v, want ErrNotHeld", err)
		}
		if err := store.SaveProgress(ctx, lease, runID, nil); !errors.Is(err, leasing.ErrNotHeld) {
			return fmt.Errorf("SaveProgress after Release: %v, want ErrNotHeld", err)
		}
		return nil
	}

	runAll := func(round int) {
		t.Helper()
		var wg sync.WaitGroup
		var failures atomic.Int32
		next := atomic.Int32{}
		for range 8 {
			wg.Go(func() {
				for {
					i := int(next.Add(1)) - 1
					if i >= nKeys {
						return
					}
					if err := lifecycle(keys[i], round); err != nil {
						if failures.Add(1) <= 10 {
							t.Errorf("round %d, key %s: %v", round, keys[i], err)
						}
					}
				}
			})
		}
		wg.Wait()
		if n := failures.Load(); n > 0 {
			t.Fatalf("round %d: %d of %d keys failed", round, n, nKeys)
		}
	}
	runAll(1)

	// All keys of a task hash to one slot (DESIGN §2.7).
	for _, key := range keys[:50] {
		slots := map[int64]bool{}
		for _, k := range []string{ks.Lease(key), ks.Fence(key), ks.Task(key), ks.History(key)} {
			slot, err := rdb.ClusterKeySlot(ctx, k).Result()
			if err != nil {
				t.Fatalf("CLUSTER KEYSLOT %s: %v", k, err)
			}
			slots[slot] = true
		}
		if len(slots) != 1 {
			t.Fatalf("keys of %s span slots %v", key, slots)
		}
	}

	// Every master holds some of the keys, and together exactly the fence,
	// record and history of each (leases were released).
	var mu sync.Mutex
	sizes := map[string]int64{}
	err = rdb.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		n, err := c.DBSize(ctx).Result()
		if err != nil {
			return err
		}
		mu.Lock()
		sizes[c.Options().Addr] = n
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatalf("ForEachMaster: %v", err)
	}
	var total int64
	for addr, n := range sizes {
		if n == 0 {
			t.Errorf("master %s holds no keys (sizes %v)", addr, sizes)
		}
		total += n
	}
	if len(sizes) != 3 {
		t.Fatalf("visited %d masters, want 3: %v", len(sizes), sizes)
	}
	if total != 3*nKeys {
		t.Fatalf("cluster holds %d keys, want %d (fence, task, history per key): %v", total, 3*nKeys, sizes)
	}
	t.Logf("keys per master: %v", sizes)

	// SCRIPT FLUSH on every master: the scripts are reloaded through EVAL.
	err = rdb.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		return c.ScriptFlush(ctx).Err()
	})
	if err != nil {
		t.Fatalf("SCRIPT FLUSH: %v", err)
	}
	runAll(2)
}
