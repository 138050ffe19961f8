package leasing_test

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/checkpoints"
	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/leasing"
	"github.com/tasklease/tasklease/taskkey"
)

// newManager returns a Manager with the default keyspace on rdb.
func newManager(t testing.TB, rdb redis.UniversalClient) *leasing.Manager {
	t.Helper()
	m, err := leasing.NewManager(rdb, leasing.Config{})
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	return m
}

// defaultSpace is the keyspace of a zero leasing.Config.
func defaultSpace(t testing.TB) *keyspace.Space {
	t.Helper()
	ks, err := keyspace.New("", 0)
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

// testKey returns a task key whose subject is unique to the running test.
func testKey(t testing.TB, scope string) taskkey.Key {
	t.Helper()
	subject := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-':
			return r
		}
		return '.'
	}, t.Name())
	if len(subject) > taskkey.MaxSubjectLen {
		subject = subject[len(subject)-taskkey.MaxSubjectLen:]
	}
	return taskkey.MustNew(subject, scope) // t.Name() starts with "Test"
}

func get(t testing.TB, rdb redis.UniversalClient, key string) (string, bool) {
	t.Helper()
	v, err := rdb.Get(context.Background(), key).Result()
	if errors.Is(err, redis.Nil) {
		return "", false
	}
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	return v, true
}

func pttl(t testing.TB, rdb redis.UniversalClient, key string) time.Duration {
	t.Helper()
	d, err := rdb.PTTL(context.Background(), key).Result()
	if err != nil {
		t.Fatalf("PTTL %s: %v", key, err)
	}
	return d
}

func TestNewManagerConfig(t *testing.T) {
	if _, err := leasing.NewManager(nil, leasing.Config{}); !errors.Is(err, leasing.ErrConfig) {
		t.Errorf("NewManager(nil) = %v, want ErrConfig", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer rdb.Close()
	for _, cfg := range []leasing.Config{
		{Prefix: "bad prefix"},
		{Prefix: "{x}"},
		{Partitions: -1},
		{Partitions: keyspace.PartitionsMax + 1},
	} {
		_, err := leasing.NewManager(rdb, cfg)
		if !errors.Is(err, leasing.ErrConfig) || !errors.Is(err, keyspace.ErrConfig) {
			t.Errorf("NewManager(%+v) = %v, want ErrConfig wrapping keyspace.ErrConfig", cfg, err)
		}
	}
	if _, err := leasing.NewManager(rdb, leasing.Config{Prefix: "app", Partitions: 4}); err != nil {
		t.Errorf("NewManager(valid): %v", err)
	}
}

func TestParseValue(t *testing.T) {
	tests := []struct {
		in    string
		token int64
		owner string
	}{
		{"7|pod-a", 7, "pod-a"},
		{"12|pod-a/run|x", 12, "pod-a/run|x"},
		{"1|", 1, ""},
		{"pod-a", 0, "pod-a"},
		{"x|pod-a", 0, "x|pod-a"},
		{"", 0, ""},
	}
	for _, tt := range tests {
		token, owner := leasing.ParseValue(tt.in)
		if token != tt.token || owner != tt.owner {
			t.Errorf("ParseValue(%q) = %d, %q; want %d, %q", tt.in, token, owner, tt.token, tt.owner)
		}
	}
}

// TestLeaseKeyLayout pins the Redis key names of DESIGN §2.7, which other
// tools (and the checkpoint scripts) rely on.
func TestLeaseKeyLayout(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			for _, tc := range []struct {
				cfg    leasing.Config
				prefix string
				parts  uint32
			}{
				{leasing.Config{}, "tasklease", 16},
				{leasing.Config{Prefix: "custom.app", Partitions: 5}, "custom.app", 5},
			} {
				m, err := leasing.NewManager(b.Client, tc.cfg)
				if err != nil {
					t.Fatal(err)
				}
				key := taskkey.MustNew("u42", "course_sync")
				lease, err := m.Acquire(ctx, key, "pod-a", 10*time.Second)
				if err != nil {
					t.Fatalf("Acquire: %v", err)
				}
				p := crc32.ChecksumIEEE([]byte("u42|course_sync")) % tc.parts
				leaseKey := fmt.Sprintf("{%s:p%d}:lease:u42|course_sync", tc.prefix, p)
				fenceKey := fmt.Sprintf("{%s:p%d}:fence:u42|course_sync", tc.prefix, p)
				if v, ok := get(t, b.Client, leaseKey); !ok || v != fmt.Sprintf("%d|pod-a", lease.Token) {
					t.Fatalf("GET %s = %q, %v; want %d|pod-a", leaseKey, v, ok, lease.Token)
				}
				if v, ok := get(t, b.Client, fenceKey); !ok || v != fmt.Sprint(lease.Token) {
					t.Fatalf("GET %s = %q, %v; want %d", fenceKey, v, ok, lease.Token)
				}
			}
		})
	}
}

func TestAcquireValidation(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			m := newManager(t, b.Client)
			key := testKey(t, "course_sync")
			for _, tc := range []struct {
				name  string
				key   taskkey.Key
				owner string
				ttl   time.Duration
			}{
				{"zero key", taskkey.Key{}, "pod-a", time.Second},
				{"empty owner", key, "", time.Second},
				{"long owner", key, strings.Repeat("o", leasing.OwnerMaxLen+1), time.Second},
				{"ttl below min", key, "pod-a", leasing.TTLMin - time.Millisecond},
				{"zero ttl", key, "pod-a", 0},
				{"negative ttl", key, "pod-a", -time.Second},
			} {
				if _, err := m.Acquire(ctx, tc.key, tc.owner, tc.ttl); !errors.Is(err, leasing.ErrConfig) {
					t.Errorf("%s: Acquire = %v, want ErrConfig", tc.name, err)
				}
			}
			// Nothing reached Redis.
			if n, err := b.Client.DBSize(ctx).Result(); err != nil || n != 0 {
				t.Fatalf("DBSIZE = %d, %v after invalid acquires; want 0", n, err)
			}
			// The limits themselves are accepted.
			if _, err := m.Acquire(ctx, key, strings.Repeat("o", leasing.OwnerMaxLen), leasing.TTLMin); err != nil {
				t.Fatalf("Acquire at the limits: %v", err)
			}
		})
	}
}

func TestAcquireRenewRelease(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			m := newManager(t, b.Client)
			ks := defaultSpace(t)
			key := testKey(t, "course_sync")
			// On real Redis, Advance sleeps: the renewal after 3/4 of
			// the TTL must come before the lease expires even when CI's
			// load stalls this process or redis-server (100 ms seen).
			ttl := 400 * time.Millisecond
			if b.Real {
				ttl = 2 * time.Second
			}

			before := time.Now()
			lease, err := m.Acquire(ctx, key, "pod-a", ttl)
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			if lease.Key != key || lease.Owner != "pod-a" || lease.Token < 1 || lease.Token >= 1<<53 || lease.TTL != ttl {
				t.Fatalf("lease = %+v, want key %s owner pod-a, a JSON-safe token, ttl %s", lease, key, ttl)
			}
			if lease.GrantedAt.Before(before) || lease.GrantedAt.After(time.Now()) {
				t.Fatalf("GrantedAt %v not within the Acquire call", lease.GrantedAt)
			}
			if v, _ := get(t, b.Client, ks.Lease(key)); v != fmt.Sprintf("%d|pod-a", lease.Token) {
				t.Fatalf("lease value %q, want %d|pod-a", v, lease.Token)
			}
			if d := pttl(t, b.Client, ks.Lease(key)); d <= 0 || d > ttl {
				t.Fatalf("lease PTTL %v, want in (0, %v]", d, ttl)
			}
			// The fence counter expires with the retention (FenceTTLDefault).
			if d := pttl(t, b.Client, ks.Fence(key)); d <= 0 || d > leasing.FenceTTLDefault {
				t.Fatalf("fence PTTL %v, want in (0, %v]", d, leasing.FenceTTLDefault)
			}

			// Renew after most of the TTL passed restores the full TTL.
			b.Advance(ttl * 3 / 4)
			if err := m.Renew(ctx, lease); err != nil {
				t.Fatalf("Renew: %v", err)
			}
			if d := pttl(t, b.Client, ks.Lease(key)); d <= ttl*3/4 || d > ttl {
				t.Fatalf("PTTL after Renew %v, want in (%v, %v]", d, ttl*3/4, ttl)
			}
			// The lease survives past its original expiry thanks to the renewal.
			b.Advance(ttl / 2)
			if v, ok := get(t, b.Client, ks.Lease(key)); !ok || v != fmt.Sprintf("%d|pod-a", lease.Token) {
				t.Fatalf("lease after renewal and original expiry = %q, %v", v, ok)
			}

			if err := m.Release(ctx, lease); err != nil {
				t.Fatalf("Release: %v", err)
			}
			if _, ok := get(t, b.Client, ks.Lease(key)); ok {
				t.Fatal("lease key exists after Release")
			}
			if err := m.Release(ctx, lease); !errors.Is(err, leasing.ErrNotHeld) {
				t.Fatalf("second Release = %v, want ErrNotHeld", err)
			}
			if err := m.Renew(ctx, lease); !errors.Is(err, leasing.ErrNotHeld) {
				t.Fatalf("Renew after Release = %v, want ErrNotHeld", err)
			}
			if _, ok := get(t, b.Client, ks.Lease(key)); ok {
				t.Fatal("Renew after Release recreated the lease")
			}

			// A new grant gets the next token.
			lease2, err := m.Acquire(ctx, key, "pod-b", ttl)
			if err != nil {
				t.Fatalf("second Acquire: %v", err)
			}
			if lease2.Token <= lease.Token {
				t.Fatalf("second token %d, want above %d", lease2.Token, lease.Token)
			}
			// The old lease (same owner name or not) cannot touch it.
			stale := lease
			stale.Owner = "pod-b"
			for _, l := range []leasing.Lease{lease, stale} {
				if err := m.Renew(ctx, l); !errors.Is(err, leasing.ErrNotHeld) {
					t.Fatalf("Renew of stale %+v = %v, want ErrNotHeld", l, err)
				}
				if err := m.Release(ctx, l); !errors.Is(err, leasing.ErrNotHeld) {
					t.Fatalf("Release of stale %+v = %v, want ErrNotHeld", l, err)
				}
			}
			if v, _ := get(t, b.Client, ks.Lease(key)); v != fmt.Sprintf("%d|pod-b", lease2.Token) {
				t.Fatalf("lease value %q after stale calls, want 2|pod-b", v)
			}
		})
	}
}

// TestExpiredLeaseNotRenewable: a lease that expired by Redis time is gone,
// even when nobody else took it: Renew must not resurrect it.
func TestExpiredLeaseNotRenewable(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			m := newManager(t, b.Client)
			ks := defaultSpace(t)
			key := testKey(t, "backup")
			lease, err := m.Acquire(ctx, key, "pod-a", 300*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			b.Advance(300 * time.Millisecond)
			if err := m.Renew(ctx, lease); !errors.Is(err, leasing.ErrNotHeld) {
				t.Fatalf("Renew after expiry = %v, want ErrNotHeld", err)
			}
			if err := m.Release(ctx, lease); !errors.Is(err, leasing.ErrNotHeld) {
				t.Fatalf("Release after expiry = %v, want ErrNotHeld", err)
			}
			if n, err := b.Client.Exists(ctx, ks.Lease(key)).Result(); err != nil || n != 0 {
				t.Fatalf("EXISTS lease = %d, %v; want 0", n, err)
			}
			// The same owner can take it again, with a new token.
			again, err := m.Acquire(ctx, key, "pod-a", time.Second)
			if err != nil || again.Token <= lease.Token {
				t.Fatalf("re-Acquire = %+v, %v; want a token above %d", again, err, lease.Token)
			}
			// The old lease value differs from the new one only by token.
			if err := m.Renew(ctx, lease); !errors.Is(err, leasing.ErrNotHeld) {
				t.Fatalf("Renew with the old token = %v, want ErrNotHeld", err)
			}
		})
	}
}

func TestHeldError(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			m := newManager(t, b.Client)
			ks := defaultSpace(t)
			key := testKey(t, "course_sync")
			const ttl = 10 * time.Second
			a, err := m.Acquire(ctx, key, "pod-a/1", ttl)
			if err != nil {
				t.Fatal(err)
			}
			b.Advance(100 * time.Millisecond)
			_, err = m.Acquire(ctx, key, "pod-b/1", ttl)
			if !errors.Is(err, leasing.ErrHeld) {
				t.Fatalf("contended Acquire = %v, want ErrHeld", err)
			}
			var held *leasing.HeldError
			if !errors.As(err, &held) {
				t.Fatalf("contended Acquire error %T is not a *HeldError", err)
			}
			if held.Key != key || held.Owner != "pod-a/1" || held.Token != a.Token {
				t.Fatalf("HeldError = %+v, want key %s owner pod-a/1 token %d", held, key, a.Token)
			}
			if held.Remaining <= 0 || held.Remaining > ttl-100*time.Millisecond {
				t.Fatalf("HeldError.Remaining = %v, want in (0, %v]", held.Remaining, ttl-100*time.Millisecond)
			}
			if msg := held.Error(); !strings.Contains(msg, "pod-a/1") || !strings.Contains(msg, key.String()) {
				t.Fatalf("HeldError message %q lacks owner or key", msg)
			}
			// The failed attempt consumed no token and changed nothing.
			if v, _ := get(t, b.Client, ks.Fence(key)); v != fmt.Sprint(a.Token) {
				t.Fatalf("fence = %q after a refused Acquire, want %d", v, a.Token)
			}
			if v, _ := get(t, b.Client, ks.Lease(key)); v != fmt.Sprintf("%d|pod-a/1", a.Token) {
				t.Fatalf("lease = %q after a refused Acquire, want %d|pod-a/1", v, a.Token)
			}
			// The holder itself is refused a second grant as well.
			if _, err := m.Acquire(ctx, key, "pod-a/1", ttl); !errors.Is(err, leasing.ErrHeld) {
				t.Fatalf("re-Acquire by the holder = %v, want ErrHeld", err)
			}
		})
	}
}

// TestKeysIndependent: dedup is by key only; another subject (an account
// switch) or another scope is never blocked.
func TestKeysIndependent(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			m := newManager(t, b.Client)
			keys := []taskkey.Key{
				taskkey.MustNew("u1", "course_sync"),
				taskkey.MustNew("u2", "course_sync"),
				taskkey.MustNew("u1", "message_sync"),
				taskkey.MustNew("u1.x", "course_sync"),
			}
			for _, k := range keys {
				l, err := m.Acquire(ctx, k, "pod-a", 10*time.Second)
				if err != nil {
					t.Fatalf("Acquire %s: %v", k, err)
				}
				if fence, _ := get(t, b.Client, defaultSpace(t).Fence(k)); fence != fmt.Sprint(l.Token) {
					t.Fatalf("Acquire %s token %d, fence %q: want the key's own fence at the token", k, l.Token, fence)
				}
			}
			for _, k := range keys {
				if _, err := m.Acquire(ctx, k, "pod-b", 10*time.Second); !errors.Is(err, leasing.ErrHeld) {
					t.Fatalf("second Acquire %s = %v, want ErrHeld", k, err)
				}
			}
		})
	}
}

// TestContention: 50 goroutines × 200 rounds race for one key. At most one
// holds it at any time, tokens strictly increase in grant order, and the
// fence counter equals the number of grants.
func TestContention(t *testing.T) {
	// CPU-bound on miniredis (it compiles every script call) and free of
	// timing assertions: run it alongside TestCluster, which mostly waits.
	t.Parallel()
	const goroutines = 50
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			// miniredis compiles each call's script, on one goroutine:
			// under -race on a busy CI machine 200 rounds of 50 pods ran
			// into the client's 3 s read timeout (twice)
			rounds := 200
			if b.Name == "miniredis" {
				rounds = 60
			}
			ctx := context.Background()
			m := newManager(t, b.Client)
			ks := defaultSpace(t)
			key := testKey(t, "course_sync")

			var (
				holders  atomic.Int32 // current holders, by the overlap recorder
				overlaps atomic.Int32
				refused  atomic.Int32
				mu       sync.Mutex
				tokens   []int64 // in grant order
				errMu    sync.Mutex
				errs     []error
			)
			fail := func(err error) {
				errMu.Lock()
				errs = append(errs, err)
				errMu.Unlock()
			}
			var wg sync.WaitGroup
			for g := range goroutines {
				owner := fmt.Sprintf("pod-%d", g)
				wg.Go(func() {
					for range rounds {
						lease, err := m.Acquire(ctx, key, owner, 10*time.Second)
						if errors.Is(err, leasing.ErrHeld) {
							refused.Add(1)
							continue
						}
						if err != nil {
							fail(fmt.Errorf("%s: Acquire: %w", owner, err))
							return
						}
						if n := holders.Add(1); n > 1 {
							overlaps.Add(1)
						}
						mu.Lock()
						tokens = append(tokens, lease.Token)
						mu.Unlock()
						runtime.Gosched() // widen the window an overlap would show in
						holders.Add(-1)
						if err := m.Release(ctx, lease); err != nil {
							fail(fmt.Errorf("%s: Release token %d: %w", owner, lease.Token, err))
							return
						}
					}
				})
			}
			wg.Wait()
			for _, err := range errs {
				t.Error(err)
			}
			if n := overlaps.Load(); n != 0 {
				t.Fatalf("%d grants overlapped another holder", n)
			}
			if len(tokens) == 0 {
				t.Fatal("no grants at all")
			}
			if got := len(tokens) + int(refused.Load()); got != goroutines*rounds {
				t.Fatalf("%d grants + %d refusals = %d attempts, want %d", len(tokens), refused.Load(), got, goroutines*rounds)
			}
			seen := make(map[int64]bool, len(tokens))
			for i, tok := range tokens {
				if seen[tok] {
					t.Fatalf("token %d granted twice", tok)
				}
				seen[tok] = true
				if i > 0 && tok <= tokens[i-1] {
					t.Fatalf("grant %d got token %d after token %d: not strictly increasing", i, tok, tokens[i-1])
				}
			}
			fence, err := b.Client.Get(ctx, ks.Fence(key)).Int64()
			if err != nil {
				t.Fatalf("GET fence: %v", err)
			}
			if fence != tokens[len(tokens)-1] {
				t.Fatalf("fence = %d, want the last token granted, %d", fence, tokens[len(tokens)-1])
			}
			if n, _ := b.Client.Exists(ctx, ks.Lease(key)).Result(); n != 0 {
				t.Fatal("lease still held after every holder released")
			}
			t.Logf("%d grants, %d refusals", len(tokens), refused.Load())
		})
	}
}

// TestTakeover: a holder whose lease expired and was granted to someone else
// can neither renew, release nor write its checkpoint.
func TestTakeover(t *testing.T) {
	stages := []string{"pulling", "pushing"}
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			m := newManager(t, b.Client)
			store, err := checkpoints.NewStore(b.Client, checkpoints.Config{})
			if err != nil {
				t.Fatal(err)
			}
			ks := defaultSpace(t)
			key := testKey(t, "course_sync")
			const ttl = 300 * time.Millisecond
			cursor := []byte{0, 255, 10, 'x'}

			a, err := m.Acquire(ctx, key, "pod-a", ttl)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := store.Begin(ctx, a, "run-1", stages); err != nil {
				t.Fatalf("A Begin: %v", err)
			}
			if next, err := store.Advance(ctx, a, "run-1", "pulling"); err != nil || next != "pushing" {
				t.Fatalf("A Advance = %q, %v", next, err)
			}
			if err := store.SaveProgress(ctx, a, "run-1", cursor); err != nil {
				t.Fatalf("A SaveProgress: %v", err)
			}

			b.Advance(ttl)
			bl, err := m.Acquire(ctx, key, "pod-b", 10*time.Second)
			if err != nil {
				t.Fatalf("B Acquire after A's TTL: %v", err)
			}
			if bl.Token <= a.Token {
				t.Fatalf("B token %d not greater than A's %d", bl.Token, a.Token)
			}
			before, err := store.Load(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			bValue := fmt.Sprintf("%d|pod-b", bl.Token)
			bTTL := pttl(t, b.Client, ks.Lease(key))

			// Every write of A is refused.
			if err := m.Renew(ctx, a); !errors.Is(err, leasing.ErrNotHeld) {
				t.Errorf("A Renew = %v, want ErrNotHeld", err)
			}
			if err := m.Release(ctx, a); !errors.Is(err, leasing.ErrNotHeld) {
				t.Errorf("A Release = %v, want ErrNotHeld", err)
			}
			if err := store.SaveProgress(ctx, a, "run-1", []byte("stale")); !errors.Is(err, leasing.ErrNotHeld) {
				t.Errorf("A SaveProgress = %v, want ErrNotHeld", err)
			}
			if _, err := store.Advance(ctx, a, "run-1", "pushing"); !errors.Is(err, leasing.ErrNotHeld) {
				t.Errorf("A Advance = %v, want ErrNotHeld", err)
			}
			if _, err := store.Begin(ctx, a, "run-2", stages); !errors.Is(err, leasing.ErrNotHeld) {
				t.Errorf("A Begin = %v, want ErrNotHeld", err)
			}
			// Renew with A's token but B's name is still refused.
			forged := a
			forged.Owner = "pod-b"
			if err := m.Renew(ctx, forged); !errors.Is(err, leasing.ErrNotHeld) {
				t.Errorf("Renew with B's owner and A's token = %v, want ErrNotHeld", err)
			}

			// Nothing changed.
			if v, ok := get(t, b.Client, ks.Lease(key)); !ok || v != bValue {
				t.Fatalf("lease = %q, %v after A's attempts, want %q", v, ok, bValue)
			}
			if d := pttl(t, b.Client, ks.Lease(key)); d > bTTL || d <= 0 {
				t.Fatalf("B's PTTL went from %v to %v: A's renewal extended it", bTTL, d)
			}
			after, err := store.Load(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprintf("%+v", after) != fmt.Sprintf("%+v", before) {
				t.Fatalf("checkpoint changed by A's refused writes:\nbefore %+v\nafter  %+v", before, after)
			}
			if string(after.Cursor) != string(cursor) || after.Completed != 1 || after.Token != a.Token {
				t.Fatalf("checkpoint = %+v, want A's last state (done 1, cursor %v)", after, cursor)
			}

			// B takes the run over and resumes where A stopped.
			cp, err := store.Begin(ctx, bl, "run-1", stages)
			if err != nil {
				t.Fatalf("B Begin: %v", err)
			}
			rec := checkpoints.Decide(cp)
			if rec.Mode != checkpoints.Resume || rec.Stage != "pushing" || string(rec.Cursor) != string(cursor) {
				t.Fatalf("B recovery = %+v, want resume at pushing with A's cursor", rec)
			}
			if cp.Owner != "pod-b" || cp.Token != bl.Token || cp.Attempt != 2 {
				t.Fatalf("B checkpoint = %+v, want owner pod-b token %d attempt 2", cp, bl.Token)
			}
			// A's writes stay refused now that the record is B's.
			if err := store.SaveProgress(ctx, a, "run-1", []byte("stale")); !errors.Is(err, leasing.ErrNotHeld) {
				t.Errorf("A SaveProgress after B's Begin = %v, want ErrNotHeld", err)
			}
			if err := m.Release(ctx, bl); err != nil {
				t.Fatalf("B Release: %v", err)
			}
		})
	}
}

// TestScriptFlush: a SCRIPT FLUSH (or a Redis restart) in the middle of work
// breaks nothing: go-redis falls back from EVALSHA to EVAL.
func TestScriptFlush(t *testing.T) {
	stages := []string{"pulling", "pushing"}
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			m := newManager(t, b.Client)
			store, err := checkpoints.NewStore(b.Client, checkpoints.Config{})
			if err != nil {
				t.Fatal(err)
			}
			key := testKey(t, "course_sync")
			lease, err := m.Acquire(ctx, key, "pod-a", 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := store.Begin(ctx, lease, "run-1", stages); err != nil {
				t.Fatal(err)
			}
			flush := func() {
				t.Helper()
				if err := b.Client.ScriptFlush(ctx).Err(); err != nil {
					t.Fatalf("SCRIPT FLUSH: %v", err)
				}
			}
			flush()
			if err := m.Renew(ctx, lease); err != nil {
				t.Fatalf("Renew after SCRIPT FLUSH: %v", err)
			}
			flush()
			if err := store.SaveProgress(ctx, lease, "run-1", []byte("c1")); err != nil {
				t.Fatalf("SaveProgress after SCRIPT FLUSH: %v", err)
			}
			flush()
			if next, err := store.Advance(ctx, lease, "run-1", "pulling"); err != nil || next != "pushing" {
				t.Fatalf("Advance after SCRIPT FLUSH = %q, %v", next, err)
			}
			flush()
			if _, err := m.Acquire(ctx, key, "pod-b", time.Second); !errors.Is(err, leasing.ErrHeld) {
				t.Fatalf("contended Acquire after SCRIPT FLUSH = %v, want ErrHeld", err)
			}
			flush()
			if err := m.Release(ctx, lease); err != nil {
				t.Fatalf("Release after SCRIPT FLUSH: %v", err)
			}
			cp, err := store.Load(ctx, key)
			if err != nil || cp.Completed != 1 || cp.Stage != "pushing" {
				t.Fatalf("Load = %+v, %v; want 1 stage done", cp, err)
			}
			flush()
			if _, err := m.Acquire(ctx, key, "pod-b", time.Second); err != nil {
				t.Fatalf("Acquire after SCRIPT FLUSH: %v", err)
			}
		})
	}
}

// TestTokensMonotonicAcrossDataLoss: a Redis that loses its data (restart
// without persistence, FLUSHALL) forgets the fence counter, and the next
// grant must still carry a token above every token granted before
// (DESIGN §2.2: max(previous + 1, Redis TIME in µs)).
func TestTokensMonotonicAcrossDataLoss(t *testing.T) {
	ctx := context.Background()
	key := taskkey.MustNew("u42", "course_sync")
	check := func(t *testing.T, m *leasing.Manager, lose func()) {
		t.Helper()
		var prev int64
		for round := range 3 {
			l, err := m.Acquire(ctx, key, "pod-a", time.Minute)
			if err != nil {
				t.Fatalf("round %d: Acquire: %v", round, err)
			}
			if l.Token <= prev || l.Token >= 1<<53 {
				t.Fatalf("round %d: token %d after %d: went backwards (or left the JSON-safe range)", round, l.Token, prev)
			}
			prev = l.Token
			lose()
		}
	}
	t.Run("redis restarted empty", func(t *testing.T) {
		srv := redistest.StartServer(t)
		rdb := srv.Client(t)
		m := newManager(t, rdb)
		check(t, m, func() {
			srv.Kill()
			srv.Restart(t)
			if n, err := rdb.DBSize(ctx).Result(); err != nil || n != 0 {
				t.Fatalf("DBSIZE after restart = %d, %v; want an empty Redis", n, err)
			}
		})
	})
	t.Run("miniredis flushed", func(t *testing.T) {
		mini := redistest.StartMini(t)
		m := newManager(t, mini.Client(t))
		check(t, m, func() {
			mini.FlushAll()
			mini.Advance(time.Millisecond) // miniredis' clock only moves when told
		})
	})
}

// TestFenceCounterExpires: the fence counter is bounded by the retention
// (Config.FenceTTL), not kept forever.
func TestFenceCounterExpires(t *testing.T) {
	ctx := context.Background()
	mini := redistest.StartMini(t)
	m, err := leasing.NewManager(mini.Client(t), leasing.Config{FenceTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	key := taskkey.MustNew("u42", "course_sync")
	l, err := m.Acquire(ctx, key, "pod-a", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if d := pttl(t, mini.Client(t), defaultSpace(t).Fence(key)); d <= 0 || d > time.Hour {
		t.Fatalf("fence PTTL = %v, want (0, 1h]", d)
	}
	mini.Advance(2 * time.Hour)
	if n, _ := mini.Client(t).Exists(ctx, defaultSpace(t).Fence(key)).Result(); n != 0 {
		t.Fatal("fence counter still there after its TTL")
	}
	again, err := m.Acquire(ctx, key, "pod-a", time.Second)
	if err != nil || again.Token <= l.Token {
		t.Fatalf("Acquire after the counter expired = %+v, %v; want a token above %d", again, err, l.Token)
	}
}
