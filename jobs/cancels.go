package jobs

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// subscribeCancels subscribes to every partition's cancel channel and
// waits for Redis to confirm.
func (r *Runner) subscribeCancels(ctx context.Context) (*redis.PubSub, error) {
	chans := make([]string, r.reg.ks.Partitions())
	for p := range chans {
		chans[p] = r.reg.ks.Cancels(p)
	}
	ps := r.reg.rdb.Subscribe(ctx, chans...)
	if _, err := ps.Receive(ctx); err != nil {
		ps.Close()
		return nil, fmt.Errorf("jobs: subscribe to cancels: %w", err)
	}
	return ps, nil
}

// cancelListener stops local runs as soon as their cancel is published.
// Missed messages are covered by the heartbeat, which returns the flag.
func (r *Runner) cancelListener(ctx context.Context, ps *redis.PubSub) {
	defer ps.Close()
	msgs := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-msgs:
			if !ok {
				return
			}
			r.mu.Lock()
			for cancel := range r.active[m.Payload] {
				(*cancel)(ErrCancelled)
			}
			r.mu.Unlock()
		}
	}
}

// track registers cancel for key's cancel messages until the returned
// func is called. It is registered before the claim, so a cancel published
// between the claim and the first stage is not missed.
func (r *Runner) track(key string, cancel context.CancelCauseFunc) (untrack func()) {
	h := &cancel
	r.mu.Lock()
	if r.active[key] == nil {
		r.active[key] = make(map[*context.CancelCauseFunc]struct{})
	}
	r.active[key][h] = struct{}{}
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		delete(r.active[key], h)
		if len(r.active[key]) == 0 {
			delete(r.active, key)
		}
		r.mu.Unlock()
	}
}
