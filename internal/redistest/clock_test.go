package redistest

import (
	"context"
	"testing"
	"time"
)

// The shim moves Redis TIME both ways while the server runs, and keys
// still expire.
func TestClockShiftsRedisTime(t *testing.T) {
	clk := NewClock(t)
	s := StartServerWithClock(t, clk)
	rdb := s.Client(t)
	ctx := context.Background()
	skew := func() time.Duration {
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return now.Sub(time.Now())
	}
	if d := skew(); d.Abs() > time.Second {
		t.Fatalf("offset 0: Redis is %s off the host's clock", d)
	}
	for _, off := range []time.Duration{-time.Hour, 10 * time.Minute} {
		if err := clk.Set(off); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for d := skew(); (d - off).Abs() > time.Second; d = skew() {
			if time.Now().After(deadline) {
				t.Fatalf("offset %s: Redis is %s off the host's clock", off, d)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if err := rdb.Set(ctx, "k", "v", 200*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for rdb.Exists(ctx, "k").Val() == 1 {
		if time.Now().After(deadline) {
			t.Fatal("a key with a 200 ms TTL still exists after 5 s on the shifted clock")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
