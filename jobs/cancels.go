package jobs

import (
	"context"
	"fmt"
	"time"
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
			cancels := r.active[m.Payload]
			for cancel := range cancels {
				(*cancel)(ErrCancelled)
			}
			if len(cancels) == 0 {
				r.unmatched.add(m.Payload, time.Now())
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
// until the returned func is called. The reclaimer registers it before
// its claim; a run a read or a finish claimed is registered after Redis
// answered, and a cancel whose message came in between is found among
// the unmatched ones, so it too acts at once.
func (r *Runner) track(id string, cancel context.CancelCauseFunc) (untrack func()) {
	h := &cancel
	r.mu.Lock()
	if r.unmatched.has(id) {
		cancel(ErrCancelled)
	}
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

// unmatchedCancels remembers, for a while, the cancel messages that found
// no local run: a read or a finish may have claimed the run, with Redis
// answering after the message came and before the runner registered the
// run (track). Without it such a cancel acted only at the run's first
// heartbeat, a third of a lease TTL later. A message names one run
// (cancelID), whose cancel flag stays set, so acting on a remembered one
// is always right; the window only bounds memory. Every runner receives
// every cancel of its partitions, so the count is capped too. Guarded by
// Runner.mu.
type unmatchedCancels struct {
	window time.Duration
	max    int
	at     map[string]time.Time
	order  []string // ids in arrival order, for expiry
}

// unmatchedMax caps the cancels remembered (a bulk cancel of many tasks
// run elsewhere); the oldest go first.
const unmatchedMax = 4096

func newUnmatchedCancels(window time.Duration) unmatchedCancels {
	return unmatchedCancels{window: window, max: unmatchedMax, at: make(map[string]time.Time)}
}

// add remembers id, received at now, and forgets what is older than the
// window or beyond the cap.
func (u *unmatchedCancels) add(id string, now time.Time) {
	drop := 0
	for drop < len(u.order) && (len(u.order)-drop >= u.max || now.Sub(u.at[u.order[drop]]) > u.window) {
		delete(u.at, u.order[drop])
		drop++
	}
	u.order = u.order[drop:]
	if _, ok := u.at[id]; !ok {
		u.order = append(u.order, id)
	}
	u.at[id] = now
}

// has reports whether a cancel of id came unmatched within the window. On
// the hot path (every registration): one map lookup, none while no cancel
// came unmatched.
func (u *unmatchedCancels) has(id string) bool {
	if len(u.at) == 0 {
		return false
	}
	t, ok := u.at[id]
	return ok && time.Since(t) <= u.window
}
