package jobs

import (
	"context"
	"fmt"
)

// subscribeCancels listens to every partition's cancel channel (over the
// Registry's shared pub/sub connection) and waits for Redis to confirm.
func (r *Runner) subscribeCancels(ctx context.Context) (*subscription, error) {
	chans := make([]string, r.reg.ks.Partitions())
	for p := range chans {
		chans[p] = r.reg.ks.Cancels(p)
	}
	sub, err := r.reg.hub.subscribe(ctx, chans)
	if err != nil {
		return nil, fmt.Errorf("jobs: subscribe to cancels: %w", err)
	}
	return sub, nil
}

// cancelListener stops local runs as soon as their cancel is published.
// A message names the run ("<task key> <runId>"), so a late one never
// stops a newer run of the key. Missed messages are covered by the
// heartbeat, which returns the flag.
func (r *Runner) cancelListener(ctx context.Context, sub *subscription) {
	defer sub.Close()
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-sub.C:
			r.mu.Lock()
			for cancel := range r.active[m.Payload] {
				(*cancel)(ErrCancelled)
			}
			r.mu.Unlock()
			if h := r.testHooks.cancelHandled; h != nil {
				h(m.Payload)
			}
		}
	}
}

// cancelID is what the cancel channel carries for a run (cancel_payload
// in lua/lib/publish.lua).
func cancelID(key, runID string) string { return key + " " + runID }

// track registers cancel for the cancel messages of run id (cancelID)
// until the returned func is called. It is registered before the claim, so
// a cancel published between the claim and the first stage is not missed.
func (r *Runner) track(id string, cancel context.CancelCauseFunc) (untrack func()) {
	h := &cancel
	r.mu.Lock()
	if r.active[id] == nil {
		r.active[id] = make(map[*context.CancelCauseFunc]struct{})
	}
	r.active[id][h] = struct{}{}
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		delete(r.active[id], h)
		if len(r.active[id]) == 0 {
			delete(r.active, id)
		}
		r.mu.Unlock()
	}
}
