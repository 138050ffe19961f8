package leasing_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/leasing"
	"github.com/tasklease/tasklease/taskkey"
)

// waitClosed waits up to timeout for ch to close and returns when it did.
func waitClosed(t *testing.T, ch <-chan struct{}, timeout time.Duration, what string) time.Time {
	t.Helper()
	select {
	case <-ch:
		return time.Now()
	case <-time.After(timeout):
		t.Fatalf("%s: not closed within %v", what, timeout)
		return time.Time{}
	}
}

// watchLost records the moment k.Lost() closes, measured by a goroutine
// blocked on it rather than by the test's own polling.
func watchLost(k *leasing.Keeper) <-chan time.Time {
	at := make(chan time.Time, 1)
	go func() {
		<-k.Lost()
		at <- time.Now()
	}()
	return at
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// lostErr checks the Keeper's loss state: Err wraps ErrLost and each of
// causes, and the context is cancelled with that error as cause.
func lostErr(k *leasing.Keeper, causes ...error) error {
	err := k.Err()
	if !errors.Is(err, leasing.ErrLost) {
		return fmt.Errorf("Err() = %v, want it to wrap ErrLost", err)
	}
	for _, c := range causes {
		if !errors.Is(err, c) {
			return fmt.Errorf("Err() = %v, want it to wrap %v", err, c)
		}
	}
	// Keeper.lose closes Lost() before it cancels the context (see the
	// report: the order should be the reverse), so allow a moment here.
	select {
	case <-k.Context().Done():
	case <-time.After(time.Second):
		return errors.New("Context() not cancelled within 1s of the loss")
	}
	if cause := context.Cause(k.Context()); !errors.Is(cause, leasing.ErrLost) {
		return fmt.Errorf("context.Cause = %v, want it to wrap ErrLost", cause)
	}
	if !errors.Is(k.Context().Err(), context.Canceled) {
		return fmt.Errorf("Context().Err() = %v, want context.Canceled", k.Context().Err())
	}
	return nil
}

// awaitLost waits up to timeout for Lost() and returns when it closed.
func awaitLost(k *leasing.Keeper, timeout time.Duration) (time.Time, error) {
	select {
	case <-k.Lost():
		return time.Now(), nil
	case <-time.After(timeout):
		return time.Time{}, fmt.Errorf("Lost() not closed within %v", timeout)
	}
}

// The Keeper tests work in real time with TTLs of a few hundred
// milliseconds. On an overloaded machine (or under -race with other test
// binaries running) the whole test process can be descheduled for longer
// than the margins, which fails a correct Keeper. stallRetry runs such a
// scenario and retries it only when it failed while this process was
// measurably stalled; a failure without a stall fails at once, so a real bug
// (which fails every time) is never hidden.
const (
	stallThreshold = 50 * time.Millisecond
	stallTries     = 3
)

func stallRetry(t *testing.T, scenario func(try int) error) {
	t.Helper()
	stallRetryOn(t, nil, scenario)
}

// stallRetryOn is stallRetry for a scenario that talks to Redis: a stall
// of redis-server (a PING that takes longer than the threshold) counts
// too, since a renewal it leaves unanswered fails a correct Keeper just
// as a stall of this process does.
func stallRetryOn(t *testing.T, rdb redis.UniversalClient, scenario func(try int) error) {
	t.Helper()
	for try := 1; ; try++ {
		w := watchStalls(rdb)
		err := scenario(try)
		stall := w.stop()
		if err == nil {
			return
		}
		if stall < stallThreshold || try == stallTries {
			t.Fatalf("%v (attempt %d, largest scheduling stall %v)", err, try, stall)
		}
		t.Logf("attempt %d failed while the test process or Redis stalled for %v; retrying: %v", try, stall, err)
	}
}

// stallWatch measures the largest gap between wake-ups of a goroutine that
// asks to wake every 5ms and, given a client, the slowest PING sent every
// 5ms.
type stallWatch struct {
	quit chan struct{}
	done sync.WaitGroup
	mu   sync.Mutex
	max  time.Duration
}

func (w *stallWatch) saw(d time.Duration) {
	w.mu.Lock()
	w.max = max(w.max, d)
	w.mu.Unlock()
}

func watchStalls(rdb redis.UniversalClient) *stallWatch {
	w := &stallWatch{quit: make(chan struct{})}
	w.done.Add(1)
	go func() {
		defer w.done.Done()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		last := time.Now()
		for {
			select {
			case <-w.quit:
				return
			case <-tick.C:
				now := time.Now()
				w.saw(now.Sub(last))
				last = now
			}
		}
	}()
	if rdb != nil {
		w.done.Add(1)
		go func() {
			defer w.done.Done()
			for {
				select {
				case <-w.quit:
					return
				case <-time.After(5 * time.Millisecond):
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				start := time.Now()
				err := rdb.Ping(ctx).Err()
				cancel()
				if err != nil {
					w.saw(time.Second)
					continue
				}
				w.saw(time.Since(start))
			}
		}()
	}
	return w
}

func (w *stallWatch) stop() time.Duration {
	close(w.quit)
	w.done.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.max
}

// checkLost asserts the Keeper's loss state: Err wraps ErrLost and each of
// causes, and the context is cancelled with that error as cause.
func checkLost(t *testing.T, k *leasing.Keeper, causes ...error) {
	t.Helper()
	if err := lostErr(k, causes...); err != nil {
		t.Fatal(err)
	}
}

func TestKeeperConfigValidate(t *testing.T) {
	const ttl = 300 * time.Millisecond
	renew := func(context.Context) error { return nil }
	tests := []struct {
		name string
		cfg  leasing.KeeperConfig
		ok   bool
	}{
		{"defaults", leasing.KeeperConfig{TTL: ttl}, true},
		{"missing TTL", leasing.KeeperConfig{}, false},
		{"negative TTL", leasing.KeeperConfig{TTL: -ttl}, false},
		{"explicit", leasing.KeeperConfig{TTL: ttl, RenewDeadline: 250 * time.Millisecond, RenewInterval: 50 * time.Millisecond, RetryInterval: 10 * time.Millisecond}, true},
		{"deadline == TTL", leasing.KeeperConfig{TTL: ttl, RenewDeadline: ttl}, false},
		{"deadline > TTL", leasing.KeeperConfig{TTL: ttl, RenewDeadline: 2 * ttl}, false},
		{"interval == deadline", leasing.KeeperConfig{TTL: ttl, RenewDeadline: 150 * time.Millisecond, RenewInterval: 150 * time.Millisecond}, false},
		{"interval > deadline", leasing.KeeperConfig{TTL: ttl, RenewDeadline: 150 * time.Millisecond, RenewInterval: 160 * time.Millisecond}, false},
		{"negative interval", leasing.KeeperConfig{TTL: ttl, RenewInterval: -time.Millisecond}, false},
		{"negative retry", leasing.KeeperConfig{TTL: ttl, RetryInterval: -time.Millisecond}, false},
		{"retry > interval", leasing.KeeperConfig{TTL: ttl, RetryInterval: 101 * time.Millisecond}, false},
		{"retry == interval", leasing.KeeperConfig{TTL: ttl, RetryInterval: 100 * time.Millisecond}, true},
		// The defaults show through the boundaries: RenewDeadline defaults
		// to 2/3 TTL (200ms), so an interval of 200ms fails and 199ms passes…
		{"default deadline is 2/3 TTL (fail)", leasing.KeeperConfig{TTL: ttl, RenewInterval: 200 * time.Millisecond}, false},
		{"default deadline is 2/3 TTL (pass)", leasing.KeeperConfig{TTL: ttl, RenewInterval: 199 * time.Millisecond}, true},
		// …and RenewInterval defaults to TTL/3 (100ms), so a deadline of
		// 100ms fails and 101ms passes.
		{"default interval is TTL/3 (fail)", leasing.KeeperConfig{TTL: ttl, RenewDeadline: 100 * time.Millisecond}, false},
		{"default interval is TTL/3 (pass)", leasing.KeeperConfig{TTL: ttl, RenewDeadline: 101 * time.Millisecond}, true},
	}
	for _, tt := range tests {
		err := tt.cfg.Validate()
		if tt.ok != (err == nil) {
			t.Errorf("%s: Validate(%+v) = %v, want ok=%v", tt.name, tt.cfg, err, tt.ok)
		}
		if err != nil && !errors.Is(err, leasing.ErrConfig) {
			t.Errorf("%s: Validate = %v, want errors.Is ErrConfig", tt.name, err)
		}
		// NewKeeper validates the same way (and never starts on error).
		cfg := tt.cfg
		cfg.Renew = renew
		k, err := leasing.NewKeeper(context.Background(), time.Now(), cfg)
		if tt.ok != (err == nil) {
			t.Errorf("%s: NewKeeper = %v, want ok=%v", tt.name, err, tt.ok)
		}
		if err != nil {
			if k != nil || !errors.Is(err, leasing.ErrConfig) {
				t.Errorf("%s: NewKeeper = %v, %v; want nil and ErrConfig", tt.name, k, err)
			}
		} else {
			k.Stop()
		}
	}
	// NewKeeper requires Renew, although Validate does not.
	if _, err := leasing.NewKeeper(context.Background(), time.Now(), leasing.KeeperConfig{TTL: ttl}); !errors.Is(err, leasing.ErrConfig) {
		t.Errorf("NewKeeper without Renew = %v, want ErrConfig", err)
	}
}

// fakeRenew records the times of renewal calls and answers with answer(n),
// n counting calls from 1.
type fakeRenew struct {
	mu     sync.Mutex
	calls  []time.Time
	answer func(n int, ctx context.Context) error
}

func (f *fakeRenew) renew(ctx context.Context) error {
	f.mu.Lock()
	f.calls = append(f.calls, time.Now())
	n := len(f.calls)
	f.mu.Unlock()
	return f.answer(n, ctx)
}

func (f *fakeRenew) times() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.calls...)
}

// TestKeeperDefaultTiming checks the default schedule by behaviour: renew
// every TTL/3, and give up when nothing was confirmed for 2/3 TTL.
func TestKeeperDefaultTiming(t *testing.T) {
	const ttl = 600 * time.Millisecond
	t.Run("renews every TTL/3", func(t *testing.T) {
		stallRetry(t, func(int) error {
			f := &fakeRenew{answer: func(int, context.Context) error { return nil }}
			granted := time.Now()
			k, err := leasing.NewKeeper(context.Background(), granted, leasing.KeeperConfig{TTL: ttl, Renew: f.renew})
			if err != nil {
				return err
			}
			deadline := time.Now().Add(5 * time.Second)
			for len(f.times()) < 3 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			k.Stop()
			calls := f.times()
			if len(calls) < 3 {
				return fmt.Errorf("%d renewals in 5s, want >= 3", len(calls))
			}
			prev := granted
			for i, c := range calls {
				// Timers never fire early: each renewal is at least TTL/3
				// after the previous one (or the grant). The fake records a
				// call a little after the Keeper took its send time, hence
				// the tolerance.
				if gap := c.Sub(prev); gap < ttl/3-10*time.Millisecond {
					return fmt.Errorf("renewal %d came %v after the previous one, want >= %v", i+1, gap, ttl/3)
				}
				prev = c
			}
			// And not much later: well before the 2/3 TTL deadline.
			if first := calls[0].Sub(granted); first >= ttl/2 {
				return fmt.Errorf("first renewal %v after grant, want about %v", first, ttl/3)
			}
			if isClosed(k.Lost()) || k.Err() != nil {
				return fmt.Errorf("Keeper lost a lease whose renewals all succeeded: %v", k.Err())
			}
			return nil
		})
	})
	t.Run("gives up after 2/3 TTL", func(t *testing.T) {
		stallRetry(t, func(int) error {
			transient := errors.New("connection refused")
			f := &fakeRenew{answer: func(int, context.Context) error { return transient }}
			granted := time.Now()
			k, err := leasing.NewKeeper(context.Background(), granted, leasing.KeeperConfig{TTL: ttl, Renew: f.renew})
			if err != nil {
				return err
			}
			defer k.Stop()
			lostAt, err := awaitLost(k, 3*time.Second)
			if err != nil {
				return err
			}
			if d := lostAt.Sub(granted); d < ttl*2/3 {
				return fmt.Errorf("lost %v after grant, before the 2/3 TTL deadline %v", d, ttl*2/3)
			}
			if !lostAt.Before(granted.Add(ttl)) {
				return fmt.Errorf("lost %v after grant, not before the TTL %v", lostAt.Sub(granted), ttl)
			}
			if err := lostErr(k, transient); err != nil {
				return err
			}
			// Failed renewals are retried (every RenewInterval/4 = 50ms).
			calls := f.times()
			if len(calls) < 2 {
				return fmt.Errorf("%d renewal attempts before giving up, want retries", len(calls))
			}
			if first := calls[0].Sub(granted); first < ttl/3 {
				return fmt.Errorf("first renewal %v after grant, want >= %v", first, ttl/3)
			}
			return nil
		})
	})
}

// TestKeeperRenewRefused: an ErrNotHeld answer is a loss at once, without
// waiting for the deadline.
func TestKeeperRenewRefused(t *testing.T) {
	const ttl = 3 * time.Second
	f := &fakeRenew{answer: func(n int, _ context.Context) error {
		if n < 2 {
			return nil
		}
		return fmt.Errorf("renew: %w", leasing.ErrNotHeld)
	}}
	granted := time.Now()
	k, err := leasing.NewKeeper(context.Background(), granted, leasing.KeeperConfig{
		TTL: ttl, RenewInterval: 50 * time.Millisecond, Renew: f.renew,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	lostAt := waitClosed(t, k.Lost(), 2*time.Second, "Lost()")
	checkLost(t, k, leasing.ErrNotHeld)
	if n := len(f.times()); n != 2 {
		t.Fatalf("%d renewals, want 2 (one ok, one refused, then stop)", n)
	}
	if d := lostAt.Sub(granted); d >= 2*time.Second {
		t.Fatalf("loss signalled %v after grant, want at the refused renewal (~100ms)", d)
	}
}

// TestKeeperDeadlineAfterRenewal: after a confirmed renewal the deadline
// restarts from the moment that renewal was sent, never from later.
func TestKeeperDeadlineAfterRenewal(t *testing.T) {
	const ttl = 600 * time.Millisecond
	stallRetry(t, func(int) error {
		var (
			mu     sync.Mutex
			okSent time.Time // written by the Keeper's renewals
		)
		transient := errors.New("i/o timeout")
		f := &fakeRenew{answer: func(n int, _ context.Context) error {
			if n <= 2 {
				mu.Lock()
				okSent = time.Now()
				mu.Unlock()
				return nil
			}
			return transient
		}}
		k, err := leasing.NewKeeper(context.Background(), time.Now(), leasing.KeeperConfig{TTL: ttl, Renew: f.renew})
		if err != nil {
			return err
		}
		defer k.Stop()
		lostAt, err := awaitLost(k, 3*time.Second)
		if err != nil {
			return err
		}
		if err := lostErr(k, transient); err != nil {
			return err
		}
		mu.Lock()
		last := okSent
		mu.Unlock()
		// okSent is taken inside Renew, a hair after the Keeper's own send
		// time that the deadline counts from: allow that much early.
		const slack = 5 * time.Millisecond
		if d := lostAt.Sub(last); d < ttl*2/3-slack || d >= ttl {
			return fmt.Errorf("lost %v after the last confirmed renewal was sent, want in [%v, %v)", d, ttl*2/3-slack, ttl)
		}
		return nil
	})
}

// TestKeeperRenewHangs: a Renew that ignores its context (a client stuck on
// a dead connection) cannot delay the loss past the deadline.
func TestKeeperRenewHangs(t *testing.T) {
	const ttl = 600 * time.Millisecond
	stallRetry(t, func(int) error {
		release := make(chan struct{})
		f := &fakeRenew{answer: func(int, context.Context) error { <-release; return nil }}
		granted := time.Now()
		k, err := leasing.NewKeeper(context.Background(), granted, leasing.KeeperConfig{TTL: ttl, Renew: f.renew})
		if err != nil {
			return err
		}
		defer k.Stop()
		defer close(release) // before Stop, in case the Keeper waits for Renew
		lostAt, err := awaitLost(k, 3*time.Second)
		if err != nil {
			return err
		}
		if !lostAt.Before(granted.Add(ttl)) {
			return fmt.Errorf("lost %v after grant, want before the TTL %v", lostAt.Sub(granted), ttl)
		}
		if err := lostErr(k); err != nil {
			return err
		}
		if n := len(f.times()); n != 1 {
			return fmt.Errorf("%d renewal calls, want 1 (the hung one)", n)
		}
		return nil
	})
}

func TestKeeperStopAndParentCancel(t *testing.T) {
	ok := func(context.Context) error { return nil }
	t.Run("Stop", func(t *testing.T) {
		k, err := leasing.NewKeeper(context.Background(), time.Now(), leasing.KeeperConfig{TTL: time.Second, Renew: ok})
		if err != nil {
			t.Fatal(err)
		}
		k.Stop()
		k.Stop() // idempotent
		if isClosed(k.Lost()) || k.Err() != nil {
			t.Fatalf("Stop signalled a loss: %v", k.Err())
		}
		if k.Context().Err() == nil {
			t.Fatal("Context() not cancelled by Stop")
		}
		if cause := context.Cause(k.Context()); errors.Is(cause, leasing.ErrLost) {
			t.Fatalf("Stop cancelled with cause %v, want not ErrLost", cause)
		}
	})
	t.Run("parent cancelled", func(t *testing.T) {
		parent, cancel := context.WithCancel(context.Background())
		k, err := leasing.NewKeeper(parent, time.Now(), leasing.KeeperConfig{TTL: time.Second, Renew: ok})
		if err != nil {
			t.Fatal(err)
		}
		cancel()
		waitClosed(t, k.Context().Done(), time.Second, "Context().Done()")
		k.Stop() // returns once the loop exited
		if isClosed(k.Lost()) || k.Err() != nil {
			t.Fatalf("parent cancellation signalled a loss: %v", k.Err())
		}
	})
	t.Run("Stop during a hung renewal", func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		started := make(chan struct{})
		var once sync.Once
		hang := func(context.Context) error { once.Do(func() { close(started) }); <-release; return nil }
		k, err := leasing.NewKeeper(context.Background(), time.Now(), leasing.KeeperConfig{TTL: 300 * time.Millisecond, Renew: hang})
		if err != nil {
			t.Fatal(err)
		}
		waitClosed(t, started, 2*time.Second, "renewal start")
		stopped := make(chan struct{})
		go func() { k.Stop(); close(stopped) }()
		waitClosed(t, stopped, time.Second, "Stop")
		if isClosed(k.Lost()) || k.Err() != nil {
			t.Fatalf("Stop during renewal signalled a loss: %v", k.Err())
		}
	})
}

func TestKeepConfig(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			m := newManager(t, b.Client)
			lease, err := m.Acquire(ctx, testKey(t, "course_sync"), "pod-a", 300*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := m.Keep(ctx, lease, leasing.KeeperConfig{Renew: func(context.Context) error { return nil }}); !errors.Is(err, leasing.ErrConfig) {
				t.Errorf("Keep with a Renew func = %v, want ErrConfig", err)
			}
			if _, err := m.Keep(ctx, lease, leasing.KeeperConfig{RenewDeadline: time.Second}); !errors.Is(err, leasing.ErrConfig) {
				t.Errorf("Keep with deadline > lease TTL = %v, want ErrConfig", err)
			}
		})
	}
}

// TestKeeperKeepsLeaseAlive: a 300ms lease stays alive for over a second
// while kept, with its value unchanged; Stop is not a loss.
func TestKeeperKeepsLeaseAlive(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			m := newManager(t, b.Client)
			ks := defaultSpace(t)
			const ttl = 300 * time.Millisecond
			stallRetryOn(t, b.Client, func(try int) error {
				key := testKey(t, fmt.Sprintf("try%d", try))
				lease, err := m.Acquire(ctx, key, "pod-a", ttl)
				if err != nil {
					return err
				}
				want := fmt.Sprintf("%d|pod-a", lease.Token)
				k, err := m.Keep(ctx, lease, leasing.KeeperConfig{})
				if err != nil {
					return err
				}
				defer k.Stop()

				// Poll over 4 TTLs of real time. On miniredis the fake clock
				// is moved along with real time, so its TTLs run as on real
				// Redis.
				start := time.Now()
				last := start
				tick := time.NewTicker(20 * time.Millisecond)
				defer tick.Stop()
				checks := 0
				for time.Since(start) < 4*ttl {
					<-tick.C
					if now := time.Now(); !b.Real {
						b.Advance(now.Sub(last))
						last = now
					}
					if d := pttl(t, b.Client, ks.Lease(key)); d <= 0 {
						return fmt.Errorf("lease PTTL %v after %v of keeping", d, time.Since(start))
					}
					if v, _ := get(t, b.Client, ks.Lease(key)); v != want {
						return fmt.Errorf("lease value %q after %v, want %q", v, time.Since(start), want)
					}
					if isClosed(k.Lost()) {
						return fmt.Errorf("Keeper lost the lease after %v: %v", time.Since(start), k.Err())
					}
					checks++
				}
				if checks < 10 {
					return fmt.Errorf("only %d checks in %v", checks, 4*ttl)
				}
				k.Stop()
				if isClosed(k.Lost()) || k.Err() != nil {
					return fmt.Errorf("after Stop: lost=%v err=%v, want no loss", isClosed(k.Lost()), k.Err())
				}
				if k.Context().Err() == nil {
					return errors.New("Context() still live after Stop")
				}
				// Stop does not release: the lease is ours until it expires.
				if v, _ := get(t, b.Client, ks.Lease(key)); v != want {
					return fmt.Errorf("lease value %q after Stop, want %q", v, want)
				}
				if err := m.Release(ctx, lease); err != nil {
					return fmt.Errorf("Release after Stop: %w", err)
				}
				return nil
			})
		})
	}
}

// TestKeeperLosesTakenOverLease: the lease key vanishes and someone else is
// granted the key; the next renewal is refused and the Keeper signals loss.
func TestKeeperLosesTakenOverLease(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			m := newManager(t, b.Client)
			ks := defaultSpace(t)
			stallRetryOn(t, b.Client, func(try int) error {
				key := testKey(t, fmt.Sprintf("try%d", try))
				lease, err := m.Acquire(ctx, key, "pod-a", 300*time.Millisecond)
				if err != nil {
					return err
				}
				k, err := m.Keep(ctx, lease, leasing.KeeperConfig{})
				if err != nil {
					return err
				}
				defer k.Stop()
				workCtx := k.Context()

				if err := b.Client.Del(ctx, ks.Lease(key)).Err(); err != nil {
					return err
				}
				other, err := m.Acquire(ctx, key, "pod-b", 10*time.Second)
				if err != nil {
					return fmt.Errorf("pod-b Acquire after DEL: %w", err)
				}
				if _, err := awaitLost(k, 2*time.Second); err != nil {
					return err
				}
				if err := lostErr(k, leasing.ErrNotHeld); err != nil {
					return err
				}
				if workCtx.Err() == nil {
					return errors.New("work context not cancelled")
				}
				// pod-b's lease is intact.
				if v, _ := get(t, b.Client, ks.Lease(key)); v != fmt.Sprintf("%d|pod-b", other.Token) {
					return fmt.Errorf("lease value %q, want pod-b's", v)
				}
				return nil
			})
		})
	}
}

// TestKeeperLosesExpiredLease: the lease expired by Redis time before the
// Keeper renewed it (nobody took it over): the renewal is refused, never
// resurrecting the lease, and the Keeper signals loss.
func TestKeeperLosesExpiredLease(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			m := newManager(t, b.Client)
			ks := defaultSpace(t)
			stallRetryOn(t, b.Client, func(try int) error {
				key := testKey(t, fmt.Sprintf("try%d", try))
				lease, err := m.Acquire(ctx, key, "pod-a", 300*time.Millisecond)
				if err != nil {
					return err
				}
				// A Keeper whose first renewal comes after the lease's
				// expiry, as after a long stall of the holder.
				const interval = 600 * time.Millisecond
				k, err := leasing.NewKeeper(ctx, lease.GrantedAt, leasing.KeeperConfig{
					TTL: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RenewInterval: interval,
					Renew: func(ctx context.Context) error { return m.Renew(ctx, lease) },
				})
				if err != nil {
					return err
				}
				defer k.Stop()
				b.Advance(300 * time.Millisecond)
				lostAt, err := awaitLost(k, 3*time.Second)
				if err != nil {
					return err
				}
				if err := lostErr(k, leasing.ErrNotHeld); err != nil {
					return err
				}
				if d := lostAt.Sub(lease.GrantedAt); d < interval {
					return fmt.Errorf("lost %v after grant, before the first renewal", d)
				}
				if n, _ := b.Client.Exists(ctx, ks.Lease(key)).Result(); n != 0 {
					return errors.New("expired lease was recreated")
				}
				return nil
			})
		})
	}
}

// recordingKeeper acquires a 1s lease on rdb and keeps it with a Keeper
// that records when each confirmed renewal was sent.
type recordingKeeper struct {
	*leasing.Keeper
	lease leasing.Lease
	lost  <-chan time.Time // when Lost() closed

	mu     sync.Mutex
	okSent []time.Time
}

func keepRecording(t *testing.T, m *leasing.Manager, key taskkey.Key) (*recordingKeeper, error) {
	ctx := context.Background()
	lease, err := m.Acquire(ctx, key, "pod-a", time.Second)
	if err != nil {
		return nil, err
	}
	r := &recordingKeeper{lease: lease}
	r.Keeper, err = leasing.NewKeeper(ctx, lease.GrantedAt, leasing.KeeperConfig{
		TTL: lease.TTL,
		Renew: func(ctx context.Context) error {
			sent := time.Now()
			err := m.Renew(ctx, lease)
			if err == nil {
				r.mu.Lock()
				r.okSent = append(r.okSent, sent)
				r.mu.Unlock()
			}
			return err
		},
	})
	if err != nil {
		return nil, err
	}
	t.Cleanup(r.Stop)
	r.lost = watchLost(r.Keeper)
	return r, nil
}

// confirmed returns how many renewals were confirmed and when the last one
// was sent (the lease's grant when none).
func (r *recordingKeeper) confirmed() (int, time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.okSent) == 0 {
		return 0, r.lease.GrantedAt
	}
	return len(r.okSent), r.okSent[len(r.okSent)-1]
}

// lostBeforeExpiry waits for the loss and checks it came before the lease
// could expire: the last confirmed renewal (as sent), or the grant, plus
// the TTL.
func (r *recordingKeeper) lostBeforeExpiry(what string) (time.Duration, error) {
	var lostAt time.Time
	select {
	case lostAt = <-r.lost:
	case <-time.After(3 * time.Second):
		return 0, fmt.Errorf("Lost() not closed within 3s of %s", what)
	}
	_, from := r.confirmed()
	if d := lostAt.Sub(from); d >= r.lease.TTL {
		return d, fmt.Errorf("loss signalled %v after the grant or last confirmed renewal, not before the lease could expire (%v)", d, r.lease.TTL)
	} else if d < r.lease.TTL*2/3-5*time.Millisecond { // okSent is taken a hair after the Keeper's send time
		// Not before the deadline either: failures are retried until then.
		return d, fmt.Errorf("loss signalled %v after the grant or last confirmed renewal, before the renew deadline %v", d, r.lease.TTL*2/3)
	}
	if err := lostErr(r.Keeper); err != nil {
		return 0, err
	}
	if errors.Is(r.Err(), leasing.ErrNotHeld) {
		return 0, fmt.Errorf("Err() = %v: an unreachable Redis is not a refusal", r.Err())
	}
	d := lostAt.Sub(from)
	return d, nil
}

// TestKeeperRedisPaused: Redis stops answering (SIGSTOP) right after the
// grant; the Keeper signals loss before the lease could expire, and after
// Redis answers again it renews no more, so the lease runs out.
func TestKeeperRedisPaused(t *testing.T) {
	stallRetry(t, func(try int) error {
		srv := redistest.StartServer(t)
		defer srv.Resume()
		rdb := srv.Client(t)
		m := newManager(t, rdb)
		r, err := keepRecording(t, m, testKey(t, "course_sync"))
		if err != nil {
			return err
		}
		srv.Pause()
		d, err := r.lostBeforeExpiry("Redis pausing")
		if err != nil {
			return err
		}
		t.Logf("lost %v after grant (TTL %v): %v", d, r.lease.TTL, r.Err())

		srv.Resume()
		key := defaultSpace(t).Lease(r.lease.Key)
		deadline := time.Now().Add(5 * time.Second)
		for {
			n, err := rdb.Exists(context.Background(), key).Result()
			if err == nil && n == 0 {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("lease still exists 5s after Resume (%d, %v): the lost Keeper kept renewing", n, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

// TestKeeperRedisPausedAfterRenewals: Redis stops answering after renewals
// succeeded; loss comes before the last confirmed renewal (as sent) plus
// the TTL.
func TestKeeperRedisPausedAfterRenewals(t *testing.T) {
	stallRetry(t, func(try int) error {
		srv := redistest.StartServer(t)
		defer srv.Resume()
		m := newManager(t, srv.Client(t))
		r, err := keepRecording(t, m, testKey(t, "course_sync"))
		if err != nil {
			return err
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			n, _ := r.confirmed()
			if n >= 2 {
				break
			}
			if time.Now().After(deadline) || isClosed(r.Lost()) {
				return fmt.Errorf("%d renewals confirmed in 5s (lost: %v)", n, r.Err())
			}
			time.Sleep(10 * time.Millisecond)
		}
		srv.Pause()
		d, err := r.lostBeforeExpiry("Redis pausing")
		if err != nil {
			return err
		}
		t.Logf("lost %v after the last confirmed renewal (TTL %v): %v", d, r.lease.TTL, r.Err())
		return nil
	})
}

// TestKeeperRedisKilled: Redis dies; the Keeper signals loss before the lease
// could expire.
func TestKeeperRedisKilled(t *testing.T) {
	stallRetry(t, func(try int) error {
		srv := redistest.StartServer(t)
		m := newManager(t, srv.Client(t))
		r, err := keepRecording(t, m, testKey(t, "course_sync"))
		if err != nil {
			return err
		}
		srv.Kill()
		d, err := r.lostBeforeExpiry("Redis dying")
		if err != nil {
			return err
		}
		t.Logf("lost %v after grant (TTL %v): %v", d, r.lease.TTL, r.Err())
		return nil
	})
}
