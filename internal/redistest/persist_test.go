package redistest

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestStartServerWithRestartKeepsData: the extra arguments reach
// redis-server, and with an fsync-always append-only file a SIGKILL loses
// nothing that was acknowledged: Restart reuses the arguments and the data
// directory.
func TestStartServerWithRestartKeepsData(t *testing.T) {
	ctx := context.Background()
	s := StartServerWith(t, "--appendonly", "yes", "--appendfsync", "always")
	c := s.Client(t)
	for param, want := range map[string]string{"appendonly": "yes", "appendfsync": "always"} {
		got, err := c.ConfigGet(ctx, param).Result()
		if err != nil || got[param] != want {
			t.Fatalf("CONFIG GET %s = %q, %v; want %q", param, got[param], err, want)
		}
	}
	if err := c.Set(ctx, "survivor", "v1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: []any{"f", "x"}}).Err(); err != nil {
		t.Fatal(err)
	}
	addr := s.Addr()

	s.Kill()
	s.Restart(t)
	if got := s.Addr(); got != addr {
		t.Fatalf("Restart moved from %s to %s", addr, got)
	}
	eventually(t, startTimeout, "GET after restart", func() error { return c.Ping(ctx).Err() })
	if got, err := c.Get(ctx, "survivor").Result(); err != nil || got != "v1" {
		t.Fatalf("after Kill+Restart GET survivor = %q, %v; want v1 (data not persisted)", got, err)
	}
	if n, err := c.XLen(ctx, "s").Result(); err != nil || n != 1 {
		t.Fatalf("after Kill+Restart XLEN s = %d, %v; want 1", n, err)
	}
	// The arguments survive the restart too.
	if got, err := c.ConfigGet(ctx, "appendfsync").Result(); err != nil || got["appendfsync"] != "always" {
		t.Fatalf("after restart CONFIG GET appendfsync = %v, %v", got, err)
	}
}

func TestWipeDataRestartsEmpty(t *testing.T) {
	s := StartServerWith(t, "--appendonly", "yes", "--appendfsync", "always")
	ctx := context.Background()
	c := s.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	if err := s.WipeData(); err != nil {
		t.Fatal(err)
	}
	s.Restart(t)
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("after WipeData and Restart: EXISTS k = %d, %v; want 0 (data gone)", n, err)
	}
}
