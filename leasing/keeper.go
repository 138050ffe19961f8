package leasing

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Keeper timing defaults, as fractions of the lease TTL. The invariant
// TTL > RenewDeadline > RenewInterval (as in client-go's leaderelection)
// guarantees the Keeper gives up TTL-RenewDeadline before the lease can
// expire, and that there is room for at least one retry before that.
const (
	// RenewIntervalDivisorDefault: renew every TTL/3.
	RenewIntervalDivisorDefault = 3
	// RenewDeadlineFractionDefault: give up when no renewal was confirmed
	// for 2/3 of the TTL, leaving TTL/3 for work to stop before expiry.
	RenewDeadlineFractionDefault = 2.0 / 3.0
	// RetryIntervalDivisorDefault: after a failed renewal retry every
	// RenewInterval/4.
	RetryIntervalDivisorDefault = 4
)

// KeeperConfig configures a Keeper. Zero durations take defaults derived
// from TTL.
type KeeperConfig struct {
	// TTL of the lease being kept. Required (Manager.Keep fills it).
	TTL time.Duration
	// RenewDeadline: if no renewal has been confirmed for this long since
	// the last confirmed one (or the grant), the lease is declared lost.
	// Must be < TTL. Default TTL*2/3.
	RenewDeadline time.Duration
	// RenewInterval: time between successful renewals. Must be <
	// RenewDeadline. Default TTL/3.
	RenewInterval time.Duration
	// RetryInterval: time between attempts after a failed renewal. Must be
	// <= RenewInterval. Default RenewInterval/4.
	RetryInterval time.Duration
	// Renew extends the lease by TTL. nil means success; an error wrapping
	// ErrNotHeld means the lease is gone (loss is signalled at once); any
	// other error is retried until RenewDeadline. Required for NewKeeper.
	Renew func(ctx context.Context) error
}

func (c *KeeperConfig) applyDefaults() error {
	if c.TTL <= 0 {
		return fmt.Errorf("%w: keeper TTL must be > 0", ErrConfig)
	}
	if c.RenewDeadline == 0 {
		c.RenewDeadline = time.Duration(float64(c.TTL) * RenewDeadlineFractionDefault)
	}
	if c.RenewInterval == 0 {
		c.RenewInterval = c.TTL / RenewIntervalDivisorDefault
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = c.RenewInterval / RetryIntervalDivisorDefault
	}
	switch {
	case c.RenewDeadline >= c.TTL:
		return fmt.Errorf("%w: renew deadline %s must be < TTL %s", ErrConfig, c.RenewDeadline, c.TTL)
	case c.RenewInterval >= c.RenewDeadline:
		return fmt.Errorf("%w: renew interval %s must be < renew deadline %s", ErrConfig, c.RenewInterval, c.RenewDeadline)
	case c.RenewInterval <= 0 || c.RetryInterval <= 0:
		return fmt.Errorf("%w: renew and retry intervals must be > 0", ErrConfig)
	case c.RetryInterval > c.RenewInterval:
		return fmt.Errorf("%w: retry interval %s must be <= renew interval %s", ErrConfig, c.RetryInterval, c.RenewInterval)
	case c.Renew == nil:
		return fmt.Errorf("%w: keeper needs a Renew func", ErrConfig)
	}
	return nil
}

// Validate reports whether the timing is consistent, after defaults.
func (c KeeperConfig) Validate() error {
	if c.Renew == nil {
		c.Renew = func(context.Context) error { return nil }
	}
	return c.applyDefaults()
}

// Keeper renews a lease in the background and signals its loss. Loss is
// signalled when a renewal is refused (ErrNotHeld: expired or taken over),
// or when no renewal was confirmed within RenewDeadline — including when
// Redis stops answering and a call hangs — which is always before the lease
// could expire by Redis time. On loss the Keeper cancels Context() with a
// cause wrapping ErrLost and closes Lost().
type Keeper struct {
	cfg    KeeperConfig
	ctx    context.Context
	cancel context.CancelCauseFunc
	lost   chan struct{}
	done   chan struct{}

	mu  sync.Mutex
	err error
}

// NewKeeper starts keeping a lease granted (request sent) at grantedAt.
// The Keeper stops on Stop, on loss, or when ctx ends.
func NewKeeper(ctx context.Context, grantedAt time.Time, cfg KeeperConfig) (*Keeper, error) {
	if err := cfg.applyDefaults(); err != nil {
		return nil, err
	}
	kctx, cancel := context.WithCancelCause(ctx)
	k := &Keeper{cfg: cfg, ctx: kctx, cancel: cancel, lost: make(chan struct{}), done: make(chan struct{})}
	go k.loop(grantedAt)
	return k, nil
}

// Context is cancelled when the lease is lost (cause wraps ErrLost), when
// Stop is called, or when the parent context ends. Run the work under it.
func (k *Keeper) Context() context.Context { return k.ctx }

// Lost is closed when the lease is lost; it is never closed by Stop.
func (k *Keeper) Lost() <-chan struct{} { return k.lost }

// Err returns why the lease was lost (wrapping ErrLost), or nil.
func (k *Keeper) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

// Stop stops renewing and waits for the renew loop to exit. It does not
// release the lease. Safe to call more than once.
func (k *Keeper) Stop() {
	k.cancel(context.Canceled)
	<-k.done
}

func (k *Keeper) lose(cause error) {
	err := fmt.Errorf("%w: %w", ErrLost, cause)
	k.mu.Lock()
	k.err = err
	k.mu.Unlock()
	if ignoreLoss {
		return
	}
	k.cancel(err) // stop the work first: whoever sees Lost() also sees Context() done
	close(k.lost)
}

func (k *Keeper) loop(grantedAt time.Time) {
	defer close(k.done)
	deadline := grantedAt.Add(k.cfg.RenewDeadline)
	next := grantedAt.Add(k.cfg.RenewInterval)
	timer := time.NewTimer(time.Until(next))
	defer timer.Stop()
	var lastErr error
	for {
		select {
		case <-k.ctx.Done():
			return
		case <-timer.C:
		}
		sent := time.Now()
		if !sent.Before(deadline) {
			k.lose(fmt.Errorf("no renewal confirmed within %s: %w", k.cfg.RenewDeadline, orTimeout(lastErr)))
			return
		}
		err := k.renewBy(deadline)
		switch {
		case err == nil:
			lastErr = nil
			deadline = sent.Add(k.cfg.RenewDeadline)
			next = sent.Add(k.cfg.RenewInterval)
		case errors.Is(err, ErrNotHeld):
			k.lose(err)
			return
		case k.ctx.Err() != nil:
			return
		default:
			lastErr = err
			next = time.Now().Add(k.cfg.RetryInterval)
			if next.After(deadline) {
				next = deadline
			}
		}
		timer.Reset(time.Until(next))
	}
}

var errRenewTimeout = errors.New("renewal unanswered")

func orTimeout(err error) error {
	if err == nil {
		return errRenewTimeout
	}
	return err
}

// renewBy runs one renewal that must answer before deadline. The call runs
// in its own goroutine because a client may not honour context deadlines on
// a hung connection; the Keeper must not wait for it past the deadline.
func (k *Keeper) renewBy(deadline time.Time) error {
	rctx, cancel := context.WithDeadline(k.ctx, deadline)
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- k.cfg.Renew(rctx) }()
	select {
	case err := <-res:
		return err
	case <-rctx.Done():
		if k.ctx.Err() != nil {
			return k.ctx.Err()
		}
		return errRenewTimeout
	}
}
