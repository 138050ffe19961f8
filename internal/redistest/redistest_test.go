package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// eventually polls cond until it returns nil or the deadline passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still failing after %v: %v", what, timeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestServerKillRestart(t *testing.T) {
	ctx := context.Background()
	s := StartServer(t)
	c := s.Client(t)

	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	// Persistence must be off so nothing is written or reloaded.
	for param, want := range map[string]string{"save": "", "appendonly": "no", "bind": "127.0.0.1"} {
		got, err := c.ConfigGet(ctx, param).Result()
		if err != nil || got[param] != want {
			t.Fatalf("CONFIG GET %s = %q, %v; want %q", param, got[param], err, want)
		}
	}
	addr := s.Addr()

	s.Kill()
	if err := ping(addr); err == nil {
		t.Fatal("PING answered after Kill")
	}
	s.Kill() // idempotent

	s.Restart(t)
	if got := s.Addr(); got != addr {
		t.Fatalf("Restart moved from %s to %s", addr, got)
	}
	// The same client must reach the restarted server on the same port.
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}

	s.Stop()
	s.Stop() // idempotent
	s.Restart(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Stop+Restart: %v", err)
	}
}

func TestServerPauseResume(t *testing.T) {
	ctx := context.Background()
	s := StartServer(t)
	// Short timeouts and no retries so a silent server shows up as an error
	// within 200ms instead of go-redis's default 3s plus retries.
	c := redis.NewClient(&redis.Options{
		Addr:         s.Addr(),
		ReadTimeout:  200 * time.Millisecond,
		WriteTimeout: 200 * time.Millisecond,
		MaxRetries:   -1,
	})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}

	s.Pause()
	start := time.Now()
	err := c.Ping(ctx).Err()
	if err == nil {
		t.Fatal("PING answered while paused")
	}
	var netErr interface{ Timeout() bool }
	if !errors.As(err, &netErr) || !netErr.Timeout() {
		t.Fatalf("PING while paused: want a timeout, got %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("PING while paused took %v, want about 200ms", took)
	}

	s.Resume()
	eventually(t, 5*time.Second, "PING after Resume", func() error { return c.Ping(ctx).Err() })
}

// TestServerStopWhilePaused checks cleanup cannot hang on a frozen server.
func TestServerStopWhilePaused(t *testing.T) {
	s := StartServer(t)
	s.Pause()
	done := make(chan struct{})
	go func() { s.Stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(stopTimeout + 5*time.Second):
		t.Fatal("Stop of a paused server did not return")
	}
}

func TestCluster(t *testing.T) {
	ctx := context.Background()
	cl := StartCluster(t)
	if n := len(cl.Addrs()); n != 3 {
		t.Fatalf("Addrs: %d nodes, want 3", n)
	}
	c := cl.Client(t)

	const n = 100
	for i := range n {
		k := fmt.Sprintf("key:%d", i)
		if err := c.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
	}
	for i := range n {
		k := fmt.Sprintf("key:%d", i)
		got, err := c.Get(ctx, k).Int()
		if err != nil || got != i {
			t.Fatalf("GET %s = %d, %v; want %d", k, got, err, i)
		}
	}

	var masters, withKeys atomic.Int32
	err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		masters.Add(1)
		size, err := m.DBSize(ctx).Result()
		if err != nil {
			return err
		}
		if size > 0 {
			withKeys.Add(1)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("ForEachMaster: %v", err)
	}
	if got := masters.Load(); got != 3 {
		t.Fatalf("ForEachMaster visited %d masters, want 3", got)
	}
	// 100 keys hash to slots on every master; if not, slots were not spread.
	if got := withKeys.Load(); got != 3 {
		t.Fatalf("%d masters hold keys, want 3", got)
	}
}

func TestMiniAdvance(t *testing.T) {
	ctx := context.Background()
	m := StartMini(t)
	c := m.Client(t)

	t0, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	if !t0.Equal(m.Now()) {
		t.Fatalf("TIME = %v, Now() = %v", t0, m.Now())
	}
	if err := c.Set(ctx, "k", "v", 1500*time.Millisecond).Err(); err != nil { // PX 1500
		t.Fatalf("SET PX: %v", err)
	}

	m.Advance(time.Second)
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 1 {
		t.Fatalf("after 1s: EXISTS = %d, %v; want 1", n, err)
	}
	if ttl, err := c.PTTL(ctx, "k").Result(); err != nil || ttl != 500*time.Millisecond {
		t.Fatalf("after 1s: PTTL = %v, %v; want 500ms", ttl, err)
	}

	m.Advance(500 * time.Millisecond)
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("after 1.5s: EXISTS = %d, %v; want 0", n, err)
	}
	t1, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	if d := t1.Sub(t0); d != 1500*time.Millisecond {
		t.Fatalf("TIME moved by %v, want 1.5s", d)
	}
}

func TestMiniAdvanceConcurrent(t *testing.T) {
	m := StartMini(t)
	start := m.Now()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				m.Advance(time.Millisecond)
			}
		})
	}
	wg.Wait()
	if d := m.Now().Sub(start); d != 800*time.Millisecond {
		t.Fatalf("clock moved %v, want 800ms", d)
	}
}

func TestBackends(t *testing.T) {
	for _, b := range Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			if err := b.Client.Set(ctx, "k", "v", 100*time.Millisecond).Err(); err != nil {
				t.Fatalf("SET PX: %v", err)
			}
			b.Advance(100 * time.Millisecond)
			if n, err := b.Client.Exists(ctx, "k").Result(); err != nil || n != 0 {
				t.Fatalf("after TTL: EXISTS = %d, %v; want 0", n, err)
			}
		})
	}
}

// TestServerRetriesTakenPort checks a launch that loses its port moves on to
// another one instead of failing the test.
func TestServerRetriesTakenPort(t *testing.T) {
	bin := requireBinary(t, "redis-server")
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port

	s := newServer(t, bin, t.TempDir(), nil)
	picks := 0
	s.startOnFreePort(t, func(t T) int {
		picks++
		if picks == 1 {
			return takenPort
		}
		return FreePort(t)
	})
	if picks != 2 {
		t.Fatalf("picked %d ports, want 2", picks)
	}
	if err := ping(s.Addr()); err != nil {
		t.Fatalf("PING: %v", err)
	}
}

func TestSentinelFailoversCountsEachPromotion(t *testing.T) {
	st := StartSentinel(t)
	ctx := context.Background()
	if n, err := st.Failovers(ctx); err != nil || n != 0 {
		t.Fatalf("Failovers before any = %d, %v; want 0", n, err)
	}
	dead, _ := st.FailOver(t, time.Minute)
	if n, err := st.Failovers(ctx); err != nil || n != 1 {
		t.Fatalf("Failovers after one = %d, %v; want 1", n, err)
	}
	if addr, err := st.MasterAddr(ctx); err != nil || addr == dead {
		t.Fatalf("master after the failover = %q, %v; want a promoted replica, not %s", addr, err, dead)
	}
}
